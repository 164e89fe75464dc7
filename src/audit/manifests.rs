//! Manifests in: files, directories (recursing into `*.yaml`, `*.yml`, `*.json`) and stdin;
//! multi-document YAML, JSON, `kind: List`; each document's position and Helm `# Source:`
//! comment kept; merge keys (`<<: *base`) resolved as kubectl and Helm resolve them
//! ([`merge_keys`](super::merge_keys)). Manifests out (`-o yaml`): every document as it was, byte for byte, except
//! the ones podmend repairs, which are written anew below their original leading comments, in
//! YAML that every reader takes back as the same values ([`yaml`](super::yaml)).

use std::collections::HashMap;
use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};

use json_patch::PatchOperation;
use serde_json::Value;

use super::merge_keys::Merged;
use super::{InputError, ObjectRepair, Source};

/// One input file (or stdin) split into documents.
#[derive(Debug, Clone)]
pub struct ManifestFile {
    /// The path as given (or found under a given directory), `-` for stdin.
    pub name: String,
    pub text: String,
    pub documents: Vec<Document>,
}

/// One YAML document (or a whole JSON file).
#[derive(Debug, Clone)]
pub struct Document {
    /// 1-based position in the file.
    pub index: usize,
    /// 1-based line of the document's first content line (after comments and `---`).
    pub line: usize,
    /// Bytes of the document in the file's text, its `---` marker and comments included.
    pub range: Range<usize>,
    /// Bytes of the leading `---` marker, comments and blank lines, within `range`.
    pub header: Range<usize>,
    pub helm_source: Option<String>,
    /// The parsed content: `None` for a document with nothing in it.
    pub value: Option<Value>,
}

impl Document {
    /// The objects in this document: itself, or a List's items (with their index).
    pub fn objects(&self) -> Vec<(Option<usize>, &Value)> {
        match &self.value {
            None => Vec::new(),
            Some(value) if is_list(value) => value
                .get("items")
                .and_then(Value::as_array)
                .map(|items| {
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, item)| (Some(i), item))
                        .collect()
                })
                .unwrap_or_default(),
            Some(value) => vec![(None, value)],
        }
    }

    pub fn source(&self, file: &str, list_item: Option<usize>) -> Source {
        Source {
            file: file.to_string(),
            document: self.index,
            line: self.line,
            helm_source: self.helm_source.clone(),
            list_item,
        }
    }
}

/// `kind: List`, or any `…List` kind with an `items` array (`kubectl get -o yaml` output).
fn is_list(value: &Value) -> bool {
    value
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|kind| kind.ends_with("List"))
        && value.get("items").is_some_and(Value::is_array)
}

/// Reads every path (`-` is stdin). Unreadable files and documents become input errors; the
/// rest is read.
pub fn read_paths(paths: &[String]) -> (Vec<ManifestFile>, Vec<InputError>) {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for path in paths {
        if path == "-" {
            let mut text = String::new();
            match std::io::stdin().read_to_string(&mut text) {
                Ok(_) => files.push(parse("-", text, &mut errors)),
                Err(error) => errors.push(file_error("-", format!("cannot read stdin: {error}"))),
            }
            continue;
        }
        let path_buf = PathBuf::from(path);
        if path_buf.is_dir() {
            let mut found = Vec::new();
            if let Err(error) = collect_manifests(&path_buf, &mut found) {
                errors.push(file_error(path, format!("cannot read directory: {error}")));
            }
            found.sort();
            for file in found {
                read_file(&file, &mut files, &mut errors);
            }
        } else {
            read_file(&path_buf, &mut files, &mut errors);
        }
    }
    (files, errors)
}

fn read_file(path: &Path, files: &mut Vec<ManifestFile>, errors: &mut Vec<InputError>) {
    let name = path.display().to_string();
    match std::fs::read(path) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => files.push(parse(&name, text, errors)),
            Err(_) => errors.push(file_error(
                &name,
                "not UTF-8 text; manifests are YAML or JSON".to_string(),
            )),
        },
        Err(error) => errors.push(file_error(&name, format!("cannot read: {error}"))),
    }
}

