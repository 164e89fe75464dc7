//! `podmend guard` under attack and under faults, against a real dockerd.
//!
//! Bypass attempts: every spelling of the create path, framing tricks (chunked bodies with
//! extensions, smuggling headers, pipelining, upgrades followed by more bytes) and JSON
//! tricks (duplicate keys, BOM, null `HostConfig`). The guard's upstream is a recording tap in
//! front of dockerd, so each refused create is proven never to have reached the daemon, and
//! the daemon is asked what exists afterwards. The same path spellings are also sent to
//! dockerd directly, to show which of them dockerd itself would route to a create.
//!
//! Faults: the daemon restarted in the middle of streams (events, attach, an upload); the
//! guard killed with SIGKILL, then restarted on its stale socket, or reaped after with
//! `podmend guard reap`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::api_stub::ApiStub;
use common::dockerd::{self, Dockerd, run, text, wait_with_timeout};
use common::guard::{
    Guard, OWNER, RUN, TIMEOUT, assert_every_cli_fails_as_straight, daemon_labelled, exists,
    inspect, ok, reap_command,
};
use common::raw_http::{raw, read_one};
use serde_json::json;

const DENY_MESSAGE: &str = "podmend: containers must be run with --rm on this CI runner (docker run --rm ...); ask the cluster admin to set the pod annotation podmend.io/dind-policy to reap or audit to allow it";
/// The label every create of the bypass tests carries, valued with its case's marker.
const MARKER: &str = "podmend-test.marker";

/// A name unique to this test and run (also a valid container name).
fn unique(test: &str) -> String {
    format!("podmend-{test}-{}", std::process::id())
}

/// A guard with `--policy policy` on a socket in its own directory.
fn start_guard(upstream: &str, uid: &str, policy: &str) -> Guard {
    Guard::start(upstream, uid, &["--policy", policy])
}

/// A guard on `socket`, wherever it is (a second guard on a dead one's socket): a stale
/// socket file accepts no connection, so this waits for the new listener.
fn start_guard_on(socket: &Path, upstream: &str, uid: &str, policy: &str) -> Guard {
    let dir = tempfile::Builder::new()
        .prefix("podmend-guard-")
        .tempdir()
        .expect("tempdir");
    let listen = format!("unix://{}", socket.display());
    let extra = ["--policy", policy];
    let guard = Guard::spawn(
        dir,
        socket.to_path_buf(),
        &["--listen", &listen],
        upstream,
        uid,
        &extra,
    );
    guard.wait_for_socket();
    guard
}

/// Whether the daemon holds a container labelled with a test case's `marker`.
fn marked(daemon: &Dockerd, marker: &str) -> bool {
    !daemon_labelled(daemon, &format!("{MARKER}={marker}")).is_empty()
}

/// A relay in front of dockerd that records every byte sent to it: what the guard let
/// through, whatever the daemon made of it.
struct Tap {
    socket: PathBuf,
    received: Arc<Mutex<Vec<u8>>>,
    _dir: tempfile::TempDir,
}

impl Tap {
    fn start(upstream: &Path) -> Tap {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("tap.sock");
        let listener = UnixListener::bind(&socket).expect("bind the tap");
        let received = Arc::new(Mutex::new(Vec::new()));
        let upstream = upstream.to_path_buf();
        let record = Arc::clone(&received);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(daemon) = UnixStream::connect(&upstream) else {
                    continue;
                };
                let record = Arc::clone(&record);
                std::thread::spawn(move || relay(client, daemon, record));
            }
        });
        Tap {
            socket,
            received,
            _dir: dir,
        }
    }

    fn host(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// Whether `needle` was ever sent to the daemon.
    fn saw(&self, needle: &str) -> bool {
        let received = self.received.lock().unwrap_or_else(|e| e.into_inner());
        received
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
    }
}

