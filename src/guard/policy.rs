//! The guard's decision, as pure functions: which requests are container or network creates,
//! swarm requests, builds, tags or commits (on the *normalised* path, so spelling tricks do
//! not bypass it) and what happens to each under each policy ([`plan`], then [`decide`] for
//! a body). No I/O: the proxy asks, this module answers.

use std::fmt;

use serde_json::{Map, Value};

pub use crate::dind::{IMAGE_OWNER_LABEL, OWNER_LABEL, Policy};
/// Containers the guard could not make `--rm` are labelled `podmend.io/reap=true`.
pub const REAP_LABEL: &str = "podmend.io/reap";
/// `docker compose` labels its containers with their project.
pub const COMPOSE_PROJECT_LABEL: &str = "com.docker.compose.project";
/// The largest create body read (they are a few KiB of JSON).
pub const MAX_CREATE_BODY: usize = 1 << 20;

/// What `deny` answers, and the docker CLI prints.
pub const DENY_MESSAGE: &str = "podmend: containers must be run with --rm on this CI runner (docker run --rm ...); ask the cluster admin to set the pod annotation podmend.io/dind-policy to reap or audit to allow it";

/// What became of one container create; the `decision` label of the creates metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    /// The container is removed when it exits (`--rm` given, or set by the guard).
    Rm,
    /// Refused.
    Deny,
    /// Labelled; removed once exited long enough, or beyond the count kept (policy `collect`).
    Collect,
    /// Labelled for reaping (policy `reap`).
    Reap,
    /// Passed on without `--rm` (policy `audit`).
    Audit,
    /// Has a restart policy, so cannot be `--rm`: labelled for reaping.
    RestartPolicy,
    /// A `docker compose` container: labelled for reaping.
    Compose,
}

impl Decision {
    pub const ALL: [Decision; 7] = [
        Decision::Rm,
        Decision::Collect,
        Decision::Deny,
        Decision::Reap,
        Decision::Audit,
        Decision::RestartPolicy,
        Decision::Compose,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Rm => "rm",
            Decision::Collect => "collect",
            Decision::Deny => "deny",
            Decision::Reap => "reap",
            Decision::Audit => "audit",
            Decision::RestartPolicy => "restart-policy",
            Decision::Compose => "compose",
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The answer for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Not a container create: relay it untouched.
    PassThrough,
    /// A container create, decided.
    Create(CreateVerdict),
    /// A network create (policy `collect`): send this body, which carries the owner label.
    Network(Vec<u8>),
    /// A create whose body cannot be judged: answer 400 with this message.
    Invalid(String),
}

/// The verdict on one container create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateVerdict {
    pub decision: Decision,
    /// The body to send to the daemon; `None` when refused.
    pub body: Option<Vec<u8>>,
    /// Whether the guard set `AutoRemove` itself.
    pub set_auto_remove: bool,
    /// `?name=` of the request, if given.
    pub name: Option<String>,
    /// `Image` of the body, if given.
    pub image: Option<String>,
}

impl CreateVerdict {
    pub fn refused(&self) -> bool {
        self.body.is_none()
    }
}

/// Whether `method target` creates a container. Decided on [`normalise_path`], with the
/// method compared case-insensitively: anything the daemon might route to
/// `POST /containers/create` counts.
pub fn is_container_create(method: &str, target: &str) -> bool {
    method.eq_ignore_ascii_case("POST") && normalise_path(target) == "/containers/create"
}

/// What `rm`, `deny` and `reap` answer to swarm requests, and the docker CLI prints.
pub const SWARM_MESSAGE: &str = "podmend: swarm mode is refused on this CI runner (docker swarm init/join, docker service create/update): swarm services create containers the guard cannot label or remove, and swarm restarts them forever; ask the cluster admin to set the pod annotation podmend.io/dind-policy to audit to allow it";

/// What `rm`, `deny` and `reap` answer to a build whose body is a form.
pub const BUILD_FORM_MESSAGE: &str = "podmend guard: a build (POST /build) whose body is a form is refused: form fields could keep the builder's intermediate containers, which the guard cannot label or remove; send the build context as application/x-tar, as the docker CLI does";

/// Whether `policy` stops what the guard cannot label or remove (swarm services, a build's
/// intermediate containers): every policy but `audit`.
pub fn enforces_removal(policy: Policy) -> bool {
    policy != Policy::Audit
}

/// Whether `method target` enters swarm mode or creates or updates a swarm service
/// (`POST /swarm/init`, `/swarm/join`, `/services/create`, `/services/{id}/update`), on
/// [`normalise_path`] as for creates. Service containers are made by swarm inside the daemon,
/// never through `/containers/create`: they carry no owner label and are restarted forever.
pub fn is_swarm_request(method: &str, target: &str) -> bool {
    if !method.eq_ignore_ascii_case("POST") {
        return false;
    }
    let path = normalise_path(target);
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    match segments.as_slice() {
        ["swarm", "init" | "join"] | ["services", "create"] => true,
        // An id with an encoded `/` decodes to more segments: refused too (dockerd 404s it).
        ["services", id @ .., "update"] => !id.is_empty(),
        _ => false,
    }
}

/// Whether `method target` is an image build (`POST /build`), on [`normalise_path`].
pub fn is_build(method: &str, target: &str) -> bool {
    method.eq_ignore_ascii_case("POST") && normalise_path(target) == "/build"
}

