//! Renders an audit [`Report`]: an aligned table for people, a JSON document, SARIF 2.1.0 for
//! code-scanning tools, and JSON Lines of repairs for `kubectl patch --type json`.

use serde::Serialize;
use serde_json::{Map, Value, json};

use super::{
    AuditFinding, InputError, ObjectRepair, Report, Source, Summary, Symptom, SymptomKind,
};
use crate::config::Mode;
use crate::rules;

/// `podmend audit -o FORMAT`. The doc comments of the variants are `--help` text, written for
/// a terminal; the renderers are [`table`], [`json`](fn@json), [`sarif`], [`patches`] and
/// `manifests::render_repaired`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns for a terminal, then symptoms, input errors and a summary.
    Table,
    /// One JSON document (apiVersion podmend.io/v1alpha1, kind AuditReport) with the summary,
    /// findings, repairs, symptoms and errors.
    Json,
    /// SARIF 2.1.0, for GitHub code scanning and other SARIF viewers.
    Sarif,
    /// One JSON Patch per repaired object, as JSON Lines, for kubectl patch --type json.
    Patch,
    /// The input manifests with every repair applied (a Helm post-renderer's output).
    Yaml,
}

/// `apiVersion` of the [`json`](fn@json) document.
pub const JSON_API_VERSION: &str = "podmend.io/v1alpha1";
/// `kind` of the [`json`](fn@json) document.
pub const JSON_KIND: &str = "AuditReport";
/// `$schema` of the [`sarif`](fn@sarif) log.
pub const SARIF_SCHEMA: &str = "https://json.schemastore.org/sarif-2.1.0.json";
/// `tool.driver.informationUri` of the [`sarif`](fn@sarif) log.
pub const INFORMATION_URI: &str = "https://github.com/podmend/podmend";
/// `Source::file` of objects read from a live cluster.
const CLUSTER_FILE: &str = "cluster";

const RED: &str = "\x1b[31m";
const YELLOW: &str = "\x1b[33m";
const CYAN: &str = "\x1b[36m";
const BOLD: &str = "\x1b[1m";
const RESET: &str = "\x1b[0m";

// ---------------------------------------------------------------------------------------------
// table

/// The report for people: one row per finding (MODE, RULE, OBJECT, LOCATION, MESSAGE) in
/// columns as wide as their content, then the cluster symptoms, the input errors, and a
/// one-line summary. Messages are never truncated. `color` adds ANSI colours (deny red, warn
/// yellow, enforce cyan); without it the output has no escape sequences.
pub fn table(report: &Report, color: bool) -> String {
    let palette = Palette { color };
    let mut out = String::new();
    findings_table(&mut out, &report.findings, palette);
    rules_legend(&mut out, &report.findings, palette);
    symptoms_table(&mut out, &report.symptoms, palette);
    if !report.errors.is_empty() {
        palette.heading(&mut out, "input errors:");
        for error in &report.errors {
            out.push_str(&format!(
                "  {}{error}{}\n",
                palette.paint(RED),
                palette.reset()
            ));
        }
    }
    out.push('\n');
    out.push_str(&summary_line(&report.summary));
    out.push('\n');
    out
}

/// The table's colours, or none.
#[derive(Clone, Copy)]
struct Palette {
    color: bool,
}

impl Palette {
    fn paint(self, code: &'static str) -> &'static str {
        if self.color { code } else { "" }
    }

    fn reset(self) -> &'static str {
        self.paint(RESET)
    }

    /// A blank line, then `title` in bold.
    fn heading(self, out: &mut String, title: &str) {
        out.push('\n');
        out.push_str(&format!("{}{title}{}\n", self.paint(BOLD), self.reset()));
    }
}

/// One row per finding; a finding without a repair is a `note`.
fn findings_table(out: &mut String, findings: &[AuditFinding], palette: Palette) {
    if findings.is_empty() {
        out.push_str("no findings\n");
        return;
    }
    let header = ["MODE", "RULE", "OBJECT", "LOCATION", "MESSAGE"]
        .map(|h| Cell::plain(h, palette.paint(BOLD)));
    let rows = findings.iter().map(|finding| {
        [
            match finding.patch.is_empty() {
                true => Cell::plain("note", ""),
                false => Cell::plain(
                    finding.mode.as_str(),
                    palette.paint(mode_color(finding.mode)),
                ),
            },
            Cell::plain(&finding.rule, ""),
            Cell::plain(&finding.object.display(), ""),
            Cell::plain(&location(&finding.source), ""),
            Cell::plain(&finding.message, ""),
        ]
    });
    render_rows(
        out,
        "",
        std::iter::once(header).chain(rows).collect(),
        palette.reset(),
    );
}

