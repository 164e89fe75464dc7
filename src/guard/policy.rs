//! The guard's policy as one pure function, [`verdict`]: which requests are container or
//! network creates, swarm requests, builds, tags or commits (on the *normalised* path, so
//! spelling tricks do not bypass it) and what each gets under each policy: forwarded,
//! rewritten (target or body) or refused, with the reason ([`GuardVerdict`]). A create is
//! asked about twice: without its body (the answer is [`Action::ReadBody`]), then with it.
//! No I/O: the proxy asks, this module answers.

use std::fmt;

use serde_json::{Map, Value};

pub use crate::dind::{IMAGE_OWNER_LABEL, OWNER_LABEL, Policy};
/// Containers the guard could not make `--rm` are labelled `podmend.io/reap=true`.
pub const REAP_LABEL: &str = "podmend.io/reap";
/// `docker compose` labels its containers with their project.
pub const COMPOSE_PROJECT_LABEL: &str = "com.docker.compose.project";
/// The largest create body the guard reads to judge. dockerd sets no limit of its own (it
/// decodes the body with a `json.Decoder` on the request stream); creates are a few KiB of
/// JSON, and a large `--env-file` makes a few MiB, so this only bounds the memory one
/// connection can hold.
pub const MAX_CREATE_BODY: usize = 64 << 20;

/// What `deny` answers, and the docker CLI prints.
pub const DENY_MESSAGE: &str = "podmend: containers must be run with --rm on this CI runner (docker run --rm ...); ask the cluster admin to set the pod annotation podmend.io/dind-policy to reap or audit to allow it";

/// What became of one container create; the `decision` label of the creates metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CreateDecision {
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

impl CreateDecision {
    pub const ALL: [CreateDecision; 7] = [
        CreateDecision::Rm,
        CreateDecision::Collect,
        CreateDecision::Deny,
        CreateDecision::Reap,
        CreateDecision::Audit,
        CreateDecision::RestartPolicy,
        CreateDecision::Compose,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CreateDecision::Rm => "rm",
            CreateDecision::Collect => "collect",
            CreateDecision::Deny => "deny",
            CreateDecision::Reap => "reap",
            CreateDecision::Audit => "audit",
            CreateDecision::RestartPolicy => "restart-policy",
            CreateDecision::Compose => "compose",
        }
    }
}

impl fmt::Display for CreateDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the guard does with one request, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardVerdict {
    pub kind: RequestKind,
    pub action: Action,
    /// For a container create judged on its body: what became of it (logged and counted),
    /// refused or not.
    pub create: Option<CreateVerdict>,
    /// An image reference this request gives a name to, which the pod removes when it ends
    /// if the daemon answers with success (policy `collect`: `docker tag`).
    pub records: Option<String>,
    /// The named volumes a container create binds (`-v NAME:/path`), which the daemon would
    /// create unlabelled: the guard creates each one that does not exist yet, labelled with
    /// the owner pod, before it forwards the create.
    pub volumes: Vec<NamedVolume>,
}

/// A named volume a container create binds, and the driver the daemon would create it with
/// (`HostConfig.VolumeDriver`; empty: the daemon's default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedVolume {
    pub name: String,
    pub driver: String,
}

/// What the proxy does with a request before the daemon sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Read the body (at most [`MAX_CREATE_BODY`]) and ask [`verdict`] again with it.
    ReadBody,
    /// Forward it as sent.
    Forward,
    /// Forward it with this request-target instead.
    RewriteTarget(String),
    /// Forward it with this body instead (its framing set to match).
    RewriteBody(Vec<u8>),
    /// Answer the client; the daemon never sees the request.
    Refuse(Refusal),
}

/// Why a request is refused: each reason has its status and the message the client prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Swarm mode or a swarm service, under every policy but `audit`: 403.
    Swarm,
    /// A build whose body is a form, under every policy but `audit`: 400.
    BuildForm,
    /// A container create without `--rm` under policy `deny`: 403.
    NoRm,
    /// A create while the pod shuts down: nothing may be created behind the clean-up: 503.
    ShuttingDown,
    /// A create body the guard cannot judge (not JSON, a field given twice, ...): 400 with
    /// this message.
    Unjudgeable(String),
    /// A bind of the daemon's own socket where the guard has no socket of its own to give
    /// instead: 403 with this message.
    SocketBind(String),
}

impl Refusal {
    pub fn status(&self) -> u16 {
        match self {
            Refusal::Swarm | Refusal::NoRm | Refusal::SocketBind(_) => 403,
            Refusal::BuildForm | Refusal::Unjudgeable(_) => 400,
            Refusal::ShuttingDown => 503,
        }
    }

    /// The `message` of the JSON answer, as the daemon's errors look.
    pub fn message(&self) -> &str {
        match self {
            Refusal::Swarm => SWARM_MESSAGE,
            Refusal::BuildForm => BUILD_FORM_MESSAGE,
            Refusal::NoRm => DENY_MESSAGE,
            Refusal::ShuttingDown => SHUTTING_DOWN_MESSAGE,
            Refusal::Unjudgeable(message) | Refusal::SocketBind(message) => message,
        }
    }
}

/// What a create gets while the pod shuts down.
pub const SHUTTING_DOWN_MESSAGE: &str =
    "podmend guard: the pod is shutting down; no new containers";

/// The verdict on one container create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateVerdict {
    pub decision: CreateDecision,
    /// Whether the guard set `AutoRemove` itself.
    pub set_auto_remove: bool,
    /// `?name=` of the request, if given.
    pub name: Option<String>,
    /// `Image` of the body, if given.
    pub image: Option<String>,
}

