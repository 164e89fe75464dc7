//! The audit's findings as Kubernetes report objects that stay true: `wgpolicyk8s.io/v1alpha2`
//! PolicyReports / ClusterPolicyReports or `openreports.io/v1alpha1` Reports / ClusterReports
//! ([`ReportFormat`]), one set per namespace, split so that no object exceeds
//! [`MAX_REPORT_BYTES`] serialized (etcd refuses requests over ~1.5 MiB; Kyverno's "request is
//! too large"), labelled as podmend's ([`MANAGED_BY_LABEL`], [`REPORT_SET_LABEL`]); and
//! [`apply_reports`], which server-side applies them and deletes the reports podmend owns that
//! the run no longer produces: a namespace without findings, the extra parts of a report that
//! shrank.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{SystemTime, UNIX_EPOCH};

use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, Preconditions,
};
use serde_json::{Map, Value, json};

use super::cluster::client::{ClusterAuditError, chain};
use super::cluster::lister::Lister;
use super::cluster::text;
use super::{ObjectRef, Report};
use crate::config::Mode;

/// The largest a report object may be, serialized as JSON: 1 MiB, well under etcd's request
/// limit (1.5 MiB by default) with room for `metadata.managedFields` and the API server's
/// own fields.
pub const MAX_REPORT_BYTES: usize = 1024 * 1024;
/// Name of the first part of each namespace's report; later parts are `podmend-audit-2`, ….
pub const REPORT_SET: &str = "podmend-audit";
/// The label every report podmend writes carries, with value [`MANAGER`].
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The label naming the report set (value [`REPORT_SET`]): podmend deletes only reports
/// with both labels.
pub const REPORT_SET_LABEL: &str = "podmend.io/report-set";
/// podmend's name as field manager, label value and report `source`.
pub const MANAGER: &str = "podmend";
/// Longest result message kept, in bytes; longer ones are cut (at a character boundary) and
/// end with `…`, so that one result can never approach [`MAX_REPORT_BYTES`] alone.
const MAX_MESSAGE_BYTES: usize = 4096;

/// Which report API the findings are written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ReportFormat {
    /// wgpolicyk8s.io/v1alpha2 PolicyReport / ClusterPolicyReport (the wg-policy CRDs, as
    /// Kyverno and Policy Reporter install them).
    #[default]
    #[value(name = "policyreport")]
    PolicyReport,
    /// openreports.io/v1alpha1 Report / ClusterReport (the OpenReports CRDs: Kubewarden's
    /// audit scanner default, a Kyverno option).
    #[value(name = "openreports")]
    OpenReports,
}

/// One report kind of one [`ReportFormat`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportKind {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub namespaced: bool,
}

impl ReportKind {
    pub fn api_version(&self) -> String {
        format!("{}/{}", self.group, self.version)
    }

    fn api_resource(&self) -> ApiResource {
        ApiResource {
            group: self.group.to_string(),
            version: self.version.to_string(),
            api_version: self.api_version(),
            kind: self.kind.to_string(),
            plural: self.plural.to_string(),
        }
    }
}

impl ReportFormat {
    /// The namespaced kind (`PolicyReport`, `Report`).
    pub fn namespaced(self) -> ReportKind {
        match self {
            Self::PolicyReport => ReportKind {
                group: "wgpolicyk8s.io",
                version: "v1alpha2",
                kind: "PolicyReport",
                plural: "policyreports",
                namespaced: true,
            },
            Self::OpenReports => ReportKind {
                group: "openreports.io",
                version: "v1alpha1",
                kind: "Report",
                plural: "reports",
                namespaced: true,
            },
        }
    }

    /// The cluster-scoped kind (`ClusterPolicyReport`, `ClusterReport`).
    pub fn cluster(self) -> ReportKind {
        match self {
            Self::PolicyReport => ReportKind {
                group: "wgpolicyk8s.io",
                version: "v1alpha2",
                kind: "ClusterPolicyReport",
                plural: "clusterpolicyreports",
                namespaced: false,
            },
            Self::OpenReports => ReportKind {
                group: "openreports.io",
                version: "v1alpha1",
                kind: "ClusterReport",
                plural: "clusterreports",
                namespaced: false,
            },
        }
    }

