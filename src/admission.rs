//! The `admission.k8s.io/v1` AdmissionReview envelope, and nothing else: decoding a request,
//! and building the response from it so `uid`, `apiVersion` and `kind` echo by construction.
//! The wire form is what `VerifyAdmissionResponse` accepts: `allowed` always present, and a
//! base64 `patch` only together with `patchType: JSONPatch`.

use std::borrow::Cow;

use base64::Engine as _;
use json_patch::PatchOperation;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::config::Mode;
use crate::engine::document::Sketch;
use crate::engine::document::scan::{self, Scanner};
use crate::engine::{Operation, Outcome, RawSubject, WholeObjects, document};

pub const API_VERSION: &str = "admission.k8s.io/v1";
pub const KIND: &str = "AdmissionReview";

/// The API server truncates each warning past 256 runes; keep ours whole.
const MAX_WARNING_CHARS: usize = 256;

/// Why a body is not an AdmissionReview we can answer. Each gets HTTP 400 with this text.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    #[error("body is not valid JSON ({0}); send an admission.k8s.io/v1 AdmissionReview")]
    NotJson(#[source] serde_json::Error),
    #[error("body is not an AdmissionReview ({0}); send an admission.k8s.io/v1 AdmissionReview")]
    NotAReview(#[source] serde_json::Error),
    #[error(
        "apiVersion {0:?} is not supported; set admissionReviewVersions: [v1] in the webhook configuration"
    )]
    UnsupportedVersion(String),
    #[error("kind {0:?} is not AdmissionReview")]
    WrongKind(String),
    #[error("AdmissionReview has no request; the API server always sends one")]
    MissingRequest,
    #[error("AdmissionReview request has no uid; the response must echo it")]
    MissingUid,
    #[error("operation {0:?} is not one of CREATE, UPDATE, DELETE, CONNECT")]
    UnknownOperation(String),
    #[error(
        "body nests JSON deeper than {MAX_DEPTH} levels; AdmissionReviews of the kinds podmend \
         handles are never that deep"
    )]
    TooDeep,
}

/// serde_json's nesting limit: a value nested deeper does not parse. The objects' parts the
/// sketch skips are counted too ([`document::sketch`]); a field of the request podmend does
/// not read is skipped uncounted, as it always was.
pub const MAX_DEPTH: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
pub struct GroupVersionKind<'a> {
    #[serde(default)]
    pub group: Cow<'a, str>,
    #[serde(default)]
    pub version: Cow<'a, str>,
    #[serde(default)]
    pub kind: Cow<'a, str>,
}

/// The parts of `AdmissionRequest` podmend reads; everything else is skipped unbuilt. The
/// objects are sketched as the body is read (only what deciding needs, see
/// [`document`]); [`Request::read_whole`] reads them whole from the body when a review needs
/// more.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest<'a> {
    #[serde(default)]
    pub uid: Cow<'a, str>,
    #[serde(default)]
    pub kind: GroupVersionKind<'a>,
    #[serde(default)]
    pub sub_resource: Option<Cow<'a, str>>,
    #[serde(default)]
    pub name: Option<Cow<'a, str>>,
    #[serde(default)]
    pub namespace: Option<Cow<'a, str>>,
    #[serde(default)]
    pub operation: Cow<'a, str>,
    /// A sketch of `object`.
    #[serde(default, rename = "object", deserialize_with = "sketch")]
    pub object_sketch: Option<Sketch<'a>>,
    /// A sketch of `oldObject`.
    #[serde(default, rename = "oldObject", deserialize_with = "sketch")]
    pub old_object_sketch: Option<Sketch<'a>>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

#[derive(Debug, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn<'a> {
    #[serde(default)]
    api_version: Option<Cow<'a, str>>,
    #[serde(default)]
    kind: Option<Cow<'a, str>>,
    #[serde(default)]
    request: Option<AdmissionRequest<'a>>,
}

/// [`document::sketch`] as serde_json reads it, for a body the scanner declines.
fn sketch<'de, 'a, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Sketch<'a>>, D::Error> {
    Ok(document::sketch(deserializer)?.map(Sketch::from))
}

/// A decoded request, ready for the engine.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub inner: AdmissionRequest<'a>,
    pub operation: Operation,
    /// The body it was decoded from (checked to be UTF-8), read again for the whole objects.
    body: &'a str,
    /// Where `object` starts in the body, when the scanner read it: a second read starts there.
    object_at: Option<usize>,
}