/// Each rule that found something, once, with its one-line summary.
fn rules_legend(out: &mut String, findings: &[AuditFinding], palette: Palette) {
    let mut seen: Vec<&str> = Vec::new();
    for finding in findings {
        if !seen.contains(&finding.rule.as_str()) {
            seen.push(&finding.rule);
        }
    }
    if seen.is_empty() {
        return;
    }
    palette.heading(out, "rules:");
    let rows = seen
        .iter()
        .map(|id| [Cell::plain(id, ""), Cell::plain(rule_description(id), "")])
        .collect();
    render_rows(out, "  ", rows, palette.reset());
}

fn symptoms_table(out: &mut String, symptoms: &[Symptom], palette: Palette) {
    if symptoms.is_empty() {
        return;
    }
    palette.heading(out, "symptoms:");
    let header =
        ["SYMPTOM", "OBJECT", "PODS", "MESSAGE"].map(|h| Cell::plain(h, palette.paint(BOLD)));
    let rows = symptoms.iter().map(|symptom| {
        [
            Cell::plain(symptom_kind(symptom.kind), palette.paint(YELLOW)),
            Cell::plain(&symptom.object.display(), ""),
            Cell::plain(&symptom.count.to_string(), ""),
            Cell::plain(&symptom.message, ""),
        ]
    });
    render_rows(
        out,
        "  ",
        std::iter::once(header).chain(rows).collect(),
        palette.reset(),
    );
}

/// One table cell: its text and the colour (possibly empty) it is printed in.
struct Cell {
    text: String,
    color: &'static str,
}

impl Cell {
    fn plain(text: &str, color: &'static str) -> Self {
        Self {
            text: text.to_string(),
            color,
        }
    }
}

/// Writes rows with every column but the last padded to its widest cell, two spaces apart.
fn render_rows<const N: usize>(out: &mut String, indent: &str, rows: Vec<[Cell; N]>, reset: &str) {
    let mut widths = [0usize; N];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.text.chars().count());
        }
    }
    for row in &rows {
        let mut line = String::from(indent);
        for (i, cell) in row.iter().enumerate() {
            if cell.color.is_empty() {
                line.push_str(&cell.text);
            } else {
                line.push_str(cell.color);
                line.push_str(&cell.text);
                line.push_str(reset);
            }
            if i + 1 < N {
                let pad = widths[i] - cell.text.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end_matches(' '));
        out.push('\n');
    }
}

fn mode_color(mode: Mode) -> &'static str {
    match mode {
        Mode::Deny => RED,
        Mode::Warn => YELLOW,
        Mode::Enforce => CYAN,
        Mode::Off => "",
    }
}

/// `file:line`, `#item` appended for a `kind: List` item; empty for cluster objects.
fn location(source: &Source) -> String {
    if source.file == CLUSTER_FILE {
        return String::new();
    }
    let file = if source.file == "-" {
        "stdin"
    } else {
        &source.file
    };
    match source.list_item {
        Some(item) => format!("{file}:{}#{item}", source.line),
        None => format!("{file}:{}", source.line),
    }
}

fn plural(count: usize, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

fn summary_line(summary: &Summary) -> String {
    let mut line = format!(
        "{}, {} ({} enforce, {} warn, {} deny, {}), {}, {}; {} without a pod spec skipped",
        plural(summary.objects, "object", "objects"),
        plural(summary.findings, "finding", "findings"),
        summary.enforce,
        summary.warn,
        summary.deny,
        plural(summary.notes, "note", "notes"),
        plural(summary.symptoms, "symptom", "symptoms"),
        plural(summary.input_errors, "input error", "input errors"),
        summary.without_pod_spec,
    );
    if summary.not_repaired > 0 {
        line.push_str(&format!(
            ", {} not repaired (a guard that can be bypassed)",
            summary.not_repaired
        ));
    }
    if summary.skipped > 0 {
        line.push_str(&format!(
            ", {} left alone (skip annotation, mirror pod, …)",
            summary.skipped
        ));
    }
    line
}

fn symptom_kind(kind: SymptomKind) -> &'static str {
    match kind {
        SymptomKind::FailedPods => "failed-pods",
        SymptomKind::PendingWithRunningContainers => "pending-with-running-containers",
        SymptomKind::DindHostSocket => "dind-host-socket",
    }
}

// ---------------------------------------------------------------------------------------------
// JSON

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonReport<'a> {
    api_version: &'static str,
    kind: &'static str,
    summary: &'a Summary,
    findings: &'a [AuditFinding],
    repairs: &'a [ObjectRepair],
    symptoms: &'a [Symptom],
    errors: &'a [InputError],
}

