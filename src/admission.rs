//! The `admission.k8s.io/v1` AdmissionReview envelope, and nothing else: decoding a request,
//! and building the response from it so `uid`, `apiVersion` and `kind` echo by construction.
//! The wire form is what `VerifyAdmissionResponse` accepts: `allowed` always present, and a
//! base64 `patch` only together with `patchType: JSONPatch`.

use base64::Engine as _;
use json_patch::PatchOperation;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::config::Mode;
use crate::engine::{Operation, Outcome, Subject};

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
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

/// The parts of `AdmissionRequest` podmend reads; everything else is ignored.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub kind: GroupVersionKind,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub operation: String,
    /// The object without `metadata.managedFields` (see [`pruned_object`]).
    #[serde(default, deserialize_with = "pruned_object")]
    pub object: Option<Value>,
    /// The old object without `metadata.managedFields`.
    #[serde(default, deserialize_with = "pruned_object")]
    pub old_object: Option<Value>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    request: Option<AdmissionRequest>,
}

/// A decoded request, ready for the engine.
#[derive(Debug, Clone)]
pub struct Request {
    pub inner: AdmissionRequest,
    pub operation: Operation,
}

impl Request {
    /// The engine's view of the request.
    pub fn subject(&self) -> Subject<'_> {
        Subject {
            operation: self.operation,
            group: &self.inner.kind.group,
            kind: &self.inner.kind.kind,
            sub_resource: self.inner.sub_resource.as_deref().unwrap_or(""),
            namespace: self.inner.namespace.as_deref().unwrap_or(""),
            object: self.inner.object.as_ref().filter(|o| !o.is_null()),
            old_object: self.inner.old_object.as_ref().filter(|o| !o.is_null()),
        }
    }

    /// `metadata.name`, or `generateName` for objects the API server has not named yet.
    pub fn object_name(&self) -> &str {
        let from_object = |key: &str| {
            self.inner
                .object
                .as_ref()
                .or(self.inner.old_object.as_ref())
                .and_then(|o| o.get("metadata")?.get(key)?.as_str())
        };
        self.inner
            .name
            .as_deref()
            .filter(|n| !n.is_empty())
            .or_else(|| from_object("name"))
            .or_else(|| from_object("generateName"))
            .unwrap_or("")
    }
}

/// Decodes an AdmissionReview body in one pass: the envelope's fields podmend does not
/// read are skipped without being built, and so is `managedFields` in the objects.
pub fn decode(body: &[u8]) -> Result<Request, AdmissionError> {
    let review: ReviewIn =
        serde_json::from_slice(body).map_err(|error| match error.classify() {
            serde_json::error::Category::Data => AdmissionError::NotAReview(error),
            _ => AdmissionError::NotJson(error),
        })?;
    match review.api_version.as_deref() {
        Some(API_VERSION) => {}
        other => {
            return Err(AdmissionError::UnsupportedVersion(
                other.unwrap_or("").to_string(),
            ));
        }
    }
    if review.kind.as_deref() != Some(KIND) {
        return Err(AdmissionError::WrongKind(review.kind.unwrap_or_default()));
    }
    let inner = review.request.ok_or(AdmissionError::MissingRequest)?;
    if inner.uid.is_empty() {
        return Err(AdmissionError::MissingUid);
    }
    let operation = Operation::parse(&inner.operation)
        .ok_or_else(|| AdmissionError::UnknownOperation(inner.operation.clone()))?;
    Ok(Request { inner, operation })
}

/// `object` and `oldObject` as JSON trees without `metadata.managedFields`: the API
/// server's record of field owners is often the largest part of an object, no rule reads
/// it, and its many small maps cost most of a review's time to build (BENCHMARKS.md).
fn pruned_object<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    struct OptionalObject;
    impl<'de> Visitor<'de> for OptionalObject {
        type Value = Option<Value>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a Kubernetes object or null")
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            Pruned(Level::Object).deserialize(d).map(Some)
        }
    }
    deserializer.deserialize_option(OptionalObject)
}

/// Where a value sits in an object being decoded: only the object's own `metadata` is pruned.
#[derive(Clone, Copy)]
enum Level {
    Object,
    Metadata,
}

/// Decodes a JSON value at `Level` into a [`Value`], leaving out what that level prunes.
#[derive(Clone, Copy)]
struct Pruned(Level);

impl<'de> DeserializeSeed<'de> for Pruned {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Pruned {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            let value = match (self.0, key.as_str()) {
                (Level::Metadata, "managedFields") => {
                    access.next_value::<IgnoredAny>()?;
                    continue;
                }
                (Level::Object, "metadata") => access.next_value_seed(Pruned(Level::Metadata))?,
                _ => access.next_value::<Value>()?,
            };
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    }

    // An object or metadata that is not a JSON object is kept as it is: the engine skips it.
    fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = access.next_element::<Value>()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
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

/// What to answer, before it is put on the wire.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    pub allowed: bool,
    pub patch: Vec<PatchOperation>,
    pub warnings: Vec<String>,
    pub denial: Option<String>,
}