/// The build target with `rm=1&forcerm=1` first in its query, so the classic builder removes
/// its intermediate containers (made inside the daemon, without the owner label) even after a
/// failed step. dockerd reads each option with Go's `FormValue`, the first value given, so
/// whatever follows (`rm=0`, `r%6D=0`, `;rm=0` for older Go) is not read; Go's query is
/// everything after the first `?`. BuildKit (`version=2`) ignores both.
pub fn build_target_removing_intermediates(target: &str) -> String {
    const FIRST: &str = "rm=1&forcerm=1";
    match target.split_once('?') {
        Some((path, query)) => format!("{path}?{FIRST}&{query}"),
        None => format!("{target}?{FIRST}"),
    }
}

/// Whether a `Content-Type` value makes Go parse the body as form fields (urlencoded or
/// multipart), which `FormValue` would read before or beside the query. Lenient on purpose:
/// any media type naming a form counts.
pub fn is_form_content_type(value: &[u8]) -> bool {
    let value = String::from_utf8_lossy(value);
    let media_type = value.split(';').next().unwrap_or_default();
    media_type.trim().to_lowercase().contains("form")
}

/// The requests the guard acts on; every other request is relayed untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestKind {
    /// `POST /containers/create`.
    ContainerCreate,
    /// `POST /networks/create`.
    NetworkCreate,
    /// `POST /build` (the classic builder, or BuildKit through the daemon's session).
    Build,
    /// `POST /swarm/init`, `/swarm/join`, `/services/create`, `/services/{id}/update`.
    Swarm,
    /// `POST /images/{name}/tag`: the pod names an image.
    ImageTag,
    /// `POST /commit`: the pod makes an image of a container.
    Commit,
    /// Anything else.
    Other,
}

impl RequestKind {
    pub const ALL: [RequestKind; 7] = [
        RequestKind::ContainerCreate,
        RequestKind::NetworkCreate,
        RequestKind::Build,
        RequestKind::Swarm,
        RequestKind::ImageTag,
        RequestKind::Commit,
        RequestKind::Other,
    ];
}

/// What kind of request `method target` is, judged on [`normalise_path`].
pub fn classify(method: &str, target: &str) -> RequestKind {
    if is_container_create(method, target) {
        return RequestKind::ContainerCreate;
    }
    if is_swarm_request(method, target) {
        return RequestKind::Swarm;
    }
    if !method.eq_ignore_ascii_case("POST") {
        return RequestKind::Other;
    }
    let path = normalise_path(target);
    match path.as_str() {
        "/networks/create" => RequestKind::NetworkCreate,
        "/build" => RequestKind::Build,
        "/commit" => RequestKind::Commit,
        _ if path.starts_with("/images/") && path.ends_with("/tag") && path.len() > 12 => {
            RequestKind::ImageTag
        }
        _ => RequestKind::Other,
    }
}

/// What the proxy does with a request before the daemon sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Relay it as sent.
    Relay,
    /// Relay it with this request-target instead.
    Retarget(String),
    /// Answer `status` with `message` and close; the daemon never sees the request.
    Refuse { status: u16, message: &'static str },
    /// Read the body and judge it with [`decide`].
    JudgeBody,
}

/// The guard's plan for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub kind: RequestKind,
    pub action: Action,
    /// An image reference this request gives a name to, which the pod removes when it ends
    /// if the daemon answers with success (policy `collect`: `docker tag`).
    pub records: Option<String>,
}

/// Plans one request under `policy` for the pod `owner`: `form_body` says whether its
/// `Content-Type` is a form ([`is_form_content_type`]), which only matters for builds.
pub fn plan(policy: Policy, owner: &str, method: &str, target: &str, form_body: bool) -> Plan {
    let kind = classify(method, target);
    let relay = |action| Plan {
        kind,
        action,
        records: None,
    };
    match kind {
        RequestKind::ContainerCreate => relay(Action::JudgeBody),
        RequestKind::NetworkCreate if policy == Policy::Collect => relay(Action::JudgeBody),
        RequestKind::Swarm if enforces_removal(policy) => relay(Action::Refuse {
            status: 403,
            message: SWARM_MESSAGE,
        }),
        RequestKind::Build if enforces_removal(policy) && form_body => relay(Action::Refuse {
            status: 400,
            message: BUILD_FORM_MESSAGE,
        }),
        RequestKind::Build if policy == Policy::Collect => relay(Action::Retarget(
            build_target_labelled(&build_target_removing_intermediates(target), owner),
        )),
        RequestKind::Build if enforces_removal(policy) => relay(Action::Retarget(
            build_target_removing_intermediates(target),
        )),
        RequestKind::Commit if policy == Policy::Collect => {
            relay(Action::Retarget(commit_target_labelled(target, owner)))
        }
        RequestKind::ImageTag if policy == Policy::Collect => Plan {
            kind,
            action: Action::Relay,
            records: tag_reference(target),
        },
        _ => relay(Action::Relay),
    }
}

/// The build target with the image label `podmend.io/built-by-pod=<owner>` first in its
/// query, merged into the client's own `labels` (Go's `FormValue` reads the first value).
/// A client `labels` value that is not a JSON object of strings is left alone: the daemon
/// refuses that build anyway.
pub fn build_target_labelled(target: &str, owner: &str) -> String {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut labels = Map::new();
    if let Some(given) = first_query_value(query, "labels")
        && !given.is_empty()
    {
        match serde_json::from_str::<Map<String, Value>>(&given) {
            Ok(map) if map.values().all(Value::is_string) => labels = map,
            _ => return target.to_string(),
        }
    }
    labels.insert(
        IMAGE_OWNER_LABEL.to_string(),
        Value::String(owner.to_string()),
    );
    let encoded = query_escape(&Value::Object(labels).to_string());
    if query.is_empty() && !target.contains('?') {
        format!("{path}?labels={encoded}")
    } else {
        format!("{path}?labels={encoded}&{query}")
    }
}

