//! `podmend audit`: the dry run. Objects from manifests ([`manifests`]) or a live cluster
//! ([`cluster`]) go through the same [`Engine::review`] as the webhook, as CREATE requests;
//! the [`Report`] holds every finding with the exact patch the webhook computes, and
//! [`report`] renders it (table, JSON, SARIF, patches); [`policy_reports`] turns it into
//! PolicyReports or OpenReports and keeps those current; repaired manifests and reports are
//! written as YAML by [`yaml`], quoted so that YAML 1.1 and 1.2 readers agree.

pub mod cluster;
pub mod manifests;
pub mod merge_keys;
pub mod policy_reports;
pub mod report;
pub mod snapshot;
pub mod yaml;

use json_patch::PatchOperation;
use k8s_openapi::api::core::v1::PodSpec;
use serde::Serialize;
use serde_json::Value;

use std::io::Write;
use std::path::PathBuf;

use crate::cluster::{ClusterView, StaticCluster};
use crate::config::{Config, ConfigError, Mode};
use crate::engine::{Engine, Operation, Outcome, Subject};
use crate::target;
use policy_reports::ReportFormat;
use report::OutputFormat;

/// Where an object came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    /// File path as given on the command line, `-` for stdin, or `cluster`.
    pub file: String,
    /// 1-based document number within the file (0 for cluster objects).
    pub document: usize,
    /// 1-based line where the document's content starts (0 for cluster objects).
    pub line: usize,
    /// Helm's `# Source: chart/templates/x.yaml` comment above the document, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub helm_source: Option<String>,
    /// Index within a `kind: List` document's `items`, if the object came from one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub list_item: Option<usize>,
}

/// Which object a finding is about.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl ObjectRef {
    pub fn of(object: &Value) -> Self {
        let text = |pointer: &str| {
            object
                .pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let name = match text("/metadata/name") {
            name if name.is_empty() => text("/metadata/generateName"),
            name => name,
        };
        Self {
            api_version: text("/apiVersion"),
            kind: text("/kind"),
            namespace: text("/metadata/namespace"),
            name,
        }
    }

    /// `Kind/namespace/name` (namespace left out when empty).
    pub fn display(&self) -> String {
        if self.namespace.is_empty() {
            format!("{}/{}", self.kind, self.name)
        } else {
            format!("{}/{}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// One rule's finding on one object.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditFinding {
    pub rule: String,
    /// What the webhook does with it: `enforce` (repairs), `warn`, or `deny`.
    pub mode: Mode,
    pub object: ObjectRef,
    pub source: Source,
    /// The finding's lines joined with `; `.
    pub message: String,
    /// How to fix the source.
    pub advice: String,
    /// This rule's repair as a JSON Patch on the whole object.
    pub patch: Vec<PatchOperation>,
}

/// The whole repair of one object: what the webhook sends when every rule enforces.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRepair {
    pub object: ObjectRef,
    pub source: Source,
    pub patch: Vec<PatchOperation>,
}

/// What only a live cluster shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SymptomKind {
    /// Failed pods of one owner with one reason: the nodeName storm shows here.
    FailedPods,
    /// Phase `Pending` while every container runs (virtual-kubelet nodes).
    PendingWithRunningContainers,
    /// A Docker-in-Docker pod that mounts the node's Docker socket.
    DindHostSocket,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Symptom {
    pub kind: SymptomKind,
    /// The owner (for failed pods) or the pod.
    pub object: ObjectRef,
    /// Pods affected.
    pub count: usize,
    /// e.g. `OutOfcpu`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// One line for people, e.g. "ReplicaSet x: 1,204 Failed pods (OutOfcpu) — its template pins spec.nodeName=y".
    pub message: String,
}

/// A document that could not be read; the run goes on with the others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InputError {
    pub file: String,
    pub document: usize,
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for InputError {
    /// One line: `FILE: document N (line L): MESSAGE`, or `FILE: MESSAGE` for the whole file;
    /// stdin is named `stdin`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let file = if self.file == "-" {
            "stdin"
        } else {
            &self.file
        };
        if self.document == 0 {
            write!(f, "{file}: {}", self.message)
        } else {
            write!(
                f,
                "{file}: document {} (line {}): {}",
                self.document, self.line, self.message
            )
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Objects read.
    pub objects: usize,
    /// Objects without a pod spec (ConfigMaps, Services, …): counted and skipped.
    pub without_pod_spec: usize,
    /// Objects with a pod spec podmend leaves alone (mirror pods, skip annotation, …).
    pub skipped: usize,
    pub findings: usize,
    /// Findings with a repair, by the mode they are in; notes are in none of them.
    pub enforce: usize,
    pub warn: usize,
    pub deny: usize,
    /// Findings with nothing to repair (what a rule left alone, and why), whatever the mode.
    pub notes: usize,
    /// Findings whose change does not repair the object (`Finding::repairs`): a guard the
    /// pod's clients can go around. Notes are not counted here.
    #[serde(skip_serializing_if = "is_zero")]
    pub not_repaired: usize,
    pub symptoms: usize,
    pub input_errors: usize,
}

fn is_zero(count: &usize) -> bool {
    *count == 0
}

/// Everything one audit run found.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub findings: Vec<AuditFinding>,
    pub repairs: Vec<ObjectRepair>,
    pub symptoms: Vec<Symptom>,
    pub errors: Vec<InputError>,
    pub summary: Summary,
}

/// The least mode that makes `--fail-on` fail: `warn < deny < enforce`; `never` for
/// pipelines that only want the output (a Helm post-renderer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum FailOn {
    Warn,
    Deny,
    Enforce,
    Never,
}

