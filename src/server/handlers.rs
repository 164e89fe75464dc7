//! Thin axum handlers: read the body, hand it to [`admission`] and the engine, answer.
//! Every decodable review gets HTTP 200 with the decision in-band; anything else gets a 4xx
//! with a one-line reason that says what was wrong and what to send instead, and is counted in
//! `podmend_bad_requests_total{reason}`.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use tracing::Level;

use super::helpers::Helpers;
use super::{AppState, MAX_BODY_BYTES};
use crate::admission::{self, AdmissionDecision, AdmissionError, Webhook};
use crate::config::Mode;
use crate::telemetry::{self, PlainField};

/// The API server sends a review's body right after its headers, and gives up on the webhook
/// after at most 30 s; a body still arriving after this long is a stalled or hostile client.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How much of a refused body is read and dropped so that an HTTP/1.1 client still sending
/// it gets to read the answer instead of a connection reset; past this, the connection closes.
const DISCARD_LIMIT: usize = 2 * MAX_BODY_BYTES;

pub(super) async fn mutate(
    State(state): State<Arc<AppState>>,
    helpers: &Helpers,
    request: Request,
) -> Response {
    answer(state, helpers, Webhook::Mutate, request).await
}

pub(super) async fn validate(
    State(state): State<Arc<AppState>>,
    helpers: &Helpers,
    request: Request,
) -> Response {
    answer(state, helpers, Webhook::Validate, request).await
}

/// `GET /mutate` and the like: the webhook paths only take POST.
pub async fn wrong_method(State(state): State<Arc<AppState>>) -> Response {
    state.metrics.bad_request("method");
    let mut response = refuse(
        StatusCode::METHOD_NOT_ALLOWED,
        "the webhook takes POST with an admission.k8s.io/v1 AdmissionReview; /healthz, \
         /readyz and /metrics are served on the metrics port",
    );
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    response
}

/// Any path other than the webhook's.
pub async fn unknown_path(State(state): State<Arc<AppState>>) -> Response {
    state.metrics.bad_request("unknown-path");
    refuse(
        StatusCode::NOT_FOUND,
        "no such path: the webhook serves POST /mutate and POST /validate; /healthz, /readyz \
         and /metrics are served on the metrics port",
    )
}

/// What the null webhook answers: a fixed v1 response that allows everything.
const NULL_RESPONSE: &[u8] =
    br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"","allowed":true}}"#;