impl CreateVerdict {
    pub fn refused(&self) -> bool {
        self.decision == CreateDecision::Deny
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

/// Whether `method target` opens a connection to the daemon's BuildKit (`POST /grpc`, which
/// buildx's `docker` driver hijacks for HTTP/2), on [`normalise_path`].
pub fn is_buildkit_grpc(method: &str, target: &str) -> bool {
    method.eq_ignore_ascii_case("POST") && normalise_path(target) == "/grpc"
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
    /// `POST /volumes/create`.
    VolumeCreate,
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
    pub const ALL: [RequestKind; 8] = [
        RequestKind::ContainerCreate,
        RequestKind::NetworkCreate,
        RequestKind::VolumeCreate,
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
        "/volumes/create" => RequestKind::VolumeCreate,
        "/build" => RequestKind::Build,
        "/commit" => RequestKind::Commit,
        _ if path.starts_with("/images/") && path.ends_with("/tag") && path.len() > 12 => {
            RequestKind::ImageTag
        }
        _ => RequestKind::Other,
    }
}

/// One request as the policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuardRequest<'a> {
    pub method: &'a str,
    pub target: &'a str,
    /// Whether its `Content-Type` is a form ([`is_form_content_type`]): only builds care.
    pub form_body: bool,
    /// Its body, once read (the verdict asked for it with [`Action::ReadBody`]).
    pub body: Option<&'a [u8]>,
}

/// Binds of the daemon's own socket into a container, which would hand the container the
/// daemon without the guard (Testcontainers' Ryuk, `docker run -v
/// /var/run/docker.sock:/var/run/docker.sock`, Jenkins' `.inside`). The daemon resolves a bind
/// source in its own filesystem: `daemon` are the paths at which it finds its own socket there,
/// `guard` the path at which it finds this guard's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SocketBinds {
    pub daemon: Vec<String>,
    /// Binds of a `daemon` path are rewritten to this one; without it, refused.
    pub guard: Option<String>,
}

impl SocketBinds {
    /// What a bind of `source` becomes: `None` when it is no daemon socket, else the guard's
    /// path, or `Err` when there is none to give.
    fn rewrite(&self, source: &str) -> Option<Result<String, Refusal>> {
        let source = normalise_path_text(source);
        let reaches_daemon = self.daemon.iter().any(|daemon| {
            let daemon = normalise_path_text(daemon);
            daemon == source || run_alias(&daemon) == source
        });
        if !reaches_daemon {
            return None;
        }
        Some(match &self.guard {
            Some(guard) if normalise_path_text(guard) == source => return None,
            Some(guard) => Ok(guard.clone()),
            None => Err(Refusal::SocketBind(format!(
                "podmend guard: a container may not bind the Docker daemon's socket ({source}): it would reach the daemon without the guard, and nothing it created would be cleaned up; this pod's guard has no socket the daemon can bind instead; ask the cluster admin"
            ))),
        })
    }
}

/// A path with `.`, `..`, repeated and trailing slashes resolved, as the daemon's bind source
/// is cleaned (Go's `filepath.Clean`).
fn normalise_path_text(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            other => segments.push(other),
        }
    }
    format!("/{}", segments.join("/"))
}

/// `/var/run/X` for `/run/X` and back: one directory on every distribution that has both.
fn run_alias(path: &str) -> String {
    match (path.strip_prefix("/var/run/"), path.strip_prefix("/run/")) {
        (Some(rest), _) => format!("/run/{rest}"),
        (_, Some(rest)) => format!("/var/run/{rest}"),
        _ => path.to_string(),
    }
}

/// The guard's verdict on one request under `policy` for the pod `owner`, with no socket
/// binds to rewrite ([`verdict_with`]).
pub fn verdict(
    policy: Policy,
    owner: &str,
    shutting_down: bool,
    request: &GuardRequest<'_>,
) -> GuardVerdict {
    verdict_with(
        policy,
        owner,
        &SocketBinds::default(),
        shutting_down,
        request,
    )
}

