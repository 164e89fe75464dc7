//! The `guard_http` target: a client's byte stream → the guard's request framing
//! (`Reader::read_head`, `RequestHead::parse`, `body_length`, chunked bodies) → the create
//! decision (`policy::is_container_create`, `policy::verdict` and its body rewrite), as the
//! proxy runs them, but without sockets.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use podmend::guard::http::{Reader, RequestHead, ResponseHead};
use podmend::guard::policy::{
    self, Action, COMPOSE_PROJECT_LABEL, CreateDecision, GuardRequest, GuardVerdict,
    MAX_CREATE_BODY, OWNER_LABEL, Policy, REAP_LABEL, Refusal, RequestKind,
};
use serde_json::{Map, Value};
use tokio::io::{AsyncRead, ReadBuf};

const OWNER: &str = "0f7a1c2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";
const POLICIES: [Policy; 5] = Policy::ALL;

/// A client that sends `data` at most `step` bytes per read, as a socket may.
struct Pieces<'a> {
    data: &'a [u8],
    step: usize,
}

impl AsyncRead for Pieces<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = self.step.min(self.data.len()).min(buf.remaining());
        let (now, rest) = self.data.split_at(n);
        buf.put_slice(now);
        self.data = rest;
        Poll::Ready(Ok(()))
    }
}

/// Runs a future whose I/O never waits (in-memory streams).
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("in-memory I/O never waits"),
    }
}

/// What the guard made of one request on the connection.
#[derive(Debug, PartialEq)]
enum Event {
    /// Relayed to the daemon as it came: the re-encoded head and the body bytes.
    Relayed { head: Vec<u8>, body: Vec<u8> },
    /// A container create, judged under each policy.
    Create {
        head: Vec<u8>,
        body: Vec<u8>,
        verdicts: Vec<GuardVerdict>,
    },
    /// The connection ends with this error.
    Error(String),
}

/// The proxy's request loop over a client stream delivered `step` bytes at a time.
fn relay(data: &[u8], step: usize) -> Vec<Event> {
    block_on(async {
        let mut reader = Reader::new(Pieces { data, step });
        let mut events = Vec::new();
        loop {
            let head = match reader.read_head().await {
                Ok(Some(head)) => head,
                Ok(None) => break,
                Err(error) => {
                    events.push(Event::Error(format!("head: {error}")));
                    break;
                }
            };
            let (request, length) =
                match RequestHead::parse(&head).and_then(|r| r.body_length().map(|l| (r, l))) {
                    Ok(parsed) => parsed,
                    Err(error) => {
                        assert!(!error.to_string().is_empty());
                        events.push(Event::Error(format!("request: {error}")));
                        break;
                    }
                };
            // The head the daemon gets reads back as the same request, framed the same way.
            let encoded = request.encode();
            let reparsed = RequestHead::parse(&encoded).unwrap_or_else(|error| {
                panic!(
                    "the re-encoded head does not parse: {error}\n{}",
                    String::from_utf8_lossy(&encoded)
                )
            });
            assert_eq!(reparsed, request, "the re-encoded head reads differently");
            assert_eq!(reparsed.body_length(), Ok(length));
            check_routing(&request.method, &request.target);

            if policy::is_container_create(&request.method, &request.target) {
                let body = match reader.read_body(length, MAX_CREATE_BODY).await {
                    Ok(body) => body,
                    Err(error) => {
                        events.push(Event::Error(format!("create body: {error}")));
                        break;
                    }
                };
                let verdicts = POLICIES
                    .iter()
                    .map(|&policy| {
                        let verdict = judge(policy, &request.method, &request.target, &body);
                        check_create(policy, &body, &verdict);
                        verdict
                    })
                    .collect();
                events.push(Event::Create {
                    head: encoded,
                    body,
                    verdicts,
                });
            } else {
                let verdict = judge(Policy::Deny, &request.method, &request.target, b"{}");
                assert_ne!(verdict.kind, RequestKind::ContainerCreate);
                assert_eq!(verdict.create, None, "a create judged off the create path");
                let mut body = Vec::new();
                if let Err(error) = reader.copy_body(length, &mut body).await {
                    events.push(Event::Error(format!("body: {error}")));
                    break;
                }
                events.push(Event::Relayed {
                    head: encoded,
                    body,
                });
            }
            if request.wants_close() {
                break;
            }
        }
        events
    })
}