fn severity(mode: Mode) -> Option<FailOn> {
    match mode {
        Mode::Warn => Some(FailOn::Warn),
        Mode::Deny => Some(FailOn::Deny),
        Mode::Enforce => Some(FailOn::Enforce),
        Mode::Off => None,
    }
}

/// Exit statuses, as documented.
pub const EXIT_CLEAN: u8 = 0;
pub const EXIT_INPUT_ERROR: u8 = 1;
pub const EXIT_FINDINGS: u8 = 3;

impl Report {
    /// Reviews one object as the webhook would on CREATE and records what it finds.
    pub fn add_object(
        &mut self,
        engine: &Engine,
        cluster: &dyn ClusterView,
        object: &Value,
        source: Source,
    ) -> Outcome {
        let api_version = object
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
        let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
        let namespace = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("");
        let subject = Subject {
            operation: Operation::Create,
            group,
            kind,
            sub_resource: "",
            namespace,
            object: Some(object),
            old_object: None,
        };
        self.add_review(engine, cluster, &subject, source)
    }

    /// Reviews one request as the webhook would (any operation and subresource, e.g. a
    /// `pods/status` update for the status rules) and records what it finds on its object.
    pub fn add_review(
        &mut self,
        engine: &Engine,
        cluster: &dyn ClusterView,
        subject: &Subject<'_>,
        source: Source,
    ) -> Outcome {
        let outcome = engine.review(subject, cluster);
        self.summary.objects += 1;
        match (&outcome.target, &outcome.skipped) {
            (None, _) | (Some(_), Some(crate::engine::Skip::NoPodSpec)) => {
                self.summary.without_pod_spec += 1
            }
            (Some(_), Some(_)) => self.summary.skipped += 1,
            (Some(_), None) => {}
        }
        let object_ref = subject.object.map(ObjectRef::of).unwrap_or_default();
        for finding in &outcome.findings {
            self.summary.findings += 1;
            if !finding.is_note() && !finding.repairs() {
                self.summary.not_repaired += 1;
            }
            match finding.mode {
                _ if finding.is_note() => self.summary.notes += 1,
                Mode::Enforce => self.summary.enforce += 1,
                Mode::Warn => self.summary.warn += 1,
                Mode::Deny => self.summary.deny += 1,
                Mode::Off => {}
            }
            self.findings.push(AuditFinding {
                rule: finding.rule.to_string(),
                mode: finding.mode,
                object: object_ref.clone(),
                source: source.clone(),
                message: finding.messages.join("; "),
                advice: finding.advice.to_string(),
                patch: finding.patch.clone(),
            });
        }
        if !outcome.repair().is_empty() {
            self.repairs.push(ObjectRepair {
                object: object_ref,
                source,
                patch: outcome.repair().to_vec(),
            });
        }
        outcome
    }