/// The benchmark's baseline: the body is read as for `/mutate` ([`read_body`]), not decoded.
pub async fn null(request: Request) -> Response {
    let declared = declared_length(request.headers());
    let mut chunks = request.into_body().into_data_stream();
    match read_body(&mut chunks, declared).await {
        Ok(_) => ([(header::CONTENT_TYPE, "application/json")], NULL_RESPONSE).into_response(),
        Err(BodyError::TooLarge) => refuse(StatusCode::PAYLOAD_TOO_LARGE, &too_large()),
        Err(BodyError::Unreadable(error)) => refuse(
            StatusCode::BAD_REQUEST,
            &format!("cannot read the body ({error})"),
        ),
    }
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
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

async fn answer(
    state: Arc<AppState>,
    helpers: &Helpers,
    webhook: Webhook,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let body = match receive(&state, &parts.headers, body).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    let started = Instant::now();
    let reviewer = state.clone();
    match helpers
        .run(move || review_caught(&reviewer, webhook, &body, started))
        .await
    {
        Some(Answer {
            response,
            rules_acted,
        }) => {
            helpers.rules_acted(rules_acted);
            response
        }
        None => internal_error(&state, webhook),
    }
}

/// What a review answered, and whether a rule found something (the review then took more
/// than the sketch, which [`Helpers`] goes by).
struct Answer {
    response: Response,
    rules_acted: bool,
}

/// [`review`], with every error answered: a 400 that says what was wrong, or a 500 if the
/// review panicked.
fn review_caught(state: &AppState, webhook: Webhook, body: &[u8], started: Instant) -> Answer {
    // The engine does not panic on any input we know of; if it ever does, the caller
    // still gets a clean answer and the process keeps serving.
    let response = match std::panic::catch_unwind(AssertUnwindSafe(|| {
        review(state, webhook, body, started)
    })) {
        Ok(Ok(answer)) => return answer,
        Ok(Err(error)) => {
            let (reason, message) = explain(&error);
            state.metrics.bad_request(reason);
            refuse(StatusCode::BAD_REQUEST, &message)
        }
        Err(_) => internal_error(state, webhook),
    };
    Answer {
        response,
        rules_acted: false,
    }
}

/// The 500 of a review that panicked, counted and logged.
fn internal_error(state: &AppState, webhook: Webhook) -> Response {
    state.metrics.bad_request("internal-error");
    tracing::error!(webhook = webhook.as_str(), "review panicked; answered 500");
    refuse(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal error while reviewing; see podmend's log",
    )
}

/// The body of a review, or the refusal (counted) of one podmend will not read: not JSON,
/// too large, unreadable, or too slow to arrive.
async fn receive(state: &AppState, headers: &HeaderMap, body: Body) -> Result<Vec<u8>, Response> {
    if !is_json(headers) {
        state.metrics.bad_request("content-type");
        discard(body, headers);
        return Err(refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "content type must be application/json (an admission.k8s.io/v1 AdmissionReview)",
        ));
    }
    let declared = declared_length(headers);
    if declared.is_some_and(|length| length > MAX_BODY_BYTES as u64) {
        // Refused before reading: a client that waits for `100 Continue` sends nothing.
        state.metrics.bad_request("too-large");
        discard(body, headers);
        return Err(refuse(StatusCode::PAYLOAD_TOO_LARGE, &too_large()));
    }
    let mut chunks = body.into_data_stream();
    let read = tokio::time::timeout(BODY_READ_TIMEOUT, read_body(&mut chunks, declared)).await;
    match read {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(BodyError::TooLarge)) => {
            state.metrics.bad_request("too-large");
            discard_stream(chunks);
            Err(refuse(StatusCode::PAYLOAD_TOO_LARGE, &too_large()))
        }
        Ok(Err(BodyError::Unreadable(error))) => {
            state.metrics.bad_request("unreadable");
            Err(refuse(
                StatusCode::BAD_REQUEST,
                &format!(
                    "cannot read the body ({error}); send the whole body, as long as its \
                     Content-Length says"
                ),
            ))
        }
        Err(_) => {
            state.metrics.bad_request("body-timeout");
            Err(refuse(
                StatusCode::REQUEST_TIMEOUT,
                &format!(
                    "the body did not arrive within {} s; send it right after the headers",
                    BODY_READ_TIMEOUT.as_secs()
                ),
            ))
        }
    }
}

enum BodyError {
    TooLarge,
    Unreadable(axum::Error),
}