/// The guard's verdict on one request under `policy` for the pod `owner`, the whole policy
/// table in one place. `shutting_down` says the pod's clean-up has begun: creates are
/// refused from then on. Container, network and volume creates are judged on their body:
/// asked without it, the answer is [`Action::ReadBody`]. A container create's binds of the
/// daemon's socket are rewritten to the guard's by `binds`.
pub fn verdict_with(
    policy: Policy,
    owner: &str,
    binds: &SocketBinds,
    shutting_down: bool,
    request: &GuardRequest<'_>,
) -> GuardVerdict {
    let kind = classify(request.method, request.target);
    let verdict = |action| GuardVerdict {
        kind,
        action,
        create: None,
        records: None,
        volumes: Vec::new(),
    };
    let target = request.target;
    match kind {
        RequestKind::ContainerCreate | RequestKind::NetworkCreate | RequestKind::VolumeCreate => {
            match request.body {
                _ if shutting_down => verdict(Action::Refuse(Refusal::ShuttingDown)),
                None => verdict(Action::ReadBody),
                Some(body) if kind == RequestKind::ContainerCreate => {
                    judge_container_create(policy, owner, binds, target, body)
                }
                Some(body) => verdict(judge_labelled_create(kind, owner, body)),
            }
        }
        RequestKind::Swarm if enforces_removal(policy) => verdict(Action::Refuse(Refusal::Swarm)),
        RequestKind::Build if enforces_removal(policy) && request.form_body => {
            verdict(Action::Refuse(Refusal::BuildForm))
        }
        RequestKind::Build if policy == Policy::Collect => verdict(Action::RewriteTarget(
            build_target_labelled(&build_target_removing_intermediates(target), owner),
        )),
        RequestKind::Build if enforces_removal(policy) => verdict(Action::RewriteTarget(
            build_target_removing_intermediates(target),
        )),
        RequestKind::Commit if policy == Policy::Collect => {
            verdict(Action::RewriteTarget(commit_target_labelled(target, owner)))
        }
        RequestKind::ImageTag if policy == Policy::Collect => GuardVerdict {
            records: tag_reference(target),
            ..verdict(Action::Forward)
        },
        _ => verdict(Action::Forward),
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

/// The verdict on a container create's `body`: the owner label added, `AutoRemove` set or
/// the reap label added as the policy says, or refused.
fn judge_container_create(
    policy: Policy,
    owner: &str,
    binds: &SocketBinds,
    target: &str,
    body: &[u8],
) -> GuardVerdict {
    let decided = if holds_no_json(body) {
        Err(None)
    } else {
        decide_create(policy, owner, binds, body).map_err(Some)
    };
    let (action, create, volumes) = match decided {
        Ok((mut create, sent, volumes)) => {
            create.name = query_name(target);
            match sent {
                Some(body) => (Action::RewriteBody(body), Some(create), volumes),
                None => (Action::Refuse(Refusal::NoRm), Some(create), Vec::new()),
            }
        }
        // Nothing to create from: the daemon answers it.
        Err(None) => (Action::Forward, None, Vec::new()),
        Err(Some(CreateError::Refused(refusal))) => (Action::Refuse(refusal), None, Vec::new()),
        Err(Some(CreateError::Unjudgeable(message))) => (
            Action::Refuse(Refusal::Unjudgeable(format!(
                "podmend guard: cannot judge the container create request: {message}"
            ))),
            None,
            Vec::new(),
        ),
    };
    GuardVerdict {
        kind: RequestKind::ContainerCreate,
        action,
        create,
        records: None,
        volumes,
    }
}

/// The action for a network or volume create's `body`: the owner label added.
fn judge_labelled_create(kind: RequestKind, owner: &str, body: &[u8]) -> Action {
    let what = if kind == RequestKind::VolumeCreate {
        "volume"
    } else {
        "network"
    };
    if holds_no_json(body) {
        // Nothing to create from: the daemon answers it.
        return Action::Forward;
    }
    match label_object(owner, body) {
        Ok(body) => Action::RewriteBody(body),
        Err(message) => Action::Refuse(Refusal::Unjudgeable(format!(
            "podmend guard: cannot judge the {what} create request: {message}"
        ))),
    }
}

/// A network or volume create body with the owner label added (the client's labels kept, a
/// forged owner label overwritten).
fn label_object(owner: &str, body: &[u8]) -> Result<Vec<u8>, String> {
    let JsonBody {
        object: mut config,
        rest,
    } = json_object(body)?;
    canonicalise(&mut config, "Labels")?;
    let mut labels = labels_of(&config)?;
    labels.insert(OWNER_LABEL.to_string(), Value::String(owner.to_string()));
    config.insert("Labels".to_string(), Value::Object(labels));
    let mut sent =
        serde_json::to_vec(&config).map_err(|e| format!("cannot encode the body: {e}"))?;
    sent.extend_from_slice(rest.as_bytes());
    Ok(sent)
}

/// A request body that must hold a JSON object, read as dockerd's `json.Decoder` reads it:
/// the object first, then `rest`, whatever followed it, which a rewrite sends on unchanged
/// after the rewritten object so the daemon judges it as it would without the guard.
struct JsonBody {
    object: Map<String, Value>,
    rest: String,
}

/// Reads `body` as Go's `encoding/json` does: invalid UTF-8 and lone surrogate escapes
/// become U+FFFD ([`go_json_text`]) and the first value is decoded, whatever follows.
fn json_object(body: &[u8]) -> Result<JsonBody, String> {
    let text = go_json_text(body);
    let mut values = serde_json::Deserializer::from_str(&text).into_iter::<Value>();
    match values.next() {
        Some(Ok(Value::Object(object))) => Ok(JsonBody {
            object,
            rest: text[values.byte_offset()..].to_string(),
        }),
        Some(Ok(_)) => Err("the body is not a JSON object".to_string()),
        Some(Err(e)) => Err(format!("the body is not valid JSON: {e}")),
        None => Err("the body is empty".to_string()),
    }
}

/// Whether `body` holds no JSON value at all (nothing or whitespace): dockerd answers such
/// a create with an error and creates nothing, so the guard forwards it unjudged.
fn holds_no_json(body: &[u8]) -> bool {
    body.iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
}

/// `body` as text with what Go's JSON decoder replaces replaced the same way, so serde_json
/// reads what dockerd reads: each byte of invalid UTF-8 becomes U+FFFD, and a `\uXXXX`
/// escape of a surrogate that is not half of a valid pair becomes `\ufffd`
/// (encoding/json/decode.go, `unquoteBytes`).
fn go_json_text(body: &[u8]) -> String {
    let mut text = String::with_capacity(body.len());
    for chunk in body.utf8_chunks() {
        text.push_str(chunk.valid());
        for _ in chunk.invalid() {
            text.push(char::REPLACEMENT_CHARACTER);
        }
    }
    if !text.contains("\\u") {
        return text;
    }
    replace_lone_surrogates(&text)
}

/// `text` with each escape of a lone surrogate (outside a valid high-low pair) replaced by
/// `\ufffd`. Escapes are only recognised after an odd run of backslashes.
fn replace_lone_surrogates(text: &str) -> String {
    let bytes = text.as_bytes();
    let escape_at = |i: usize| -> Option<u16> {
        let hex = bytes.get(i..i + 6)?;
        if &hex[..2] != b"\\u" {
            return None;
        }
        u16::from_str_radix(std::str::from_utf8(&hex[2..]).ok()?, 16).ok()
    };
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut copied = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            i += 1;
            continue;
        }
        let Some(unit) = escape_at(i) else {
            // Another escape: skip the escaped character too.
            i += 2;
            continue;
        };
        let high = (0xD800..0xDC00).contains(&unit);
        let paired = high && escape_at(i + 6).is_some_and(|low| (0xDC00..0xE000).contains(&low));
        if paired {
            i += 12;
        } else if (0xD800..0xE000).contains(&unit) {
            out.push_str(&text[copied..i]);
            out.push_str("\\ufffd");
            i += 6;
            copied = i;
        } else {
            i += 6;
        }
    }
    out.push_str(&text[copied..]);
    out
}