    /// Reviews every object of a manifest file, looking up `cluster` (offline, or a
    /// `--cluster-snapshot`): what `podmend audit FILE` does per file. An object whose pod
    /// spec the API server would refuse is an input error, not reviewed.
    pub fn add_file(
        &mut self,
        engine: &Engine,
        cluster: &dyn ClusterView,
        file: &manifests::ManifestFile,
    ) {
        for document in &file.documents {
            for (item, object) in document.objects() {
                let source = document.source(&file.name, item);
                match invalid_pod_spec(object) {
                    Some(message) => {
                        self.summary.objects += 1;
                        self.add_error(InputError {
                            file: source.file,
                            document: source.document,
                            line: source.line,
                            message,
                        });
                    }
                    None => {
                        self.add_object(engine, cluster, object, source);
                    }
                }
            }
        }
    }

    pub fn add_error(&mut self, error: InputError) {
        self.summary.input_errors += 1;
        self.errors.push(error);
    }

    pub fn add_symptom(&mut self, symptom: Symptom) {
        self.summary.symptoms += 1;
        self.symptoms.push(symptom);
    }

    /// 1 on any input error; else 3 when a finding with a repair is at or above `fail_on`
    /// (symptoms count as `warn`; notes, findings with nothing to repair, never count); else 0.
    pub fn exit_status(&self, fail_on: FailOn) -> u8 {
        if !self.errors.is_empty() {
            return EXIT_INPUT_ERROR;
        }
        let failing = self
            .findings
            .iter()
            .filter(|f| !f.patch.is_empty())
            .filter_map(|f| severity(f.mode))
            .chain(self.symptoms.iter().map(|_| FailOn::Warn))
            .any(|level| level >= fail_on);
        if failing { EXIT_FINDINGS } else { EXIT_CLEAN }
    }
}