/// Reads the whole body, refusing it as soon as it passes [`MAX_BODY_BYTES`].
async fn read_body(
    chunks: &mut axum::body::BodyDataStream,
    declared: Option<u64>,
) -> Result<Vec<u8>, BodyError> {
    // Reserve what the client announced, but not much on its word alone.
    let reserve = declared.map_or(0, |length| length.min(1024 * 1024) as usize);
    let mut body = Vec::with_capacity(reserve);
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(BodyError::Unreadable)?;
        if body.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn too_large() -> String {
    format!(
        "body is larger than {MAX_BODY_BYTES} bytes; the API server never sends reviews that \
         large (objects are capped at about 3 MiB)"
    )
}

/// The Content-Length the client announced, if any (HTTP/1.1 chunked bodies have none).
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Drops a refused body without reading it when the client waits for `100 Continue` before
/// sending it; otherwise reads the rest in the background (see [`discard_stream`]).
fn discard(body: Body, headers: &HeaderMap) {
    let expects_continue = headers
        .get(header::EXPECT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    if !expects_continue {
        discard_stream(body.into_data_stream());
    }
}

/// Reads and drops the rest of a refused body, up to [`DISCARD_LIMIT`] bytes and
/// [`BODY_READ_TIMEOUT`], so that an HTTP/1.1 client still sending it reads the answer
/// instead of a connection reset.
fn discard_stream(mut chunks: axum::body::BodyDataStream) {
    tokio::spawn(async move {
        let drain = async {
            let mut read = 0;
            while let Some(Ok(chunk)) = chunks.next().await {
                read += chunk.len();
                if read > DISCARD_LIMIT {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(BODY_READ_TIMEOUT, drain).await;
    });
}

fn review(
    state: &AppState,
    webhook: Webhook,
    body: &[u8],
    started: Instant,
) -> Result<Answer, AdmissionError> {
    let request = admission::decode(body)?;
    let engine = state.engine();
    let outcome = engine.review_raw(&request.subject(), state.cluster.as_ref());
    let decision = AdmissionDecision::from_outcome(&outcome, webhook);
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
    AdmissionLine {
        webhook: webhook.as_str(),
        uid: &request.inner.uid,
        kind,
        namespace: request.inner.namespace.as_deref().unwrap_or(""),
        name: request.object_name(outcome.name.as_deref()),
        operation,
        result,
        rules: &rules,
        skipped: outcome.skipped.as_ref().map_or("", |s| s.as_str()),
        duration_us: elapsed.as_micros() as u64,
    }
    .log();
    Ok(Answer {
        response: ([(header::CONTENT_TYPE, "application/json")], encoded).into_response(),
        rules_acted: !outcome.findings.is_empty(),
    })
}

/// The one log line of an admission decision, at `info`, with this module's target
/// (`podmend::server::handlers`). A type of its own so that the benchmark that prices the line
/// logs exactly the server's.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct AdmissionLine<'a> {
    pub webhook: &'a str,
    pub uid: &'a str,
    pub kind: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub operation: &'a str,
    /// `allowed`, `warned`, `patched` or `denied`.
    pub result: &'a str,
    /// The rules that found something.
    pub rules: &'a [&'a str],
    /// Why the object was skipped; empty when it was not.
    pub skipped: &'a str,
    pub duration_us: u64,
}

/// The decision line's target (this module's path, as the logging macros default to) and
/// message.
const TARGET: &str = module_path!();
const ADMISSION: &str = "admission";

impl AdmissionLine<'_> {
    /// Logs the line: `admission webhook="mutate" uid=… kind=Pod …` in the text format. Under
    /// `serve`'s plain text subscriber it is written straight into the log's batch, byte for
    /// byte as the subscriber writes the event ([`telemetry::write_plain_line`]; a test holds
    /// the two equal); under any other, as the event.
    pub fn log(&self) {
        let written = tracing::enabled!(target: TARGET, Level::INFO)
            && telemetry::write_plain_line(Level::INFO, TARGET, ADMISSION, &self.fields());
        if !written {
            self.log_event();
        }
    }

    /// The line as a `tracing` event, its fields in the order of [`Self::fields`].
    fn log_event(&self) {
        tracing::info!(
            target: TARGET,
            webhook = self.webhook,
            uid = %self.uid,
            kind = %self.kind,
            namespace = self.namespace,
            name = %self.name,
            operation = self.operation,
            result = self.result,
            rules = %self.rules.join(","),
            skipped = self.skipped,
            duration_us = self.duration_us,
            "{ADMISSION}"
        );
    }

    /// The fields of [`Self::log_event`], recorded as it records them.
    fn fields(&self) -> [(&'static str, PlainField<'_>); 10] {
        [
            ("webhook", PlainField::Str(self.webhook)),
            ("uid", PlainField::Display(self.uid)),
            ("kind", PlainField::Display(self.kind)),
            ("namespace", PlainField::Str(self.namespace)),
            ("name", PlainField::Display(self.name)),
            ("operation", PlainField::Str(self.operation)),
            ("result", PlainField::Str(self.result)),
            ("rules", PlainField::Joined(self.rules, ",")),
            ("skipped", PlainField::Str(self.skipped)),
            ("duration_us", PlainField::U64(self.duration_us)),
        ]
    }
}

/// Kinds outside the handled set share one label value, so a client cannot grow the
/// metric's label set without bound.
fn metric_kind(kind: &str) -> &'static str {
    crate::target::TARGETS
        .iter()
        .find(|t| t.name == kind)
        .map_or("other", |t| t.name)
}

/// The metric reason and the answer's text for a body that is not a review we can answer.
fn explain(error: &AdmissionError) -> (&'static str, String) {
    let reason = match error {
        AdmissionError::TooDeep => "too-deep",
        AdmissionError::NotJson(_) => "not-json",
        AdmissionError::UnsupportedVersion(version) if version.is_empty() => {
            return (
                "not-a-review",
                "body is not an AdmissionReview: it has no apiVersion; send an \
                 admission.k8s.io/v1 AdmissionReview"
                    .to_string(),
            );
        }
        AdmissionError::WrongKind(_) => {
            return (
                "not-a-review",
                format!("{error}; send an admission.k8s.io/v1 AdmissionReview"),
            );
        }
        AdmissionError::NotAReview(_) => "not-a-review",
        AdmissionError::UnsupportedVersion(_) => "unsupported-version",
        AdmissionError::MissingRequest => "missing-request",
        AdmissionError::MissingUid => "missing-uid",
        AdmissionError::UnknownOperation(_) => "unknown-operation",
    };
    (reason, error.to_string())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::tests::Sink;

    /// A created pod's decision line, two rules having repaired it.
    const PATCHED: AdmissionLine<'static> = AdmissionLine {
        webhook: "mutate",
        uid: "705ab4f5-6393-11e8-b7cc-42010a800002",
        kind: "Pod",
        namespace: "default",
        name: "web-",
        operation: "CREATE",
        result: "patched",
        rules: &["node-affinity", "agent-requests"],
        skipped: "",
        duration_us: 41,
    };

    #[test]
    fn the_decision_line_has_its_fields_in_order_under_the_handlers_target() {
        let captured = Sink::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .without_time()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let line = PATCHED;
        tracing::subscriber::with_default(subscriber, || line.log());
        assert_eq!(
            captured.text(),
            " INFO podmend::server::handlers: admission webhook=\"mutate\" \
             uid=705ab4f5-6393-11e8-b7cc-42010a800002 kind=Pod namespace=\"default\" name=web- \
             operation=\"CREATE\" result=\"patched\" rules=node-affinity,agent-requests \
             skipped=\"\" duration_us=41\n"
        );
    }

    #[test]
    fn the_line_written_straight_into_the_batch_is_the_event_as_the_subscriber_writes_it() {
        let lines = [
            PATCHED,
            AdmissionLine {
                webhook: "validate",
                uid: "",
                kind: "Deployment",
                namespace: "say \"hi\" \\ žluťoučký\t\u{1b}",
                name: "",
                operation: "UPDATE",
                result: "allowed",
                rules: &["dind-rm"],
                skipped: "excluded-namespace",
                duration_us: u64::MAX,
            },
            AdmissionLine {
                webhook: "mutate",
                uid: "u",
                kind: "other",
                namespace: "",
                name: "a b=c",
                operation: "",
                result: "denied",
                rules: &[],
                skipped: "",
                duration_us: 0,
            },
        ];
        for line in lines {
            let event = telemetry::tests::text_of(false, || line.log_event());
            let plain =
                telemetry::tests::plain_line_of(Level::INFO, TARGET, ADMISSION, &line.fields());
            assert_eq!(plain.as_deref(), Some(event.as_str()));
        }
    }
}