fn collect_manifests(dir: &Path, found: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_manifests(&path, found)?;
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            found.push(path);
        }
    }
    Ok(())
}

fn file_error(file: &str, message: String) -> InputError {
    InputError {
        file: file.to_string(),
        document: 0,
        line: 0,
        message,
    }
}

/// Splits a file into documents and parses each; a document that does not parse is an
/// input error naming its number and line, and the others are still read.
pub fn parse(name: &str, text: String, errors: &mut Vec<InputError>) -> ManifestFile {
    let documents = if looks_like_json(name, &text) {
        parse_json(name, &text, errors)
    } else {
        parse_yaml_stream(name, &text, errors)
    };
    ManifestFile {
        name: name.to_string(),
        text,
        documents,
    }
}

fn looks_like_json(name: &str, text: &str) -> bool {
    name.ends_with(".json") || text.trim_start().starts_with('{')
}

fn parse_json(name: &str, text: &str, errors: &mut Vec<InputError>) -> Vec<Document> {
    let leading = text.len() - text.trim_start().len();
    let line = 1 + text[..leading].matches('\n').count();
    let value = match serde_json::from_str::<Value>(text) {
        Ok(value) => checked_object(value, name, 1, line, errors),
        Err(error) => {
            errors.push(InputError {
                file: name.to_string(),
                document: 1,
                line: error.line(),
                message: format!("invalid JSON: {error}"),
            });
            None
        }
    };
    vec![Document {
        index: 1,
        line,
        range: 0..text.len(),
        header: 0..leading,
        helm_source: None,
        value,
    }]
}

/// A document must be a mapping; anything else cannot be a Kubernetes object.
fn checked_object(
    value: Value,
    file: &str,
    index: usize,
    line: usize,
    errors: &mut Vec<InputError>,
) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::Object(_) => Some(value),
        other => {
            let what = match other {
                Value::Array(_) => "a list",
                Value::String(_) => "a string",
                _ => "a scalar",
            };
            errors.push(InputError {
                file: file.to_string(),
                document: index,
                line,
                message: format!("document is {what}, not a Kubernetes object (a mapping with apiVersion and kind)"),
            });
            None
        }
    }
}

fn is_marker(line: &str, marker: &str) -> bool {
    line.strip_prefix(marker)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r']))
}

fn parse_yaml_stream(name: &str, text: &str, errors: &mut Vec<InputError>) -> Vec<Document> {
    // Lines are counted once through the stream, not again from its start per document.
    let (mut line, mut counted) = (1, 0);
    document_ranges(text)
        .into_iter()
        .enumerate()
        .map(|(position, range)| {
            line += text[counted..range.start].matches('\n').count();
            counted = range.start;
            parse_yaml_document(name, text, position + 1, range, line, errors)
        })
        .collect()
}

/// Byte ranges of the documents of a YAML stream: split at `---` lines, `...` ends one.
fn document_ranges(text: &str) -> Vec<Range<usize>> {
    let mut start = 0;
    let mut offset = 0;
    let mut bounds = Vec::new();
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        if is_marker(bare, "---") && offset > start {
            bounds.push(start..offset);
            start = offset;
        } else if is_marker(bare, "...") {
            bounds.push(start..offset + line.len());
            start = offset + line.len();
        }
        offset += line.len();
    }
    if start < text.len() || bounds.is_empty() {
        bounds.push(start..text.len());
    }
    bounds
}

/// A document's leading `---` marker, comments and blank lines.
struct Header {
    /// Bytes, from the document's start.
    len: usize,
    /// Helm's `# Source:` comment, if one is there.
    helm_source: Option<String>,
    /// 1-based line of the first content line.
    content_line: usize,
}

/// A `---` line with nothing after it but a comment (`--- # the pod`): part of the header.
/// One with content after it (`--- {kind: Pod}`, `--- !!map`) starts the content.
fn is_bare_marker(line: &str) -> bool {
    is_marker(line, "---") && {
        let rest = line[3..].trim();
        rest.is_empty() || rest.starts_with('#')
    }
}