    /// Where the CRDs come from, for the "not installed" error.
    fn crd_source(self) -> &'static str {
        match self {
            Self::PolicyReport => {
                "install the wg-policy PolicyReport CRDs (kubernetes-sigs/wg-policy-prototypes, policy-report/crd; Kyverno ships them too)"
            }
            Self::OpenReports => {
                "install the OpenReports CRDs (openreports/reports-api, crd/openreports.io/v1alpha1; Kubewarden's and Kyverno's charts can install them)"
            }
        }
    }

    /// The kind of a report object this format writes, by its `kind`.
    fn kind_of(self, kind: &str) -> Option<ReportKind> {
        [self.namespaced(), self.cluster()]
            .into_iter()
            .find(|k| k.kind == kind)
    }
}

/// What can stop `--policy-report --apply`, each with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum PolicyReportError {
    #[error(
        "the {kind} CRD ({api_version}) is not installed in the cluster (404); {install}, or print the reports without --apply"
    )]
    CrdMissing {
        kind: String,
        api_version: String,
        install: &'static str,
    },
    #[error(
        "not allowed to {verb} {kind} {name} (403 Forbidden: {message}); podmend needs create, patch, list and delete on {plural}.{group} (the chart's reports CronJob has them)"
    )]
    Forbidden {
        verb: &'static str,
        kind: String,
        name: String,
        plural: String,
        group: String,
        message: String,
    },
    #[error("cannot {verb} {kind} {name} ({code} {reason}: {message})")]
    Request {
        verb: &'static str,
        kind: String,
        name: String,
        code: u16,
        reason: String,
        message: String,
    },
    #[error("not a {format:?} report object with a name: {detail}")]
    NotAReport {
        format: ReportFormat,
        detail: String,
    },
    #[error(transparent)]
    Cluster(#[from] ClusterAuditError),
}

/// The report as `wgpolicyk8s.io/v1alpha2` reports (see [`reports`]).
pub fn policy_reports(report: &Report) -> Vec<Value> {
    reports(report, ReportFormat::PolicyReport)
}

/// The report as report objects of `format`: per namespace one report named `podmend-audit`
/// (then `podmend-audit-2`, … while the results do not fit in [`MAX_REPORT_BYTES`]), and the
/// same for objects without a namespace as cluster-scoped reports, last. Findings with a
/// repair are `fail` (enforce, deny) or `warn`; notes (nothing to repair) are `skip`;
/// symptoms are `warn`. Every object carries the labels
/// `app.kubernetes.io/managed-by: podmend` and `podmend.io/report-set: podmend-audit`.
pub fn reports(report: &Report, format: ReportFormat) -> Vec<Value> {
    let mut out = Vec::new();
    let mut cluster_scoped = Vec::new();
    for (namespace, results) in results_by_namespace(report, format) {
        let objects = split(format, namespace, results);
        if namespace.is_empty() {
            cluster_scoped = objects;
        } else {
            out.extend(objects);
        }
    }
    out.extend(cluster_scoped);
    out
}

/// Every finding and symptom as a report result, by the namespace of its object (`""` for
/// cluster-scoped ones).
fn results_by_namespace(report: &Report, format: ReportFormat) -> BTreeMap<&str, Vec<Value>> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let result = ResultTemplate {
        format,
        timestamp: json!({"seconds": now.as_secs(), "nanos": now.subsec_nanos()}),
    };
    let mut by_namespace: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    for finding in &report.findings {
        let outcome = match finding.mode {
            // A note changes nothing and asks nothing of anyone: no failure to chase.
            _ if finding.patch.is_empty() => "skip",
            Mode::Enforce | Mode::Deny => "fail",
            Mode::Warn => "warn",
            Mode::Off => "skip",
        };
        let message = if finding.advice.is_empty() {
            finding.message.clone()
        } else {
            format!("{}; fix: {}", finding.message, finding.advice)
        };
        by_namespace
            .entry(&finding.object.namespace)
            .or_default()
            .push(result.build(&finding.rule, outcome, &message, &finding.object));
    }
    for symptom in &report.symptoms {
        let rule = serde_json::to_value(symptom.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        by_namespace
            .entry(&symptom.object.namespace)
            .or_default()
            .push(result.build(&rule, "warn", &symptom.message, &symptom.object));
    }
    by_namespace
}