/// The commit target with one more `changes` line: the image gets
/// `podmend.io/built-by-pod=<owner>`, and the container's own `podmend.io/owner-pod` and
/// `podmend.io/reap` labels, which the image would inherit and pass on to every container
/// made from it (outside any guard too), are blanked.
pub fn commit_target_labelled(target: &str, owner: &str) -> String {
    let quoted = |value: &str| {
        let escaped = value.replace('\\', "\\\\").replace('"', "\\\"");
        format!("\"{escaped}\"")
    };
    let change = format!(
        "LABEL {IMAGE_OWNER_LABEL}={} {OWNER_LABEL}=\"\" {REAP_LABEL}=\"\"",
        quoted(owner)
    );
    let separator = if target.contains('?') { "&" } else { "?" };
    format!("{target}{separator}changes={}", query_escape(&change))
}

/// The reference `POST /images/{name}/tag?repo=R&tag=T` creates: `R:T` (`latest` without a
/// tag), as the daemon reads the first value of each.
pub fn tag_reference(target: &str) -> Option<String> {
    let query = target.split_once('?')?.1;
    let repo = first_query_value(query, "repo").filter(|r| !r.is_empty())?;
    let tag = first_query_value(query, "tag").filter(|t| !t.is_empty());
    Some(format!("{repo}:{}", tag.as_deref().unwrap_or("latest")))
}

/// The first value of `key` in `query`, decoded as Go's `url.ParseQuery` does (`+` is a
/// space, `%XX` an escape); pairs whose key does not decode are skipped, as Go skips them.
pub fn first_query_value(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = go_query_unescape(k)?;
        (k == key).then(|| go_query_unescape(v)).flatten()
    })
}

/// Go's `url.QueryUnescape`: `None` on a malformed escape.
fn go_query_unescape(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let high = hex(*bytes.get(i + 1)?)?;
                let low = hex(*bytes.get(i + 2)?)?;
                out.push(high << 4 | low);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
pub fn query_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The request path as the guard judges it: a scheme and authority (as Go's server reads them)
/// dropped, query dropped, percent-decoded (until stable), lower case, `.`/`..` resolved,
/// duplicate and trailing slashes removed, and any `/vX.Y` API version prefix stripped.
pub fn normalise_path(target: &str) -> String {
    let mut path = strip_authority(target);
    if let Some(cut) = path.find(['?', '#']) {
        path = &path[..cut];
    }
    let mut decoded = path.to_string();
    for _ in 0..4 {
        let next = percent_decode(&decoded);
        if next == decoded {
            break;
        }
        decoded = next;
    }
    let lower = decoded.to_lowercase();
    let mut segments: Vec<&str> = Vec::new();
    for segment in lower.split(['/', '\\']) {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            other => segments.push(other),
        }
    }
    let start = segments
        .iter()
        .position(|s| !is_version_segment(s))
        .unwrap_or(segments.len());
    format!("/{}", segments[start..].join("/"))
}

/// `v1.41`, `v1`, `v1.` ...: Docker's router accepts `/v{version:[0-9.]+}`.
fn is_version_segment(segment: &str) -> bool {
    segment.strip_prefix('v').is_some_and(|rest| {
        !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit() || b == b'.')
    })
}

/// Drops a scheme and authority the way Go's `url.ParseRequestURI` does, so the guard judges
/// the path dockerd routes: `http://docker/containers/create` and also `http:/containers/create`
/// or `x:/v1.41/containers/create` (a scheme with no authority) are `/containers/create`.
/// A scheme is `[A-Za-z][A-Za-z0-9+.-]*` before the first `:`; an authority follows only as `//`.
fn strip_authority(target: &str) -> &str {
    let Some(colon) = target.find(':') else {
        return target;
    };
    let scheme = &target[..colon];
    let is_scheme = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !is_scheme {
        return target;
    }
    let rest = &target[colon + 1..];
    let Some(authority_and_path) = rest.strip_prefix("//") else {
        return rest;
    };
    match authority_and_path.find(['/', '?']) {
        Some(slash) => &authority_and_path[slash..],
        None => "/",
    }
}

/// Decodes `%XX` escapes; malformed escapes stay as they are.
pub fn percent_decode(input: &str) -> String {
    let bytes = input.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(high), Some(low)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push(high << 4 | low);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The `name` query parameter, decoded.
fn query_name(target: &str) -> Option<String> {
    let query = target.split_once('?')?.1;
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == "name" && !value.is_empty()).then(|| percent_decode(&value.replace('+', " ")))
    })
}

/// Decides one request: relays anything but a container create (and, under `collect`, a
/// network create); judges a create's body under `policy`, adds the owner label
/// `owner_pod_uid`, and returns the body to send.
pub fn decide(
    policy: Policy,
    owner_pod_uid: &str,
    method: &str,
    target: &str,
    body: &[u8],
) -> Outcome {
    match classify(method, target) {
        RequestKind::ContainerCreate => {}
        RequestKind::NetworkCreate if policy == Policy::Collect => {
            return match label_network(owner_pod_uid, body) {
                Ok(body) => Outcome::Network(body),
                Err(message) => Outcome::Invalid(format!(
                    "podmend guard: cannot judge the network create request: {message}"
                )),
            };
        }
        _ => return Outcome::PassThrough,
    }
    match decide_create(policy, owner_pod_uid, body) {
        Ok(mut verdict) => {
            verdict.name = query_name(target);
            Outcome::Create(verdict)
        }
        Err(message) => Outcome::Invalid(format!(
            "podmend guard: cannot judge the container create request: {message}"
        )),
    }
}