/// Why an object of a handled kind is not a valid one: its pod spec does not decode. Names
/// the field by its path in the object and says what was wrong. Objects from a live cluster
/// were validated by the API server and are not checked again.
fn invalid_pod_spec(object: &Value) -> Option<String> {
    let text = |key: &str| object.get(key).and_then(Value::as_str).unwrap_or("");
    let target = target::for_api_version(text("apiVersion"), text("kind"))?;
    let spec = object.pointer(target.spec)?;
    let error = serde_path_to_error::deserialize::<_, PodSpec>(spec).err()?;
    let mut path = target.spec.trim_start_matches('/').replace('/', ".");
    let field = error.path().to_string();
    if field != "." {
        path.push('.');
        path.push_str(&field);
    }
    Some(format!(
        "not a valid {}: {path}: {} (the API server would refuse it; fix the field and run the audit again)",
        target.name,
        error.inner()
    ))
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Cluster(#[from] cluster::ClusterAuditError),
    #[error(transparent)]
    PolicyReport(Box<policy_reports::PolicyReportError>),
    #[error("-o yaml prints the given manifests repaired; it takes manifest paths, not --cluster")]
    YamlFromCluster,
    #[error(transparent)]
    Snapshot(#[from] snapshot::SnapshotError),
    #[error("cannot write the output: {0}")]
    Write(#[source] std::io::Error),
}

impl From<policy_reports::PolicyReportError> for AuditError {
    fn from(error: policy_reports::PolicyReportError) -> Self {
        Self::PolicyReport(Box::new(error))
    }
}

/// How the output is shown.
#[derive(Debug, Clone, Copy, Default)]
pub struct Terminal {
    /// Colour in the table (stdout is a terminal and NO_COLOR is unset).
    pub color: bool,
    /// Progress on stderr while listing a cluster (stderr is a terminal).
    pub progress: bool,
}

/// Everything `podmend audit` is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditOptions {
    /// What to audit.
    pub input: AuditInput,
    pub output: OutputFormat,
    /// When the run fails with [`EXIT_FINDINGS`]; `None`: `warn`, but never with
    /// [`OutputFormat::Yaml`] (a Helm post-renderer must not fail on what it repairs).
    pub fail_on: Option<FailOn>,
    /// Configuration file, as for `podmend serve` (its modes decide what each finding is).
    pub config: Option<PathBuf>,
    /// With files: the Nodes, Namespaces and LimitRanges the rules look up
    /// ([`snapshot`]); without it, look-ups are off.
    pub cluster_snapshot: Option<PathBuf>,
}

impl AuditOptions {
    /// The `--fail-on` level, its default resolved.
    pub fn fail_on(&self) -> FailOn {
        let default = if self.output == OutputFormat::Yaml {
            FailOn::Never
        } else {
            FailOn::Warn
        };
        self.fail_on.unwrap_or(default)
    }
}

/// Manifest files or a live cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditInput {
    /// Files or directories (recursing into `*.yaml`, `*.yml`, `*.json`); `-` is stdin.
    Files(Vec<String>),
    Cluster(LiveCluster),
}

/// `audit --cluster`: which cluster, how to list it, and whether to write report objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveCluster {
    /// Kubeconfig file; `None`: `$KUBECONFIG`, `~/.kube/config`, in-cluster.
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context; `None`: the current one.
    pub context: Option<String>,
    /// Only this namespace; `None`: all namespaces.
    pub namespace: Option<String>,
    /// Objects per list request.
    pub page_size: u32,
    /// `--policy-report`: the findings as report objects instead of `output`.
    pub policy_reports: Option<PolicyReportOutput>,
}

/// `--policy-report [--report-format F] [--apply]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyReportOutput {
    pub format: ReportFormat,
    /// Server-side apply them (and delete podmend's stale ones) instead of printing them.
    pub apply: bool,
}

/// Runs `podmend audit`: reads, reviews, renders to `out`; returns the exit status.
pub async fn run(
    options: &AuditOptions,
    out: &mut dyn Write,
    terminal: Terminal,
) -> Result<u8, AuditError> {
    let config = match &options.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    let engine = Engine::new(&config);
    let report = match &options.input {
        AuditInput::Files(paths) => {
            let cluster = match &options.cluster_snapshot {
                Some(path) => snapshot::read(path)?,
                None => StaticCluster::offline(),
            };
            audit_files(&engine, &cluster, paths, options.output, terminal, out)?
        }
        AuditInput::Cluster(live) => {
            if options.output == OutputFormat::Yaml && live.policy_reports.is_none() {
                return Err(AuditError::YamlFromCluster);
            }
            audit_live_cluster(&engine, live, options.output, terminal, out).await?
        }
    };
    Ok(report.exit_status(options.fail_on()))
}

/// Writes `text` to the output.
fn write(out: &mut dyn Write, text: &str) -> Result<(), AuditError> {
    out.write_all(text.as_bytes()).map_err(AuditError::Write)
}

/// Reviews the manifests in `paths` and writes the report, or the manifests repaired with
/// `-o yaml`.
fn audit_files(
    engine: &Engine,
    cluster: &StaticCluster,
    paths: &[String],
    output: OutputFormat,
    terminal: Terminal,
    out: &mut dyn Write,
) -> Result<Report, AuditError> {
    let mut report = Report::default();
    let (files, errors) = manifests::read_paths(paths);
    for error in errors {
        report.add_error(error);
    }
    for file in &files {
        report.add_file(engine, cluster, file);
    }
    print_input_errors(&report);
    if output == OutputFormat::Yaml {
        write(out, &manifests::render_repaired(&files, &report.repairs))?;
    } else {
        write(out, &render(&report, output, terminal))?;
    }
    Ok(report)
}