/// Where Go's `net/http` server and Docker's router send `method target`: true when it is
/// `POST /containers/create` (or `/v{version:[0-9.]+}/containers/create`). A model of
/// `url.ParseRequestURI` (scheme, query, authority, one strict percent-decoding) and of
/// gorilla/mux's `cleanPath`, over-approximated where unsure (a redirect counts as routed).
///
/// An independent oracle on purpose: it models the daemon's routing from Go's sources and
/// shares no code with the guard's own path normalisation (`guard::policy`), so that a
/// request the guard misreads is caught instead of misread twice.
pub fn go_routes_to_create(method: &str, target: &str) -> bool {
    if method != "POST" || target == "*" {
        return false;
    }
    // getScheme: letters, then letters, digits, `+-.`, up to the first `:`.
    let mut scheme = "";
    let mut rest = target;
    for (i, c) in target.bytes().enumerate() {
        match c {
            b'a'..=b'z' | b'A'..=b'Z' => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' if i > 0 => {}
            b':' if i > 0 => {
                (scheme, rest) = (&target[..i], &target[i + 1..]);
                break;
            }
            b':' => return false,
            _ => break,
        }
    }
    let rest = rest.split_once('?').map_or(rest, |(path, _)| path);
    if !rest.starts_with('/') {
        return false;
    }
    let rest = if !scheme.is_empty() && rest.starts_with("//") {
        rest[2..].find('/').map_or("", |slash| &rest[2 + slash..])
    } else {
        rest
    };
    let Some(path) = go_unescape(rest) else {
        return false;
    };
    // cleanPath: path.Clean, keeping a trailing slash (which then matches no route).
    let mut segments: Vec<&[u8]> = Vec::new();
    for segment in path.split(|b| *b == b'/') {
        match segment {
            b"" | b"." => {}
            b".." => {
                segments.pop();
            }
            other => segments.push(other),
        }
    }
    if path.ends_with(b"/") {
        return false;
    }
    match segments.as_slice() {
        [b"containers", b"create"] => true,
        [version, b"containers", b"create"] => version
            .strip_prefix(b"v")
            .is_some_and(|v| !v.is_empty() && v.iter().all(|b| b.is_ascii_digit() || *b == b'.')),
        _ => false,
    }
}

/// `url.unescape(s, encodePath)`: every `%` starts two hex digits, or the URL is refused.
fn go_unescape(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

/// The guard judges every request the daemon would route to the create endpoint.
fn check_routing(method: &str, target: &str) {
    if go_routes_to_create(method, target) {
        assert!(
            policy::is_container_create(method, target),
            "the Docker daemon creates a container for {method} {target:?}, but the guard relays it unjudged (normalised: {:?})",
            policy::normalise_path(target)
        );
    }
}

/// Go's encoding/json field-name folding (ASCII case, KELVIN SIGN, LONG S).
fn go_fold_eq(key: &str, field: &str) -> bool {
    let folded = key.chars().map(|c| match c {
        '\u{212A}' => 'k',
        '\u{017F}' => 's',
        c => c.to_ascii_lowercase(),
    });
    folded.eq(field.chars().map(|c| c.to_ascii_lowercase()))
}

/// The keys of `object` that Go would decode into `field`.
fn spellings<'a>(object: &'a Map<String, Value>, field: &str) -> Vec<&'a str> {
    object
        .keys()
        .filter(|k| go_fold_eq(k, field))
        .map(String::as_str)
        .collect()
}

/// The guard's verdict on `method target` under `policy`, its body read.
fn judge(policy: Policy, method: &str, target: &str, body: &[u8]) -> GuardVerdict {
    let request = GuardRequest {
        method,
        target,
        form_body: false,
        body: Some(body),
    };
    policy::verdict(policy, OWNER, false, &request)
}