impl<'a> Request<'a> {
    /// The engine's view of the request.
    pub fn subject(&self) -> RawSubject<'_> {
        RawSubject {
            operation: self.operation,
            group: &self.inner.kind.group,
            kind: &self.inner.kind.kind,
            sub_resource: self.inner.sub_resource.as_deref().unwrap_or(""),
            namespace: self.inner.namespace.as_deref().unwrap_or(""),
            object: self.inner.object_sketch.as_ref(),
            old_object: self.inner.old_object_sketch.as_ref(),
            whole: self,
        }
    }

    /// `metadata.name`, or `generateName` for objects the API server has not named yet (the
    /// request's `name` is empty for those). `read` is that name as the review read it
    /// ([`Outcome::name`]).
    pub fn object_name<'r>(&'r self, read: Option<&'r str>) -> &'r str {
        if let Some(name) = self.inner.name.as_deref().filter(|n| !n.is_empty()) {
            return name;
        }
        if let Some(read) = read {
            return read;
        }
        // A request routed away before the review read its object (a DELETE, a subresource).
        self.inner
            .object_sketch
            .as_ref()
            .or(self.inner.old_object_sketch.as_ref())
            .map_or("", |sketch| document::name(sketch))
    }
}

/// The objects whole, read from the body a second time: only a review in which a rule may
/// act, or one of an update or a status, needs them.
impl WholeObjects for Request<'_> {
    fn read_whole(&self) -> Result<(Option<Value>, Option<Value>), serde_json::Error> {
        #[derive(Deserialize)]
        struct Review {
            #[serde(default)]
            request: Option<Objects>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Objects {
            #[serde(default, deserialize_with = "document::parse")]
            object: Option<Value>,
            #[serde(default, deserialize_with = "document::parse")]
            old_object: Option<Value>,
        }
        let review: Review = serde_json::from_str(self.body)?;
        Ok(review
            .request
            .map_or((None, None), |r| (r.object, r.old_object)))
    }

    /// Through the scanner, which read this body for the sketch; serde_json reads what it
    /// declines.
    fn read_object(&self, keep: document::Union) -> Result<Option<Value>, serde_json::Error> {
        // `decode` read the body whole: its JSON is known good, and where the scanner read it,
        // the object is built from its sketch when that holds what `keep` reads, else read
        // from where it starts.
        let reread = match (self.object_at, &self.inner.object_sketch) {
            (Some(_), Some(sketch)) => scan::reread(sketch, keep),
            _ => None,
        };
        let scanned = match (reread, self.object_at) {
            (Some(object), _) => Some(Some(object).filter(|object| !object.is_null())),
            (None, Some(at)) => Scanner::starting_at(self.body, at).read_at(&[], keep),
            (None, None) => {
                let mut scanner = Scanner::new(self.body);
                scanner
                    .read_at(OBJECT_PATH, keep)
                    .and_then(|object| scanner.end().map(|()| object))
            }
        };
        match scanned {
            Some(object) => {
                #[cfg(debug_assertions)]
                check_scanned_object(self.body, keep, &object);
                Ok(object)
            }
            None => read_object_by_serde(self.body, keep),
        }
    }
}

/// Debug builds: the object the scanner read is the one serde_json reads (as [`check_scan`]
/// for the review).
#[cfg(debug_assertions)]
fn check_scanned_object(body: &str, keep: document::Union, scanned: &Option<Value>) {
    let read = read_object_by_serde(body, keep).ok();
    debug_assert!(
        read.as_ref() == Some(scanned),
        "the scanner read an object otherwise than serde_json:\n{scanned:?}\n{read:?}"
    );
}

/// Where a review holds the object it asks about.
const OBJECT_PATH: &[&str] = &["request", "object"];

/// The created object with the parts `keep` keeps, read by serde_json.
fn read_object_by_serde(
    body: &str,
    keep: document::Union,
) -> Result<Option<Value>, serde_json::Error> {
    let mut reader = serde_json::Deserializer::from_str(body);
    let object = document::read_at(&mut reader, OBJECT_PATH, keep)?;
    reader.end()?;
    Ok(object)
}

/// Decodes an AdmissionReview body in one pass: the envelope's fields podmend does not read
/// are skipped without being built, and the objects are sketched (their depth checked).
pub fn decode(body: &[u8]) -> Result<Request<'_>, AdmissionError> {
    // The sketch skips most strings unread: the whole body is checked to be UTF-8 here, as
    // serde_json checked each object when it kept them raw.
    let text = std::str::from_utf8(body).map_err(|error| {
        AdmissionError::NotJson(serde::de::Error::custom(format_args!(
            "invalid UTF-8 at byte {}",
            error.valid_up_to()
        )))
    })?;
    let (review, object_at) = match scan_review(text) {
        Some((review, object_at)) => {
            #[cfg(debug_assertions)]
            check_scan(text, &review);
            (review, object_at)
        }
        None => (read_review(text)?, None),
    };
    match review.api_version.as_deref() {
        Some(API_VERSION) => {}
        other => {
            return Err(AdmissionError::UnsupportedVersion(
                other.unwrap_or("").to_string(),
            ));
        }
    }
    if review.kind.as_deref() != Some(KIND) {
        return Err(AdmissionError::WrongKind(
            review.kind.unwrap_or_default().into_owned(),
        ));
    }
    let inner = review.request.ok_or(AdmissionError::MissingRequest)?;
    if inner.uid.is_empty() {
        return Err(AdmissionError::MissingUid);
    }
    let operation = Operation::parse(&inner.operation)
        .ok_or_else(|| AdmissionError::UnknownOperation(inner.operation.to_string()))?;
    Ok(Request {
        inner,
        operation,
        body: text,
        object_at,
    })
}

