//! One client connection of the guard: a pipe that frames and forwards. Every request on it
//! is framed ([`http`](super::http)), judged by the policy's one pure function
//! ([`policy::verdict`]: forward, rewrite or refuse, with the reason) and applied, then
//! relayed in turn over one daemon connection (bodies streamed both ways, no body timeout);
//! upgraded (`101`) or hijacked (`200` then raw) connections are relayed byte for byte with
//! half-close. A request that arrives before the daemon has ever answered waits for it
//! (bounded). A head over [`MAX_HEAD`](super::http::MAX_HEAD) is answered `431`, as Go's
//! server does. Never panics on input; errors end the connection.
//!
//! # Why a hand-written HTTP/1.1 relay, not hyper or a generic proxy
//!
//! - **Docker's hijack is not an HTTP upgrade.** `attach` and `exec start` without an
//!   `Upgrade` header (the Debian 20.10 CLI, compose, SDKs) are answered `200 OK` with no
//!   length and no chunking, and from then on both directions are the container's raw
//!   stdin/stdout. hyper (and proxies built on it) treat that as a response body read until
//!   close and stop reading the client once its request body ended: stdin never arrives.
//!   Only a `101` is an upgrade to them; here a `200` with no framing turns the connection
//!   raw too ([`relay_response`]).
//! - **Half-close.** `docker run -i` ends stdin with a half-close and keeps reading the
//!   output: an end of stream on one side is passed on as `shutdown(SHUT_WR)` while the other
//!   direction keeps flowing ([`relay_raw`]). A relay that closes both ways loses the tail
//!   of the output.
//! - **The framing must match dockerd's exactly.** The guard judges the request dockerd will
//!   route; if the two read the bytes differently (a `Content-Length` beside chunking, two
//!   lengths, `Transfer-Encoding` on HTTP/1.0, obs-fold, a bare CR) a create could pass
//!   unjudged, hidden in what the guard took for a body. So requests are parsed as strictly
//!   as Go's server parses them or more, refused when ambiguous, and re-encoded from what was
//!   parsed; a general-purpose library accepts (and normalises) what we must refuse.
//! - **Exactly one daemon connection per client connection, in order.** Requests are relayed
//!   one at a time (pipelined ones wait their turn), so the daemon sees what the client sent
//!   in the order sent, `Expect: 100-continue` is answered only for bodies the guard reads,
//!   and a client's end of stream is passed on as a half-close of the daemon connection:
//!   the daemon answers a client that half-closed after its request, and cancels the stream
//!   of one that hung up (`docker logs -f`), as it does without the guard.
//!
//! A daemon that is down is not answered for: the client's connection closes unanswered,
//! and the listeners refuse connections until the daemon answers again
//! ([`Shared::watch_daemon`]), as the daemon's own socket does.

use std::collections::BTreeSet;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadHalf, WriteHalf};
use tokio::sync::{Notify, watch};

use super::buildkit::ResponseTap;
use super::collected::Collected;
use super::docker::DockerClient;
use super::http::{
    BodyLength, CopyError, FramingError, HeadReadError, ReadBodyError, Reader, RequestHead,
    ResponseHead,
};
use super::metrics::GuardMetrics;
use super::policy::{
    self, Action, GuardRequest, GuardVerdict, MAX_CREATE_BODY, NamedVolume, OWNER_LABEL, Policy,
    Refusal, RequestKind, SocketBinds,
};
use super::upstream::{BoxStream, DaemonUpstream};

/// How long a closing connection keeps reading what the client still sends, so the client
/// sees the last answer instead of a reset.
const LINGER: Duration = Duration::from_secs(2);
/// How often a daemon that is down is tried.
const DOWN_PROBE: Duration = Duration::from_millis(200);