/// What every result of one run shares: the format and the run's timestamp.
struct ResultTemplate {
    format: ReportFormat,
    timestamp: Value,
}

impl ResultTemplate {
    /// One result: `rule`'s `outcome` on `object`, with `message` cut to
    /// [`MAX_MESSAGE_BYTES`].
    fn build(&self, rule: &str, outcome: &str, message: &str, object: &ObjectRef) -> Value {
        let mut resource = Map::new();
        resource.insert("apiVersion".into(), object.api_version.clone().into());
        resource.insert("kind".into(), object.kind.clone().into());
        resource.insert("name".into(), object.name.clone().into());
        if !object.namespace.is_empty() {
            resource.insert("namespace".into(), object.namespace.clone().into());
        }
        let mut result = Map::new();
        result.insert("policy".into(), MANAGER.into());
        result.insert("rule".into(), rule.into());
        result.insert("result".into(), outcome.into());
        result.insert("message".into(), bounded(message).into());
        if self.format == ReportFormat::PolicyReport {
            // OpenReports names the source once, on the report.
            result.insert("source".into(), MANAGER.into());
        }
        result.insert("scored".into(), true.into());
        result.insert("timestamp".into(), self.timestamp.clone());
        result.insert("resources".into(), json!([resource]));
        Value::Object(result)
    }
}

/// `message`, cut to [`MAX_MESSAGE_BYTES`].
fn bounded(message: &str) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message.to_string();
    }
    let mut end = MAX_MESSAGE_BYTES - '…'.len_utf8();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

/// The name of part `index` (0-based) of a report set.
pub fn part_name(index: usize) -> String {
    match index {
        0 => REPORT_SET.to_string(),
        n => format!("{REPORT_SET}-{}", n + 1),
    }
}

/// One namespace's results as report objects, each at most [`MAX_REPORT_BYTES`] serialized.
fn split(format: ReportFormat, namespace: &str, results: Vec<Value>) -> Vec<Value> {
    let sizes: Vec<usize> = results.iter().map(json_len).collect();
    // The object without results, its summary counts as wide as they can get: the part's
    // size is this, plus each result, plus a comma between two.
    let total = results.len();
    let widest = report_object(format, namespace, 0, &[], Some(total));
    let base = json_len(&widest);
    let mut parts: Vec<Vec<Value>> = Vec::new();
    let mut current: Vec<Value> = Vec::new();
    let mut size = base;
    for (result, len) in results.into_iter().zip(sizes) {
        let added = len + usize::from(!current.is_empty());
        if !current.is_empty() && size + added > MAX_REPORT_BYTES {
            parts.push(std::mem::take(&mut current));
            size = base;
        }
        size += len + usize::from(!current.is_empty());
        current.push(result);
    }
    if !current.is_empty() || parts.is_empty() {
        parts.push(current);
    }
    parts
        .iter()
        .enumerate()
        .map(|(index, results)| report_object(format, namespace, index, results, None))
        .collect()
}

fn json_len(value: &Value) -> usize {
    serde_json::to_vec(value).map_or(0, |bytes| bytes.len())
}

/// One report object. `widest_count` replaces every summary count (to size the object as
/// it can grow at most).
fn report_object(
    format: ReportFormat,
    namespace: &str,
    index: usize,
    results: &[Value],
    widest_count: Option<usize>,
) -> Value {
    let count = |outcome: &str| {
        widest_count.unwrap_or_else(|| results.iter().filter(|r| r["result"] == outcome).count())
    };
    let summary = json!({
        "pass": count("pass"),
        "fail": count("fail"),
        "warn": count("warn"),
        "error": count("error"),
        "skip": count("skip"),
    });
    let mut metadata = json!({
        "name": part_name(index),
        "labels": {MANAGED_BY_LABEL: MANAGER, REPORT_SET_LABEL: REPORT_SET},
    });
    let kind = if namespace.is_empty() {
        format.cluster()
    } else {
        metadata["namespace"] = namespace.into();
        format.namespaced()
    };
    let mut object = Map::new();
    object.insert("apiVersion".into(), kind.api_version().into());
    object.insert("kind".into(), kind.kind.into());
    object.insert("metadata".into(), metadata);
    if format == ReportFormat::OpenReports {
        object.insert("source".into(), MANAGER.into());
    }
    object.insert("summary".into(), summary);
    object.insert("results".into(), Value::Array(results.to_vec()));
    Value::Object(object)
}