/// Copies both ways with half-close, recording what goes to the daemon.
fn relay(client: UnixStream, daemon: UnixStream, record: Arc<Mutex<Vec<u8>>>) {
    let (Ok(mut client_in), Ok(mut daemon_out)) = (client.try_clone(), daemon.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || {
        let mut buf = [0u8; 64 * 1024];
        while let Ok(n) = client_in.read(&mut buf) {
            if n == 0 {
                break;
            }
            record
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(&buf[..n]);
            if daemon_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = daemon_out.shutdown(std::net::Shutdown::Write);
    });
    let (mut daemon_in, mut client_out) = (daemon, client);
    let _ = std::io::copy(&mut daemon_in, &mut client_out);
    let _ = client_out.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
}

/// A create request for `target` with a Content-Length body.
fn request(method: &str, target: &str, version: &str, body: &str, close: bool) -> String {
    format!(
        "{method} {target} {version}\r\nHost: docker\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}\r\n{body}",
        body.len(),
        if close { "Connection: close\r\n" } else { "" }
    )
}

/// A request with the body in chunks of `size` bytes, each size line with an extension.
fn chunked(target: &str, body: &str, size: usize) -> String {
    let mut out = format!(
        "POST {target} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    for (i, chunk) in body.as_bytes().chunks(size).enumerate() {
        out.push_str(&format!("{:x};n={i}\r\n{}\r\n", chunk.len(), text(chunk)));
    }
    out.push_str("0\r\nX-Trailer: done\r\n\r\n");
    out
}

/// A create body without `--rm`, labelled with `marker`.
fn plain_body(marker: &str) -> String {
    json!({
        "Image": "busybox:latest",
        "Cmd": ["true"],
        "HostConfig": {"NetworkMode": "none"},
        "Labels": {MARKER: marker},
    })
    .to_string()
}

#[test]
fn every_spelling_of_the_create_path_is_refused_and_never_reaches_the_daemon() {
    let daemon = dockerd::shared();
    let tap = Tap::start(daemon.socket());
    let run_id = unique("paths");
    let guard = start_guard(&tap.host(), &run_id, "deny");

    // (target, HTTP version, method, whether dockerd 20.10 itself creates a container for it)
    let cases: [(&str, &str, &str, bool); 20] = [
        ("/v1.41/containers/create", "HTTP/1.1", "POST", true),
        ("/v1.99/containers/create", "HTTP/1.1", "POST", false),
        ("/containers/create", "HTTP/1.1", "POST", true),
        ("/v1.41//containers/create", "HTTP/1.1", "POST", false),
        ("//containers/create", "HTTP/1.1", "POST", false),
        ("/containers/create/", "HTTP/1.1", "POST", false),
        ("/CONTAINERS/create", "HTTP/1.1", "POST", false),
        ("/Containers/Create", "HTTP/1.1", "POST", false),
        ("/containers%2Fcreate", "HTTP/1.1", "POST", true),
        ("/%63ontainers/create", "HTTP/1.1", "POST", true),
        ("/containers%252Fcreate", "HTTP/1.1", "POST", false),
        ("/v1.41/./containers/create", "HTTP/1.1", "POST", false),
        ("/v1.41/x/../containers/create", "HTTP/1.1", "POST", false),
        ("/%761.41/containers/create", "HTTP/1.1", "POST", true),
        (
            "http://docker/v1.41/containers/create",
            "HTTP/1.1",
            "POST",
            true,
        ),
        // A scheme without an authority: Go keeps the path after it. Relayed unjudged (and
        // created without --rm) before the guard read targets the way Go does.
        ("http:/containers/create", "HTTP/1.1", "POST", true),
        ("x:/v1.41/containers/create", "HTTP/1.1", "POST", true),
        ("/v1.41/containers/create", "HTTP/1.0", "POST", true),
        ("/v1.41/containers/create", "HTTP/1.1", "post", false),
        ("/v1.41/containers/create", "HTTP/1.1", "Post", false),
    ];
    let with_name = |target: &str, marker: &str| {
        let separator = if target.contains('?') { '&' } else { '?' };
        format!("{target}{separator}name={marker}")
    };

    for (i, (target, version, method, _)) in cases.iter().enumerate() {
        let marker = format!("{run_id}-g{i}");
        let sent = request(
            method,
            &with_name(target, &marker),
            version,
            &plain_body(&marker),
            true,
        );
        let responses = raw(&guard.socket, sent.as_bytes());
        let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
        assert_eq!(
            statuses,
            [403],
            "{method} {target} {version}: {responses:?}"
        );
        assert_eq!(responses[0].json()["message"], DENY_MESSAGE, "{target}");
        assert!(
            !tap.saw(&marker),
            "{method} {target} {version} reached the daemon"
        );
        assert!(
            !marked(daemon, &marker),
            "{target}: a container was created"
        );
    }

    // The same requests straight to dockerd: which of them it would have created.
    let mut created = Vec::new();
    for (i, (target, version, method, dockerd_creates)) in cases.iter().enumerate() {
        let marker = format!("{run_id}-d{i}");
        let sent = request(
            method,
            &with_name(target, &marker),
            version,
            &plain_body(&marker),
            true,
        );
        let responses = raw(daemon.socket(), sent.as_bytes());
        let status = responses.first().map(|r| r.status);
        if status == Some(201) {
            created.push(marker.clone());
        }
        assert_eq!(
            status == Some(201),
            *dockerd_creates,
            "dockerd's routing of {method} {target} {version} changed ({responses:?}): check \
             that the guard's path normalisation still covers it"
        );
    }
    if !created.is_empty() {
        ok(daemon.docker().args(["rm", "-f"]).args(&created));
    }
}

#[test]
fn framing_tricks_get_the_policy_or_a_400_and_never_smuggle_a_create_through() {
    let daemon = dockerd::shared();
    let tap = Tap::start(daemon.socket());
    let run_id = unique("framing");
    let guard = start_guard(&tap.host(), &run_id, "deny");
    let create = |marker: &str, close: bool| {
        request(
            "POST",
            &format!("/v1.41/containers/create?name={marker}"),
            "HTTP/1.1",
            &plain_body(marker),
            close,
        )
    };

    type Build = Box<dyn Fn(&str) -> String>;
    let cases: Vec<(&str, Build, Vec<u16>)> = vec![
        (
            "a chunked body split every 3 bytes, with chunk extensions and a trailer",
            Box::new(|m: &str| chunked(&format!("/containers/create?name={m}"), &plain_body(m), 3)),
            vec![403],
        ),
        (
            "Content-Length and Transfer-Encoding",
            Box::new(|m: &str| {
                let body = plain_body(m);
                format!(
                    "POST /containers/create?name={m} HTTP/1.1\r\nHost: docker\r\nContent-Length: {}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            }),
            vec![400],
        ),
        (
            "Transfer-Encoding before a zero Content-Length, a create in the chunks",
            Box::new(move |m: &str| {
                let inner = request(
                    "POST",
                    &format!("/containers/create?name={m}"),
                    "HTTP/1.1",
                    &plain_body(m),
                    true,
                );
                format!(
                    "POST /v1.41/build HTTP/1.1\r\nHost: docker\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\nConnection: close\r\n\r\n{:x}\r\n{inner}\r\n0\r\n\r\n",
                    inner.len()
                )
            }),
            vec![400],
        ),
        (
            "two different Content-Lengths",
            Box::new(|m: &str| {
                let body = plain_body(m);
                format!(
                    "POST /containers/create?name={m} HTTP/1.1\r\nHost: docker\r\nContent-Length: {}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            }),
            vec![400],
        ),
        (
            "Transfer-Encoding on HTTP/1.0 (Go ignores it there)",
            Box::new(|m: &str| {
                chunked(&format!("/containers/create?name={m}"), &plain_body(m), 16)
                    .replacen("HTTP/1.1", "HTTP/1.0", 1)
            }),
            vec![400],
        ),
        (
            "Transfer-Encoding hidden in a folded header line",
            Box::new(|m: &str| {
                chunked(&format!("/containers/create?name={m}"), &plain_body(m), 16).replacen(
                    "Transfer-Encoding: chunked",
                    "X-Fold: a\r\n Transfer-Encoding: chunked",
                    1,
                )
            }),
            vec![400],
        ),
        (
            "gzip, chunked",
            Box::new(|m: &str| {
                chunked(&format!("/containers/create?name={m}"), &plain_body(m), 16).replacen(
                    "Transfer-Encoding: chunked",
                    "Transfer-Encoding: gzip, chunked",
                    1,
                )
            }),
            vec![400],
        ),
        (
            "pipelined in one write after an allowed ping",
            Box::new(move |m: &str| {
                format!(
                    "GET /_ping HTTP/1.1\r\nHost: docker\r\n\r\n{}",
                    create(m, true)
                )
            }),
            vec![200, 403],
        ),
        (
            "after a POST whose Content-Length ends before it",
            Box::new(move |m: &str| {
                format!(
                    "POST /v1.41/containers/podmend-missing/stop HTTP/1.1\r\nHost: docker\r\nContent-Length: 0\r\n\r\n{}",
                    create(m, true)
                )
            }),
            vec![404, 403],
        ),
        (
            "a lower-case head before it (the daemon answers with a body)",
            Box::new(move |m: &str| {
                format!(
                    "head /_ping HTTP/1.1\r\nHost: docker\r\n\r\n{}",
                    create(m, true)
                )
            }),
            vec![404, 403],
        ),
    ];
    for (i, (case, build, expected)) in cases.iter().enumerate() {
        let marker = format!("{run_id}-{i}");
        let responses = raw(&guard.socket, build(&marker).as_bytes());
        let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
        assert_eq!(&statuses, expected, "{case}: {responses:?}");
        for response in responses.iter().filter(|r| r.status >= 400) {
            let message = response.json()["message"]
                .as_str()
                .unwrap_or("")
                .to_string();
            match response.status {
                403 => assert_eq!(message, DENY_MESSAGE, "{case}"),
                400 => assert!(
                    message.starts_with("podmend guard: malformed HTTP request: "),
                    "{case}: {message}"
                ),
                404 => assert!(!message.is_empty(), "{case}: the daemon's own answer"),
                _ => {}
            }
        }
        assert!(!tap.saw(&marker), "{case}: the create reached the daemon");
        assert!(!marked(daemon, &marker), "{case}: a container was created");
    }

    // A forbidden create on a connection kept alive after an allowed request.
    let marker = format!("{run_id}-keepalive");
    let mut stream = UnixStream::connect(&guard.socket).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut buffer = Vec::new();
    for _ in 0..2 {
        stream
            .write_all(b"GET /v1.41/version HTTP/1.1\r\nHost: docker\r\n\r\n")
            .expect("write");
        assert_eq!(read_one(&mut stream, &mut buffer).status, 200);
    }
    stream
        .write_all(create(&marker, false).as_bytes())
        .expect("write");
    let refused = read_one(&mut stream, &mut buffer);
    assert_eq!(refused.status, 403, "{refused:?}");
    stream
        .write_all(b"GET /_ping HTTP/1.1\r\nHost: docker\r\n\r\n")
        .expect("write");
    assert_eq!(
        read_one(&mut stream, &mut buffer).status,
        200,
        "the connection still serves"
    );
    assert!(
        !tap.saw(&marker),
        "the kept-alive create reached the daemon"
    );

    // `--rm` split across chunk boundaries is still seen: allowed, with the owner label.
    let marker = format!("{run_id}-rm-chunked");
    let body = json!({
        "Image": "busybox:latest",
        "Cmd": ["true"],
        "HostConfig": {"NetworkMode": "none", "AutoRemove": true},
        "Labels": {MARKER: marker},
    })
    .to_string();
    let responses = raw(
        &guard.socket,
        chunked(&format!("/containers/create?name={marker}"), &body, 2).as_bytes(),
    );
    assert_eq!(responses[0].status, 201, "{responses:?}");
    assert_eq!(
        inspect(daemon, &marker, "{{.HostConfig.AutoRemove}}"),
        "true"
    );
    assert_eq!(
        inspect(
            daemon,
            &marker,
            &format!("{{{{index .Config.Labels \"{OWNER}\"}}}}")
        ),
        run_id
    );
}

#[test]
fn create_bodies_are_judged_the_way_dockerd_decodes_them() {
    let daemon = dockerd::shared();
    let tap = Tap::start(daemon.socket());
    let run_id = unique("bodies");
    let guard = start_guard(&tap.host(), &run_id, "deny");

    // (case, body with MARKER/MARK for the label and the marker, the guard's answer); what is
    // created must be --rm, what is refused must not have reached the daemon.
    let cases: [(&str, &str, u16); 10] = [
        (
            "duplicate AutoRemove, false last (Go takes the last)",
            r#"{"Image":"busybox:latest","HostConfig":{"AutoRemove":true,"NetworkMode":"none","AutoRemove":false},"Labels":{"MARKER":"MARK"}}"#,
            403,
        ),
        (
            "duplicate AutoRemove, true last",
            r#"{"Image":"busybox:latest","HostConfig":{"AutoRemove":false,"NetworkMode":"none","AutoRemove":true},"Labels":{"MARKER":"MARK"}}"#,
            201,
        ),
        (
            "duplicate HostConfig, the last without AutoRemove",
            r#"{"Image":"busybox:latest","HostConfig":{"AutoRemove":true},"HostConfig":{"NetworkMode":"none"},"Labels":{"MARKER":"MARK"}}"#,
            403,
        ),
        (
            "two spellings of AutoRemove",
            r#"{"Image":"busybox:latest","HostConfig":{"AutoRemove":true,"autoremove":false},"Labels":{"MARKER":"MARK"}}"#,
            400,
        ),
        (
            "a byte-order mark (dockerd: invalid character)",
            "\u{feff}{\"Image\":\"busybox:latest\",\"HostConfig\":{\"AutoRemove\":true},\"Labels\":{\"MARKER\":\"MARK\"}}",
            400,
        ),
        (
            "whitespace around the object, with --rm",
            " \r\n\t{\"Image\":\"busybox:latest\",\"HostConfig\":{\"AutoRemove\":true,\"NetworkMode\":\"none\"},\"Labels\":{\"MARKER\":\"MARK\"}} \n",
            201,
        ),
        (
            "whitespace around the object, without --rm",
            " \r\n\t{\"Image\":\"busybox:latest\",\"Labels\":{\"MARKER\":\"MARK\"}} \n",
            403,
        ),
        (
            "unknown fields everywhere, with --rm",
            r#"{"Image":"busybox:latest","Future":{"x":1},"HostConfig":{"AutoRemove":true,"NetworkMode":"none","Future":2},"Labels":{"MARKER":"MARK"}}"#,
            201,
        ),
        (
            "HostConfig null",
            r#"{"Image":"busybox:latest","HostConfig":null,"Labels":{"MARKER":"MARK"}}"#,
            403,
        ),
        (
            // dockerd 20.10 reads top-level HostConfig fields when HostConfig is null: this is
            // a --rm container there; the guard refuses it (stricter, never looser).
            "AutoRemove at the top level, HostConfig null",
            r#"{"Image":"busybox:latest","HostConfig":null,"AutoRemove":true,"Labels":{"MARKER":"MARK"}}"#,
            403,
        ),
    ];
    for (i, (case, body, expected)) in cases.iter().enumerate() {
        let marker = format!("{run_id}-{i}");
        let body = body
            .replace("MARKER", MARKER)
            .replace("MARK\"", &format!("{marker}\""));
        let sent = request(
            "POST",
            &format!("/v1.41/containers/create?name={marker}"),
            "HTTP/1.1",
            &body,
            true,
        );
        let responses = raw(&guard.socket, sent.as_bytes());
        assert_eq!(responses[0].status, *expected, "{case}: {responses:?}");
        match expected {
            201 => {
                assert_eq!(
                    inspect(daemon, &marker, "{{.HostConfig.AutoRemove}}"),
                    "true",
                    "{case}"
                );
            }
            _ => {
                assert!(!tap.saw(&marker), "{case}: the create reached the daemon");
                assert!(!marked(daemon, &marker), "{case}");
            }
        }
    }
}

#[test]
fn bytes_after_an_upgraded_attach_are_the_containers_stdin_not_requests() {
    let daemon = dockerd::shared();
    let run_id = unique("upgrade");
    let guard = start_guard(&daemon.host(), &run_id, "deny");
    let body = json!({
        "Image": "busybox:latest",
        "Cmd": ["cat"],
        "OpenStdin": true,
        "StdinOnce": true,
        "AttachStdin": true,
        "AttachStdout": true,
        "HostConfig": {"NetworkMode": "none", "AutoRemove": true},
    })
    .to_string();
    let created = raw(
        &guard.socket,
        request("POST", "/v1.41/containers/create", "HTTP/1.1", &body, true).as_bytes(),
    );
    assert_eq!(created[0].status, 201, "{created:?}");
    let id = created[0].json()["Id"].as_str().expect("Id").to_string();

    // The upgrade and, in the same write, a forbidden create.
    let marker = format!("{run_id}-smuggled");
    let smuggled = request(
        "POST",
        &format!("/v1.41/containers/create?name={marker}"),
        "HTTP/1.1",
        &plain_body(&marker),
        true,
    );
    let mut attach = UnixStream::connect(&guard.socket).expect("connect");
    attach
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let upgrade = format!(
        "POST /v1.41/containers/{id}/attach?stream=1&stdin=1&stdout=1 HTTP/1.1\r\nHost: docker\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n{smuggled}"
    );
    attach.write_all(upgrade.as_bytes()).expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        attach.read_exact(&mut byte).expect("the attach answer");
        head.push(byte[0]);
    }
    assert!(text(&head).starts_with("HTTP/1.1 101"), "{}", text(&head));

    let started = raw(
        &guard.socket,
        request(
            "POST",
            &format!("/v1.41/containers/{id}/start"),
            "HTTP/1.1",
            "",
            true,
        )
        .as_bytes(),
    );
    assert_eq!(started[0].status, 204, "{started:?}");
    attach
        .shutdown(std::net::Shutdown::Write)
        .expect("half-close");
    let mut output = Vec::new();
    attach
        .read_to_end(&mut output)
        .expect("the container's output");
    // `cat` echoed the request: it was stdin, never a request to the daemon.
    assert!(text(&output).contains(&marker), "{}", text(&output));
    assert!(!marked(daemon, &marker), "the smuggled create was not made");

    // An attach to a missing container: dockerd hijacks the connection before it finds out,
    // answers 404 as a raw stream and closes. What follows is never read as a request.
    let marker = format!("{run_id}-after-404");
    let sent = format!(
        "POST /v1.41/containers/podmend-missing/attach?stream=1&stdin=1 HTTP/1.1\r\nHost: docker\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n{}",
        request(
            "POST",
            &format!("/v1.41/containers/create?name={marker}"),
            "HTTP/1.1",
            &plain_body(&marker),
            true,
        )
    );
    let responses = raw(&guard.socket, sent.as_bytes());
    assert_eq!(responses.len(), 1, "{responses:?}");
    assert_eq!(responses[0].status, 404, "{responses:?}");
    assert!(
        responses[0]
            .head
            .contains("application/vnd.docker.raw-stream"),
        "{responses:?}"
    );
    assert!(
        text(&responses[0].body).contains("No such container"),
        "{responses:?}"
    );
    assert!(
        !marked(daemon, &marker),
        "the create after the hijack was not made"
    );
}

#[test]
fn under_rm_a_scheme_prefixed_create_gets_auto_remove_and_the_owner_label() {
    let daemon = dockerd::shared();
    let run_id = unique("scheme-rm");
    let guard = start_guard(&daemon.host(), &run_id, "rm");
    for (i, target) in ["http:/containers/create", "x:/v1.41/containers/create"]
        .iter()
        .enumerate()
    {
        let name = format!("{run_id}-{i}");
        let responses = raw(
            &guard.socket,
            request(
                "POST",
                &format!("{target}?name={name}"),
                "HTTP/1.1",
                &plain_body(&name),
                true,
            )
            .as_bytes(),
        );
        assert_eq!(responses[0].status, 201, "{target}: {responses:?}");
        assert_eq!(
            inspect(daemon, &name, "{{.HostConfig.AutoRemove}}"),
            "true",
            "{target}"
        );
        assert_eq!(
            inspect(
                daemon,
                &name,
                &format!("{{{{index .Config.Labels \"{OWNER}\"}}}}")
            ),
            run_id,
            "{target}"
        );
    }
}

#[test]
fn a_lower_case_head_gets_the_daemons_body_and_the_next_answer_is_not_garbled() {
    let daemon = dockerd::shared();
    let guard = start_guard(&daemon.host(), &unique("head"), "rm");
    let responses = raw(
        &guard.socket,
        b"head /_ping HTTP/1.1\r\nHost: docker\r\n\r\nGET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n",
    );
    let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [404, 200], "{responses:?}");
    assert_eq!(responses[0].json()["message"], "page not found");
    assert_eq!(responses[1].body, b"OK");
}

/// A client process whose stdout lines arrive on a channel while it runs.
struct Streaming {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: JoinHandle<Vec<u8>>,
}

impl Streaming {
    fn spawn(command: &mut Command, stdin: bool) -> Streaming {
        let mut child = command
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
        let stdout = child.stdout.take().expect("stdout");
        let mut stderr = child.stderr.take().expect("stderr");
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = stderr.read_to_end(&mut buf);
            buf
        });
        Streaming {
            child,
            lines,
            stderr,
        }
    }

    /// Waits for a stdout line containing `needle`.
    fn wait_for(&self, what: &str, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return,
                Ok(_) => {}
                Err(_) => panic!("{what}: no line with {needle:?} within 30 s"),
            }
        }
    }

    /// Waits for the exit (`None`: still running after `timeout`, then killed) and stderr.
    fn finish(mut self, timeout: Duration) -> (Option<ExitStatus>, String) {
        let status = wait_with_timeout(&mut self.child, timeout);
        let stderr = self.stderr.join().unwrap_or_default();
        (status, text(&stderr))
    }
}

/// A POSIX tar header for a regular file `name` of `size` bytes.
fn tar_header(name: &str, size: u64) -> [u8; 512] {
    let mut header = [0u8; 512];
    header[..name.len()].copy_from_slice(name.as_bytes());
    header[100..108].copy_from_slice(b"0000644\0");
    header[108..116].copy_from_slice(b"0000000\0");
    header[116..124].copy_from_slice(b"0000000\0");
    header[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    header[136..148].copy_from_slice(b"00000000000\0");
    header[148..156].copy_from_slice(b"        ");
    header[156] = b'0';
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    let sum: u32 = header.iter().map(|b| u32::from(*b)).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    header
}

#[test]
fn a_daemon_restarted_mid_stream_ends_the_streams_with_errors_and_later_requests_succeed() {
    // Its own daemon: this one is stopped and started again. Containers stop within 1 s.
    let mut daemon = Dockerd::start_with(&["--shutdown-timeout", "1"]);
    let run_id = unique("restart");
    let mut guard = start_guard(&daemon.host(), &run_id, "rm");

    // Three clients in the middle of streams through the guard. The events stream starts a
    // second back, so the create below is in it even if it lands before the stream is open
    // (a loaded machine starts the two clients in either order).
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |now| now.as_secs().saturating_sub(1));
    let events = Streaming::spawn(
        guard
            .docker()
            .args(["events", "--since", &since.to_string()])
            .args(["--filter", "type=container", "--format"])
            .arg("{{.Action}} {{.Actor.Attributes.name}}"),
        false,
    );
    let marker = format!("{run_id}-event");
    ok(guard.docker().args([
        "create",
        "--pull=never",
        "--network=none",
        "--name",
        &marker,
        "busybox",
    ]));
    events.wait_for(
        "docker events through the guard",
        &format!("create {marker}"),
    );

    let attached = Streaming::spawn(
        guard.docker().args(RUN).args([
            "--stop-timeout=1",
            "busybox",
            "sh",
            "-c",
            "while :; do echo tick; sleep 0.2; done",
        ]),
        false,
    );
    attached.wait_for("an attached docker run through the guard", "tick");

    let mut load = Streaming::spawn(guard.docker().arg("load"), true);
    let mut stdin = load.child.stdin.take().expect("stdin");
    let uploaded = Arc::new(AtomicUsize::new(0));
    let stop_upload = Arc::new(AtomicBool::new(false));
    let uploader = {
        let (uploaded, stop_upload) = (Arc::clone(&uploaded), Arc::clone(&stop_upload));
        std::thread::spawn(move || {
            // A tar of one 1 GiB file, sent slowly: the upload is still going on.
            if stdin.write_all(&tar_header("big.bin", 1 << 30)).is_err() {
                return;
            }
            let zeros = vec![0u8; 64 * 1024];
            while !stop_upload.load(Ordering::Relaxed) {
                if stdin.write_all(&zeros).is_err() {
                    return;
                }
                uploaded.fetch_add(zeros.len(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while uploaded.load(Ordering::Relaxed) < 2 << 20 {
        assert!(Instant::now() < deadline, "the upload did not get going");
        std::thread::sleep(Duration::from_millis(20));
    }

    let stopped = Instant::now();
    daemon.stop();
    eprintln!("dockerd stopped in {:?}", stopped.elapsed());

    // Every client ends with an error instead of hanging.
    let (status, stderr) = events.finish(Duration::from_secs(30));
    let status = status.expect("docker events ends when the daemon goes away");
    assert!(!status.success(), "docker events: {status} {stderr}");
    assert!(!stderr.trim().is_empty(), "docker events says why");
    eprintln!("docker events through the guard printed: {}", stderr.trim());
    let (status, stderr) = attached.finish(Duration::from_secs(30));
    let status = status.expect("an attached docker run ends when the daemon goes away");
    eprintln!(
        "the attached docker run ended with {status}: {}",
        stderr.trim()
    );
    let (status, stderr) = load.finish(Duration::from_secs(30));
    stop_upload.store(true, Ordering::Relaxed);
    let _ = uploader.join();
    let status = status.expect("docker load ends when the daemon goes away");
    assert!(!status.success(), "docker load: {status}");
    // The daemon's connection closed under the upload: so does the client's, with no
    // answer a daemon never gave.
    assert!(
        !stderr.trim().is_empty() && !stderr.contains("Error response from daemon"),
        "docker load says the connection failed: {stderr}"
    );

    // While it is down: refused as by the stopped daemon itself, and the guard keeps running.
    let out = run(guard.docker().args(["ps"]), None, TIMEOUT);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(&format!(
            "Cannot connect to the Docker daemon at {}",
            guard.host()
        )),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(guard.exited(), None, "the guard survived: {}", guard.log());

    // Back up: the same guard serves again, once it has seen the daemon answer (it tries
    // every 200 ms).
    daemon.start_again();
    wait_until_served(&guard);
    let out = ok(guard.docker().args(RUN).args(["busybox", "echo", "back"]));
    assert_eq!(out, "back\n");
    ok(guard.docker().args(["ps", "-a"]));
    drop(guard);
}

/// Waits (up to 10 s) until `docker version` through `guard` reaches the daemon.
fn wait_until_served(guard: &Guard) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = run(guard.docker().arg("version"), None, TIMEOUT);
        if out.status.success() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the guard does not serve again: {}\n{}",
            text(&out.stderr),
            guard.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_daemon_that_is_down_fails_every_cli_through_the_guard_as_it_does_straight_to_it() {
    // Its own daemon: this one is stopped and started again.
    let mut daemon = Dockerd::start_with(&["--shutdown-timeout", "1"]);
    let guard = start_guard(&daemon.host(), &unique("down"), "collect");
    ok(guard.docker().arg("version"));
    daemon.stop();

    let info = ["info", "--format", "{{.ServerVersion}}"];
    let configs = tempfile::tempdir().expect("tempdir");
    // Through the guard: refused as by the stopped daemon. The guard holds an idle
    // connection to the daemon, which the daemon closes as it stops (net/http/server.go,
    // `Server.Close` closes every connection), so the guard knows at once; the wait only
    // covers the guard's reaction.
    let deadline = Instant::now() + Duration::from_secs(5);
    while UnixStream::connect(&guard.socket).is_ok() {
        assert!(Instant::now() < deadline, "not refused: {}", guard.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    // Every CLI says and does what it does straight to the stopped daemon.
    assert_every_cli_fails_as_straight(
        &guard,
        &daemon.host(),
        &[&info, &["ps"], &["run", "--rm", "busybox", "true"]],
        configs.path(),
    );

    daemon.start_again();
    wait_until_served(&guard);
    let version = ok(guard.docker().args(info));
    assert!(!version.trim().is_empty(), "{version:?}");
}

#[test]
fn a_guard_killed_with_sigkill_comes_back_on_its_stale_socket_and_sigterm_then_removes_everything()
{
    let daemon = dockerd::shared();
    let uid = unique("sigkill-restart");
    let sockets = tempfile::tempdir().expect("tempdir");
    let socket = sockets.path().join("docker.sock");

    let mut first = start_guard_on(&socket, &daemon.host(), &uid, "rm");
    let before = ok(first
        .docker()
        .args(RUN)
        .args(["-d", "busybox", "sleep", "300"]));
    let status = first.signal("-KILL");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    assert!(socket.exists(), "SIGKILL leaves the socket file behind");
    assert_eq!(
        inspect(daemon, before.trim(), "{{.State.Status}}"),
        "running"
    );

    // The kubelet restarts the sidecar: same pod UID, same socket path.
    let mut second = start_guard_on(&socket, &daemon.host(), &uid, "rm");
    assert_eq!(
        ok(second.docker().args(RUN).args(["busybox", "echo", "again"])),
        "again\n"
    );
    let after = ok(second
        .docker()
        .args(RUN)
        .args(["-d", "busybox", "sleep", "300"]));
    let status = second.signal("-TERM");
    assert!(status.success(), "{status}: {}", second.log());
    for id in [&before, &after] {
        assert!(
            !exists(daemon, id.trim()),
            "{id} of the pod was removed at shutdown"
        );
    }
}

#[test]
fn after_a_sigkill_guard_reap_removes_the_dead_pods_running_containers_and_nothing_else() {
    // Its own daemon: reap works across the whole daemon.
    let daemon = Dockerd::start_with(&[]);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let stub = runtime.block_on(ApiStub::start(Vec::new(), Vec::new()));
    let killed = unique("pod-killed");
    let alive = unique("pod-alive");
    stub.set_objects(
        "pods",
        vec![json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "runner-alive", "namespace": "ci", "uid": alive},
            "spec": {"containers": [{"name": "job", "image": "docker:27-dind"}]},
        })],
    );

    let mut guard = start_guard(&daemon.host(), &killed, "rm");
    let killed_ids = [
        ok(guard
            .docker()
            .args(RUN)
            .args(["-d", "busybox", "sleep", "300"])),
        ok(guard
            .docker()
            .args(RUN)
            .args(["-d", "--restart=always", "busybox", "sleep", "300"])),
        ok(guard
            .docker()
            .args(["create", "--pull=never", "--network=none", "busybox"])),
    ];
    let alive_guard = start_guard(&daemon.host(), &alive, "rm");
    let kept = [
        ok(alive_guard
            .docker()
            .args(RUN)
            .args(["-d", "busybox", "sleep", "300"])),
        ok(daemon
            .docker()
            .args(RUN)
            .args(["-d", "busybox", "sleep", "300"])),
        ok(daemon
            .docker()
            .args(["create", "--pull=never", "--network=none", "busybox"])),
    ];

    let status = guard.signal("-KILL");
    assert!(!status.success());
    for id in &killed_ids[..2] {
        assert_eq!(
            inspect(&daemon, id.trim(), "{{.State.Status}}"),
            "running",
            "no clean-up ran after SIGKILL"
        );
    }

    let out = run(
        reap_command(&daemon.host())
            .arg("--kubeconfig")
            .arg(stub.kubeconfig_path()),
        None,
        TIMEOUT,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), killed_ids.len(), "{lines:?}");
    for id in &killed_ids {
        let id = id.trim();
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("removed {}", &id[..12]))
                    && l.contains(&format!("{OWNER}={killed}"))),
            "{id}: {lines:?}"
        );
        assert!(!exists(&daemon, id), "{id} was removed");
    }
    for id in &kept {
        assert!(exists(&daemon, id.trim()), "{id} of another owner was kept");
    }
    assert_eq!(
        daemon_labelled(&daemon, &format!("{OWNER}={killed}")),
        Vec::<String>::new()
    );
    drop(alive_guard);
    drop(runtime);
}

/// What the guard answers, under `rm`, `deny` and `reap`, to swarm init/join and service
/// create/update.
const SWARM_MESSAGE: &str = "podmend: swarm mode is refused on this CI runner (docker swarm init/join, docker service create/update): swarm services create containers the guard cannot label or remove, and swarm restarts them forever; ask the cluster admin to set the pod annotation podmend.io/dind-policy to audit to allow it";

#[test]
fn swarm_services_are_refused_under_rm_and_allowed_under_audit() {
    // Its own daemon: swarm mode is daemon-wide. Swarm containers carry no owner label and
    // are restarted by swarm, so neither the clean-up nor `guard reap` would see them.
    let daemon = Dockerd::start_with(&[]);
    let run_id = unique("swarm");
    let rm = start_guard(&daemon.host(), &run_id, "rm");
    let audit = start_guard(&daemon.host(), &format!("{run_id}-audit"), "audit");
    let state = || {
        ok(daemon
            .docker()
            .args(["info", "--format", "{{.Swarm.LocalNodeState}}"]))
        .trim()
        .to_string()
    };
    let refused = |command: &mut Command| {
        let out = run(command, None, TIMEOUT);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{command:?} succeeded");
        assert!(
            stderr.contains(SWARM_MESSAGE),
            "{command:?}: the CLI prints the guard's message: {stderr}"
        );
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let listen = format!("127.0.0.1:{port}");
    let init = [
        "swarm",
        "init",
        "--advertise-addr",
        "127.0.0.1",
        "--listen-addr",
    ];

    refused(rm.docker().args(init).arg(&listen));
    refused(rm.docker().args([
        "swarm",
        "join",
        "--token",
        "SWMTKN-1-3pu6hszjas19xyp7ghgosyx9k8atbfcr8p2is99znpy26u2lkl-1awxwuwd3z9j1z3puu7rcgdbx",
        "192.0.2.1:2377",
    ]));
    assert_eq!(
        state(),
        "inactive",
        "the refused init never reached the daemon"
    );

    // Under audit swarm mode is allowed (and a pod sharing the daemon could turn it on).
    ok(audit.docker().args(init).arg(&listen));
    assert_eq!(state(), "active");

    // With swarm on, a service is still refused under rm, however the path is spelled.
    let service = format!("{run_id}-service");
    let create = |guard: &Guard, replicas: &str| {
        let mut command = guard.docker();
        command
            .args(["service", "create", "--detach", "--no-resolve-image"])
            .args(["--replicas", replicas, "--name", &service])
            .args(["busybox:latest", "sleep", "300"]);
        command
    };
    refused(&mut create(&rm, "1"));
    let spec = json!({
        "Name": service,
        "TaskTemplate": {"ContainerSpec": {"Image": "busybox:latest", "Command": ["sleep", "300"]}},
    })
    .to_string();
    for target in ["//V1.41/Services/Create", "/v1.41/services%2Fcreate"] {
        let responses = raw(
            &rm.socket,
            request("POST", target, "HTTP/1.1", &spec, true).as_bytes(),
        );
        assert_eq!(responses.len(), 1, "{target}: {responses:?}");
        assert_eq!(responses[0].status, 403, "{target}: {responses:?}");
        assert_eq!(responses[0].json()["message"], SWARM_MESSAGE, "{target}");
    }
    let services = || ok(daemon.docker().args(["service", "ls", "-q"]));
    assert_eq!(services(), "", "no service was created under rm");

    // Under audit a service is created and updated (no replicas: this daemon has no network
    // for a task), and updating it under rm is refused.
    ok(&mut create(&audit, "0"));
    let replicas = || {
        ok(daemon.docker().args([
            "service",
            "inspect",
            "--format",
            "{{.Spec.Mode.Replicated.Replicas}}",
            &service,
        ]))
        .trim()
        .to_string()
    };
    refused(
        rm.docker()
            .args(["service", "update", "--detach", "--replicas", "1", &service]),
    );
    assert_eq!(
        replicas(),
        "0",
        "the refused update never reached the daemon"
    );
    ok(audit
        .docker()
        .args([
            "service",
            "update",
            "--detach",
            "--label-add",
            "podmend-test=1",
        ])
        .arg(&service));
    let labels = ok(daemon.docker().args([
        "service",
        "inspect",
        "--format",
        "{{index .Spec.Labels \"podmend-test\"}}",
        &service,
    ]));
    assert_eq!(
        labels.trim(),
        "1",
        "the update under audit reached the daemon"
    );

    // Nothing stays behind: no service, no swarm.
    ok(daemon.docker().args(["service", "rm", &service]));
    ok(daemon.docker().args(["swarm", "leave", "--force"]));
    assert_eq!(state(), "inactive");
    assert_eq!(
        ok(daemon.docker().args(["ps", "-aq"])),
        "",
        "no task container"
    );
}