/// A network create body with the owner label added (the client's labels kept, a forged
/// owner label overwritten).
fn label_network(owner: &str, body: &[u8]) -> Result<Vec<u8>, String> {
    let mut config: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not valid JSON: {e}"))?;
    let Some(config) = config.as_object_mut() else {
        return Err("the body is not a JSON object".to_string());
    };
    canonicalise(config, "Labels")?;
    let mut labels = match config.get("Labels") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(labels)) => labels.clone(),
        Some(_) => return Err("Labels is not a JSON object".to_string()),
    };
    labels.insert(OWNER_LABEL.to_string(), Value::String(owner.to_string()));
    config.insert("Labels".to_string(), Value::Object(labels));
    serde_json::to_vec(config).map_err(|e| format!("cannot encode the body: {e}"))
}

fn decide_create(policy: Policy, owner: &str, body: &[u8]) -> Result<CreateVerdict, String> {
    let mut config: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not valid JSON: {e}"))?;
    let Some(config) = config.as_object_mut() else {
        return Err("the body is not a JSON object".to_string());
    };
    // Docker decodes with Go's encoding/json, which matches field names case-insensitively:
    // judge and send one canonical spelling, and refuse two spellings of one field.
    canonicalise(config, "Labels")?;
    canonicalise(config, "HostConfig")?;
    let image = config
        .iter()
        .find(|(k, _)| go_fold_eq(k, "Image"))
        .and_then(|(_, v)| v.as_str())
        .map(str::to_string);

    let auto_remove;
    let restart_policy;
    match config.get_mut("HostConfig") {
        None | Some(Value::Null) => {
            auto_remove = false;
            restart_policy = None;
        }
        Some(Value::Object(host)) => {
            canonicalise(host, "AutoRemove")?;
            canonicalise(host, "RestartPolicy")?;
            auto_remove = host.get("AutoRemove") == Some(&Value::Bool(true));
            restart_policy = match host.get_mut("RestartPolicy") {
                Some(Value::Object(restart)) => {
                    canonicalise(restart, "Name")?;
                    restart
                        .get("Name")
                        .and_then(Value::as_str)
                        .filter(|name| !name.is_empty() && *name != "no")
                        .map(str::to_string)
                }
                _ => None,
            };
        }
        Some(_) => return Err("HostConfig is not a JSON object".to_string()),
    }
    let labels = match config.get("Labels") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(labels)) => labels.clone(),
        Some(_) => return Err("Labels is not a JSON object".to_string()),
    };
    let compose = labels.contains_key(COMPOSE_PROJECT_LABEL);
    let exception = if restart_policy.is_some() {
        Some(Decision::RestartPolicy)
    } else if compose {
        Some(Decision::Compose)
    } else {
        None
    };

    let (decision, set_auto_remove, reap) = match (policy, auto_remove, exception) {
        (_, true, _) => (Decision::Rm, false, false),
        (Policy::Audit, false, _) => (Decision::Audit, false, false),
        // Compose containers stay until `docker compose down` or the pod's end.
        (Policy::Collect, false, Some(Decision::Compose)) => (Decision::Compose, false, true),
        (Policy::Collect, false, _) => (Decision::Collect, false, true),
        (Policy::Reap, false, _) => (Decision::Reap, false, true),
        (Policy::Rm | Policy::Deny, false, Some(exception)) => (exception, false, true),
        (Policy::Rm, false, None) => (Decision::Rm, true, false),
        (Policy::Deny, false, None) => {
            return Ok(CreateVerdict {
                decision: Decision::Deny,
                body: None,
                set_auto_remove: false,
                name: None,
                image,
            });
        }
    };

    if set_auto_remove {
        let host = config
            .entry("HostConfig")
            .or_insert_with(|| Value::Object(Map::new()));
        if host.is_null() {
            *host = Value::Object(Map::new());
        }
        if let Some(host) = host.as_object_mut() {
            host.insert("AutoRemove".to_string(), Value::Bool(true));
        }
    }
    let mut labels = labels;
    labels.insert(OWNER_LABEL.to_string(), Value::String(owner.to_string()));
    if reap {
        labels.insert(REAP_LABEL.to_string(), Value::String("true".to_string()));
    }
    config.insert("Labels".to_string(), Value::Object(labels));

    let body = serde_json::to_vec(config).map_err(|e| format!("cannot encode the body: {e}"))?;
    Ok(CreateVerdict {
        decision,
        body: Some(body),
        set_auto_remove,
        name: None,
        image,
    })
}

/// Go's encoding/json field-name match: ASCII case-insensitive, plus the two non-ASCII
/// letters that fold to ASCII ones (KELVIN SIGN to `k`, LATIN SMALL LETTER LONG S to `s`).
fn go_fold_eq(key: &str, field: &str) -> bool {
    let folded = key.chars().map(|c| match c {
        '\u{212A}' => 'k',
        '\u{017F}' => 's',
        c => c.to_ascii_lowercase(),
    });
    folded.eq(field.chars().map(|c| c.to_ascii_lowercase()))
}