/// What [`apply_reports`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Report objects applied (created or updated).
    pub applied: usize,
    /// Stale report objects deleted, `namespace/name` (or `name`), in the order deleted.
    pub deleted: Vec<String>,
    /// Namespaces whose reports were not written, each with why: being deleted, or gone.
    pub skipped: Vec<(String, &'static str)>,
}

impl Applied {
    /// Records that `namespace` gets no report, and says so on stderr once per namespace.
    fn skip(&mut self, namespace: &str, why: &'static str, kind: &str, name: &str) {
        if self.skipped.iter().any(|(ns, _)| ns == namespace) {
            return;
        }
        eprintln!(
            "podmend audit: namespace {namespace} {why}: its {kind} {name} is not written; the other namespaces' are"
        );
        self.skipped.push((namespace.to_string(), why));
    }
}

/// Where [`apply_reports`] looks for stale reports.
#[derive(Debug, Clone, Default)]
pub struct ApplyScope<'a> {
    /// The audit's namespace: only reports there are candidates; `None` for every namespace.
    pub namespace: Option<&'a str>,
    /// Objects per list request.
    pub page_size: u32,
}

/// Server-side applies `reports` (from [`reports`] with `format`) as field manager `podmend`
/// (forced: podmend owns these objects), then deletes the reports of `format` that carry
/// podmend's labels in `scope` but are not among `reports` (a namespace whose findings are
/// gone, the extra parts of a report that shrank), each with a precondition on its UID. The
/// cluster-scoped kind is only looked at when `reports` has a cluster-scoped object: a
/// cluster audit never writes one (every object it reviews is namespaced). A namespace that
/// is being deleted, or was deleted since the audit listed it, gets no report: it is said on
/// stderr and in [`Applied::skipped`], and the other namespaces and the clean-up go on.
pub async fn apply_reports(
    client: Client,
    format: ReportFormat,
    reports: &[Value],
    scope: &ApplyScope<'_>,
) -> Result<Applied, PolicyReportError> {
    let params = PatchParams::apply(MANAGER).force();
    let mut done = Applied::default();
    let mut kept = Kept::new();
    for report in reports {
        let kind = report_kind(format, report).ok_or_else(|| not_a_report(format, report))?;
        let name = text(report, "/metadata/name");
        let namespace = text(report, "/metadata/namespace");
        let api = api_for(&client, &kind, namespace);
        let shown = shown(namespace, name);
        match api.patch(name, &params, &Patch::Apply(report)).await {
            Ok(_) => done.applied += 1,
            Err(kube::Error::Api(status)) => match namespace_gone(&status, namespace) {
                // Skipped, and its name kept from the stale clean-up: the namespace goes
                // with everything in it.
                Some(why) => done.skip(namespace, why, kind.kind, name),
                None => {
                    let error = kube::Error::Api(status);
                    return Err(request_error(format, &kind, "apply", &shown, error));
                }
            },
            Err(error) => return Err(request_error(format, &kind, "apply", &shown, error)),
        }
        kept.entry(kind.kind)
            .or_default()
            .insert((namespace.to_string(), name.to_string()));
    }

    let mut kinds = vec![format.namespaced()];
    if kept.contains_key(format.cluster().kind) {
        kinds.push(format.cluster());
    }
    for kind in kinds {
        let empty = BTreeSet::new();
        let applied = kept.get(kind.kind).unwrap_or(&empty);
        for (namespace, name, uid) in list_stale(&client, format, &kind, applied, scope).await? {
            let shown = shown(&namespace, &name);
            if delete_stale(&client, format, &kind, (&namespace, &name), uid, &shown).await? {
                done.deleted.push(shown);
            }
        }
    }
    Ok(done)
}