/// The report as one JSON document (`-o json`), pretty-printed with a trailing newline.
/// Fields are only ever added within `podmend.io/v1alpha1`. Optional fields are left out
/// when absent. Schema:
///
/// - `apiVersion`: `"podmend.io/v1alpha1"`.
/// - `kind`: `"AuditReport"`.
/// - `summary.objects`: objects read.
/// - `summary.withoutPodSpec`: objects without a pod spec (ConfigMaps, Services, …), skipped.
/// - `summary.skipped`: objects with a pod spec podmend leaves alone (mirror pods, `podmend.io/skip`).
/// - `summary.findings`: number of `findings`.
/// - `summary.enforce` / `summary.warn` / `summary.deny`: findings with a repair in each mode.
/// - `summary.notes`: findings with nothing to repair (notes), in any mode.
/// - `summary.notRepaired`: findings whose change does not repair the object (a Docker
///   guard the pod's clients can go around); present only when not zero.
/// - `summary.symptoms`: number of `symptoms`.
/// - `summary.inputErrors`: number of `errors`.
/// - `findings[]`: one per rule per object.
/// - `findings[].rule`: the rule id (`node-affinity`, `agent-requests`).
/// - `findings[].mode`: what the webhook does: `enforce` (repairs), `warn` or `deny`; a
///   finding whose `patch` is empty is a note (what a rule left alone, and why): warned, never
///   applied or denied, and not counted by `--fail-on`.
/// - `findings[].object.apiVersion` / `.kind` / `.namespace` / `.name`: the object (`namespace` may be `""`; `name` falls back to `generateName`).
/// - `findings[].source.file`: file path as given, `-` for stdin, or `cluster`.
/// - `findings[].source.document`: 1-based document number in the file (0 for cluster objects).
/// - `findings[].source.line`: 1-based line where the document starts (0 for cluster objects).
/// - `findings[].source.helmSource`: Helm's `# Source:` template path, when present.
/// - `findings[].source.listItem`: 0-based index in a `kind: List`'s `items`, when from one.
/// - `findings[].message`: what the rule found or would change, lines joined with `; `.
/// - `findings[].advice`: how to fix the source.
/// - `findings[].patch`: this rule's repair, a JSON Patch (RFC 6902) array of `{op, path, value?, from?}`.
/// - `repairs[]`: one per object with any finding: the whole patch the webhook sends when every rule enforces.
/// - `repairs[].object` / `repairs[].source`: as in `findings[]`.
/// - `repairs[].patch`: JSON Patch array, every finding's repair plus the `podmend.io/mutated` annotation.
/// - `symptoms[]`: what only a live cluster shows (`--cluster`).
/// - `symptoms[].kind`: `failed-pods`, `pending-with-running-containers` or `dind-host-socket`.
/// - `symptoms[].object`: the owner (failed pods) or the pod, as in `findings[].object`.
/// - `symptoms[].count`: pods affected.
/// - `symptoms[].reason`: e.g. `OutOfcpu`, when there is one.
/// - `symptoms[].message`: one line for people.
/// - `errors[]`: documents that could not be read; the run went on without them.
/// - `errors[].file` / `.document` / `.line`: where, as in `source`.
/// - `errors[].message`: what was wrong.
pub fn json(report: &Report) -> String {
    let document = JsonReport {
        api_version: JSON_API_VERSION,
        kind: JSON_KIND,
        summary: &report.summary,
        findings: &report.findings,
        repairs: &report.repairs,
        symptoms: &report.symptoms,
        errors: &report.errors,
    };
    // Strings, numbers and JSON Patch operations only: serializing cannot fail.
    let mut text = serde_json::to_string_pretty(&document).unwrap_or_default();
    text.push('\n');
    text
}

// ---------------------------------------------------------------------------------------------
// patches

/// One line of JSON per repaired object (JSON Lines): `{"object": {apiVersion, kind,
/// namespace, name}, "source": {file, document, line, …}, "patch": [JSON Patch]}`, the same
/// fields as `repairs[]` in [`json`](fn@json). A CI step applies each `patch` with
/// `kubectl patch --type json`. Empty when nothing needs repairing.
pub fn patches(report: &Report) -> String {
    let mut out = String::new();
    for repair in &report.repairs {
        // Strings, numbers and JSON Patch operations only: serializing cannot fail.
        out.push_str(&serde_json::to_string(repair).unwrap_or_default());
        out.push('\n');
    }
    out
}

// ---------------------------------------------------------------------------------------------
// SARIF