impl Decision {
    /// Turns the engine's outcome into the answer of one webhook. `/mutate` applies
    /// `enforce` repairs and warns for `enforce` and `warn`; `/validate` rejects for `deny`.
    /// A note (a finding with nothing to repair) is warned in every mode, never denied.
    pub fn from_outcome(outcome: &Outcome, webhook: Webhook) -> Self {
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
                            .map(|m| clip(format!("{prefix}{m}"))),
                    );
                }
                Decision {
                    allowed: true,
                    patch: outcome.patch.clone(),
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
                Decision {
                    allowed: reasons.is_empty(),
                    denial: (!reasons.is_empty()).then(|| reasons.join(" | ")),
                    ..Decision::default()
                }
            }
        }
    }
}

fn clip(mut warning: String) -> String {
    if let Some((index, _)) = warning.char_indices().nth(MAX_WARNING_CHARS) {
        warning.truncate(index);
    }
    warning
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: ResponseOut<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseOut<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<StatusOut<'a>>,
}

#[derive(Serialize)]
struct StatusOut<'a> {
    code: u16,
    reason: &'static str,
    message: &'a str,
}

/// Serializes the AdmissionReview response for `request`.
pub fn encode_response(uid: &str, decision: &Decision) -> Vec<u8> {
    let patch = (!decision.patch.is_empty()).then(|| {
        // Serializing patch operations (strings and JSON values) cannot fail.
        let bytes = serde_json::to_vec(&decision.patch).unwrap_or_default();
        base64::engine::general_purpose::STANDARD.encode(bytes)
    });
    let review = ReviewOut {
        api_version: API_VERSION,
        kind: KIND,
        response: ResponseOut {
            uid,
            allowed: decision.allowed,
            patch_type: patch.as_ref().map(|_| "JSONPatch"),
            patch,
            warnings: &decision.warnings,
            status: decision.denial.as_deref().map(|message| StatusOut {
                code: 403,
                reason: "Forbidden",
                message,
            }),
        },
    };
    serde_json::to_vec(&review).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn review(request: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({"apiVersion": API_VERSION, "kind": KIND, "request": request}))
            .expect("json")
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
        assert_eq!(request.object_name(), "web-");
    }

    #[test]
    fn managed_fields_are_left_out_and_everything_else_is_kept() {
        let object = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"a": "b"}, "managedFields": [{"manager": "kubectl"}],
                "annotations": {"x": "1.5"}},
            "spec": {"managedFields": "a field of that name elsewhere stays", "n": [1, -2, 2.5, null, true]},
            "status": {}
        });
        let body = review(
            json!({"uid": "u1", "operation": "UPDATE", "object": object, "oldObject": object}),
        );
        let request = decode(&body).expect("decodes");
        let mut expected = object.clone();
        expected["metadata"]
            .as_object_mut()
            .expect("map")
            .remove("managedFields");
        assert_eq!(request.inner.object, Some(expected.clone()));
        assert_eq!(request.inner.old_object, Some(expected));
    }

    #[test]
    fn objects_that_are_null_missing_or_not_maps_decode_as_they_are() {
        let request = decode(&review(
            json!({"uid": "u", "operation": "CREATE", "object": null}),
        ))
        .expect("decodes");
        assert_eq!(request.inner.object, None);
        let request = decode(&review(json!({"uid": "u", "operation": "DELETE"}))).expect("decodes");
        assert_eq!(request.inner.object, None);
        let request = decode(&review(json!({"uid": "u", "operation": "CREATE", "object": [1, "x"], "oldObject": {"metadata": 3}})))
            .expect("decodes");
        assert_eq!(request.inner.object, Some(json!([1, "x"])));
        assert_eq!(request.inner.old_object, Some(json!({"metadata": 3})));
    }

    #[test]
    fn unreadable_bodies_are_refused_with_a_reason() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
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
            &Decision {
                allowed: true,
                ..Decision::default()
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
            &Decision {
                allowed: true,
                patch,
                ..Decision::default()
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
    fn a_denial_carries_a_forbidden_status_with_the_message() {
        let body = encode_response(
            "u1",
            &Decision {
                allowed: false,
                denial: Some("fix it".into()),
                ..Decision::default()
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
    }

    fn outcome_with(mode: Mode, patch: Vec<PatchOperation>) -> Outcome {
        Outcome {
            findings: vec![crate::engine::Finding {
                rule: "dind-rm",
                mode,
                messages: vec!["left alone: a node agent".into()],
                advice: "",
                patch,
            }],
            ..Outcome::default()
        }
    }

    #[test]
    fn a_note_is_warned_in_every_mode_and_never_denied() {
        for mode in [Mode::Enforce, Mode::Warn, Mode::Deny] {
            let outcome = outcome_with(mode, Vec::new());
            let mutate = Decision::from_outcome(&outcome, Webhook::Mutate);
            assert_eq!(
                mutate.warnings,
                ["podmend dind-rm: left alone: a node agent"],
                "{mode:?}"
            );
            let validate = Decision::from_outcome(&outcome, Webhook::Validate);
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
            Decision::from_outcome(&outcome, Webhook::Mutate)
                .warnings
                .is_empty()
        );
        let validate = Decision::from_outcome(&outcome, Webhook::Validate);
        assert!(!validate.allowed);
    }
}