fn header(chunk: &str, first_line: usize) -> Header {
    let mut header = Header {
        len: 0,
        helm_source: None,
        content_line: first_line,
    };
    for line in chunk.split_inclusive('\n') {
        let bare = line.trim();
        if bare.is_empty() || bare.starts_with('#') || (header.len == 0 && is_bare_marker(bare)) {
            if let Some(source) = bare.strip_prefix("# Source:") {
                header.helm_source = Some(source.trim().to_string());
            }
            header.len += line.len();
            header.content_line += 1;
        } else {
            break;
        }
    }
    header
}

/// Document `index` (1-based) of `text`, at `range`, which starts on line `first_line`; what
/// cannot be read goes to `errors`.
fn parse_yaml_document(
    name: &str,
    text: &str,
    index: usize,
    range: Range<usize>,
    first_line: usize,
    errors: &mut Vec<InputError>,
) -> Document {
    let chunk = &text[range.clone()];
    let header = header(chunk, first_line);
    let body = &chunk[header.len..];
    let value = if body.trim().is_empty() || body.trim() == "..." {
        None
    } else {
        match serde_yaml_ng::from_str::<Merged>(chunk) {
            Ok(Merged(value)) => checked_object(value, name, index, header.content_line, errors),
            Err(error) => {
                let line = error
                    .location()
                    .map_or(header.content_line, |l| first_line + l.line() - 1);
                let message = error.to_string();
                let message = message
                    .split(" at line ")
                    .next()
                    .unwrap_or(&message)
                    .to_string();
                errors.push(InputError {
                    file: name.to_string(),
                    document: index,
                    line,
                    message: format!("invalid YAML: {message}"),
                });
                None
            }
        }
    };
    Document {
        index,
        line: header.content_line,
        header: range.start..range.start + header.len,
        range,
        helm_source: header.helm_source,
        value,
    }
}

/// The files again with every repair applied: untouched documents byte for byte, repaired
/// ones re-serialized below their original `---` marker and comments.
pub fn render_repaired(files: &[ManifestFile], repairs: &[ObjectRepair]) -> String {
    let mut by_document: HashMap<(&str, usize), Vec<&ObjectRepair>> = HashMap::new();
    for repair in repairs {
        by_document
            .entry((repair.source.file.as_str(), repair.source.document))
            .or_default()
            .push(repair);
    }
    let mut out = String::new();
    for file in files {
        for document in &file.documents {
            let original = &file.text[document.range.clone()];
            let repaired = by_document
                .get(&(file.name.as_str(), document.index))
                .zip(document.value.as_ref())
                .and_then(|(repairs, value)| apply_repairs(value, repairs));
            let starts_document = original.trim_start().starts_with("---");
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            if !out.is_empty() && !starts_document && document.index == 1 {
                out.push_str("---\n");
            }
            match repaired {
                None => out.push_str(original),
                Some(value) => {
                    out.push_str(&file.text[document.header.clone()]);
                    // A marker with content on its line is not in the header; the
                    // document written anew still needs it, or it runs on into the one
                    // before.
                    let content = &file.text[document.header.end..document.range.end];
                    if content.lines().next().is_some_and(|l| is_marker(l, "---")) {
                        out.push_str("---\n");
                    }
                    out.push_str(&super::yaml::to_string(&value));
                    // A document its `...` line ended keeps it: the next document may start
                    // without `---`, and would otherwise run on into this one.
                    if original
                        .lines()
                        .rev()
                        .find(|l| !l.trim().is_empty())
                        .is_some_and(|l| is_marker(l.trim_end_matches('\r'), "..."))
                    {
                        out.push_str("...\n");
                    }
                }
            }
        }
    }
    out
}