/// What the daemon gets for a container create under `policy`.
fn check_create(policy: Policy, body: &[u8], judged: &GuardVerdict) {
    assert_eq!(
        judged.kind,
        RequestKind::ContainerCreate,
        "a container create judged as another kind"
    );
    let sent = match &judged.action {
        Action::Refuse(Refusal::Unjudgeable(message)) => {
            assert!(!message.is_empty());
            assert_eq!(judged.create, None);
            return;
        }
        Action::Refuse(Refusal::NoRm) => None,
        Action::RewriteBody(sent) => Some(sent),
        // Nothing but JSON whitespace: no container to judge, dockerd answers it (500).
        Action::Forward
            if body
                .iter()
                .all(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n')) =>
        {
            assert_eq!(judged.create, None);
            return;
        }
        other => panic!("a container create was not judged: {other:?}"),
    };
    let Some(verdict) = &judged.create else {
        panic!("a judged container create without its verdict: {judged:?}");
    };
    let Some(sent) = sent else {
        assert_eq!(policy, Policy::Deny, "only deny refuses");
        assert_eq!(verdict.decision, CreateDecision::Deny);
        return;
    };
    // The guard sends one JSON object, then whatever followed the client's (Go stops there).
    let output: Value = serde_json::Deserializer::from_slice(sent)
        .into_iter::<Value>()
        .next()
        .expect("the guard sends a JSON value")
        .expect("the guard sends JSON");
    // What Go's decoder accepts and serde_json refuses (a lone surrogate escape, data after
    // the object) is judged as Go reads it: the field-by-field comparison below needs serde.
    let Ok(input) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let (Some(input), Some(output)) = (input.as_object(), output.as_object()) else {
        panic!("a judged create body is not a JSON object");
    };
    // One spelling of every field the guard judges, the canonical one: Go decodes the body
    // case-insensitively, and must see what the guard saw.
    for field in ["Labels", "HostConfig"] {
        let keys = spellings(output, field);
        assert!(
            keys.is_empty() || keys == [field],
            "the daemon gets {field} spelled {keys:?}"
        );
    }
    let host = output.get("HostConfig").and_then(Value::as_object);
    if let Some(host) = host {
        for field in ["AutoRemove", "RestartPolicy"] {
            let keys = spellings(host, field);
            assert!(
                keys.is_empty() || keys == [field],
                "the daemon gets HostConfig.{field} spelled {keys:?}"
            );
        }
    }
    let labels = output.get("Labels").and_then(Value::as_object);
    let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
    assert_eq!(
        label(OWNER_LABEL),
        Some(OWNER),
        "every create carries the owner label"
    );
    let auto_remove = host.and_then(|h| h.get("AutoRemove")) == Some(&Value::Bool(true));
    let reaped = label(REAP_LABEL) == Some("true");
    match verdict.decision {
        CreateDecision::Rm => assert!(auto_remove, "decision rm without AutoRemove"),
        CreateDecision::Collect
        | CreateDecision::Reap
        | CreateDecision::RestartPolicy
        | CreateDecision::Compose => {
            assert!(
                reaped,
                "decision {} without the reap label",
                verdict.decision
            )
        }
        CreateDecision::Audit => assert_eq!(policy, Policy::Audit),
        CreateDecision::Deny => panic!("a denied create was forwarded"),
    }
    if matches!(policy, Policy::Rm | Policy::Deny) {
        assert!(
            auto_remove || reaped,
            "policy {policy}: a container that is neither --rm nor reaped"
        );
    }
    if verdict.decision == CreateDecision::Compose {
        assert!(labels.is_some_and(|l| l.contains_key(COMPOSE_PROJECT_LABEL)));
    }
    // Nothing else changes: every other field reaches the daemon as the client sent it.
    let judged = |key: &str| go_fold_eq(key, "Labels") || go_fold_eq(key, "HostConfig");
    for (key, value) in input.iter().filter(|(k, _)| !judged(k)) {
        assert_eq!(
            output.get(key),
            Some(value),
            "field {key} changed on its way"
        );
    }
    assert_eq!(
        output.keys().filter(|k| !judged(k)).count(),
        input.keys().filter(|k| !judged(k)).count(),
        "the guard added a field"
    );
    let input_host = input
        .iter()
        .find(|(k, _)| go_fold_eq(k, "HostConfig"))
        .and_then(|(_, v)| v.as_object());
    if let (Some(before), Some(after)) = (input_host, host) {
        let judged = |key: &str| go_fold_eq(key, "AutoRemove") || go_fold_eq(key, "RestartPolicy");
        for (key, value) in before.iter().filter(|(k, _)| !judged(k)) {
            assert_eq!(
                after.get(key),
                Some(value),
                "HostConfig.{key} changed on its way"
            );
        }
    }
    // Judging the forwarded body again changes nothing (the guard is its own fixed point).
    match judge(policy, "POST", "/containers/create", sent).action {
        Action::RewriteBody(again) => {
            assert_eq!(&again, sent, "a second judgement rewrites the body");
        }
        other => panic!("the forwarded body is judged {other:?} the second time"),
    }
}

pub fn check(data: &[u8]) {
    // The first byte sets how the stream is cut into reads; the rest is the stream.
    let Some((&cut, stream)) = data.split_first() else {
        return;
    };
    let whole = relay(stream, usize::MAX);
    let pieces = relay(stream, usize::from(cut % 64) + 1);
    assert_eq!(
        whole, pieces,
        "the stream framed differently when it arrives in pieces"
    );
    // The daemon's side: a response head parses or is refused, without panicking.
    if let Ok(response) = ResponseHead::parse(stream) {
        for method in ["GET", "HEAD", "POST"] {
            let _ = response.body_length(method);
        }
        let _ = response.wants_close();
    }
}