/// The report as a SARIF 2.1.0 log (`-o sarif`) with one run: a `reportingDescriptor` per
/// rule seen, a `result` per finding (`deny` → `error`, `enforce` → `warning`, `warn` →
/// `note`; `properties` carry `mode`, `object` and `patch`) and per cluster symptom
/// (`cluster-symptom/<kind>`, `warning`). Findings from files point at the document's first
/// line; cluster objects get a logical location (`resource`, `Kind/ns/name`). Input errors
/// are tool execution notifications, and make `executionSuccessful` false.
pub fn sarif(report: &Report, tool_version: &str) -> String {
    let mut rules = SarifRules::default();
    let mut results = Vec::new();
    for finding in &report.findings {
        let index = rules.index(&finding.rule, || {
            json!({
                "id": finding.rule,
                "name": rule_name(&finding.rule),
                "shortDescription": {"text": rule_description(&finding.rule)},
                "help": {"text": finding.advice},
            })
        });
        results.push(finding_result(finding, index));
    }
    for symptom in &report.symptoms {
        let id = format!("cluster-symptom/{}", symptom_kind(symptom.kind));
        let index = rules.index(&id, || {
            json!({
                "id": id,
                "name": rule_name(&id),
                "shortDescription": {"text": symptom_description(symptom.kind)},
                "help": {"text": symptom_help(symptom.kind)},
            })
        });
        results.push(symptom_result(symptom, &id, index));
    }
    let log = json!({
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "podmend",
                "version": tool_version,
                "informationUri": INFORMATION_URI,
                "rules": rules.descriptors,
            }},
            "invocations": [invocation(&report.errors)],
            "results": results,
        }],
    });
    // A serde_json::Value always serializes.
    let mut text = serde_json::to_string_pretty(&log).unwrap_or_default();
    text.push('\n');
    text
}

/// The run's `reportingDescriptor`s, each rule once, in the order first seen.
#[derive(Default)]
struct SarifRules {
    ids: Vec<String>,
    descriptors: Vec<Value>,
}

impl SarifRules {
    /// The `ruleIndex` of `id`, adding its descriptor the first time.
    fn index(&mut self, id: &str, descriptor: impl FnOnce() -> Value) -> usize {
        if let Some(index) = self.ids.iter().position(|seen| seen == id) {
            return index;
        }
        self.ids.push(id.to_string());
        self.descriptors.push(descriptor());
        self.ids.len() - 1
    }
}

/// One finding as a SARIF `result`.
fn finding_result(finding: &AuditFinding, rule_index: usize) -> Value {
    let mut properties = Map::new();
    properties.insert("mode".into(), Value::from(finding.mode.as_str()));
    properties.insert("object".into(), Value::from(finding.object.display()));
    // JSON Patch operations always serialize.
    properties.insert(
        "patch".into(),
        serde_json::to_value(&finding.patch).unwrap_or_default(),
    );
    if finding.source.file != CLUSTER_FILE {
        properties.insert("document".into(), Value::from(finding.source.document));
    }
    if let Some(helm) = &finding.source.helm_source {
        properties.insert("helmSource".into(), Value::from(helm.as_str()));
    }
    if let Some(item) = finding.source.list_item {
        properties.insert("listItem".into(), Value::from(item));
    }
    let text = if finding.advice.is_empty() {
        finding.message.clone()
    } else {
        format!("{} — {}", finding.message, finding.advice)
    };
    let location = if finding.source.file == CLUSTER_FILE {
        logical_location(&finding.object.display())
    } else {
        physical_location(&finding.source.file, finding.source.line)
    };
    json!({
        "ruleId": finding.rule,
        "ruleIndex": rule_index,
        "level": if finding.patch.is_empty() { "note" } else { sarif_level(finding.mode) },
        "message": {"text": text},
        "locations": [location],
        "properties": properties,
    })
}

/// One cluster symptom as a SARIF `result` of rule `id`.
fn symptom_result(symptom: &Symptom, id: &str, rule_index: usize) -> Value {
    let mut properties = Map::new();
    properties.insert("object".into(), Value::from(symptom.object.display()));
    properties.insert("count".into(), Value::from(symptom.count));
    if !symptom.reason.is_empty() {
        properties.insert("reason".into(), Value::from(symptom.reason.as_str()));
    }
    json!({
        "ruleId": id,
        "ruleIndex": rule_index,
        "level": "warning",
        "message": {"text": symptom.message},
        "locations": [logical_location(&symptom.object.display())],
        "properties": properties,
    })
}