/// The review read by serde_json: any body, with its error when it is not one.
fn read_review(text: &str) -> Result<ReviewIn<'_>, AdmissionError> {
    serde_json::from_str(text).map_err(|error| match error.classify() {
        serde_json::error::Category::Data => AdmissionError::NotAReview(error),
        _ if error.to_string().starts_with("recursion limit exceeded") => AdmissionError::TooDeep,
        _ => AdmissionError::NotJson(error),
    })
}

/// Debug builds (every unit, property, fixture and fuzz run): what the scanner read is what
/// serde_json reads.
#[cfg(debug_assertions)]
fn check_scan(text: &str, scanned: &ReviewIn<'_>) {
    let read = read_review(text).ok();
    debug_assert!(
        read.as_ref() == Some(scanned),
        "the scanner read a body otherwise than serde_json:\n{scanned:?}\n{read:?}"
    );
}

/// The review read by [`document::scan`], the quick way, for the bodies the API server sends;
/// `None` when the scanner is not sure, and [`read_review`] then decides. It reads as serde's
/// derive does: unknown fields skipped, `null` as absent for an `Option`, and a field given
/// twice refused (declined here).
fn scan_review(text: &str) -> Option<(ReviewIn<'_>, Option<usize>)> {
    let mut scan = Scanner::new(text);
    let mut review = ReviewIn::default();
    let mut seen = Seen::default();
    let mut object_at = None;
    scan.object(|scan, key| {
        match key {
            "apiVersion" => review.api_version = seen.first(0, optional_string(scan))?,
            "kind" => review.kind = seen.first(1, optional_string(scan))?,
            "request" => {
                let request = scan.optional(|scan| scan_request(scan, &mut object_at));
                review.request = seen.first(2, request)?;
            }
            _ => scan.skip()?,
        }
        Some(())
    })?;
    scan.end()?;
    Some((review, object_at))
}

/// An `AdmissionRequest`, read as [`scan_review`] reads; `object_at` is where its `object`
/// starts.
fn scan_request<'a>(
    scan: &mut Scanner<'a>,
    object_at: &mut Option<usize>,
) -> Option<AdmissionRequest<'a>> {
    let mut request = AdmissionRequest::default();
    let mut seen = Seen::default();
    scan.object(|scan, key| {
        match key {
            "uid" => request.uid = seen.first(0, string(scan))?,
            "kind" => request.kind = seen.first(1, scan_kind(scan))?,
            "subResource" => request.sub_resource = seen.first(2, optional_string(scan))?,
            "name" => request.name = seen.first(3, optional_string(scan))?,
            "namespace" => request.namespace = seen.first(4, optional_string(scan))?,
            "operation" => request.operation = seen.first(5, string(scan))?,
            "object" => {
                *object_at = Some(scan.position());
                request.object_sketch = seen.first(6, scan.sketch())?;
            }
            "oldObject" => request.old_object_sketch = seen.first(7, scan.sketch())?,
            "dryRun" => request.dry_run = seen.first(8, scan.optional(Scanner::bool))?,
            _ => scan.skip()?,
        }
        Some(())
    })?;
    Some(request)
}

/// The request's `kind`, read as [`scan_review`] reads.
fn scan_kind<'a>(scan: &mut Scanner<'a>) -> Option<GroupVersionKind<'a>> {
    let mut kind = GroupVersionKind::default();
    let mut seen = Seen::default();
    scan.object(|scan, key| {
        match key {
            "group" => kind.group = seen.first(0, string(scan))?,
            "version" => kind.version = seen.first(1, string(scan))?,
            "kind" => kind.kind = seen.first(2, string(scan))?,
            _ => scan.skip()?,
        }
        Some(())
    })?;
    Some(kind)
}

/// A string, borrowed from the body.
fn string<'a>(scan: &mut Scanner<'a>) -> Option<Cow<'a, str>> {
    scan.string().map(Cow::Borrowed)
}

fn optional_string<'a>(scan: &mut Scanner<'a>) -> Option<Option<Cow<'a, str>>> {
    scan.optional(string)
}

/// The fields of a struct read so far: serde's derive refuses one given twice.
#[derive(Default)]
struct Seen(u16);

impl Seen {
    /// What was read of field `bit`, the first time; `None` (decline) when the field came
    /// before, or its value did not read.
    fn first<T>(&mut self, bit: u8, read: Option<T>) -> Option<T> {
        let mask = 1 << bit;
        if self.0 & mask != 0 {
            return None;
        }
        self.0 |= mask;
        read
    }
}

/// Which webhook path answers: `/mutate` repairs and warns, `/validate` denies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Webhook {
    Mutate,
    Validate,
}

impl Webhook {
    pub fn as_str(self) -> &'static str {
        match self {
            Webhook::Mutate => "mutate",
            Webhook::Validate => "validate",
        }
    }
}