/// Why the API server refused a report in `namespace` because of the namespace itself:
/// `None` for any other refusal. The NamespaceLifecycle admission plugin
/// (`plugin/pkg/admission/namespace/lifecycle/admission.go`, `Lifecycle.Admit`) refuses to
/// create anything in a terminating namespace (403, cause `NamespaceTerminating`) and answers
/// the namespace's own 404 when it is gone.
fn namespace_gone(status: &kube::core::Status, namespace: &str) -> Option<&'static str> {
    let details = status.details.as_ref()?;
    if namespace.is_empty() {
        return None;
    }
    if status.code == 403
        && details
            .causes
            .iter()
            .any(|cause| cause.reason == "NamespaceTerminating")
    {
        return Some("is being deleted (the API server creates nothing in it)");
    }
    if status.code == 404 && details.kind == "namespaces" && details.name == namespace {
        return Some("was deleted during the audit");
    }
    None
}

/// Kind → the (namespace, name) of each report object applied.
type Kept = BTreeMap<&'static str, BTreeSet<(String, String)>>;

/// The kind of a report object `format` writes, checked: one of its two kinds, scoped as
/// that kind is, of its apiVersion, with a name.
fn report_kind(format: ReportFormat, report: &Value) -> Option<ReportKind> {
    let namespace = text(report, "/metadata/namespace");
    format
        .kind_of(text(report, "/kind"))
        .filter(|k| k.namespaced != namespace.is_empty())
        .filter(|k| {
            text(report, "/apiVersion") == k.api_version()
                && !text(report, "/metadata/name").is_empty()
        })
}

fn not_a_report(format: ReportFormat, report: &Value) -> PolicyReportError {
    PolicyReportError::NotAReport {
        format,
        detail: format!(
            "{:?} {:?} in namespace {:?} of apiVersion {:?}",
            text(report, "/kind"),
            text(report, "/metadata/name"),
            text(report, "/metadata/namespace"),
            text(report, "/apiVersion")
        ),
    }
}

/// The reports of `kind` in `scope` with both of podmend's labels that are not among
/// `applied`: (namespace, name, UID).
async fn list_stale(
    client: &Client,
    format: ReportFormat,
    kind: &ReportKind,
    applied: &BTreeSet<(String, String)>,
    scope: &ApplyScope<'_>,
) -> Result<Vec<(String, String, Option<String>)>, PolicyReportError> {
    let lister = Lister {
        page_size: scope.page_size.max(1),
        namespace: scope.namespace,
        progress: false,
        needs: "podmend needs list on the report kind to find its stale reports (the chart's reports CronJob has it)",
    };
    let selector = format!("{MANAGED_BY_LABEL}={MANAGER},{REPORT_SET_LABEL}={REPORT_SET}");
    let resource = kind.api_resource();
    let api: Api<DynamicObject> = match (kind.namespaced, scope.namespace) {
        (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
        _ => Api::all_with(client.clone(), &resource),
    };
    let mut stale = Vec::new();
    let listed = lister
        .list_with(
            api,
            kind.plural,
            ListParams::default().labels(&selector),
            |object: DynamicObject| {
                let labels = object.metadata.labels.clone().unwrap_or_default();
                let ours = labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGER)
                    && labels.get(REPORT_SET_LABEL).map(String::as_str) == Some(REPORT_SET);
                let key = (
                    object.metadata.namespace.clone().unwrap_or_default(),
                    object.metadata.name.clone().unwrap_or_default(),
                );
                if ours && !applied.contains(&key) {
                    stale.push((key.0, key.1, object.metadata.uid.clone()));
                }
            },
        )
        .await;
    match listed {
        Ok(_) => Ok(stale),
        Err(ClusterAuditError::List { code: 404, .. }) => Err(crd_missing(format, kind)),
        Err(error) => Err(error.into()),
    }
}

/// Deletes one stale report, with a precondition on its UID; false when it was gone
/// already or replaced by a newer object of the same name (then it is not stale).
async fn delete_stale(
    client: &Client,
    format: ReportFormat,
    kind: &ReportKind,
    (namespace, name): (&str, &str),
    uid: Option<String>,
    shown: &str,
) -> Result<bool, PolicyReportError> {
    let api = api_for(client, kind, namespace);
    let params = DeleteParams {
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(false),
        Err(error) => Err(request_error(format, kind, "delete", shown, error)),
    }
}

fn api_for(client: &Client, kind: &ReportKind, namespace: &str) -> Api<DynamicObject> {
    let resource = kind.api_resource();
    if kind.namespaced {
        Api::namespaced_with(client.clone(), namespace, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    }
}

fn shown(namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        name.to_string()
    } else {
        format!("{namespace}/{name}")
    }
}