/// The run's `invocation`: successful without input errors, which are its notifications.
fn invocation(errors: &[InputError]) -> Value {
    let notifications: Vec<Value> = errors
        .iter()
        .map(|error| {
            json!({
                "level": "error",
                "message": {"text": error.to_string()},
                "locations": [physical_location(&error.file, error.line)],
                "properties": {"document": error.document},
            })
        })
        .collect();
    let mut invocation = Map::new();
    invocation.insert("executionSuccessful".into(), Value::from(errors.is_empty()));
    if !notifications.is_empty() {
        invocation.insert(
            "toolExecutionNotifications".into(),
            Value::Array(notifications),
        );
    }
    Value::Object(invocation)
}

fn sarif_level(mode: Mode) -> &'static str {
    match mode {
        Mode::Deny => "error",
        Mode::Enforce => "warning",
        Mode::Warn => "note",
        Mode::Off => "none",
    }
}

/// A location in a file: its URI and, when known, the line.
fn physical_location(file: &str, line: usize) -> Value {
    let mut physical = Map::new();
    physical.insert(
        "artifactLocation".into(),
        json!({"uri": artifact_uri(file)}),
    );
    if line >= 1 {
        physical.insert("region".into(), json!({"startLine": line}));
    }
    json!({"physicalLocation": physical})
}

/// A live object, named `Kind/namespace/name`.
fn logical_location(object: &str) -> Value {
    json!({"logicalLocations": [{"kind": "resource", "fullyQualifiedName": object}]})
}

/// The file as a URI reference: `-` is `stdin`; relative paths keep forward slashes without a
/// leading `./`; absolute paths under the working directory become relative to it, others
/// `file://` URIs. Characters a URI cannot hold are percent-encoded.
fn artifact_uri(file: &str) -> String {
    if file == "-" {
        return "stdin".to_string();
    }
    let mut path = file.replace('\\', "/");
    let absolute = std::path::Path::new(file).is_absolute() || is_drive_path(&path);
    if absolute
        && let Ok(cwd) = std::env::current_dir()
        && let Ok(relative) = std::path::Path::new(file).strip_prefix(&cwd)
    {
        return percent_encode(&relative.to_string_lossy().replace('\\', "/"));
    }
    if absolute {
        if !path.starts_with('/') {
            path.insert(0, '/');
        }
        return format!("file://{}", percent_encode(&path));
    }
    while let Some(rest) = path.strip_prefix("./") {
        path = rest.to_string();
    }
    let encoded = percent_encode(&path);
    // A `:` in the first segment would read as a URI scheme.
    match encoded.split('/').next() {
        Some(first) if first.contains(':') => format!("./{encoded}"),
        _ => encoded,
    }
}

/// `C:/…`: a Windows absolute path.
fn is_drive_path(path: &str) -> bool {
    let bytes = path.as_bytes();
    bytes.len() >= 3 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':' && bytes[2] == b'/'
}

fn percent_encode(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for byte in path.bytes() {
        let keep = byte.is_ascii_alphanumeric() || b"-._~/!$&'()*+,;=:@".contains(&byte);
        if keep {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `node-affinity` → `NodeAffinity`, SARIF's suggested rule-name style.
fn rule_name(id: &str) -> String {
    id.split(['-', '/'])
        .map(|word| {
            let mut chars = word.chars();
            match chars.next() {
                Some(first) => first.to_uppercase().chain(chars).collect::<String>(),
                None => String::new(),
            }
        })
        .collect()
}

/// The rule's one-line summary, from the rule itself.
fn rule_description(id: &str) -> &'static str {
    rules::info(id).map_or("a podmend rule", |info| info.summary)
}

fn symptom_description(kind: SymptomKind) -> &'static str {
    match kind {
        SymptomKind::FailedPods => "Failed pods of one owner with one reason",
        SymptomKind::PendingWithRunningContainers => {
            "a pod Pending while every container runs (virtual-kubelet node)"
        }
        SymptomKind::DindHostSocket => "a Docker-in-Docker pod on the node's Docker socket",
    }
}

fn symptom_help(kind: SymptomKind) -> &'static str {
    match kind {
        SymptomKind::FailedPods => {
            "a pod template that pins spec.nodeName bypasses the scheduler; replace it with \
             required node affinity (podmend's node-affinity rule does)"
        }
        SymptomKind::PendingWithRunningContainers => {
            "clients that wait for phase Running (the Jenkins kubernetes-plugin, \
             JENKINS-68649) kill and recreate such pods; on virtual-kubelet nodes podmend's \
             opt-in virtual-node-phase rule sets Running"
        }
        SymptomKind::DindHostSocket => {
            "containers it starts without --rm outlive the pod on the node's daemon and fill \
             its disk; nothing in Kubernetes removes them"
        }
    }
}