/// What to answer, before it is put on the wire. The patch is the outcome's own, not a copy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdmissionDecision<'a> {
    pub allowed: bool,
    pub patch: &'a [PatchOperation],
    pub warnings: Vec<String>,
    pub denial: Option<String>,
}

impl<'a> AdmissionDecision<'a> {
    /// Turns the engine's outcome into the answer of one webhook. `/mutate` applies
    /// `enforce` repairs and warns for `enforce` and `warn`; `/validate` rejects for `deny`.
    /// A note (a finding with nothing to repair) is warned in every mode, never denied.
    pub fn from_outcome(outcome: &'a Outcome, webhook: Webhook) -> Self {
        match webhook {
            Webhook::Mutate => {
                let mut warnings = Vec::new();
                for finding in &outcome.findings {
                    let prefix = match finding.mode {
                        Mode::Off => continue,
                        _ if finding.is_note() => format!("podmend {}: ", finding.rule),
                        Mode::Enforce => format!("podmend {}: ", finding.rule),
                        Mode::Warn => format!("podmend {} would repair: ", finding.rule),
                        Mode::Deny => continue,
                    };
                    warnings.extend(
                        finding
                            .messages
                            .iter()
                            .map(|m| clip([prefix.as_str(), m].concat())),
                    );
                }
                AdmissionDecision {
                    allowed: true,
                    patch: &outcome.patch,
                    warnings,
                    denial: None,
                }
            }
            Webhook::Validate => {
                let reasons: Vec<String> = outcome
                    .in_mode(Mode::Deny)
                    .filter(|f| !f.is_note())
                    .map(|f| {
                        format!(
                            "podmend {}: {}; {}",
                            f.rule,
                            f.messages.join("; "),
                            f.advice
                        )
                    })
                    .collect();
                AdmissionDecision {
                    allowed: reasons.is_empty(),
                    denial: (!reasons.is_empty()).then(|| reasons.join(" | ")),
                    ..AdmissionDecision::default()
                }
            }
        }
    }
}

fn clip(mut warning: String) -> String {
    // No longer in bytes than the limit in characters: nothing to count.
    if warning.len() <= MAX_WARNING_CHARS {
        return warning;
    }
    if let Some((index, _)) = warning.char_indices().nth(MAX_WARNING_CHARS) {
        warning.truncate(index);
    }
    warning
}

/// Serializes the AdmissionReview response to the request `uid` names: `apiVersion`, `kind`,
/// and the `response` with `uid` and `allowed`, then `patchType` and `patch`, `warnings` and
/// `status` when there are any. Written field by field rather than through a derived struct:
/// the patch's base64 (most of a repair's answer) goes straight into the answer, neither
/// copied nor scanned for characters to escape, which it never has.
pub fn encode_response(uid: &str, decision: &AdmissionDecision<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    // `API_VERSION` and `KIND`, written out: the response test holds them to serde_json's.
    out.extend_from_slice(
        b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"response\":{\"uid\":",
    );
    push_string(&mut out, uid);
    out.extend_from_slice(if decision.allowed {
        b",\"allowed\":true"
    } else {
        b",\"allowed\":false"
    });
    if !decision.patch.is_empty() {
        out.extend_from_slice(b",\"patchType\":\"JSONPatch\",\"patch\":\"");
        push_base64_json(&mut out, decision.patch);
        out.push(b'"');
    }
    if !decision.warnings.is_empty() {
        out.extend_from_slice(b",\"warnings\":");
        push_json(&mut out, &decision.warnings);
    }
    if let Some(message) = &decision.denial {
        out.extend_from_slice(b",\"status\":{\"code\":403,\"reason\":\"Forbidden\",\"message\":");
        push_string(&mut out, message);
        out.push(b'}');
    }
    out.extend_from_slice(b"}}");
    out
}

/// Appends `text` as a JSON string: as it is when nothing in it needs an escape (a uid), found
/// eight bytes at a time, where serde_json looks each byte up in its escape table; otherwise
/// as serde_json writes it.
fn push_string(out: &mut Vec<u8>, text: &str) {
    if !scan::is_plain(text) {
        return push_json(out, text);
    }
    out.push(b'"');
    out.extend_from_slice(text.as_bytes());
    out.push(b'"');
}

/// Appends `value` as JSON. Strings and lists of strings always serialize: nothing to fail.
fn push_json(out: &mut Vec<u8>, value: &(impl Serialize + ?Sized)) {
    let _ = serde_json::to_writer(out, value);
}

/// Appends the patch as JSON, in base64.
fn push_base64_json(out: &mut Vec<u8>, patch: &[PatchOperation]) {
    use base64::engine::general_purpose::STANDARD;
    let mut json = Vec::with_capacity(256);
    push_patch(&mut json, patch);
    // Debug builds (every test and fuzz run): as serde_json writes it.
    debug_assert_eq!(Some(&json), serde_json::to_vec(patch).ok().as_ref());
    let start = out.len();
    // `None` only for a length past `usize`, which a patch in memory never has.
    let Some(length) = base64::encoded_len(json.len(), true) else {
        return;
    };
    out.resize(start + length, 0);
    if let Some(slot) = out.get_mut(start..) {
        // The slot is exactly the encoded length: encoding cannot run out of room.
        let _ = STANDARD.encode_slice(&json, slot);
    }
}