/// The `Labels` of a (canonicalised) body: absent and `null` are none.
fn labels_of(config: &Map<String, Value>) -> Result<Map<String, Value>, String> {
    match config.get("Labels") {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(labels)) => Ok(labels.clone()),
        Some(_) => Err("Labels is not a JSON object".to_string()),
    }
}

/// What the policy reads of a container create body.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CreateFacts {
    image: Option<String>,
    /// `HostConfig.AutoRemove` is `true` (`docker run --rm`).
    auto_remove: bool,
    /// `HostConfig.RestartPolicy.Name` is set and not `no`.
    restart_policy: bool,
    /// It carries the `docker compose` project label.
    compose: bool,
}

/// The create's decision under `policy`, and whether the guard sets `AutoRemove` and adds
/// the reap label; `None` when refused.
fn create_decision(policy: Policy, facts: &CreateFacts) -> Option<(CreateDecision, bool, bool)> {
    let exception = if facts.restart_policy {
        Some(CreateDecision::RestartPolicy)
    } else if facts.compose {
        Some(CreateDecision::Compose)
    } else {
        None
    };
    Some(match (policy, facts.auto_remove, exception) {
        (_, true, _) => (CreateDecision::Rm, false, false),
        (Policy::Audit, false, _) => (CreateDecision::Audit, false, false),
        // Compose containers stay until `docker compose down` or the pod's end.
        (Policy::Collect, false, Some(CreateDecision::Compose)) => {
            (CreateDecision::Compose, false, true)
        }
        (Policy::Collect, false, _) => (CreateDecision::Collect, false, true),
        (Policy::Reap, false, _) => (CreateDecision::Reap, false, true),
        (Policy::Rm | Policy::Deny, false, Some(exception)) => (exception, false, true),
        (Policy::Rm, false, None) => (CreateDecision::Rm, true, false),
        (Policy::Deny, false, None) => return None,
    })
}

/// A judged container create: the verdict, the body to send (`None` when refused), and the
/// named volumes its binds would have the daemon create.
type DecidedCreate = (CreateVerdict, Option<Vec<u8>>, Vec<NamedVolume>);

/// Why a container create is not passed on.
enum CreateError {
    /// Its body cannot be judged.
    Unjudgeable(String),
    /// It binds what it may not.
    Refused(Refusal),
}

impl From<String> for CreateError {
    fn from(message: String) -> Self {
        CreateError::Unjudgeable(message)
    }
}

/// Judges a container create body under `policy`.
fn decide_create(
    policy: Policy,
    owner: &str,
    binds: &SocketBinds,
    body: &[u8],
) -> Result<DecidedCreate, CreateError> {
    let JsonBody {
        object: mut config,
        rest,
    } = json_object(body)?;
    let facts = read_create(&mut config)?;
    let verdict = |decision, set_auto_remove| CreateVerdict {
        decision,
        set_auto_remove,
        name: None,
        image: facts.image.clone(),
    };
    let Some((decision, set_auto_remove, reap)) = create_decision(policy, &facts) else {
        return Ok((verdict(CreateDecision::Deny, false), None, Vec::new()));
    };
    let volumes = bound_volumes(&mut config)?;
    rewrite_socket_binds(&mut config, binds)?;
    let mut sent = rewrite_create(config, owner, set_auto_remove, reap)?;
    sent.extend_from_slice(rest.as_bytes());
    Ok((verdict(decision, set_auto_remove), Some(sent), volumes))
}

/// The named volumes of `HostConfig.Binds` (`NAME:/path[:options]`: a source that is not an
/// absolute path names a volume, as dockerd's Linux mount parser reads it), with the
/// `HostConfig.VolumeDriver` the daemon would create them with. `HostConfig.Mounts` of type
/// `volume` carry their own labels instead ([`label_volume_mounts`]).
fn bound_volumes(config: &mut Map<String, Value>) -> Result<Vec<NamedVolume>, String> {
    let Some(Value::Object(host)) = config.get_mut("HostConfig") else {
        return Ok(Vec::new());
    };
    canonicalise(host, "Binds")?;
    canonicalise(host, "VolumeDriver")?;
    let driver = host
        .get("VolumeDriver")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let binds = match host.get("Binds") {
        Some(Value::Array(binds)) => binds,
        _ => return Ok(Vec::new()),
    };
    let mut volumes: Vec<NamedVolume> = Vec::new();
    for bind in binds.iter().filter_map(Value::as_str) {
        let Some((source, _)) = bind.split_once(':') else {
            continue;
        };
        if source.is_empty() || source.starts_with('/') {
            continue;
        }
        if volumes.iter().all(|v| v.name != source) {
            volumes.push(NamedVolume {
                name: source.to_string(),
                driver: driver.clone(),
            });
        }
    }
    Ok(volumes)
}