fn crd_missing(format: ReportFormat, kind: &ReportKind) -> PolicyReportError {
    PolicyReportError::CrdMissing {
        kind: kind.kind.to_string(),
        api_version: kind.api_version(),
        install: format.crd_source(),
    }
}

fn request_error(
    format: ReportFormat,
    kind: &ReportKind,
    verb: &'static str,
    name: &str,
    error: kube::Error,
) -> PolicyReportError {
    match error {
        // A missing namespace is a 404 too, naming the namespace in its details.
        kube::Error::Api(status)
            if status.code == 404
                && status
                    .details
                    .as_ref()
                    .is_none_or(|d| d.kind != "namespaces") =>
        {
            crd_missing(format, kind)
        }
        kube::Error::Api(status) if status.code == 401 => ClusterAuditError::Unauthorized {
            url: None,
            message: status.message,
        }
        .into(),
        kube::Error::Api(status) if status.code == 403 => PolicyReportError::Forbidden {
            verb,
            kind: kind.kind.to_string(),
            name: name.to_string(),
            plural: kind.plural.to_string(),
            group: kind.group.to_string(),
            message: status.message,
        },
        kube::Error::Api(status) => PolicyReportError::Request {
            verb,
            kind: kind.kind.to_string(),
            name: name.to_string(),
            code: status.code,
            reason: status.reason,
            message: status.message,
        },
        error => ClusterAuditError::Unreachable {
            url: None,
            detail: chain(&error),
        }
        .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{Symptom, SymptomKind};

    fn symptom(namespace: &str, name: &str, message: &str) -> Symptom {
        Symptom {
            kind: SymptomKind::FailedPods,
            object: ObjectRef {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                namespace: namespace.into(),
                name: name.into(),
            },
            count: 1,
            reason: "OutOfcpu".into(),
            message: message.into(),
        }
    }

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_MESSAGE_BYTES);
        let cut = bounded(&long);
        assert!(cut.len() <= MAX_MESSAGE_BYTES, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert_eq!(bounded("short"), "short");
    }

    #[test]
    fn part_names_count_from_two_after_the_first() {
        assert_eq!(part_name(0), "podmend-audit");
        assert_eq!(part_name(1), "podmend-audit-2");
        assert_eq!(part_name(9), "podmend-audit-10");
    }

    #[test]
    fn a_namespace_too_big_for_one_object_is_split_into_parts_that_each_fit() {
        let mut report = Report::default();
        let message = "x".repeat(3000);
        for i in 0..1000 {
            report.add_symptom(symptom("ci", &format!("rs-{i}"), &message));
        }
        for format in [ReportFormat::PolicyReport, ReportFormat::OpenReports] {
            let objects = reports(&report, format);
            assert!(objects.len() >= 3, "{}", objects.len());
            let mut total = 0;
            for (i, object) in objects.iter().enumerate() {
                assert!(json_len(object) <= MAX_REPORT_BYTES);
                assert_eq!(object["metadata"]["name"], part_name(i));
                let results = object["results"].as_array().expect("results").len();
                assert_eq!(object["summary"]["warn"], results);
                total += results;
            }
            assert_eq!(total, 1000);
        }
    }

    #[test]
    fn the_formats_differ_in_kinds_and_where_the_source_is_named() {
        let mut report = Report::default();
        report.add_symptom(symptom("ci", "rs", "m"));
        let wg = &reports(&report, ReportFormat::PolicyReport)[0];
        assert_eq!(wg["apiVersion"], "wgpolicyk8s.io/v1alpha2");
        assert_eq!(wg["kind"], "PolicyReport");
        assert_eq!(wg["results"][0]["source"], "podmend");
        assert!(wg.get("source").is_none());
        let open = &reports(&report, ReportFormat::OpenReports)[0];
        assert_eq!(open["apiVersion"], "openreports.io/v1alpha1");
        assert_eq!(open["kind"], "Report");
        assert_eq!(open["source"], "podmend");
        assert!(open["results"][0].get("source").is_none());
        for object in [wg, open] {
            assert_eq!(object["metadata"]["labels"][MANAGED_BY_LABEL], "podmend");
            assert_eq!(object["metadata"]["labels"][REPORT_SET_LABEL], REPORT_SET);
        }
    }
}