/// Appends the patch as serde_json writes it, its strings copied as they are where nothing
/// in them needs an escape (see [`push_string`]): an answer's paths, names and quantities.
fn push_patch(out: &mut Vec<u8>, patch: &[PatchOperation]) {
    out.push(b'[');
    for (index, op) in patch.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        let (name, path, value): (&[u8], _, _) = match op {
            PatchOperation::Add(op) => (b"add", &op.path, Some(&op.value)),
            PatchOperation::Replace(op) => (b"replace", &op.path, Some(&op.value)),
            PatchOperation::Remove(op) => (b"remove", &op.path, None),
            // Not in podmend's patches: as serde_json writes them.
            other => {
                push_json(out, other);
                continue;
            }
        };
        out.extend_from_slice(b"{\"op\":\"");
        out.extend_from_slice(name);
        out.extend_from_slice(b"\",\"path\":");
        push_string(out, path.as_str());
        if let Some(value) = value {
            out.extend_from_slice(b",\"value\":");
            push_value(out, value);
        }
        out.push(b'}');
    }
    out.push(b']');
}

/// Appends `value` as serde_json writes it, strings as [`push_string`] does.
fn push_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::String(text) => push_string(out, text),
        Value::Array(items) => {
            out.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                push_value(out, item);
            }
            out.push(b']');
        }
        Value::Object(members) => {
            out.push(b'{');
            for (index, (key, member)) in members.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                push_string(out, key);
                out.push(b':');
                push_value(out, member);
            }
            out.push(b'}');
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => push_json(out, value),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn review(request: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({"apiVersion": API_VERSION, "kind": KIND, "request": request}))
            .expect("json")
    }

    /// The captured AdmissionReviews and AdmissionRequests of `tests/fixtures`, as the API
    /// server sends them, compact.
    fn captured_reviews() -> Vec<(String, String)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let mut bodies = Vec::new();
        for entry in std::fs::read_dir(dir).expect("fixtures") {
            let path = entry.expect("entry").path();
            let name = path
                .file_name()
                .expect("name")
                .to_string_lossy()
                .into_owned();
            if !(name.starts_with("admission") && name.ends_with(".json")) {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("fixture");
            let value: Value = serde_json::from_str(&text).expect("json");
            let review = if value.get("request").is_some() {
                value
            } else {
                json!({"apiVersion": API_VERSION, "kind": KIND, "request": value})
            };
            bodies.push((name, review.to_string()));
        }
        assert!(
            bodies.len() >= 10,
            "found {} captured reviews",
            bodies.len()
        );
        bodies
    }

    #[test]
    fn every_captured_review_is_read_by_the_scanner_as_serde_json_reads_it() {
        for (name, body) in captured_reviews() {
            let scanned = scan_review(&body).map(|(review, _)| review);
            assert!(scanned.is_some(), "the scanner declined {name}");
            assert_eq!(scanned, read_review(&body).ok(), "{name}");
        }
    }

    #[test]
    fn every_captured_object_is_read_in_part_by_the_scanner_as_serde_json_reads_it() {
        use crate::engine::document::{Part, SCOPE, TEMPLATE_METADATA, Union};
        let rules = crate::rules::registry(&crate::config::Config::default());
        let reads: Vec<_> = rules.iter().filter_map(|rule| rule.reads()).collect();
        assert!(!reads.is_empty(), "no rule names what it reads");
        for (name, body) in captured_reviews() {
            for target in crate::target::TARGETS {
                for shape in &reads {
                    let keep = Union::of([
                        Part::Here(&SCOPE),
                        Part::Below(target.metadata, &TEMPLATE_METADATA),
                        Part::Below(target.spec, shape),
                    ])
                    .expect("three parts");
                    let by_serde = read_object_by_serde(&body, keep).ok();
                    let scanned = Scanner::new(&body).read_at(OBJECT_PATH, keep);
                    assert!(scanned.is_some(), "the scanner declined {name}");
                    assert_eq!(scanned, by_serde, "{name} at {}", target.spec);
                    // The webhook's: from where the scanner found the object.
                    let request = decode(body.as_bytes()).expect("decodes");
                    assert!(request.object_at.is_some(), "{name}");
                    let read = request.read_object(keep).ok();
                    assert_eq!(read, by_serde, "{name} at {}", target.spec);
                }
            }
        }
    }

    #[test]
    fn a_review_the_scanner_declines_is_read_by_serde_json_alike() {
        // An escaped key and an exponent: the scanner declines both.
        let body = r#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE", "namespace": "ns", "options": {"x": 1e3},
            "object": {"metadata": {"n\u0061me": "p"}, "spec": {"nodeName": "n1"}}}}"#;
        assert!(scan_review(body).is_none(), "the scanner read it");
        let request = decode(body.as_bytes()).expect("decodes");
        assert_eq!(request.inner.uid, "u1");
        assert_eq!(request.operation, Operation::Create);
        let sketch = request
            .inner
            .object_sketch
            .as_ref()
            .expect("an object")
            .to_value();
        assert_eq!(sketch["metadata"]["name"], "p");
        assert_eq!(sketch["spec"]["nodeName"], "n1");
        // The second read of the same body, declined by the scanner too.
        let keep = document::Union::of([document::Part::Here(&document::OBJECT)]).expect("a part");
        assert!(Scanner::new(body).read_at(OBJECT_PATH, keep).is_none());
        let object = request
            .read_object(keep)
            .expect("reads")
            .expect("an object");
        assert_eq!(object["metadata"]["name"], "p");
        assert_eq!(object["spec"]["nodeName"], "n1");
    }

    #[test]
    fn a_review_decodes_with_its_operation_and_kind() {
        let body = review(
            json!({"uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE", "namespace": "ns", "object": {"metadata": {"generateName": "web-"}}}),
        );
        let request = decode(&body).expect("decodes");
        assert_eq!(request.operation, Operation::Create);
        assert_eq!(request.subject().kind, "Pod");
        assert_eq!(request.object_name(None), "web-");
        assert_eq!(request.object_name(Some("as-read")), "as-read");
        let body = review(json!({"uid": "u2", "operation": "DELETE",
            "oldObject": {"metadata": {"name": "", "generateName": "old-", "uid": "x"}}}));
        assert_eq!(decode(&body).expect("decodes").object_name(None), "old-");
        // The request's own name, once the object has one, wins over what was read.
        let body = review(json!({"uid": "u3", "operation": "UPDATE", "name": "web-1",
            "object": {"metadata": {"name": "web-1"}}}));
        assert_eq!(
            decode(&body).expect("decodes").object_name(Some("as-read")),
            "web-1"
        );
    }

    /// The request's sketches of `object` and `oldObject`, as the `Value`s serde_json reads.
    fn sketches(request: &Request<'_>) -> (Option<Value>, Option<Value>) {
        let value = |sketch: &Option<Sketch<'_>>| sketch.as_ref().map(Sketch::to_value);
        (
            value(&request.inner.object_sketch),
            value(&request.inner.old_object_sketch),
        )
    }

    #[test]
    fn objects_are_sketched_as_the_body_is_read_and_read_whole_from_it_on_demand() {
        let object = json!({"metadata": {"name": "p", "uid": "u", "managedFields": [{"manager": "kubectl"}]},
            "spec": {"nodeName": "n1", "priority": 3}});
        let body = review(
            json!({"uid": "u1", "operation": "UPDATE", "object": object, "oldObject": object}),
        );
        let request = decode(&body).expect("decodes");
        let sketch = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}});
        assert_eq!(sketches(&request), (Some(sketch.clone()), Some(sketch)));
        let whole = json!({"metadata": {"name": "p", "uid": "u"},
            "spec": {"nodeName": "n1", "priority": 3}});
        assert_eq!(
            request.read_whole().expect("reads"),
            (Some(whole.clone()), Some(whole))
        );
    }

    #[test]
    fn objects_that_are_null_missing_or_not_maps_decode_as_they_are() {
        let decoded = |request: Value| {
            let body = review(request);
            let request = decode(&body).expect("decodes");
            (sketches(&request), request.read_whole().expect("reads"))
        };
        let none = ((None, None), (None, None));
        assert_eq!(
            decoded(json!({"uid": "u", "operation": "CREATE", "object": null})),
            none
        );
        assert_eq!(decoded(json!({"uid": "u", "operation": "DELETE"})), none);
        let (object, old) = (json!([1, "x"]), json!({"metadata": 3}));
        let both = (Some(object.clone()), Some(old.clone()));
        assert_eq!(
            decoded(json!({"uid": "u", "operation": "CREATE", "object": object, "oldObject": old})),
            (both.clone(), both)
        );
    }

    #[test]
    fn objects_nested_deeper_than_serde_json_builds_are_refused_as_too_deep() {
        let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let body = |depth: usize| {
            format!(
                r#"{{"apiVersion":"{API_VERSION}","kind":"{KIND}","request":{{"uid":"u","operation":"CREATE","object":{{"x":{}}}}}}}"#,
                nested(depth)
            )
            .into_bytes()
        };
        // The object's own braces count: 1 + depth levels inside the review and the request.
        assert!(decode(&body(MAX_DEPTH - 4)).is_ok());
        assert!(matches!(
            decode(&body(MAX_DEPTH - 3)),
            Err(AdmissionError::TooDeep)
        ));
        assert!(matches!(
            decode(&body(10_000)),
            Err(AdmissionError::TooDeep)
        ));
        // Whether the sketch skips the deep part (above) or keeps it (labels), or it is in
        // the old object; but not a field of the request the review does not read.
        let labelled = |depth: usize| {
            format!(
                r#"{{"apiVersion":"{API_VERSION}","kind":"{KIND}","request":{{"uid":"u","operation":"UPDATE","object":{{}},"oldObject":{{"metadata":{{"labels":{}}}}}}}}}"#,
                nested(depth)
            )
            .into_bytes()
        };
        assert!(decode(&labelled(MAX_DEPTH - 5)).is_ok());
        for depth in [MAX_DEPTH - 4, 10_000] {
            assert!(matches!(
                decode(&labelled(depth)),
                Err(AdmissionError::TooDeep)
            ));
        }
        let unread = format!(
            r#"{{"apiVersion":"{API_VERSION}","kind":"{KIND}","request":{{"uid":"u","operation":"CREATE","options":{},"object":{{}}}}}}"#,
            nested(10_000)
        );
        assert!(decode(unread.as_bytes()).is_ok());
        // Nor `metadata.managedFields`, which no path builds: the sketch passes over it as the
        // whole parse does, so both accept it.
        let managed = format!(
            r#"{{"apiVersion":"{API_VERSION}","kind":"{KIND}","request":{{"uid":"u","operation":"CREATE","object":{{"metadata":{{"name":"p","managedFields":{}}}}}}}}}"#,
            nested(10_000)
        );
        let request = decode(managed.as_bytes()).expect("a deep managedFields is passed over");
        let (object, _) = request.read_whole().expect("and the whole parse drops it");
        assert_eq!(object, Some(json!({"metadata": {"name": "p"}})));
    }

    /// A review whose object has a byte that is not UTF-8 in a field the sketch skips.
    fn not_utf8() -> Vec<u8> {
        let mut body = review(json!({"uid": "u", "operation": "CREATE",
            "object": {"metadata": {"creationTimestamp": "2025-06-02T09:21:0__7Z"}}}));
        if let Some(at) = body.windows(2).position(|w| w == b"__") {
            body[at] = 0x8d;
        }
        body
    }

    #[test]
    fn unreadable_bodies_are_refused_with_a_reason() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (not_utf8(), "invalid UTF-8 at byte"),
            (b"{not json".to_vec(), "not valid JSON"),
            (b"[1,2]".to_vec(), "not an AdmissionReview"),
            (b"{\"apiVersion\": 1}".to_vec(), "not an AdmissionReview"),
            (b"{\"apiVersion\": \"admission.k8s.io/v1\", \"kind\": \"AdmissionReview\", \"request\": {\"uid\": \"u\", \"object\": {".to_vec(), "not valid JSON"),
            (serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": KIND, "request": {"uid": "u"}})).expect("json"), "v1beta1"),
            (serde_json::to_vec(&json!({"apiVersion": API_VERSION, "kind": KIND})).expect("json"), "no request"),
            (review(json!({"operation": "CREATE"})), "no uid"),
            (review(json!({"uid": "u", "operation": "PATCH"})), "PATCH"),
        ];
        for (body, expected) in cases {
            let error = decode(&body).expect_err("refused").to_string();
            assert!(error.contains(expected), "{error}");
        }
    }

    #[test]
    fn a_response_without_changes_has_no_patch_fields() {
        let body = encode_response(
            "u1",
            &AdmissionDecision {
                allowed: true,
                ..AdmissionDecision::default()
            },
        );
        let value: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(
            value,
            json!({"apiVersion": API_VERSION, "kind": KIND, "response": {"uid": "u1", "allowed": true}})
        );
    }

    #[test]
    fn the_patch_is_a_base64_string_with_its_type() {
        let patch: Vec<PatchOperation> =
            serde_json::from_value(json!([{"op": "remove", "path": "/spec/nodeName"}]))
                .expect("patch");
        let body = encode_response(
            "u1",
            &AdmissionDecision {
                allowed: true,
                patch: &patch,
                ..AdmissionDecision::default()
            },
        );
        let value: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(value["response"]["patchType"], "JSONPatch");
        let encoded = value["response"]["patch"]
            .as_str()
            .expect("patch is a string");
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .expect("base64");
        assert_eq!(
            serde_json::from_slice::<Value>(&decoded).expect("json"),
            json!([{"op": "remove", "path": "/spec/nodeName"}])
        );
    }

    #[test]
    fn the_response_is_written_as_serde_json_writes_the_same_fields() {
        let patch: Vec<PatchOperation> = serde_json::from_value(json!([
            {"op": "add", "path": "/metadata/annotations/a~1b", "value": "q\"é\n"}
        ]))
        .expect("patch");
        let warnings = vec![
            "podmend x: \"quoted\" \\ é \u{1}".to_string(),
            "second".into(),
        ];
        let base64 = |ops: &[PatchOperation]| {
            base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(ops).expect("json"))
        };
        let cases = [
            (
                AdmissionDecision::default(),
                json!({"uid": "u\"1", "allowed": false}),
            ),
            (
                AdmissionDecision {
                    allowed: true,
                    patch: &patch,
                    warnings: warnings.clone(),
                    denial: None,
                },
                json!({"uid": "u\"1", "allowed": true, "patchType": "JSONPatch",
                       "patch": base64(&patch), "warnings": warnings}),
            ),
            (
                AdmissionDecision {
                    denial: Some("no \"way\" \u{7f}".into()),
                    ..AdmissionDecision::default()
                },
                json!({"uid": "u\"1", "allowed": false,
                       "status": {"code": 403, "reason": "Forbidden", "message": "no \"way\" \u{7f}"}}),
            ),
            (
                AdmissionDecision {
                    denial: Some("a plain message".into()),
                    ..AdmissionDecision::default()
                },
                json!({"uid": "u\"1", "allowed": false,
                       "status": {"code": 403, "reason": "Forbidden", "message": "a plain message"}}),
            ),
        ];
        // A uid with a quote is escaped; one with nothing to escape is copied as it is.
        for uid in ["u\"1", "0d5f-\u{e9}\u{7f}-plain"] {
            for (decision, response) in &cases {
                let mut response = response.clone();
                response["uid"] = json!(uid);
                let expected =
                    json!({"apiVersion": API_VERSION, "kind": KIND, "response": response});
                assert_eq!(
                    String::from_utf8(encode_response(uid, decision)).expect("UTF-8"),
                    serde_json::to_string(&expected).expect("json"),
                );
            }
        }
    }

    #[test]
    fn a_patch_is_written_as_serde_json_writes_it() {
        let patch: Vec<PatchOperation> = serde_json::from_value(json!([
            {"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {"terms": [
                {"key": "metadata.name", "values": ["n\"1", "é\u{1}"]}]}, "n": [1, -2.5, true, null, {}, []]}},
            {"op": "replace", "path": "/spec/containers/0/resources/requests/cpu", "value": "0"},
            {"op": "remove", "path": "/spec/nodeName"},
            {"op": "add", "path": "/metadata/annotations/podmend.io~1mutated", "value": "a,b"},
            {"op": "move", "from": "/a", "path": "/b"},
            {"op": "copy", "from": "/a", "path": "/c"},
            {"op": "test", "path": "/a\\~0", "value": 1e300}
        ]))
        .expect("patch");
        for ops in [&patch[..], &patch[..1], &[]] {
            let mut written = Vec::new();
            push_patch(&mut written, ops);
            assert_eq!(
                String::from_utf8(written).expect("UTF-8"),
                serde_json::to_string(ops).expect("json")
            );
        }
    }

    #[test]
    fn a_denial_carries_a_forbidden_status_with_the_message() {
        let body = encode_response(
            "u1",
            &AdmissionDecision {
                allowed: false,
                denial: Some("fix it".into()),
                ..AdmissionDecision::default()
            },
        );
        let value: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(value["response"]["allowed"], false);
        assert_eq!(
            value["response"]["status"],
            json!({"code": 403, "reason": "Forbidden", "message": "fix it"})
        );
    }

    #[test]
    fn long_warnings_are_clipped_to_what_the_api_server_keeps() {
        assert_eq!(clip("é".repeat(300)).chars().count(), MAX_WARNING_CHARS);
        // At the limit, in characters and in bytes, and one past it.
        for text in ["é".repeat(MAX_WARNING_CHARS), "e".repeat(MAX_WARNING_CHARS)] {
            assert_eq!(clip(text.clone()), text);
            assert_eq!(clip(format!("{text}x")), text);
        }
    }

    fn outcome_with(mode: Mode, patch: Vec<PatchOperation>) -> Outcome {
        let mut outcome = Outcome::default();
        outcome.findings = vec![crate::engine::Finding {
            rule: "dind-rm",
            mode,
            messages: vec!["left alone: a node agent".into()],
            advice: "",
            patch,
        }];
        outcome
    }

    #[test]
    fn a_note_is_warned_in_every_mode_and_never_denied() {
        for mode in [Mode::Enforce, Mode::Warn, Mode::Deny] {
            let outcome = outcome_with(mode, Vec::new());
            let mutate = AdmissionDecision::from_outcome(&outcome, Webhook::Mutate);
            assert_eq!(
                mutate.warnings,
                ["podmend dind-rm: left alone: a node agent"],
                "{mode:?}"
            );
            let validate = AdmissionDecision::from_outcome(&outcome, Webhook::Validate);
            assert!(validate.allowed, "{mode:?}: a note is never denied");
        }
    }

    #[test]
    fn a_finding_with_a_repair_in_deny_mode_is_denied_not_warned() {
        let patch: Vec<PatchOperation> =
            serde_json::from_value(json!([{"op": "remove", "path": "/spec/nodeName"}]))
                .expect("patch");
        let outcome = outcome_with(Mode::Deny, patch);
        assert!(
            AdmissionDecision::from_outcome(&outcome, Webhook::Mutate)
                .warnings
                .is_empty()
        );
        let validate = AdmissionDecision::from_outcome(&outcome, Webhook::Validate);
        assert!(!validate.allowed);
    }
}