fn apply_repairs(value: &Value, repairs: &[&ObjectRepair]) -> Option<Value> {
    let mut value = value.clone();
    for repair in repairs {
        let target = match repair.source.list_item {
            None => &mut value,
            Some(index) => value.get_mut("items")?.get_mut(index)?,
        };
        let patch: Vec<PatchOperation> = repair.patch.clone();
        // The patch was computed from this very object; should it not apply, keep the original.
        json_patch::patch(target, &patch).ok()?;
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parsed(text: &str) -> (ManifestFile, Vec<InputError>) {
        let mut errors = Vec::new();
        let file = parse("m.yaml", text.to_string(), &mut errors);
        (file, errors)
    }

    #[test]
    fn a_multi_document_stream_keeps_positions_and_helm_sources() {
        let text = "---\n# Source: chart/templates/a.yaml\napiVersion: v1\nkind: Pod\nmetadata: {name: a}\n---\n# Source: chart/templates/b.yaml\napiVersion: v1\nkind: Service\nmetadata: {name: b}\n";
        let (file, errors) = parsed(text);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(file.documents.len(), 2);
        assert_eq!(file.documents[0].line, 3);
        assert_eq!(
            file.documents[0].helm_source.as_deref(),
            Some("chart/templates/a.yaml")
        );
        assert_eq!(file.documents[1].index, 2);
        assert_eq!(file.documents[1].line, 8);
        assert_eq!(
            file.documents[1].value.as_ref().map(|v| v["kind"].clone()),
            Some(json!("Service"))
        );
    }

    #[test]
    fn a_broken_document_is_an_error_with_its_number_and_line_and_the_rest_is_read() {
        let text = "kind: Pod\napiVersion: v1\n---\nkind: Pod\n  bad: indent: here\n---\nkind: Service\napiVersion: v1\n";
        let (file, errors) = parsed(text);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].document, 2);
        assert!((4..=5).contains(&errors[0].line), "{errors:?}");
        assert!(file.documents[0].value.is_some());
        assert!(file.documents[2].value.is_some());
    }

    #[test]
    fn empty_documents_are_skipped_and_scalars_are_errors() {
        let (file, errors) = parsed("---\n# nothing\n---\njust a string\n");
        assert!(file.documents[0].value.is_none());
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].message.contains("not a Kubernetes object"),
            "{errors:?}"
        );
    }

    #[test]
    fn list_items_are_objects_of_their_own() {
        let (file, _) = parsed(
            "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod}\n- {apiVersion: v1, kind: Service}\n",
        );
        let objects = file.documents[0].objects();
        assert_eq!(objects.len(), 2);
        assert_eq!(objects[1].0, Some(1));
    }

    #[test]
    fn json_files_are_one_document_and_errors_name_the_line() {
        let mut errors = Vec::new();
        let file = parse(
            "x.json",
            "{\n  \"kind\": \"Pod\",\n  oops\n}".to_string(),
            &mut errors,
        );
        assert_eq!(file.documents.len(), 1);
        assert_eq!(errors[0].line, 3);
    }

    #[test]
    fn a_dashes_line_inside_a_value_is_not_a_document_marker() {
        let (file, errors) = parsed("kind: ConfigMap\ndata:\n  x: |\n    ---not a marker\n");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(file.documents.len(), 1);
    }

    #[test]
    fn repaired_output_keeps_untouched_documents_byte_for_byte() {
        let text = "# top comment\napiVersion: v1\nkind: Service   # odd spacing kept\nmetadata: {name: s}\n---\n# Source: c/pod.yaml\napiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  nodeName: n1\n  containers: [{name: a}]\n";
        let (file, _) = parsed(text);
        let repair = ObjectRepair {
            object: super::super::ObjectRef::of(file.documents[1].value.as_ref().expect("pod")),
            source: file.documents[1].source("m.yaml", None),
            patch: serde_json::from_value(json!([{"op": "remove", "path": "/spec/nodeName"}]))
                .expect("patch"),
        };
        let out = render_repaired(std::slice::from_ref(&file), &[repair]);
        let (first, second) = out.split_once("---\n").expect("two documents");
        assert_eq!(
            first,
            "# top comment\napiVersion: v1\nkind: Service   # odd spacing kept\nmetadata: {name: s}\n"
        );
        assert!(
            second.starts_with("# Source: c/pod.yaml\napiVersion: v1\nkind: Pod\n"),
            "{second}"
        );
        assert!(!second.contains("nodeName"), "{second}");
    }
}