/// Reviews a live cluster and writes the report, or its report objects (printed or
/// applied).
async fn audit_live_cluster(
    engine: &Engine,
    live: &LiveCluster,
    output: OutputFormat,
    terminal: Terminal,
    out: &mut dyn Write,
) -> Result<Report, AuditError> {
    let mut report = Report::default();
    let client = cluster::client_for(live.kubeconfig.as_deref(), live.context.as_deref()).await?;
    let options = cluster::ClusterAuditOptions {
        namespace: live.namespace.clone(),
        page_size: live.page_size,
        progress: terminal.progress,
    };
    cluster::audit_cluster(client.clone(), engine, &options, &mut report).await?;
    if terminal.progress {
        eprintln!();
    }
    print_input_errors(&report);
    match live.policy_reports {
        Some(reports) => write_policy_reports(client, &report, live, reports, out).await?,
        None => write(out, &render(&report, output, terminal))?,
    }
    Ok(report)
}

/// `--policy-report`: prints the report objects as YAML, or applies them and writes one
/// line saying what changed.
async fn write_policy_reports(
    client: kube::Client,
    report: &Report,
    live: &LiveCluster,
    reports: PolicyReportOutput,
    out: &mut dyn Write,
) -> Result<(), AuditError> {
    let objects = policy_reports::reports(report, reports.format);
    if !reports.apply {
        for object in &objects {
            write(out, &format!("---\n{}", yaml::to_string(object)))?;
        }
        return Ok(());
    }
    let scope = policy_reports::ApplyScope {
        namespace: live.namespace.as_deref(),
        page_size: live.page_size,
    };
    let done = policy_reports::apply_reports(client, reports.format, &objects, &scope).await?;
    let kind = reports.format.namespaced().kind;
    let mut line = format!("applied {} {kind}(s)", done.applied);
    if done.deleted.is_empty() {
        line.push_str(", none stale");
    } else {
        line.push_str(&format!(
            ", deleted {} stale: {}",
            done.deleted.len(),
            done.deleted.join(", ")
        ));
    }
    if !done.skipped.is_empty() {
        let skipped: Vec<String> = done
            .skipped
            .iter()
            .map(|(namespace, why)| format!("{namespace} ({why})"))
            .collect();
        line.push_str(&format!("; skipped namespace(s) {}", skipped.join(", ")));
    }
    line.push('\n');
    write(out, &line)
}

/// Every input error, one line each on stderr, whatever the output format: stdout may be a
/// Helm post-renderer's pipe or a report file, and the user must still see why the run
/// failed. The formats that have a place for errors also carry them.
fn print_input_errors(report: &Report) {
    for error in &report.errors {
        eprintln!("podmend audit: {error}");
    }
}

