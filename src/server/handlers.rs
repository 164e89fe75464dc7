//! Thin axum handlers: read the body, hand it to [`admission`] and the engine, answer.
//! Every decodable review gets HTTP 200 with the decision in-band; only an unreadable body
//! gets a 4xx, with a one-line reason.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::admission::{self, AdmissionError, Decision, Webhook};
use crate::config::Mode;

pub async fn mutate(
    state: State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(&state, Webhook::Mutate, &headers, body)
}

pub async fn validate(
    state: State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(&state, Webhook::Validate, &headers, body)
}

/// What the null webhook answers: a fixed v1 response that allows everything.
const NULL_RESPONSE: &[u8] =
    br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"","allowed":true}}"#;

/// The benchmark's baseline: the body is read (as for `/mutate`), not decoded.
pub async fn null(body: Result<Bytes, BytesRejection>) -> Response {
    match body {
        Ok(_) => ([(header::CONTENT_TYPE, "application/json")], NULL_RESPONSE).into_response(),
        Err(rejection) => refuse(rejection.status(), &rejection.body_text()),
    }
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

pub async fn healthz() -> &'static str {
    "ok\n"
}

pub async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    match state.readiness.not_ready_reason() {
        None => (StatusCode::OK, "ok\n".to_string()).into_response(),
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        )
            .into_response(),
    }
}

fn answer(
    state: &AppState,
    webhook: Webhook,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    if !is_json(headers) {
        state.metrics.bad_request("content-type");
        return refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "content type must be application/json (an admission.k8s.io/v1 AdmissionReview)",
        );
    }
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            let status = rejection.status();
            let reason = if status == StatusCode::PAYLOAD_TOO_LARGE {
                state.metrics.bad_request("too-large");
                format!(
                    "body is larger than {} bytes; the API server never sends reviews that large",
                    super::MAX_BODY_BYTES
                )
            } else {
                state.metrics.bad_request("unreadable");
                format!("cannot read body: {}", rejection.body_text())
            };
            return refuse(status, &reason);
        }
    };
    // The engine does not panic on any input we know of; if it ever does, the caller
    // still gets a clean answer and the process keeps serving.
    match std::panic::catch_unwind(AssertUnwindSafe(|| review(state, webhook, &body, started))) {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => {
            state.metrics.bad_request(bad_request_reason(&error));
            refuse(StatusCode::BAD_REQUEST, &error.to_string())
        }
        Err(_) => {
            state.metrics.bad_request("internal-error");
            tracing::error!(webhook = webhook.as_str(), "review panicked; answered 500");
            refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal error while reviewing; see podmend's log",
            )
        }
    }
}

fn review(
    state: &AppState,
    webhook: Webhook,
    body: &[u8],
    started: Instant,
) -> Result<Response, AdmissionError> {
    let request = admission::decode(body)?;
    let engine = state.engine();
    let outcome = engine.review(&request.subject(), state.cluster.as_ref());
    let decision = Decision::from_outcome(&outcome, webhook);
    let encoded = admission::encode_response(&request.inner.uid, &decision);
    let elapsed = started.elapsed();

    let result = if !decision.allowed {
        "denied"
    } else if !decision.patch.is_empty() {
        "patched"
    } else if !decision.warnings.is_empty() {
        "warned"
    } else {
        "allowed"
    };
    for finding in &outcome.findings {
        let action = match (webhook, finding.mode) {
            (Webhook::Mutate, Mode::Enforce) => "repaired",
            (Webhook::Mutate, Mode::Warn) => "warned",
            (Webhook::Validate, Mode::Deny) => "denied",
            _ => continue,
        };
        state.metrics.rule_action(finding.rule, action);
    }
    let kind = &request.inner.kind.kind;
    let operation = request.operation.as_str();
    state.metrics.admission(
        webhook.as_str(),
        metric_kind(kind),
        operation,
        result,
        elapsed,
    );
    let rules: Vec<&str> = outcome.findings.iter().map(|f| f.rule).collect();
    tracing::info!(
        webhook = webhook.as_str(),
        uid = %request.inner.uid,
        kind = %kind,
        namespace = request.inner.namespace.as_deref().unwrap_or(""),
        name = request.object_name(),
        operation,
        result,
        rules = %rules.join(","),
        skipped = outcome.skipped.as_ref().map_or("", |s| s.as_str()),
        duration_us = elapsed.as_micros() as u64,
        "admission"
    );
    Ok(([(header::CONTENT_TYPE, "application/json")], encoded).into_response())
}

/// Kinds outside the handled set share one label value, so a client cannot grow the
/// metric's label set without bound.
fn metric_kind(kind: &str) -> &'static str {
    crate::target::TARGETS
        .iter()
        .find(|t| t.name == kind)
        .map_or("other", |t| t.name)
}

fn bad_request_reason(error: &AdmissionError) -> &'static str {
    match error {
        AdmissionError::NotJson(_) => "not-json",
        AdmissionError::NotAReview(_) | AdmissionError::WrongKind(_) => "not-a-review",
        AdmissionError::UnsupportedVersion(_) => "unsupported-version",
        AdmissionError::MissingRequest => "missing-request",
        AdmissionError::MissingUid => "missing-uid",
        AdmissionError::UnknownOperation(_) => "unknown-operation",
    }
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

fn refuse(status: StatusCode, reason: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{reason}\n"),
    )
        .into_response()
}