/// Why a client connection ended early.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("reading from the client: {0}")]
    ClientRead(#[source] io::Error),
    #[error("writing to the client: {0}")]
    ClientWrite(#[source] io::Error),
    #[error("malformed request: {0}")]
    Request(#[source] FramingError),
    #[error("the client went away in the middle of an exchange")]
    ClientGone,
    #[error("cannot reach the Docker daemon at {address}: {source}")]
    Connect {
        address: String,
        #[source]
        source: io::Error,
    },
    #[error("the connection to the Docker daemon failed: {0}")]
    Daemon(#[source] io::Error),
    #[error("malformed response from the Docker daemon: {0}")]
    Response(#[source] FramingError),
    #[error("the Docker daemon closed the connection without answering")]
    NoResponse,
}

/// What every connection shares: where the daemon is and how creates are judged.
#[derive(Debug)]
pub struct Shared {
    pub upstream: DaemonUpstream,
    pub policy: Policy,
    pub owner_pod_uid: String,
    pub metrics: Arc<GuardMetrics>,
    /// Set when the guard shuts down: creates are refused from then on, so nothing is
    /// created behind the final clean-up.
    pub shutting_down: AtomicBool,
    /// How long a request waits for a daemon the guard has not reached yet.
    pub upstream_wait: Duration,
    /// Whether the daemon has answered once: from then on a failure is answered at once.
    reached: AtomicBool,
    /// Whether the wait was logged (once).
    wait_logged: AtomicBool,
    /// Image references the pod tagged through the guard (policy `collect`).
    images: Mutex<BTreeSet<String>>,
    /// Binds of the daemon's socket, and the guard's to give instead.
    socket_binds: SocketBinds,
    /// Whether the daemon is known to be down: the listeners refuse connections meanwhile
    /// ([`Shared::watch_daemon`]).
    down: watch::Sender<bool>,
    /// The containers policy `collect` removed, for the answer to a client asking for one.
    pub collected: Arc<Collected>,
}

impl Shared {
    pub fn new(
        upstream: DaemonUpstream,
        policy: Policy,
        owner_pod_uid: &str,
        metrics: Arc<GuardMetrics>,
        upstream_wait: Duration,
        collected: Arc<Collected>,
    ) -> Self {
        Self {
            upstream,
            policy,
            owner_pod_uid: owner_pod_uid.to_string(),
            metrics,
            shutting_down: AtomicBool::new(false),
            upstream_wait,
            reached: AtomicBool::new(false),
            wait_logged: AtomicBool::new(false),
            images: Mutex::new(BTreeSet::new()),
            down: watch::Sender::new(false),
            collected,
            socket_binds: SocketBinds::default(),
        }
    }

    /// Says whether the daemon is known to be down, and when that changes.
    pub fn daemon_down(&self) -> watch::Receiver<bool> {
        self.down.subscribe()
    }

    /// Notes that the daemon cannot be reached, once it had been (or the start-up wait for
    /// it is over): the listeners close until it answers again.
    /// Returns whether it was not known down before.
    fn mark_down(&self, error: &io::Error) -> bool {
        let changed = self
            .down
            .send_if_modified(|down| !std::mem::replace(down, true));
        if changed {
            tracing::warn!(
                upstream = %self.upstream,
                %error,
                "the Docker daemon is down: connections are refused until it answers"
            );
        }
        changed
    }

    fn mark_up(&self) {
        if self
            .down
            .send_if_modified(|down| std::mem::replace(down, false))
        {
            tracing::info!(upstream = %self.upstream, "the Docker daemon answers again: listening");
        }
    }

    /// Keeps one idle connection to the daemon and notices when the daemon closes it, so
    /// that the guard refuses connections as soon as the daemon is gone, not only after a
    /// client's request found it gone. A closed connection whose daemon still accepts a new
    /// one (an idle timeout) is not a daemon that is down. While down, the daemon is tried
    /// every [`DOWN_PROBE`]. Runs until aborted.
    pub async fn watch_daemon(self: Arc<Self>) {
        loop {
            match self.connect_upstream().await {
                Ok(stream) => {
                    if let Err(error) = self.hold_idle(stream).await {
                        tracing::debug!(%error, "the daemon closed the guard's idle connection");
                    }
                }
                Err(error) if is_misconfiguration(&error) => {}
                Err(error) => {
                    if self.mark_down(&error) {
                        self.metrics.upstream_error();
                    }
                }
            }
            tokio::time::sleep(DOWN_PROBE).await;
        }
    }

    /// Pings the daemon over `stream`, says it is up when it answers, then waits until the
    /// daemon closes the connection.
    async fn hold_idle(&self, stream: BoxStream) -> io::Result<()> {
        let (read, mut write) = tokio::io::split(stream);
        let mut input = Reader::new(read);
        write
            .write_all(b"GET /_ping HTTP/1.1\r\nHost: docker\r\n\r\n")
            .await?;
        write.flush().await?;
        let head = input
            .read_head()
            .await
            .map_err(|e| io::Error::other(e.to_string()))?
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        let response = ResponseHead::parse(&head).map_err(io::Error::other)?;
        let length = response.body_length("GET").map_err(io::Error::other)?;
        input
            .read_body(length, 4096)
            .await
            .map_err(|e| io::Error::other(e.to_string()))?;
        self.mark_up();
        let mut discarded = 0;
        while input.fill().await? > 0 && discarded < 1 << 20 {
            let n = input.buffered().len();
            input.consume(n);
            discarded += n;
        }
        Ok(())
    }

    /// Rewrites (or refuses) binds of the daemon's socket by `binds`.
    pub fn with_socket_binds(mut self, binds: SocketBinds) -> Self {
        self.socket_binds = binds;
        self
    }

    /// The image references the pod tagged, in order.
    pub fn recorded_images(&self) -> Vec<String> {
        self.images
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    fn record_image(&self, reference: String) {
        tracing::debug!(image = %reference, "the pod tagged an image");
        self.images
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(reference);
    }

    /// A new connection to the daemon. Until the daemon has answered once, a daemon that is
    /// not there yet (socket missing, port closed, TLS files not written yet) is waited for,
    /// up to `upstream_wait` from now; a certificate the CA does not vouch for is not.
    pub async fn connect_upstream(&self) -> io::Result<BoxStream> {
        let deadline = tokio::time::Instant::now() + self.upstream_wait;
        let mut pause = Duration::from_millis(50);
        loop {
            match self.upstream.connect().await {
                Ok(stream) => {
                    if !self.reached.swap(true, Ordering::AcqRel)
                        && self.wait_logged.load(Ordering::Acquire)
                    {
                        tracing::info!(upstream = %self.upstream, "the Docker daemon answers now");
                    }
                    return Ok(stream);
                }
                Err(error) => {
                    let now = tokio::time::Instant::now();
                    let waiting =
                        !self.reached.load(Ordering::Acquire) && !is_misconfiguration(&error);
                    if !waiting || now >= deadline {
                        return Err(error);
                    }
                    if !self.wait_logged.swap(true, Ordering::AcqRel) {
                        tracing::info!(
                            upstream = %self.upstream,
                            %error,
                            wait_seconds = self.upstream_wait.as_secs(),
                            "the Docker daemon is not there yet; requests wait for it"
                        );
                    }
                    tokio::time::sleep(pause.min(deadline - now)).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
}

type ClientIn = Reader<ReadHalf<BoxStream>>;
type ClientOut = WriteHalf<BoxStream>;

struct Daemon {
    input: Reader<ReadHalf<BoxStream>>,
    output: WriteHalf<BoxStream>,
    /// The client's end of stream was passed on: nothing more goes up.
    up_closed: bool,
}

/// How one exchange ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Read the next request.
    KeepAlive,
    /// Close the connection.
    Close,
    /// The connection was upgraded or hijacked: relay raw bytes both ways.
    Raw,
    /// A BuildKit `/grpc` connection under `collect`: relayed raw, and the images its builds
    /// produce recorded from the daemon's answers.
    RawBuildKit,
}

/// Serves one client connection to its end.
pub async fn serve_connection(client: BoxStream, shared: Arc<Shared>) {
    let (read, write) = tokio::io::split(client);
    let mut client_in = Reader::new(read);
    let mut client_out = write;
    let mut daemon = None;
    let result = run(&mut client_in, &mut client_out, &mut daemon, &shared).await;
    match result {
        Ok(next @ (Next::Raw | Next::RawBuildKit)) => {
            let tap = (next == Next::RawBuildKit).then(|| Arc::clone(&shared));
            if let Some(daemon) = daemon.take()
                && let Err(error) = relay_raw(client_in, client_out, daemon, tap).await
            {
                tracing::debug!(%error, "raw stream ended with an error");
            }
            return;
        }
        Ok(_) => {}
        Err(error) => tracing::debug!(%error, "client connection ended"),
    }
    drop(daemon);
    linger_close(&mut client_in, &mut client_out).await;
}

/// Requests one after another until the connection ends or turns raw: each is framed,
/// judged ([`judge`]), and forwarded with its answer relayed ([`forward`]).
async fn run(
    client_in: &mut ClientIn,
    client_out: &mut ClientOut,
    daemon: &mut Option<Daemon>,
    shared: &Shared,
) -> Result<Next, ProxyError> {
    loop {
        let head = match next_head(client_in, daemon).await {
            Ok(Some(head)) => head,
            Ok(None) => return Ok(Next::Close),
            Err(ProxyError::Request(error @ FramingError::HeadTooLarge)) => {
                // As Go's server answers a head past its limit (net/http/server.go,
                // `conn.serve`, the `errTooLarge` case).
                let message = format!("podmend guard: {error}");
                reply(client_out, 431, &message, true).await?;
                return Err(ProxyError::Request(error));
            }
            Err(error) => return Err(error),
        };
        let (mut request, body_length) =
            match RequestHead::parse(&head).and_then(|r| r.body_length().map(|l| (r, l))) {
                Ok(parsed) => parsed,
                Err(error) => {
                    let message = format!("podmend guard: malformed HTTP request: {error}");
                    reply(client_out, 400, &message, true).await?;
                    return Err(ProxyError::Request(error));
                }
            };
        let close_after = request.wants_close();
        let buildkit = shared.policy == Policy::Collect
            && policy::is_buildkit_grpc(&request.method, &request.target);
        let (body, records) =
            match judge(client_in, client_out, &mut request, body_length, shared).await? {
                Judged::Forward { body, records } => (body, records),
                Judged::Answered { close: false } => continue,
                Judged::Answered { close: true } => return Ok(Next::Close),
            };
        // A body the guard read goes from memory; any other streams through.
        let streamed_body = match body {
            Some(_) => BodyLength::Empty,
            None => body_length,
        };
        let outgoing = Outgoing {
            request: &request,
            body,
            streamed_body,
            records,
            collected: collected_message(shared, &request),
        };
        match forward(client_in, client_out, daemon, shared, outgoing).await? {
            Next::KeepAlive if !close_after => {}
            Next::KeepAlive | Next::Close => return Ok(Next::Close),
            Next::Raw | Next::RawBuildKit if buildkit => return Ok(Next::RawBuildKit),
            Next::Raw | Next::RawBuildKit => return Ok(Next::Raw),
        }
    }
}

/// What the policy made of a request.
enum Judged {
    /// Forward it: with `body` when the guard read (and maybe rewrote) it, and `records`
    /// to remember on success.
    Forward {
        body: Option<Vec<u8>>,
        records: Option<String>,
    },
    /// The guard answered the client itself; `close` ends the connection.
    Answered { close: bool },
}

/// Asks the policy about `request` ([`policy::verdict`]), reading its body first when the
/// policy judges it, counts and logs the verdict, and applies it: a refusal is answered
/// here, a rewrite changes `request` (a body read is sent with a matching length).
async fn judge(
    client_in: &mut ClientIn,
    client_out: &mut ClientOut,
    request: &mut RequestHead,
    body_length: BodyLength,
    shared: &Shared,
) -> Result<Judged, ProxyError> {
    let form_body = request
        .headers
        .all("content-type")
        .any(policy::is_form_content_type);
    let shutting_down = shared.shutting_down.load(Ordering::Acquire);
    let ask = |request: &RequestHead, body: Option<&[u8]>| {
        let question = GuardRequest {
            method: &request.method,
            target: &request.target,
            form_body,
            body,
        };
        policy::verdict_with(
            shared.policy,
            &shared.owner_pod_uid,
            &shared.socket_binds,
            shutting_down,
            &question,
        )
    };
    let mut verdict = ask(request, None);
    let mut body = None;
    if verdict.action == Action::ReadBody {
        let Some(read) = read_judged_body(client_in, client_out, request, body_length).await?
        else {
            return Ok(Judged::Answered { close: true });
        };
        verdict = ask(request, Some(&read));
        body = Some(read);
    }
    observe(shared, &request.target, &verdict);
    match verdict.action {
        Action::Refuse(refusal) => {
            // A body not read cannot be framed away: closing is simpler.
            let close = request.wants_close() || body.is_none();
            reply(client_out, refusal.status(), refusal.message(), close).await?;
            return Ok(Judged::Answered { close });
        }
        Action::Forward | Action::ReadBody => {}
        Action::RewriteTarget(target) => request.target = target,
        Action::RewriteBody(rewritten) => {
            create_bound_volumes(shared, &verdict.volumes).await;
            body = Some(rewritten);
        }
    }
    if let Some(body) = &body {
        request.set_content_length(body.len());
    }
    Ok(Judged::Forward {
        body,
        records: verdict.records,
    })
}

/// Creates, labelled with the owner pod, each named volume a container create binds that
/// does not exist yet, so that the pod's end and the reaper find it; the daemon would
/// otherwise create it unlabelled. A volume that exists is not the pod's and is left alone.
/// A failure is logged and the create goes on: the daemon then makes the volume itself, as
/// without the guard.
async fn create_bound_volumes(shared: &Shared, volumes: &[NamedVolume]) {
    if volumes.is_empty() {
        return;
    }
    let client = DockerClient::new(shared.upstream.clone());
    let labels = [(OWNER_LABEL.to_string(), shared.owner_pod_uid.clone())].into();
    for volume in volumes {
        let created = match client.volume_exists(&volume.name).await {
            Ok(true) => continue,
            Ok(false) => {
                client
                    .create_volume(&volume.name, &volume.driver, &labels)
                    .await
            }
            Err(error) => Err(error),
        };
        match created {
            Ok(()) => {
                tracing::info!(volume = %volume.name, "created a named volume of this pod, labelled")
            }
            Err(error) => tracing::warn!(
                %error,
                volume = %volume.name,
                "cannot create a named volume ahead of the container create; the daemon creates it unlabelled"
            ),
        }
    }
}

/// Reads a body the policy judges (answering `100 Continue` first when the client waits for
/// it). `None` when it is too large: the client was answered `413`.
async fn read_judged_body(
    client_in: &mut ClientIn,
    client_out: &mut ClientOut,
    request: &mut RequestHead,
    body_length: BodyLength,
) -> Result<Option<Vec<u8>>, ProxyError> {
    if request.headers.has_token("expect", "100-continue") {
        request.headers.remove("expect");
        client_out
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .map_err(ProxyError::ClientWrite)?;
    }
    match client_in.read_body(body_length, MAX_CREATE_BODY).await {
        Ok(body) => Ok(Some(body)),
        Err(ReadBodyError::TooLarge) => {
            let message = format!(
                "podmend guard: the create body is larger than {} MiB",
                MAX_CREATE_BODY >> 20
            );
            reply(client_out, 413, &message, true).await?;
            Ok(None)
        }
        Err(ReadBodyError::Framing(error)) => {
            let message = format!("podmend guard: malformed HTTP request: {error}");
            reply(client_out, 400, &message, true).await?;
            Err(ProxyError::Request(error))
        }
        Err(ReadBodyError::Io(error)) => Err(ProxyError::ClientRead(error)),
        Err(ReadBodyError::Truncated) => Err(ProxyError::ClientGone),
    }
}

/// Counts and logs what the policy decided about the request to `target`.
fn observe(shared: &Shared, target: &str, verdict: &GuardVerdict) {
    let refused = matches!(verdict.action, Action::Refuse(_));
    match (&verdict.kind, &verdict.action) {
        (RequestKind::Swarm, _) => {
            shared.metrics.swarm_request(refused);
            tracing::info!(path = %target, policy = %shared.policy, refused, "swarm request");
        }
        (RequestKind::Build, Action::Refuse(_)) => {
            tracing::info!(path = %target, "build with a form body refused");
        }
        (_, Action::RewriteTarget(to)) => {
            tracing::debug!(from = %target, to = %to, "request relayed with a new target");
        }
        (RequestKind::NetworkCreate | RequestKind::VolumeCreate, Action::RewriteBody(_)) => {
            tracing::info!(path = %target, "network or volume create labelled");
        }
        (_, Action::Refuse(Refusal::Unjudgeable(message))) => {
            tracing::info!(path = %target, %message, "create refused");
        }
        _ => {}
    }
    if let Some(create) = &verdict.create {
        shared.metrics.create(create.decision);
        tracing::info!(
            path = %target,
            decision = %create.decision,
            policy = %shared.policy,
            name = create.name.as_deref().unwrap_or(""),
            image = create.image.as_deref().unwrap_or(""),
            set_auto_remove = create.set_auto_remove,
            "container create"
        );
    }
}

/// A judged request on its way to the daemon.
struct Outgoing<'a> {
    request: &'a RequestHead,
    /// The body from memory (read by the guard), or `None` to stream `streamed_body`.
    body: Option<Vec<u8>>,
    streamed_body: BodyLength,
    /// An image reference to remember if the daemon answers with success.
    records: Option<String>,
    /// What a `404` answer says instead of the daemon's: the request names a container
    /// policy `collect` removed.
    collected: Option<String>,
}

/// Sends the request over the daemon connection (opened on first use, kept across
/// requests) and relays the exchange; a daemon that cannot be reached closes the client's
/// connection unanswered ([`open_daemon`]).
async fn forward(
    client_in: &mut ClientIn,
    client_out: &mut ClientOut,
    daemon: &mut Option<Daemon>,
    shared: &Shared,
    outgoing: Outgoing<'_>,
) -> Result<Next, ProxyError> {
    let connection = match daemon {
        Some(connection) => connection,
        None => daemon.insert(open_daemon(client_out, shared).await?),
    };
    send(connection, shared, outgoing.request, outgoing.body).await?;
    let mut status = 0;
    let answer = Answer {
        method: &outgoing.request.method,
        collected: outgoing.collected.as_deref(),
    };
    let next = exchange(
        client_in,
        client_out,
        connection,
        outgoing.streamed_body,
        answer,
        &mut status,
    )
    .await;
    if let Some(reference) = outgoing.records
        && (200..300).contains(&status)
    {
        shared.record_image(reference);
    }
    match next {
        Ok(next) => Ok(next),
        Err((error, answered)) => Err(exchange_failed(client_out, shared, error, answered).await),
    }
}

/// Writes the request head (and a body from memory) to the daemon; when that fails, the
/// client's connection is closed unanswered ([`open_daemon`] says why).
async fn send(
    connection: &mut Daemon,
    shared: &Shared,
    request: &RequestHead,
    body: Option<Vec<u8>>,
) -> Result<(), ProxyError> {
    let mut bytes = request.encode();
    if let Some(body) = body {
        bytes.extend_from_slice(&body);
    }
    let sent = async {
        connection.output.write_all(&bytes).await?;
        connection.output.flush().await
    };
    let Err(source) = sent.await else {
        return Ok(());
    };
    shared.metrics.upstream_error();
    Err(ProxyError::Daemon(source))
}

/// The error an exchange ended with; a daemon failure is counted. A daemon that answers
/// garbage gets the client a `502` (unless the client already has part of an answer); a
/// daemon that went away closes the client's connection unanswered, as the daemon's own
/// connection closed ([`open_daemon`] says why).
async fn exchange_failed(
    client_out: &mut ClientOut,
    shared: &Shared,
    error: ProxyError,
    answered: bool,
) -> ProxyError {
    if matches!(
        error,
        ProxyError::Daemon(_) | ProxyError::NoResponse | ProxyError::Response(_)
    ) {
        shared.metrics.upstream_error();
        if !answered && matches!(error, ProxyError::Response(_)) {
            let message = format!(
                "podmend guard: the Docker daemon at {} failed: {error}",
                shared.upstream.address()
            );
            if let Err(reply_error) = reply(client_out, 502, &message, true).await {
                return reply_error;
            }
        }
    }
    error
}

/// A new daemon connection; when the daemon is not there, the client's connection is
/// closed unanswered. An HTTP answer would be an "Error response from daemon" to the docker CLI,
/// which then believes a daemon answered: CLI 28.x's `docker info --format` exits 0 on one,
/// and readiness loops pass. A connection that ends without an answer is an error of the
/// connection, as with no daemon at all, and every CLI fails.
async fn open_daemon(client_out: &mut ClientOut, shared: &Shared) -> Result<Daemon, ProxyError> {
    match shared.connect_upstream().await {
        Ok(stream) => {
            let (read, write) = tokio::io::split(stream);
            Ok(Daemon {
                input: Reader::new(read),
                output: write,
                up_closed: false,
            })
        }
        Err(source) => {
            shared.metrics.upstream_error();
            let error = ProxyError::Connect {
                address: shared.upstream.address().to_string(),
                source,
            };
            // A daemon refusing the guard itself (a certificate the CA does not vouch for,
            // a socket the guard may not open) is the guard's set-up: say so to the client.
            let ProxyError::Connect { source, .. } = &error else {
                return Err(error);
            };
            if is_misconfiguration(source) {
                tracing::warn!(%error, "cannot forward a request");
                reply(client_out, 502, &format!("podmend guard: {error}"), true).await?;
            } else {
                tracing::info!(%error, "cannot forward a request; its connection is closed");
                shared.mark_down(source);
            }
            Err(error)
        }
    }
}

/// Whether a connect error is the guard's own set-up rather than a daemon that is down: a
/// certificate the CA does not vouch for, a socket the guard may not open.
fn is_misconfiguration(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::InvalidData | io::ErrorKind::PermissionDenied
    )
}

/// Waits for the next request head. Meanwhile a daemon connection that the daemon closes
/// (an idle keep-alive connection) is dropped, to be reopened when needed.
async fn next_head(
    client_in: &mut ClientIn,
    daemon: &mut Option<Daemon>,
) -> Result<Option<Vec<u8>>, ProxyError> {
    loop {
        let read = match daemon.as_mut() {
            None => client_in.read_head().await,
            Some(connection) => {
                let idle_end = tokio::select! {
                    head = client_in.read_head() => Err(head),
                    filled = connection.input.fill() => Ok(filled),
                };
                match idle_end {
                    Err(head) => head,
                    // Closed, failed, or sent something unasked: this connection is done.
                    Ok(_) => {
                        *daemon = None;
                        continue;
                    }
                }
            }
        };
        return match read {
            Ok(head) => Ok(head),
            Err(HeadReadError::Io(error)) => Err(ProxyError::ClientRead(error)),
            Err(HeadReadError::Framing(error)) => Err(ProxyError::Request(error)),
        };
    }
}

/// Streams the request body up while the response comes down. Returns how the exchange
/// ended, or an error and whether the client already got (part of) an answer; `status` is
/// the final response's.
async fn exchange(
    client_in: &mut ClientIn,
    client_out: &mut ClientOut,
    daemon: &mut Daemon,
    request_body: BodyLength,
    answer: Answer<'_>,
    status: &mut u16,
) -> Result<Next, (ProxyError, bool)> {
    let response_done = Notify::new();
    let client_gone = Notify::new();
    let Daemon { input, output, .. } = daemon;

    let send = send_body(
        client_in,
        output,
        request_body,
        &response_done,
        &client_gone,
    );
    let receive = async {
        let mut answered = false;
        let result = tokio::select! {
            result = relay_response(input, client_out, answer, &mut answered, status) => result,
            () = client_gone.notified() => Err(ProxyError::ClientGone),
        };
        response_done.notify_one();
        result.map_err(|e| (e, answered))
    };
    let (sent, received) = tokio::join!(send, receive);
    if sent == Sent::ClientClosed {
        daemon.up_closed = true;
    }
    match received {
        Ok(Next::KeepAlive) if sent != Sent::Whole => Ok(Next::Close),
        other => other,
    }
}

/// How the request's half of an exchange ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// The body reached the daemon whole and the client is still there.
    Whole,
    /// The daemon stopped reading the body: the connection cannot carry another request.
    Failed,
    /// The client ended its stream (a half-close, a hang-up, a body cut short): that end of
    /// stream was passed on to the daemon, which answers or cancels as it would without the
    /// guard. Nothing more goes up this daemon connection.
    ClientClosed,
}

/// The request's half of [`exchange`]: copies the body up, then watches the client until
/// the response is done. A client that ends its stream is passed on as a half-close of the
/// daemon connection, and the daemon's answer still comes down: Go's server writes the
/// handler's reply to a client that half-closed (`printf 'GET /_ping ...' | socat`), and
/// cancels the request's context on that end of stream, which ends a `docker logs -f`
/// (net/http/server.go, `connReader.backgroundRead` and `handleReadError`). Notifies
/// `client_gone` only when the client's body cannot be framed.
async fn send_body(
    client_in: &mut ClientIn,
    daemon_out: &mut WriteHalf<BoxStream>,
    request_body: BodyLength,
    response_done: &Notify,
    client_gone: &Notify,
) -> Sent {
    let sent = client_in.copy_body(request_body, daemon_out).await;
    let outcome = match sent {
        Ok(()) => Sent::Whole,
        // The daemon may have answered early and closed: let the answer through.
        Err(CopyError::Write(error)) => {
            tracing::debug!(%error, "the daemon stopped reading the request body");
            Sent::Failed
        }
        Err(CopyError::Truncated | CopyError::Read(_)) => {
            return pass_on_client_end(daemon_out, response_done).await;
        }
        Err(CopyError::Framing(_)) => {
            client_gone.notify_one();
            return Sent::Failed;
        }
    };
    // Until the response is complete, notice a client that ends its stream. Once the
    // client sent more (a pipelined request, or stdin for a hijacked stream), stop
    // watching, as Go's server does.
    loop {
        if !client_in.buffered().is_empty() {
            response_done.notified().await;
            return outcome;
        }
        tokio::select! {
            biased;
            () = response_done.notified() => return outcome,
            filled = client_in.fill() => match filled {
                Ok(0) | Err(_) => return pass_on_client_end(daemon_out, response_done).await,
                Ok(_) => {}
            },
        }
    }
}

/// Half-closes the daemon connection for a client that ended its stream, then waits for
/// the daemon's answer to be relayed.
async fn pass_on_client_end(daemon_out: &mut WriteHalf<BoxStream>, response_done: &Notify) -> Sent {
    if let Err(error) = daemon_out.shutdown().await {
        tracing::debug!(%error, "cannot pass the client's end of stream on to the daemon");
    }
    response_done.notified().await;
    Sent::ClientClosed
}

/// What the relay of a response needs to know of its request.
#[derive(Debug, Clone, Copy)]
struct Answer<'a> {
    method: &'a str,
    /// What a `404` says instead of the daemon's message ([`collected_message`]).
    collected: Option<&'a str>,
}

/// The message for a request that names a container policy `collect` removed
/// (`/containers/{name or id}/...`), if it does; HEAD requests carry no message.
fn collected_message(shared: &Shared, request: &RequestHead) -> Option<String> {
    if shared.policy != Policy::Collect || request.method == "HEAD" {
        return None;
    }
    let path = policy::normalise_path(&request.target);
    let mut segments = path.trim_start_matches('/').split('/');
    let (Some("containers"), Some(reference)) = (segments.next(), segments.next()) else {
        return None;
    };
    let listing = matches!(reference, "json" | "create" | "prune") && segments.next().is_none();
    if listing {
        return None;
    }
    shared.collected.message(reference)
}

/// Relays the response (interim `1xx` responses first), and its body by its framing.
async fn relay_response<R, W>(
    daemon_in: &mut Reader<R>,
    client_out: &mut W,
    answer: Answer<'_>,
    answered: &mut bool,
    status: &mut u16,
) -> Result<Next, ProxyError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        let head = match daemon_in.read_head().await {
            Ok(Some(head)) => head,
            Ok(None) => return Err(ProxyError::NoResponse),
            Err(HeadReadError::Io(error)) => return Err(ProxyError::Daemon(error)),
            Err(HeadReadError::Framing(error)) => return Err(ProxyError::Response(error)),
        };
        let response = ResponseHead::parse(&head).map_err(ProxyError::Response)?;
        let length = response
            .body_length(answer.method)
            .map_err(ProxyError::Response)?;
        *answered = true;
        if let (404, Some(message)) = (response.status, answer.collected) {
            *status = 404;
            return answer_collected(daemon_in, client_out, &response, length, message).await;
        }
        client_out
            .write_all(&head)
            .await
            .map_err(ProxyError::ClientWrite)?;
        client_out.flush().await.map_err(ProxyError::ClientWrite)?;
        if response.status == 101 {
            return Ok(Next::Raw);
        }
        if (100..200).contains(&response.status) {
            continue;
        }
        *status = response.status;
        if length == BodyLength::UntilClose {
            // Docker's hijacked endpoints answer `200` with a raw stream and no framing.
            return Ok(Next::Raw);
        }
        daemon_in
            .copy_body(length, client_out)
            .await
            .map_err(|error| match error {
                CopyError::Read(e) => ProxyError::Daemon(e),
                CopyError::Write(e) => ProxyError::ClientWrite(e),
                CopyError::Truncated => ProxyError::NoResponse,
                CopyError::Framing(e) => ProxyError::Response(e),
            })?;
        return Ok(if response.wants_close() {
            Next::Close
        } else {
            Next::KeepAlive
        });
    }
}

/// Answers a `404` about a container policy `collect` removed with `message` in place of
/// the daemon's (whose body is read and dropped), keeping the connection as the daemon did.
async fn answer_collected<R, W>(
    daemon_in: &mut Reader<R>,
    client_out: &mut W,
    response: &ResponseHead,
    length: BodyLength,
    message: &str,
) -> Result<Next, ProxyError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    match daemon_in.read_body(length, 64 << 10).await {
        Ok(_) => {}
        Err(ReadBodyError::Io(error)) => return Err(ProxyError::Daemon(error)),
        Err(ReadBodyError::Framing(error)) => return Err(ProxyError::Response(error)),
        Err(ReadBodyError::TooLarge | ReadBodyError::Truncated) => {
            return Err(ProxyError::NoResponse);
        }
    }
    let close = response.wants_close() || length == BodyLength::UntilClose;
    reply(client_out, 404, message, close).await?;
    Ok(if close { Next::Close } else { Next::KeepAlive })
}

/// Relays raw bytes both ways until both sides are done; an end of stream on one side is
/// passed on as a half-close (`shutdown(SHUT_WR)`), and the other direction keeps flowing.
/// With `tap`, the daemon's side is also read for the images BuildKit builds produce, which
/// are recorded as the pod's.
async fn relay_raw(
    client_in: ClientIn,
    client_out: ClientOut,
    daemon: Daemon,
    tap: Option<Arc<Shared>>,
) -> io::Result<()> {
    let Daemon {
        input,
        output,
        up_closed,
    } = daemon;
    let up = async move {
        if up_closed {
            Ok(())
        } else {
            pump(client_in, output).await
        }
    };
    match tap {
        None => tokio::try_join!(up, pump(input, client_out)).map(|_| ()),
        Some(shared) => {
            let tapped = TapWriter {
                inner: client_out,
                tap: ResponseTap::default(),
                shared,
            };
            tokio::try_join!(up, pump(input, tapped)).map(|_| ())
        }
    }
}

/// Writes to the client what the daemon sent on a BuildKit connection, feeding each byte
/// written to a [`ResponseTap`].
struct TapWriter {
    inner: ClientOut,
    tap: ResponseTap,
    shared: Arc<Shared>,
}

impl AsyncWrite for TapWriter {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        let this = &mut *self;
        let written = std::pin::Pin::new(&mut this.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &written {
            for reference in this.tap.feed(&buf[..*n]) {
                tracing::info!(image = %reference, "a BuildKit build of this pod wrote an image");
                this.shared.record_image(reference);
            }
        }
        written
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

async fn pump<R, W>(mut from: Reader<R>, mut to: W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    from.copy_to_end(&mut to)
        .await
        .map_err(|error| match error {
            CopyError::Read(e) | CopyError::Write(e) => e,
            other => io::Error::other(other.to_string()),
        })?;
    to.shutdown().await
}

/// Ends a connection politely: no more writes, then read (and drop) what the client still
/// sends for a moment, so it reads the last answer rather than a connection reset.
async fn linger_close(client_in: &mut ClientIn, client_out: &mut ClientOut) {
    let _ = client_out.shutdown().await;
    let drain = async {
        let mut discarded = 0usize;
        while discarded < 16 << 20 {
            let n = client_in.buffered().len();
            client_in.consume(n);
            discarded += n;
            match client_in.fill().await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// Answers the client directly with `{"message": ...}`, as the daemon's errors look.
async fn reply<W: AsyncWrite + Unpin>(
    client_out: &mut W,
    status: u16,
    message: &str,
    close: bool,
) -> Result<(), ProxyError> {
    client_out
        .write_all(&json_response(status, message, close))
        .await
        .map_err(ProxyError::ClientWrite)?;
    client_out.flush().await.map_err(ProxyError::ClientWrite)
}

/// A complete JSON error response.
pub fn json_response(status: u16, message: &str, close: bool) -> Vec<u8> {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let body = serde_json::json!({ "message": message }).to_string();
    let connection = if close { "Connection: close\r\n" } else { "" };
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{connection}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    use tokio::io::AsyncReadExt as _;

    use super::super::policy::{IMAGE_OWNER_LABEL, SWARM_MESSAGE, query_escape};
    use super::super::upstream::Address;

    /// A daemon on a Unix socket that records every request head (and body) it is sent and
    /// answers each `200 {}`.
    async fn recording_daemon(socket: &std::path::Path) -> Arc<Mutex<Vec<String>>> {
        let listener = tokio::net::UnixListener::bind(socket).expect("bind the daemon socket");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let record = Arc::clone(&record);
                tokio::spawn(async move {
                    let (read, mut write) = tokio::io::split(stream);
                    let mut reader = Reader::new(read);
                    while let Ok(Some(head)) = reader.read_head().await {
                        let request = RequestHead::parse(&head).expect("a request the guard sent");
                        let length = request.body_length().expect("framed");
                        let body = reader.read_body(length, 1 << 20).await.expect("a body");
                        let mut text = String::from_utf8_lossy(&head).into_owned();
                        text.push_str(&String::from_utf8_lossy(&body));
                        record.lock().expect("record").push(text);
                        let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
                        if write.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        seen
    }

    /// Sends `request` (ending with `Connection: close`) through a guard under `policy` to a
    /// recording daemon: the guard's answers, what reached the daemon, the guard's metrics.
    async fn through_guard(
        policy: Policy,
        request: &str,
    ) -> (String, Vec<String>, Arc<GuardMetrics>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("daemon.sock");
        let seen = recording_daemon(&socket).await;
        let metrics = Arc::new(GuardMetrics::new());
        let shared = Arc::new(Shared::new(
            DaemonUpstream::new(Address::Unix(socket), None).expect("upstream"),
            policy,
            "uid-1",
            Arc::clone(&metrics),
            Duration::ZERO,
            Arc::new(Collected::new(Duration::ZERO, 20)),
        ));
        let (mut client, guard_side) = tokio::io::duplex(1 << 16);
        let served = tokio::spawn(serve_connection(Box::pin(guard_side), shared));
        client.write_all(request.as_bytes()).await.expect("send");
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut answer))
            .await
            .expect("the guard answers and closes")
            .expect("read the answer");
        drop(client);
        served.await.expect("the connection task ends");
        let seen = seen.lock().expect("record").clone();
        (String::from_utf8_lossy(&answer).into_owned(), seen, metrics)
    }

    fn post(target: &str, content_type: &str, body: &str) -> String {
        format!(
            "POST {target} HTTP/1.1\r\nHost: docker\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn swarm_requests_get_403_and_are_counted_under_rm_deny_and_reap() {
        let targets = [
            "/v1.41/swarm/init",
            "/swarm/join",
            "//V1.41/Services/Create",
            "/services%2Fcreate",
            "/v1.41/services/abc/update?version=3",
        ];
        for policy in [Policy::Rm, Policy::Deny, Policy::Reap] {
            for target in targets {
                let (answer, seen, metrics) =
                    through_guard(policy, &post(target, "application/json", r#"{"x":1}"#)).await;
                assert!(
                    answer.starts_with("HTTP/1.1 403 Forbidden\r\n"),
                    "{policy} {target}: {answer}"
                );
                let body = answer.split_once("\r\n\r\n").expect("a body").1;
                let message: serde_json::Value = serde_json::from_str(body).expect("JSON");
                assert_eq!(message["message"], SWARM_MESSAGE, "{policy} {target}");
                assert_eq!(
                    seen,
                    Vec::<String>::new(),
                    "{policy} {target} reached the daemon"
                );
                assert_eq!(metrics.swarm_requests(true), 1, "{policy} {target}");
                assert_eq!(metrics.swarm_requests(false), 0, "{policy} {target}");
            }
        }
    }

    #[tokio::test]
    async fn swarm_requests_are_relayed_and_counted_under_audit() {
        let request = post(
            "/v1.41/services/create",
            "application/json",
            r#"{"Name":"s"}"#,
        );
        let (answer, seen, metrics) = through_guard(Policy::Audit, &request).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(
            seen[0].starts_with("POST /v1.41/services/create HTTP/1.1\r\n"),
            "{seen:?}"
        );
        assert!(seen[0].ends_with(r#"{"Name":"s"}"#), "{seen:?}");
        assert_eq!(metrics.swarm_requests(false), 1);
        assert_eq!(metrics.swarm_requests(true), 0);
    }

    #[tokio::test]
    async fn builds_are_relayed_with_rm_and_forcerm_first_unless_audit() {
        let tar = "context";
        for (policy, sent) in [
            (
                Policy::Rm,
                "POST /v1.41/build?rm=1&forcerm=1&t=x&rm=0 HTTP/1.1\r\n",
            ),
            (
                Policy::Deny,
                "POST /v1.41/build?rm=1&forcerm=1&t=x&rm=0 HTTP/1.1\r\n",
            ),
            (
                Policy::Reap,
                "POST /v1.41/build?rm=1&forcerm=1&t=x&rm=0 HTTP/1.1\r\n",
            ),
            (Policy::Audit, "POST /v1.41/build?t=x&rm=0 HTTP/1.1\r\n"),
        ] {
            let request = post("/v1.41/build?t=x&rm=0", "application/x-tar", tar);
            let (answer, seen, _) = through_guard(policy, &request).await;
            assert!(
                answer.starts_with("HTTP/1.1 200 OK\r\n"),
                "{policy}: {answer}"
            );
            assert_eq!(seen.len(), 1, "{policy}: {seen:?}");
            assert!(seen[0].starts_with(sent), "{policy}: {seen:?}");
            assert!(seen[0].ends_with(tar), "{policy}: the context is relayed");
        }
    }

    #[tokio::test]
    async fn under_collect_builds_are_labelled_and_commits_keep_no_owner_label() {
        let request = post("/v1.41/build?t=x", "application/x-tar", "context");
        let (answer, seen, _) = through_guard(Policy::Collect, &request).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        let labels = query_escape(&format!(r#"{{"{IMAGE_OWNER_LABEL}":"uid-1"}}"#));
        assert!(
            seen[0].starts_with(&format!(
                "POST /v1.41/build?labels={labels}&rm=1&forcerm=1&t=x HTTP/1.1\r\n"
            )),
            "{seen:?}"
        );
        let request = post(
            "/v1.41/commit?container=b&repo=img",
            "application/json",
            "{}",
        );
        let (_, seen, _) = through_guard(Policy::Collect, &request).await;
        assert!(
            seen[0].starts_with("POST /v1.41/commit?container=b&repo=img&changes=LABEL%20"),
            "{seen:?}"
        );
    }

    #[tokio::test]
    async fn a_request_waits_for_a_daemon_that_is_not_there_yet() {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("later.sock");
        let shared = Arc::new(Shared::new(
            DaemonUpstream::new(Address::Unix(socket.clone()), None).expect("upstream"),
            Policy::Collect,
            "uid-1",
            Arc::new(GuardMetrics::new()),
            Duration::from_secs(30),
            Arc::new(Collected::new(Duration::ZERO, 20)),
        ));
        let (mut client, guard_side) = tokio::io::duplex(1 << 16);
        let served = tokio::spawn(serve_connection(Box::pin(guard_side), Arc::clone(&shared)));
        client
            .write_all(b"GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n")
            .await
            .expect("send");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let seen = recording_daemon(&socket).await;
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut answer))
            .await
            .expect("answered once the daemon is there")
            .expect("read");
        served.await.expect("the connection task ends");
        assert!(
            String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200 OK\r\n"),
            "{answer:?}"
        );
        assert_eq!(seen.lock().expect("record").len(), 1);

        // Reached once: a daemon that goes away closes the connection at once, unanswered.
        std::fs::remove_file(&socket).expect("remove the socket");
        let (mut client, guard_side) = tokio::io::duplex(1 << 16);
        let served = tokio::spawn(serve_connection(Box::pin(guard_side), shared));
        client
            .write_all(b"GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n")
            .await
            .expect("send");
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut answer))
            .await
            .expect("closed at once")
            .expect("read");
        served.await.expect("the connection task ends");
        assert_eq!(String::from_utf8_lossy(&answer), "", "no answer at all");
    }

    #[tokio::test]
    async fn a_build_with_a_form_body_gets_400_unless_audit() {
        let request = post(
            "/build?remote=https://example.invalid/x.git",
            "application/x-www-form-urlencoded",
            "rm=0",
        );
        for policy in [Policy::Rm, Policy::Deny, Policy::Reap] {
            let (answer, seen, _) = through_guard(policy, &request).await;
            assert!(
                answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
                "{policy}: {answer}"
            );
            assert!(answer.contains("application/x-tar"), "{policy}: {answer}");
            assert_eq!(seen, Vec::<String>::new(), "{policy}");
        }
        let (answer, seen, _) = through_guard(Policy::Audit, &request).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert_eq!(seen.len(), 1, "{seen:?}");
    }

    #[test]
    fn error_responses_carry_a_json_message_and_their_length() {
        let response = String::from_utf8(json_response(403, "no \"rm\"", false)).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{head}");
        assert!(head.contains("Content-Type: application/json"), "{head}");
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        assert!(!head.contains("Connection: close"), "{head}");
        let parsed: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(parsed["message"], "no \"rm\"");
        assert!(
            String::from_utf8(json_response(502, "x", true))
                .unwrap()
                .contains("Connection: close\r\n")
        );
    }
}