/// Renames the one key of `object` that Go would decode into `field` to its canonical
/// spelling; two such keys are refused (Go would merge them in an order we cannot vouch for).
fn canonicalise(object: &mut Map<String, Value>, field: &str) -> Result<(), String> {
    let keys: Vec<String> = object
        .keys()
        .filter(|k| go_fold_eq(k, field))
        .cloned()
        .collect();
    match keys.as_slice() {
        [] => Ok(()),
        [key] if key == field => Ok(()),
        [key] => {
            if let Some(value) = object.shift_remove(key) {
                object.insert(field.to_string(), value);
            }
            Ok(())
        }
        _ => Err(format!(
            "the field {field} is given more than once ({})",
            keys.join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const UID: &str = "0f7a1c2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";

    fn create(policy: Policy, body: Value) -> CreateVerdict {
        match decide(
            policy,
            UID,
            "POST",
            "/v1.41/containers/create?name=ci-job",
            body.to_string().as_bytes(),
        ) {
            Outcome::Create(verdict) => verdict,
            other => panic!("not a create verdict: {other:?}"),
        }
    }

    fn sent(verdict: &CreateVerdict) -> Value {
        serde_json::from_slice(verdict.body.as_ref().expect("forwarded")).unwrap()
    }

    #[test]
    fn create_paths_are_recognised_however_they_are_spelled() {
        let creates = [
            "/containers/create",
            "/v1.41/containers/create",
            "/V1.41/Containers/Create",
            "//containers//create/",
            "/containers%2Fcreate",
            "/containers%2fcreate",
            "/containers%252Fcreate",
            "/v1.41/containers/create?name=x",
            "/v1.41/containers/create/?name=x&platform=linux",
            "/v1/containers/create",
            "/v1.41//containers/./create",
            "/containers/x/../create",
            "/%63ontainers/create",
            "http://docker/v1.41/containers/create",
            "HTTP://api.moby.localhost/containers/create?name=y",
            "/v1.41/v1.40/containers/create",
        ];
        for target in creates {
            assert!(is_container_create("POST", target), "{target}");
            assert!(is_container_create("post", target), "{target}");
        }
        let others = [
            ("GET", "/containers/create"),
            ("POST", "/containers/json"),
            ("POST", "/containers/abc/start"),
            ("POST", "/containers/create-x"),
            ("POST", "/containers/createx"),
            ("POST", "/x/containers/create"),
            ("POST", "/version/containers/create"),
            ("POST", "/containers"),
            ("POST", "/containers/create%3Fname=x/more"),
            ("HEAD", "/_ping"),
        ];
        for (method, target) in others {
            assert!(!is_container_create(method, target), "{method} {target}");
        }
    }

    #[test]
    fn a_scheme_without_an_authority_is_dropped_as_go_does() {
        // Go's url.ParseRequestURI keeps the path after `scheme:`, so dockerd 20.10 creates a
        // container for `http:/containers/create`: relayed unjudged before. (The opaque
        // `http:containers/create` it redirects; judging it too costs nothing.)
        for target in [
            "http:/containers/create",
            "HTTP:/containers/create",
            "x:/v1.41/containers/create",
            "v1.41:/containers/create?name=y",
            "a+b.c-d:/containers/create",
            "http:///containers/create",
            "http:containers/create",
        ] {
            assert!(is_container_create("POST", target), "{target}");
        }
        for target in [
            "/x?y=http://docker/containers/create",
            "/x:/containers/create",
            "http://docker?/containers/create",
            "1x:/containers/create/more",
        ] {
            assert!(!is_container_create("POST", target), "{target}");
        }
    }

    #[test]
    fn swarm_requests_are_recognised_however_they_are_spelled() {
        let swarm = [
            "/swarm/init",
            "/v1.41/swarm/init",
            "/V1.41/SWARM/Init",
            "//swarm//join/",
            "/swarm%2Fjoin",
            "/swarm%252Finit",
            "/%73warm/init?x=1",
            "http://docker/v1.41/services/create",
            "x:/services/create",
            "/v1.41/services/create?name=x",
            "/services/abc123/update?version=12",
            "/v1.41/Services/ABC/Update",
            "/services/a%2Fb/update",
            "/services/create/update",
            "/services/./x/../y/update",
        ];
        for target in swarm {
            assert!(is_swarm_request("POST", target), "{target}");
            assert!(is_swarm_request("post", target), "{target}");
            assert!(!is_container_create("POST", target), "{target}");
        }
        let others = [
            ("GET", "/swarm"),
            ("POST", "/swarm/leave"),
            ("POST", "/swarm/update"),
            ("POST", "/swarm/unlock"),
            ("GET", "/swarm/init"),
            ("GET", "/services"),
            ("DELETE", "/services/abc"),
            ("POST", "/services/update"),
            ("POST", "/services//update"),
            ("POST", "/services/abc/updates"),
            ("POST", "/x/services/create"),
            ("POST", "/services/create-x"),
            ("POST", "/containers/create"),
        ];
        for (method, target) in others {
            assert!(!is_swarm_request(method, target), "{method} {target}");
        }
    }

    #[test]
    fn swarm_requests_are_refused_under_every_policy_but_audit() {
        assert!(enforces_removal(Policy::Rm));
        assert!(enforces_removal(Policy::Deny));
        assert!(enforces_removal(Policy::Reap));
        assert!(!enforces_removal(Policy::Audit));
        for needle in [
            "swarm",
            "cannot label or remove",
            "podmend.io/dind-policy",
            "audit",
        ] {
            assert!(SWARM_MESSAGE.contains(needle), "{needle}");
        }
    }

    #[test]
    fn builds_get_rm_and_forcerm_first_in_their_query() {
        for (target, expected) in [
            ("/v1.41/build", "/v1.41/build?rm=1&forcerm=1"),
            ("/build?t=x&rm=0", "/build?rm=1&forcerm=1&t=x&rm=0"),
            ("/build?", "/build?rm=1&forcerm=1&"),
            (
                "http://docker/build?r%6D=0&forcerm=0",
                "http://docker/build?rm=1&forcerm=1&r%6D=0&forcerm=0",
            ),
            ("/build?a=1?rm=0", "/build?rm=1&forcerm=1&a=1?rm=0"),
        ] {
            assert!(is_build("POST", target), "{target}");
            assert_eq!(build_target_removing_intermediates(target), expected);
        }
        for target in ["/BUILD", "/v1.41//build/", "/%62uild", "x:/build"] {
            assert!(is_build("post", target), "{target}");
        }
        for (method, target) in [
            ("POST", "/build/prune"),
            ("POST", "/build/cancel"),
            ("GET", "/build"),
            ("POST", "/builds"),
        ] {
            assert!(!is_build(method, target), "{method} {target}");
        }
    }

    #[test]
    fn form_content_types_are_recognised_leniently() {
        for value in [
            &b"application/x-www-form-urlencoded"[..],
            b"Application/X-WWW-Form-Urlencoded; charset=utf-8",
            b" multipart/form-data; boundary=x",
            b"MULTIPART/FORM-DATA",
        ] {
            assert!(is_form_content_type(value), "{value:?}");
        }
        for value in [
            &b"application/x-tar"[..],
            b"application/octet-stream",
            b"",
            b"application/x-tar; name=form",
        ] {
            assert!(!is_form_content_type(value), "{value:?}");
        }
    }

    #[test]
    fn normalised_paths_drop_versions_queries_and_case() {
        assert_eq!(
            normalise_path("/V1.41/Containers/ABC/Json?all=1"),
            "/containers/abc/json"
        );
        assert_eq!(normalise_path("/"), "/");
        assert_eq!(normalise_path("/v1.41"), "/");
        assert_eq!(normalise_path("/_ping"), "/_ping");
        assert_eq!(normalise_path("/a%zz/b"), "/a%zz/b");
    }

    #[test]
    fn the_decision_table_covers_every_policy_and_exception() {
        let plain = json!({"Image": "busybox", "HostConfig": {}});
        let with_rm = json!({"Image": "busybox", "HostConfig": {"AutoRemove": true}});
        let restart =
            json!({"Image": "busybox", "HostConfig": {"RestartPolicy": {"Name": "always"}}});
        let restart_no =
            json!({"Image": "busybox", "HostConfig": {"RestartPolicy": {"Name": "no"}}});
        let compose = json!({"Image": "busybox", "Labels": {"com.docker.compose.project": "ci"}});
        // (policy, body, decision, AutoRemove sent, reap label)
        let table = [
            (Policy::Rm, &plain, Decision::Rm, true, false),
            (Policy::Rm, &with_rm, Decision::Rm, true, false),
            (Policy::Rm, &restart, Decision::RestartPolicy, false, true),
            (Policy::Rm, &restart_no, Decision::Rm, true, false),
            (Policy::Rm, &compose, Decision::Compose, false, true),
            (Policy::Deny, &with_rm, Decision::Rm, true, false),
            (Policy::Deny, &restart, Decision::RestartPolicy, false, true),
            (Policy::Deny, &compose, Decision::Compose, false, true),
            (Policy::Reap, &plain, Decision::Reap, false, true),
            (Policy::Reap, &restart, Decision::Reap, false, true),
            (Policy::Reap, &with_rm, Decision::Rm, true, false),
            (Policy::Audit, &plain, Decision::Audit, false, false),
            (Policy::Audit, &restart, Decision::Audit, false, false),
            (Policy::Audit, &with_rm, Decision::Rm, true, false),
            (Policy::Collect, &plain, Decision::Collect, false, true),
            (Policy::Collect, &restart, Decision::Collect, false, true),
            (Policy::Collect, &restart_no, Decision::Collect, false, true),
            (Policy::Collect, &compose, Decision::Compose, false, true),
            (Policy::Collect, &with_rm, Decision::Rm, true, false),
        ];
        for (policy, body, decision, auto_remove, reap) in table {
            let verdict = create(policy, body.clone());
            assert_eq!(verdict.decision, decision, "{policy} {body}");
            let sent = sent(&verdict);
            assert_eq!(
                sent.pointer("/HostConfig/AutoRemove") == Some(&json!(true)),
                auto_remove,
                "{policy} {body} -> {sent}"
            );
            assert_eq!(sent["Labels"][OWNER_LABEL], json!(UID), "{sent}");
            assert_eq!(
                sent["Labels"].get(REAP_LABEL).is_some(),
                reap,
                "{policy} {body} -> {sent}"
            );
            assert_eq!(verdict.name.as_deref(), Some("ci-job"));
            assert_eq!(verdict.image.as_deref(), Some("busybox"));
        }
    }

    #[test]
    fn deny_refuses_a_create_without_rm() {
        for body in [
            json!({"Image": "busybox"}),
            json!({"Image": "busybox", "HostConfig": null}),
            json!({"Image": "busybox", "HostConfig": {"AutoRemove": false}}),
        ] {
            let verdict = create(Policy::Deny, body);
            assert_eq!(verdict.decision, Decision::Deny);
            assert!(verdict.refused());
        }
    }

    #[test]
    fn rm_creates_host_config_and_labels_when_absent_or_null() {
        for body in [
            json!({"Image": "busybox"}),
            json!({"Image": "busybox", "HostConfig": null, "Labels": null}),
        ] {
            let sent = sent(&create(Policy::Rm, body));
            assert_eq!(sent["HostConfig"], json!({"AutoRemove": true}));
            assert_eq!(sent["Labels"], json!({OWNER_LABEL: UID}));
        }
    }

    #[test]
    fn unknown_fields_and_order_survive_the_rewrite() {
        let body = r#"{"Hostname":"","Image":"busybox","Cmd":["true"],"HostConfig":{"Binds":null,"NetworkMode":"none","AutoRemove":false,"Future":{"x":1}},"Labels":{"a":"b"},"Zeta":1}"#;
        let Outcome::Create(verdict) = decide(
            Policy::Rm,
            UID,
            "POST",
            "/containers/create",
            body.as_bytes(),
        ) else {
            panic!("not a create");
        };
        let sent = String::from_utf8(verdict.body.unwrap()).unwrap();
        assert_eq!(
            sent,
            format!(
                r#"{{"Hostname":"","Image":"busybox","Cmd":["true"],"HostConfig":{{"Binds":null,"NetworkMode":"none","AutoRemove":true,"Future":{{"x":1}}}},"Labels":{{"a":"b","{OWNER_LABEL}":"{UID}"}},"Zeta":1}}"#
            )
        );
    }

    #[test]
    fn a_forged_owner_label_is_overwritten() {
        let sent = sent(&create(
            Policy::Audit,
            json!({"Image": "busybox", "Labels": {OWNER_LABEL: "someone-else"}}),
        ));
        assert_eq!(sent["Labels"][OWNER_LABEL], json!(UID));
    }

    #[test]
    fn go_style_field_spellings_are_judged_as_docker_reads_them() {
        // Go matches field names case-insensitively: one spelling is renamed and judged.
        let verdict = create(
            Policy::Deny,
            json!({"Image": "busybox", "hostconfig": {"autoremove": true}}),
        );
        assert_eq!(verdict.decision, Decision::Rm);
        assert_eq!(sent(&verdict)["HostConfig"], json!({"AutoRemove": true}));

        let verdict = create(
            Policy::Rm,
            json!({"Image": "busybox", "hostConfig": {"restartpolicy": {"name": "always"}}}),
        );
        assert_eq!(verdict.decision, Decision::RestartPolicy);

        let verdict = create(
            Policy::Rm,
            json!({"Image": "busybox", "Label\u{017F}": {"com.docker.compose.project": "p"}}),
        );
        assert_eq!(verdict.decision, Decision::Compose, "LONG S folds to s");

        let verdict = create(
            Policy::Audit,
            json!({"Image": "busybox", "labels": {"a": "b"}}),
        );
        let sent = sent(&verdict);
        assert_eq!(sent["Labels"], json!({"a": "b", OWNER_LABEL: UID}));
        assert!(sent.get("labels").is_none());
    }

    #[test]
    fn two_spellings_of_one_field_are_refused_as_invalid() {
        let bodies = [
            r#"{"Image":"busybox","HostConfig":{"AutoRemove":true},"hostconfig":{"AutoRemove":false}}"#,
            r#"{"Image":"busybox","HostConfig":{"AutoRemove":true,"autoRemove":false}}"#,
            r#"{"Image":"busybox","Labels":{},"LABELS":{}}"#,
        ];
        for body in bodies {
            let outcome = decide(
                Policy::Deny,
                UID,
                "POST",
                "/containers/create",
                body.as_bytes(),
            );
            assert!(
                matches!(&outcome, Outcome::Invalid(m) if m.contains("more than once")),
                "{body}: {outcome:?}"
            );
        }
    }

    #[test]
    fn bodies_that_cannot_be_judged_are_invalid() {
        for body in [
            &b""[..],
            b"not json",
            b"[]",
            br#"{"Image":"busybox"} trailing"#,
            br#"{"HostConfig":[]}"#,
            br#"{"Labels":"x"}"#,
        ] {
            let outcome = decide(Policy::Rm, UID, "POST", "/containers/create", body);
            assert!(
                matches!(outcome, Outcome::Invalid(_)),
                "{body:?}: {outcome:?}"
            );
        }
    }

    #[test]
    fn other_requests_pass_through_whatever_their_body() {
        assert_eq!(
            decide(
                Policy::Deny,
                UID,
                "POST",
                "/v1.41/containers/abc/start",
                b"garbage"
            ),
            Outcome::PassThrough
        );
        assert_eq!(
            decide(Policy::Deny, UID, "GET", "/v1.41/containers/create", b""),
            Outcome::PassThrough
        );
    }

    #[test]
    fn the_query_name_is_decoded() {
        assert_eq!(
            query_name("/containers/create?name=a%2Db&x=1").as_deref(),
            Some("a-b")
        );
        assert_eq!(query_name("/containers/create?x=1").as_deref(), None);
    }

    const TAG: &str = "/v1.41/images/busybox:latest/tag?repo=ci%2Fapp&tag=B1";

    /// One request of each kind, as the docker CLI sends it.
    fn request_of(kind: RequestKind) -> (&'static str, &'static str) {
        match kind {
            RequestKind::ContainerCreate => ("POST", "/v1.41/containers/create?name=x"),
            RequestKind::NetworkCreate => ("POST", "/v1.41/networks/create"),
            RequestKind::Build => (
                "POST",
                "/v1.41/build?t=app%3A1&labels=%7B%22a%22%3A%22b%22%7D",
            ),
            RequestKind::Swarm => ("POST", "/v1.41/swarm/init"),
            RequestKind::ImageTag => ("POST", TAG),
            RequestKind::Commit => ("POST", "/v1.41/commit?container=b&repo=img&tag=1"),
            RequestKind::Other => ("GET", "/v1.41/containers/json"),
        }
    }

    #[test]
    fn every_policy_has_a_plan_for_every_request_kind() {
        let labelled_build = format!(
            "/v1.41/build?labels={}&rm=1&forcerm=1&t=app%3A1&labels=%7B%22a%22%3A%22b%22%7D",
            query_escape(&format!(r#"{{"a":"b","{IMAGE_OWNER_LABEL}":"{UID}"}}"#))
        );
        let plain_build = "/v1.41/build?rm=1&forcerm=1&t=app%3A1&labels=%7B%22a%22%3A%22b%22%7D";
        let labelled_commit = format!(
            "/v1.41/commit?container=b&repo=img&tag=1&changes={}",
            query_escape(&format!(
                r#"LABEL {IMAGE_OWNER_LABEL}="{UID}" {OWNER_LABEL}="" {REAP_LABEL}="""#
            ))
        );
        let swarm = Action::Refuse {
            status: 403,
            message: SWARM_MESSAGE,
        };
        use Action::{JudgeBody, Relay, Retarget};
        use RequestKind::*;
        // (policy, kind) -> (action, recorded reference)
        let expected = |policy: Policy, kind: RequestKind| -> (Action, Option<&str>) {
            match (policy, kind) {
                (_, ContainerCreate) => (JudgeBody, None),
                (Policy::Collect, NetworkCreate) => (JudgeBody, None),
                (_, NetworkCreate) => (Relay, None),
                (Policy::Collect, Build) => (Retarget(labelled_build.clone()), None),
                (Policy::Audit, Build) => (Relay, None),
                (_, Build) => (Retarget(plain_build.to_string()), None),
                (Policy::Audit, Swarm) => (Relay, None),
                (_, Swarm) => (swarm.clone(), None),
                (Policy::Collect, ImageTag) => (Relay, Some("ci/app:B1")),
                (_, ImageTag) => (Relay, None),
                (Policy::Collect, Commit) => (Retarget(labelled_commit.clone()), None),
                (_, Commit) => (Relay, None),
                (_, Other) => (Relay, None),
            }
        };
        for policy in Policy::ALL {
            for kind in RequestKind::ALL {
                let (method, target) = request_of(kind);
                assert_eq!(classify(method, target), kind, "{target}");
                let plan = plan(policy, UID, method, target, false);
                let (action, records) = expected(policy, kind);
                assert_eq!(plan.kind, kind);
                assert_eq!(plan.action, action, "{policy} {kind:?}");
                assert_eq!(plan.records.as_deref(), records, "{policy} {kind:?}");
            }
        }
    }

    #[test]
    fn a_build_with_a_form_body_is_refused_under_every_policy_but_audit() {
        let (method, target) = request_of(RequestKind::Build);
        for policy in Policy::ALL {
            let action = plan(policy, UID, method, target, true).action;
            if policy == Policy::Audit {
                assert_eq!(action, Action::Relay);
            } else {
                assert_eq!(
                    action,
                    Action::Refuse {
                        status: 400,
                        message: BUILD_FORM_MESSAGE
                    },
                    "{policy}"
                );
            }
        }
    }

    #[test]
    fn build_labels_are_merged_with_the_clients_and_read_first() {
        let owner = |target: &str| -> Value {
            let query = target.split_once('?').unwrap().1;
            serde_json::from_str(&first_query_value(query, "labels").unwrap()).unwrap()
        };
        assert_eq!(
            owner(&build_target_labelled("/build", UID)),
            json!({IMAGE_OWNER_LABEL: UID})
        );
        // A forged owner is overwritten; the client's other labels stay, in order.
        let forged = format!(
            "/build?labels={}",
            query_escape(&format!(r#"{{"z":"1","{IMAGE_OWNER_LABEL}":"x","a":"2"}}"#))
        );
        let labelled = build_target_labelled(&forged, UID);
        assert_eq!(
            owner(&labelled).to_string(),
            format!(r#"{{"z":"1","{IMAGE_OWNER_LABEL}":"{UID}","a":"2"}}"#)
        );
        // A `+` is a space and `%6Cabels` is `labels`, as Go reads them.
        let spelled = "/build?%6Cabels=%7B%22k%22:%22a+b%22%7D";
        assert_eq!(
            owner(&build_target_labelled(spelled, UID)),
            json!({"k": "a b", IMAGE_OWNER_LABEL: UID})
        );
        // Labels the daemon would refuse are left for it to refuse.
        for target in ["/build?labels=nope", "/build?labels=%7B%22k%22:1%7D"] {
            assert_eq!(build_target_labelled(target, UID), target);
        }
    }

    #[test]
    fn tag_references_default_to_latest_and_need_a_repository() {
        for (target, reference) in [
            (TAG, Some("ci/app:B1")),
            ("/images/abc/tag?repo=x", Some("x:latest")),
            ("/images/abc/tag?tag=1&repo=r%2Fs&repo=t", Some("r/s:1")),
            ("/images/abc/tag?tag=1", None),
            ("/images/abc/tag", None),
        ] {
            assert_eq!(tag_reference(target).as_deref(), reference, "{target}");
        }
        for (method, target) in [
            ("POST", "/images/a/b/tag?repo=x"),
            ("POST", "/V1.41/Images/a%2Fb/Tag"),
        ] {
            assert_eq!(classify(method, target), RequestKind::ImageTag, "{target}");
        }
        for (method, target) in [
            ("POST", "/images/tag"),
            ("GET", "/images/a/tag"),
            ("POST", "/images/a/push"),
            ("POST", "/images//tag"),
        ] {
            assert_eq!(classify(method, target), RequestKind::Other, "{target}");
        }
    }

    #[test]
    fn network_creates_get_the_owner_label_under_collect_only() {
        let body =
            br#"{"Name":"ci","labels":{"a":"b","podmend.io/owner-pod":"x"},"Driver":"bridge"}"#;
        let Outcome::Network(sent) =
            decide(Policy::Collect, UID, "POST", "/v1.41/networks/create", body)
        else {
            panic!("not labelled");
        };
        let sent: Value = serde_json::from_slice(&sent).unwrap();
        assert_eq!(
            sent,
            json!({"Name": "ci", "Labels": {"a": "b", OWNER_LABEL: UID}, "Driver": "bridge"})
        );
        for policy in [Policy::Rm, Policy::Deny, Policy::Reap, Policy::Audit] {
            assert_eq!(
                decide(policy, UID, "POST", "/networks/create", body),
                Outcome::PassThrough
            );
        }
        assert!(matches!(
            decide(Policy::Collect, UID, "POST", "/networks/create", b"[]"),
            Outcome::Invalid(_)
        ));
    }
}