fn render(report: &Report, format: OutputFormat, terminal: Terminal) -> String {
    match format {
        OutputFormat::Table => report::table(report, terminal.color),
        OutputFormat::Json => report::json(report),
        OutputFormat::Sarif => report::sarif(report, env!("CARGO_PKG_VERSION")),
        OutputFormat::Patch => report::patches(report),
        // Only reachable for cluster findings, refused above.
        OutputFormat::Yaml => report::json(report),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cluster::StaticCluster;
    use crate::config::Config;

    fn source() -> Source {
        Source {
            file: "x.yaml".into(),
            document: 1,
            line: 1,
            helm_source: None,
            list_item: None,
        }
    }

    #[test]
    fn findings_carry_the_object_source_and_the_rules_patch() {
        let mut report = Report::default();
        let engine = Engine::new(&Config::default());
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"nodeName": "n1", "containers": [{"name": "a"}]}});
        let cluster = StaticCluster::empty().with_node("n1", vec![]);
        report.add_object(&engine, &cluster, &pod, source());
        assert_eq!(report.findings.len(), 1);
        let finding = &report.findings[0];
        assert_eq!(finding.rule, "node-affinity");
        assert_eq!(finding.object.display(), "Pod/ns/p");
        assert!(!finding.patch.is_empty());
        assert_eq!(report.repairs.len(), 1);
        assert_eq!(report.summary.enforce, 1);
    }

    #[test]
    fn a_guard_the_pod_s_clients_can_go_around_is_counted_as_not_repaired() {
        let engine = Engine::new(&Config::default());
        let dind = |daemon_command: serde_json::Value| {
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
                "spec": {"containers": [
                    {"name": "build", "image": "docker:27-cli",
                     "env": [{"name": "DOCKER_HOST", "value": "tcp://localhost:2375"}]},
                    {"name": "dind", "image": "docker:27-dind", "command": daemon_command,
                     "env": [{"name": "DOCKER_TLS_CERTDIR", "value": ""}],
                     "securityContext": {"privileged": true}}]}})
        };
        let mut report = Report::default();
        // A shell-wrapped daemon cannot be moved: the guard stands aside, reached by
        // DOCKER_HOST only.
        report.add_object(
            &engine,
            &StaticCluster::offline(),
            &dind(json!(["sh", "-c", "dockerd-entrypoint.sh"])),
            source(),
        );
        assert_eq!(report.summary.enforce, 1);
        assert_eq!(report.summary.not_repaired, 1);
        assert!(
            report.findings[0]
                .message
                .starts_with("podmend-guard can be bypassed")
        );
        assert!(report::table(&report, false).contains("1 not repaired"));
        let mut report = Report::default();
        report.add_object(
            &engine,
            &StaticCluster::offline(),
            &dind(json!(["dockerd-entrypoint.sh"])),
            source(),
        );
        assert_eq!(report.summary.enforce, 1);
        assert_eq!(report.summary.not_repaired, 0);
        assert!(!report::table(&report, false).contains("not repaired"));
    }

    #[test]
    fn objects_without_a_pod_spec_are_counted_and_skipped() {
        let mut report = Report::default();
        let engine = Engine::new(&Config::default());
        report.add_object(
            &engine,
            &StaticCluster::offline(),
            &json!({"apiVersion": "v1", "kind": "Service"}),
            source(),
        );
        assert_eq!(report.summary.objects, 1);
        assert_eq!(report.summary.without_pod_spec, 1);
        assert!(report.findings.is_empty());
    }

    #[test]
    fn exit_status_follows_fail_on_and_input_errors() {
        let mut report = Report::default();
        assert_eq!(report.exit_status(FailOn::Warn), EXIT_CLEAN);
        let engine = Engine::new(&Config::default());
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"template": {"spec": {"nodeName": "n1", "containers": [{"name": "a"}]}}}});
        let cluster = StaticCluster::empty().with_node("n1", vec![]);
        report.add_object(&engine, &cluster, &deployment, source());
        assert_eq!(report.exit_status(FailOn::Warn), EXIT_FINDINGS);
        assert_eq!(report.exit_status(FailOn::Deny), EXIT_CLEAN);
        assert_eq!(report.exit_status(FailOn::Enforce), EXIT_CLEAN);
        report.add_error(InputError {
            file: "x".into(),
            document: 2,
            line: 7,
            message: "bad".into(),
        });
        assert_eq!(report.exit_status(FailOn::Enforce), EXIT_INPUT_ERROR);
    }

    #[test]
    fn a_note_shows_but_never_fails_the_run() {
        let mut report = Report::default();
        report.findings.push(AuditFinding {
            rule: "dind-rm".into(),
            mode: Mode::Enforce,
            object: ObjectRef::default(),
            source: source(),
            message: "left alone: a node agent".into(),
            advice: String::new(),
            patch: Vec::new(),
        });
        assert_eq!(report.exit_status(FailOn::Warn), EXIT_CLEAN);
        assert!(report::table(&report, false).contains("note"));
    }
}