/// Rewrites every bind of the daemon's socket (`HostConfig.Binds` sources, `HostConfig.Mounts`
/// of type `bind`) to the guard's socket, or refuses the create when there is none to give.
fn rewrite_socket_binds(
    config: &mut Map<String, Value>,
    binds: &SocketBinds,
) -> Result<(), CreateError> {
    if binds.daemon.is_empty() {
        return Ok(());
    }
    let Some(Value::Object(host)) = config.get_mut("HostConfig") else {
        return Ok(());
    };
    canonicalise(host, "Binds")?;
    canonicalise(host, "Mounts")?;
    if let Some(Value::Array(list)) = host.get_mut("Binds") {
        for bind in list.iter_mut() {
            let Some(text) = bind.as_str() else { continue };
            let Some((source, rest)) = text.split_once(':') else {
                continue;
            };
            if let Some(rewritten) = binds.rewrite(source) {
                *bind = Value::String(format!(
                    "{}:{rest}",
                    rewritten.map_err(CreateError::Refused)?
                ));
            }
        }
    }
    if let Some(Value::Array(mounts)) = host.get_mut("Mounts") {
        for mount in mounts.iter_mut().filter_map(Value::as_object_mut) {
            canonicalise(mount, "Type")?;
            canonicalise(mount, "Source")?;
            if mount.get("Type").and_then(Value::as_str) != Some("bind") {
                continue;
            }
            let Some(source) = mount.get("Source").and_then(Value::as_str) else {
                continue;
            };
            if let Some(rewritten) = binds.rewrite(source) {
                let rewritten = rewritten.map_err(CreateError::Refused)?;
                mount.insert("Source".to_string(), Value::String(rewritten));
            }
        }
    }
    Ok(())
}

/// Adds the owner label to the `VolumeOptions.Labels` of every `HostConfig.Mounts` entry of
/// type `volume` with a name (`--mount type=volume,src=NAME,...`, buildx's builder state):
/// dockerd creates a volume that does not exist yet with those labels, and leaves an
/// existing one as it is.
fn label_volume_mounts(config: &mut Map<String, Value>, owner: &str) -> Result<(), String> {
    let Some(Value::Object(host)) = config.get_mut("HostConfig") else {
        return Ok(());
    };
    canonicalise(host, "Mounts")?;
    let Some(Value::Array(mounts)) = host.get_mut("Mounts") else {
        return Ok(());
    };
    for mount in mounts.iter_mut().filter_map(Value::as_object_mut) {
        canonicalise(mount, "Type")?;
        canonicalise(mount, "Source")?;
        let is_named_volume = mount.get("Type").and_then(Value::as_str) == Some("volume")
            && mount
                .get("Source")
                .and_then(Value::as_str)
                .is_some_and(|source| !source.is_empty());
        if !is_named_volume {
            continue;
        }
        canonicalise(mount, "VolumeOptions")?;
        let options = mount
            .entry("VolumeOptions")
            .or_insert_with(|| Value::Object(Map::new()));
        if options.is_null() {
            *options = Value::Object(Map::new());
        }
        let Some(options) = options.as_object_mut() else {
            return Err("a mount's VolumeOptions is not a JSON object".to_string());
        };
        canonicalise(options, "Labels")?;
        let mut labels = labels_of(options)?;
        labels.insert(OWNER_LABEL.to_string(), Value::String(owner.to_string()));
        options.insert("Labels".to_string(), Value::Object(labels));
    }
    Ok(())
}

/// Reads what the policy judges from a create body, renaming each judged field to its
/// canonical spelling. Docker decodes with Go's encoding/json, which matches field names
/// case-insensitively: judge and send one canonical spelling, and refuse two spellings of
/// one field.
fn read_create(config: &mut Map<String, Value>) -> Result<CreateFacts, String> {
    canonicalise(config, "Labels")?;
    canonicalise(config, "HostConfig")?;
    let image = config
        .iter()
        .find(|(k, _)| go_fold_eq(k, "Image"))
        .and_then(|(_, v)| v.as_str())
        .map(str::to_string);
    let (auto_remove, restart_policy) = match config.get_mut("HostConfig") {
        None | Some(Value::Null) => (false, false),
        Some(Value::Object(host)) => read_host_config(host)?,
        Some(_) => return Err("HostConfig is not a JSON object".to_string()),
    };
    let compose = labels_of(config)?.contains_key(COMPOSE_PROJECT_LABEL);
    Ok(CreateFacts {
        image,
        auto_remove,
        restart_policy,
        compose,
    })
}

/// `HostConfig`'s `AutoRemove` and whether it has a restart policy (a name other than `no`).
fn read_host_config(host: &mut Map<String, Value>) -> Result<(bool, bool), String> {
    canonicalise(host, "AutoRemove")?;
    canonicalise(host, "RestartPolicy")?;
    let auto_remove = host.get("AutoRemove") == Some(&Value::Bool(true));
    let restart_policy = match host.get_mut("RestartPolicy") {
        Some(Value::Object(restart)) => {
            canonicalise(restart, "Name")?;
            restart
                .get("Name")
                .and_then(Value::as_str)
                .is_some_and(|name| !name.is_empty() && name != "no")
        }
        _ => false,
    };
    Ok((auto_remove, restart_policy))
}

/// The body sent for an allowed create: `AutoRemove` set if the guard sets it, the owner
/// label (and the reap label) added, everything else as the client sent it.
fn rewrite_create(
    mut config: Map<String, Value>,
    owner: &str,
    set_auto_remove: bool,
    reap: bool,
) -> Result<Vec<u8>, String> {
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
    label_volume_mounts(&mut config, owner)?;
    let mut labels = labels_of(&config)?;
    labels.insert(OWNER_LABEL.to_string(), Value::String(owner.to_string()));
    if reap {
        labels.insert(REAP_LABEL.to_string(), Value::String("true".to_string()));
    }
    config.insert("Labels".to_string(), Value::Object(labels));
    serde_json::to_vec(&config).map_err(|e| format!("cannot encode the body: {e}"))
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

    /// The verdict on `method target` under `policy`, its body read.
    fn judge(policy: Policy, method: &str, target: &str, body: &[u8]) -> GuardVerdict {
        let request = GuardRequest {
            method,
            target,
            form_body: false,
            body: Some(body),
        };
        verdict(policy, UID, false, &request)
    }

    /// A container create judged under `policy`: the create's verdict, and the body sent
    /// (`None` when refused).
    struct Created {
        verdict: CreateVerdict,
        body: Option<Vec<u8>>,
    }

    impl std::ops::Deref for Created {
        type Target = CreateVerdict;

        fn deref(&self) -> &CreateVerdict {
            &self.verdict
        }
    }

    fn create(policy: Policy, body: Value) -> Created {
        let target = "/v1.41/containers/create?name=ci-job";
        let judged = judge(policy, "POST", target, body.to_string().as_bytes());
        assert_eq!(judged.kind, RequestKind::ContainerCreate);
        let Some(verdict) = judged.create else {
            panic!("not a create verdict: {judged:?}");
        };
        let body = match judged.action {
            Action::RewriteBody(sent) => Some(sent),
            Action::Refuse(Refusal::NoRm) => None,
            other => panic!("a create verdict with {other:?}"),
        };
        Created { verdict, body }
    }

    fn sent(created: &Created) -> Value {
        serde_json::from_slice(created.body.as_ref().expect("forwarded")).unwrap()
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
            (Policy::Rm, &plain, CreateDecision::Rm, true, false),
            (Policy::Rm, &with_rm, CreateDecision::Rm, true, false),
            (
                Policy::Rm,
                &restart,
                CreateDecision::RestartPolicy,
                false,
                true,
            ),
            (Policy::Rm, &restart_no, CreateDecision::Rm, true, false),
            (Policy::Rm, &compose, CreateDecision::Compose, false, true),
            (Policy::Deny, &with_rm, CreateDecision::Rm, true, false),
            (
                Policy::Deny,
                &restart,
                CreateDecision::RestartPolicy,
                false,
                true,
            ),
            (Policy::Deny, &compose, CreateDecision::Compose, false, true),
            (Policy::Reap, &plain, CreateDecision::Reap, false, true),
            (Policy::Reap, &restart, CreateDecision::Reap, false, true),
            (Policy::Reap, &with_rm, CreateDecision::Rm, true, false),
            (Policy::Audit, &plain, CreateDecision::Audit, false, false),
            (Policy::Audit, &restart, CreateDecision::Audit, false, false),
            (Policy::Audit, &with_rm, CreateDecision::Rm, true, false),
            (
                Policy::Collect,
                &plain,
                CreateDecision::Collect,
                false,
                true,
            ),
            (
                Policy::Collect,
                &restart,
                CreateDecision::Collect,
                false,
                true,
            ),
            (
                Policy::Collect,
                &restart_no,
                CreateDecision::Collect,
                false,
                true,
            ),
            (
                Policy::Collect,
                &compose,
                CreateDecision::Compose,
                false,
                true,
            ),
            (Policy::Collect, &with_rm, CreateDecision::Rm, true, false),
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
            assert_eq!(verdict.decision, CreateDecision::Deny);
            assert!(verdict.refused());
            assert_eq!(verdict.body, None, "nothing is sent");
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
        let judged = judge(Policy::Rm, "POST", "/containers/create", body.as_bytes());
        let Action::RewriteBody(sent) = judged.action else {
            panic!("not a create: {judged:?}");
        };
        let sent = String::from_utf8(sent).unwrap();
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
        assert_eq!(verdict.decision, CreateDecision::Rm);
        assert_eq!(sent(&verdict)["HostConfig"], json!({"AutoRemove": true}));

        let verdict = create(
            Policy::Rm,
            json!({"Image": "busybox", "hostConfig": {"restartpolicy": {"name": "always"}}}),
        );
        assert_eq!(verdict.decision, CreateDecision::RestartPolicy);

        let verdict = create(
            Policy::Rm,
            json!({"Image": "busybox", "Label\u{017F}": {"com.docker.compose.project": "p"}}),
        );
        assert_eq!(
            verdict.decision,
            CreateDecision::Compose,
            "LONG S folds to s"
        );

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
            let judged = judge(Policy::Deny, "POST", "/containers/create", body.as_bytes());
            assert!(
                matches!(&judged.action, Action::Refuse(Refusal::Unjudgeable(m)) if m.contains("more than once")),
                "{body}: {judged:?}"
            );
        }
    }

    #[test]
    fn bodies_that_cannot_be_judged_are_invalid() {
        for body in [
            &b"not json"[..],
            b"[]",
            b"\"\\ud800\"",
            br#"{"HostConfig":[]}"#,
            br#"{"Labels":"x"}"#,
        ] {
            let judged = judge(Policy::Rm, "POST", "/containers/create", body);
            assert!(
                matches!(&judged.action, Action::Refuse(refusal @ Refusal::Unjudgeable(_)) if refusal.status() == 400),
                "{body:?}: {judged:?}"
            );
        }
    }

    #[test]
    fn bodies_are_read_as_gos_json_decoder_reads_them() {
        // No value at all: forwarded for the daemon to answer (it creates nothing).
        for body in [&b""[..], b" \r\n\t"] {
            for (target, kind) in [
                ("/containers/create", RequestKind::ContainerCreate),
                ("/networks/create", RequestKind::NetworkCreate),
                ("/volumes/create", RequestKind::VolumeCreate),
            ] {
                let judged = judge(Policy::Deny, "POST", target, body);
                assert_eq!(judged.kind, kind);
                assert_eq!(judged.action, Action::Forward, "{target} {body:?}");
            }
        }
        // What follows the object is sent on after the rewritten object.
        let judged = judge(
            Policy::Rm,
            "POST",
            "/containers/create",
            br#"{"Image":"busybox"} trailing"#,
        );
        let Action::RewriteBody(sent) = &judged.action else {
            panic!("{judged:?}");
        };
        assert!(
            sent.ends_with(b"} trailing"),
            "{}",
            String::from_utf8_lossy(sent)
        );
        // Lone surrogates and invalid UTF-8 become U+FFFD; a valid pair and an escaped
        // backslash stay.
        let body = b"{\"Image\":\"busybox\",\"Cmd\":[\"\\ud800\",\"\\udc00x\",\"\\ud83d\\ude00\",\"\\\\ud800\",\"\xff\"]}";
        let judged = judge(Policy::Rm, "POST", "/containers/create", body);
        let Action::RewriteBody(sent) = &judged.action else {
            panic!("{judged:?}");
        };
        let sent: Value = serde_json::from_slice(sent).unwrap();
        assert_eq!(
            sent["Cmd"],
            json!(["\u{fffd}", "\u{fffd}x", "\u{1f600}", "\\ud800", "\u{fffd}"])
        );
    }

    #[test]
    fn other_requests_pass_through_whatever_their_body() {
        for (method, target) in [
            ("POST", "/v1.41/containers/abc/start"),
            ("GET", "/v1.41/containers/create"),
        ] {
            let judged = judge(Policy::Deny, method, target, b"garbage");
            assert_eq!(judged.action, Action::Forward, "{method} {target}");
            assert_eq!(judged.create, None, "{method} {target}");
        }
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
            RequestKind::VolumeCreate => ("POST", "/v1.41/volumes/create"),
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

    /// The verdict on `kind`'s request under `policy`, before any body is read.
    fn verdict_on(
        policy: Policy,
        kind: RequestKind,
        form_body: bool,
        shutting_down: bool,
    ) -> GuardVerdict {
        let (method, target) = request_of(kind);
        let request = GuardRequest {
            method,
            target,
            form_body,
            body: None,
        };
        verdict(policy, UID, shutting_down, &request)
    }

    #[test]
    fn every_policy_has_a_verdict_for_every_request_kind() {
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
        use Action::{Forward, ReadBody, Refuse, RewriteTarget};
        use RequestKind::*;
        // (policy, kind) -> (action, recorded reference)
        let expected = |policy: Policy, kind: RequestKind| -> (Action, Option<&str>) {
            match (policy, kind) {
                (_, ContainerCreate | NetworkCreate | VolumeCreate) => (ReadBody, None),
                (Policy::Collect, Build) => (RewriteTarget(labelled_build.clone()), None),
                (Policy::Audit, Build) => (Forward, None),
                (_, Build) => (RewriteTarget(plain_build.to_string()), None),
                (Policy::Audit, Swarm) => (Forward, None),
                (_, Swarm) => (Refuse(Refusal::Swarm), None),
                (Policy::Collect, ImageTag) => (Forward, Some("ci/app:B1")),
                (_, ImageTag) => (Forward, None),
                (Policy::Collect, Commit) => (RewriteTarget(labelled_commit.clone()), None),
                (_, Commit) => (Forward, None),
                (_, Other) => (Forward, None),
            }
        };
        for policy in Policy::ALL {
            for kind in RequestKind::ALL {
                let (method, target) = request_of(kind);
                assert_eq!(classify(method, target), kind, "{target}");
                let verdict = verdict_on(policy, kind, false, false);
                let (action, records) = expected(policy, kind);
                assert_eq!(verdict.kind, kind);
                assert_eq!(verdict.action, action, "{policy} {kind:?}");
                assert_eq!(verdict.records.as_deref(), records, "{policy} {kind:?}");
                assert_eq!(verdict.create, None, "{policy} {kind:?}");
                // Shutting down refuses exactly what would be judged on its body.
                let closing = verdict_on(policy, kind, false, true);
                if action == ReadBody {
                    assert_eq!(
                        closing.action,
                        Refuse(Refusal::ShuttingDown),
                        "{policy} {kind:?}"
                    );
                } else {
                    assert_eq!(closing, verdict, "{policy} {kind:?}");
                }
            }
        }
    }

    #[test]
    fn every_policy_judges_the_bodies_it_reads() {
        use RequestKind::*;
        let create = json!({"Image": "busybox"}).to_string();
        let network = json!({"Name": "ci"}).to_string();
        for policy in Policy::ALL {
            for kind in [ContainerCreate, NetworkCreate, VolumeCreate] {
                if verdict_on(policy, kind, false, false).action != Action::ReadBody {
                    continue;
                }
                let (method, target) = request_of(kind);
                let body = if kind == ContainerCreate {
                    &create
                } else {
                    &network
                };
                let judged = judge(policy, method, target, body.as_bytes());
                assert_eq!(judged.kind, kind);
                assert_eq!(judged.records, None);
                match (&judged.action, &judged.create) {
                    (Action::Refuse(Refusal::NoRm), Some(create)) => {
                        assert_eq!(policy, Policy::Deny);
                        assert_eq!(create.decision, CreateDecision::Deny);
                    }
                    (Action::RewriteBody(sent), create) => {
                        let sent: Value = serde_json::from_slice(sent).unwrap();
                        assert_eq!(sent["Labels"][OWNER_LABEL], json!(UID), "{policy} {kind:?}");
                        assert_eq!(
                            create.is_some(),
                            kind == ContainerCreate,
                            "{policy} {kind:?}"
                        );
                    }
                    other => panic!("{policy} {kind:?}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn a_create_names_the_volumes_its_binds_would_create_and_labels_its_volume_mounts() {
        let body = json!({
            "Image": "busybox",
            "HostConfig": {
                "binds": ["cache:/cache:ro", "/host:/host", "cache:/again", "data:/data"],
                "VolumeDriver": "local",
                "Mounts": [
                    {"Type": "volume", "Source": "state", "Target": "/state",
                     "VolumeOptions": {"Labels": {"team": "ci"}}},
                    {"Type": "volume", "Target": "/anonymous"},
                    {"Type": "bind", "Source": "/etc", "Target": "/etc2"},
                ],
            },
        });
        let judged = judge(
            Policy::Collect,
            "POST",
            "/containers/create",
            body.to_string().as_bytes(),
        );
        let named = |name: &str| NamedVolume {
            name: name.to_string(),
            driver: "local".to_string(),
        };
        assert_eq!(judged.volumes, vec![named("cache"), named("data")]);
        let Action::RewriteBody(sent) = judged.action else {
            panic!("{judged:?}");
        };
        let sent: Value = serde_json::from_slice(&sent).unwrap();
        let mounts = &sent["HostConfig"]["Mounts"];
        assert_eq!(
            mounts[0]["VolumeOptions"]["Labels"],
            json!({"team": "ci", OWNER_LABEL: UID})
        );
        assert_eq!(
            mounts[1].get("VolumeOptions"),
            None,
            "anonymous: goes with its container"
        );
        assert_eq!(mounts[2].get("VolumeOptions"), None, "a bind is no volume");
        // Refused creates make no volume.
        let refused = judge(
            Policy::Deny,
            "POST",
            "/containers/create",
            body.to_string().as_bytes(),
        );
        assert_eq!(refused.action, Action::Refuse(Refusal::NoRm));
        assert!(refused.volumes.is_empty());
    }

    #[test]
    fn binds_of_the_daemons_socket_however_spelled_get_the_guards_or_are_refused() {
        let binds = SocketBinds {
            daemon: vec!["/var/run/docker.sock".to_string()],
            guard: Some("/pods/u/guard.sock".to_string()),
        };
        for source in [
            "/var/run/docker.sock",
            "/run/docker.sock",
            "//var/run//docker.sock/",
            "/var/./run/../run/docker.sock",
        ] {
            assert_eq!(
                binds.rewrite(source),
                Some(Ok("/pods/u/guard.sock".to_string())),
                "{source}"
            );
        }
        for other in [
            "/var/run",
            "/var/run/docker.sock.bak",
            "/home/docker.sock",
            "/pods/u/guard.sock",
        ] {
            assert_eq!(binds.rewrite(other), None, "{other}");
        }
        let refusing = SocketBinds {
            guard: None,
            ..binds.clone()
        };
        assert!(matches!(
            refusing.rewrite("/run/docker.sock"),
            Some(Err(Refusal::SocketBind(_)))
        ));
        let body = json!({"Image": "busybox", "HostConfig": {
            "Binds": ["/run/docker.sock:/var/run/docker.sock:ro", "/src:/src"],
            "Mounts": [{"Type": "bind", "Source": "/var/run/docker.sock", "Target": "/d.sock"}],
        }});
        let body = body.to_string();
        let request = GuardRequest {
            method: "POST",
            target: "/containers/create",
            form_body: false,
            body: Some(body.as_bytes()),
        };
        let judged = verdict_with(Policy::Collect, UID, &binds, false, &request);
        let Action::RewriteBody(sent) = judged.action else {
            panic!("{judged:?}");
        };
        let sent: Value = serde_json::from_slice(&sent).unwrap();
        assert_eq!(
            sent["HostConfig"]["Binds"],
            json!(["/pods/u/guard.sock:/var/run/docker.sock:ro", "/src:/src"])
        );
        assert_eq!(
            sent["HostConfig"]["Mounts"][0]["Source"],
            "/pods/u/guard.sock"
        );
        let refused = verdict_with(Policy::Collect, UID, &refusing, false, &request);
        assert!(matches!(
            refused.action,
            Action::Refuse(Refusal::SocketBind(_))
        ));
        assert_eq!(refused.action.clone(), refused.action);
    }

    #[test]
    fn every_refusal_has_its_status_and_message() {
        let unjudgeable = Refusal::Unjudgeable("podmend guard: cannot judge".to_string());
        for (refusal, status, message) in [
            (Refusal::Swarm, 403, SWARM_MESSAGE),
            (Refusal::BuildForm, 400, BUILD_FORM_MESSAGE),
            (Refusal::NoRm, 403, DENY_MESSAGE),
            (Refusal::ShuttingDown, 503, SHUTTING_DOWN_MESSAGE),
            (unjudgeable, 400, "podmend guard: cannot judge"),
        ] {
            assert_eq!(refusal.status(), status, "{refusal:?}");
            assert_eq!(refusal.message(), message, "{refusal:?}");
        }
    }

    #[test]
    fn a_build_with_a_form_body_is_refused_under_every_policy_but_audit() {
        for policy in Policy::ALL {
            let action = verdict_on(policy, RequestKind::Build, true, false).action;
            if policy == Policy::Audit {
                assert_eq!(action, Action::Forward);
            } else {
                assert_eq!(action, Action::Refuse(Refusal::BuildForm), "{policy}");
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
    fn network_and_volume_creates_get_the_owner_label_under_every_policy() {
        let body =
            br#"{"Name":"ci","labels":{"a":"b","podmend.io/owner-pod":"x"},"Driver":"bridge"}"#;
        for policy in Policy::ALL {
            for target in ["/v1.41/networks/create", "/volumes/create"] {
                let Action::RewriteBody(sent) = judge(policy, "POST", target, body).action else {
                    panic!("{policy} {target}: not labelled");
                };
                let sent: Value = serde_json::from_slice(&sent).unwrap();
                assert_eq!(
                    sent,
                    json!({"Name": "ci", "Labels": {"a": "b", OWNER_LABEL: UID}, "Driver": "bridge"})
                );
                assert!(matches!(
                    judge(policy, "POST", target, b"[]").action,
                    Action::Refuse(Refusal::Unjudgeable(_))
                ));
            }
        }
    }
}
