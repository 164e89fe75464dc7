//! `podmend guard` between the real docker CLI and a real dockerd (no mocks): `--rm`
//! enforcement and its exceptions, the whole API relayed (attach/exec hijacks with half-close,
//! streamed logs, a large build context, save/load), bypass attempts over raw HTTP, the
//! shutdown clean-up, TLS to the daemon, and `podmend guard reap`.
//!
//! One dockerd per test binary, one guard per test. Tests that reap by label across the
//! whole daemon take [`exclusive`]; every other test takes [`shared_daemon`].

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use common::api_stub::ApiStub;
use common::dockerd::{self, Dockerd, docker_cli, run, text, wait_with_timeout};
use common::guard::{
    Guard, OWNER, PODMEND, Pki, RUN, TIMEOUT, assert_every_cli_fails_as_straight, daemon_labelled,
    exists, free_port, http_get, inspect, ok, reap_command, uid, wait_until,
};
use common::raw_http::raw;
use serde_json::json;

const REAP: &str = "podmend.io/reap";
const DENY_MESSAGE: &str = "podmend: containers must be run with --rm on this CI runner (docker run --rm ...); ask the cluster admin to set the pod annotation podmend.io/dind-policy to reap or audit to allow it";

static DAEMON_WIDE: RwLock<()> = RwLock::new(());

/// Taken by tests whose containers must not be reaped by someone else's test.
fn shared_daemon() -> RwLockReadGuard<'static, ()> {
    DAEMON_WIDE.read().unwrap_or_else(|e| e.into_inner())
}

/// Taken by tests that reap across the whole daemon.
fn exclusive() -> RwLockWriteGuard<'static, ()> {
    DAEMON_WIDE.write().unwrap_or_else(|e| e.into_inner())
}

/// A guard with `--policy policy` in front of `daemon`.
fn start_guard(daemon: &Dockerd, policy: &str, uid: &str) -> Guard {
    Guard::start(&daemon.host(), uid, &["--policy", policy])
}

/// A request with a Content-Length body.
fn request(method: &str, target: &str, body: &str, close: bool) -> String {
    format!(
        "{method} {target} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}\r\n{body}",
        body.len(),
        if close { "Connection: close\r\n" } else { "" }
    )
}

/// A request with the body in chunks of at most 7 bytes.
fn chunked_request(target: &str, body: &str) -> String {
    let mut out = format!(
        "POST {target} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    for chunk in body.as_bytes().chunks(7) {
        out.push_str(&format!("{:x}\r\n{}\r\n", chunk.len(), text(chunk)));
    }
    out.push_str("0\r\n\r\n");
    out
}

fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

#[test]
fn without_the_guard_docker_run_leaves_a_stopped_container_and_through_the_guard_nothing_is_left() {
    let _lock = shared_daemon();
    let daemon = dockerd::shared();
    let uid = uid("rm");

    // The failure: straight to the daemon, a run without --rm leaves a stopped container.
    let leaked = format!("podmend-leak-{uid}");
    ok(daemon
        .docker()
        .args(RUN)
        .args(["--name", &leaked, "busybox", "true"]));
    let state = inspect(daemon, &leaked, "{{.State.Status}}");
    assert_eq!(state, "exited");
    ok(daemon.docker().args(["rm", &leaked]));

    // Through the guard: the same run leaves nothing, and exit codes survive.
    let guard = start_guard(daemon, "rm", &uid);
    let name = format!("podmend-clean-{uid}");
    ok(guard
        .docker()
        .args(RUN)
        .args(["--name", &name, "busybox", "true"]));
    wait_until("the container is removed", Duration::from_secs(20), || {
        !exists(daemon, &name)
    });
    let out = run(
        guard
            .docker()
            .args(RUN)
            .args(["busybox", "sh", "-c", "echo out; exit 3"]),
        None,
        TIMEOUT,
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "out\n");
    wait_until(
        "nothing of the pod is left",
        Duration::from_secs(20),
        || daemon_labelled(daemon, &format!("{OWNER}={uid}")).is_empty(),
    );
    assert!(guard.log().contains("decision=rm"), "{}", guard.log());
}

#[test]
fn stdin_reaches_the_container_through_the_upgraded_attach_and_its_half_close() {
    let _lock = shared_daemon();
    let daemon = dockerd::shared();
    let guard = start_guard(daemon, "rm", &uid("stdin"));

    let out = run(
        guard.docker().args(RUN).args(["-i", "busybox", "cat"]),
        Some(b"hello\n"),
        TIMEOUT,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hello\n");

    // A MiB of stdin, then EOF: the container sees all of it and its output still arrives.
    let input: Vec<u8> = (0..1 << 20).map(|i| b'a' + (i % 26) as u8).collect();
    let out = run(
        guard.docker().args(RUN).args(["-i", "busybox", "wc", "-c"]),
        Some(&input),
        TIMEOUT,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "1048576");
}

#[test]
fn the_debian_docker_20_10_cli_works_through_the_guard_too() {
    let _lock = shared_daemon();
    let daemon = dockerd::shared();
    let guard = start_guard(daemon, "rm", &uid("cli2010"));
    let debian_cli = PathBuf::from("/usr/bin/docker");
    assert!(debian_cli.is_file(), "{}", dockerd::INSTALL_HINT);
    let mut command = Command::new(&debian_cli);
    command
        .env("DOCKER_HOST", guard.host())
        .env("DOCKER_CONFIG", guard.dir.path().join("cli-2010"))
        .args(RUN)
        .args(["-i", "busybox", "sh", "-c", "cat; exit 4"]);
    let out = run(&mut command, Some(b"from 20.10\n"), TIMEOUT);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "from 20.10\n");
    let version = ok(Command::new(&debian_cli)
        .env("DOCKER_HOST", guard.host())
        .env("DOCKER_CONFIG", guard.dir.path().join("cli-2010"))
        .args(["version", "--format", "{{.Server.APIVersion}}"]));
    assert_eq!(version.trim(), "1.41");
}

#[test]
fn docker_exec_runs_commands_and_relays_stdin_through_the_guard() {
    let _lock = shared_daemon();
    let daemon = dockerd::shared();
    let guard = start_guard(daemon, "rm", &uid("exec"));
    let id = ok(guard
        .docker()
        .args(RUN)
        .args(["-d", "busybox", "sleep", "300"]));
    let id = id.trim();

    let out = ok(guard
        .docker()
        .args(["exec", id, "sh", "-c", "echo exec-ok; echo err >&2"]));
    assert_eq!(out, "exec-ok\n");
    let out = run(
        guard.docker().args(["exec", "-i", id, "cat"]),
        Some(b"piped\n"),
        TIMEOUT,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "piped\n");
    let out = run(
        guard.docker().args(["exec", id, "sh", "-c", "exit 7"]),
        None,
        TIMEOUT,
    );
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(inspect(daemon, id, "{{.HostConfig.AutoRemove}}"), "true");
}

#[test]
fn docker_logs_follow_streams_output_as_it_is_printed_until_the_container_exits() {
    let _lock = shared_daemon();
    let daemon = dockerd::shared();
    // reap: the container outlives its exit, so following it can start at any time.
    let guard = start_guard(daemon, "reap", &uid("logs"));
    let id = ok(guard.docker().args(RUN).args([
        "-d",
        "busybox",
        "sh",
        "-c",
        "echo one; sleep 3; echo two",
    ]));
    let started = Instant::now();
    let mut follow = guard
        .docker()
        .args(["logs", "-f", id.trim()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("docker logs -f");
    let stdout = follow.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .map(|line| (line, Instant::now()))
            .collect::<Vec<_>>()
    });
    let status = wait_with_timeout(&mut follow, TIMEOUT).expect("docker logs -f ends");
    let ended = Instant::now();
    let lines = reader.join().expect("reader");
    assert!(status.success());
    let texts: Vec<&str> = lines.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(texts, ["one", "two"]);
    // "one" came through while the stream was still open: not buffered to the end.
    let streamed_for = ended - lines[0].1;
    assert!(
        streamed_for >= Duration::from_secs(1),
        "first line arrived only {streamed_for:?} before the end ({:?} after start)",
        lines[0].1 - started
    );
}

#[test]
fn docker_build_streams_a_large_context_through_the_guard() {
    let _lock = shared_daemon();
    let daemon = dockerd::shared();
    let uid = uid("build");
    let guard = start_guard(daemon, "rm", &uid);
    let context = tempfile::tempdir().expect("tempdir");
    const SIZE: usize = 64 << 20;
    let mut big = Vec::with_capacity(SIZE);
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    while big.len() < SIZE {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        big.extend_from_slice(&state.to_le_bytes());
    }
    std::fs::write(context.path().join("big"), &big).expect("write big");
    drop(big);
    std::fs::write(
        context.path().join("Dockerfile"),
        "FROM busybox\nCOPY big /big\n",
    )
    .expect("Dockerfile");
    let tag = format!("podmend-build-{uid}:1");

    let started = Instant::now();
    ok(guard
        .docker()
        .env("DOCKER_BUILDKIT", "0")
        .args(["build", "--network", "none", "-t", &tag])
        .arg(context.path()));
    let took = started.elapsed();
    let peak_kib = vm_hwm_kib(guard.pid());
    eprintln!(
        "build of a 64 MiB context through the guard: {took:?}, guard peak RSS {peak_kib} KiB"
    );
    assert!(
        peak_kib < 40 * 1024,
        "the guard's peak RSS was {peak_kib} KiB: was the context buffered?"
    );

    let expected = ok(Command::new("sha256sum").arg(context.path().join("big")));
    let inside = ok(guard
        .docker()
        .args(RUN)
        .args(["--rm", &tag, "sha256sum", "/big"]));
    assert_eq!(
        inside.split_whitespace().next(),
        expected.split_whitespace().next()
    );
    ok(daemon.docker().args(["rmi", "-f", &tag]));
}

#[test]
fn docker_save_and_load_round_trip_an_image_through_the_guard() {
    let _lock = shared_daemon();
    let daemon = dockerd::shared();
    let uid = uid("saveload");
    let guard = start_guard(daemon, "rm", &uid);
    let tag = format!("podmend-load-{uid}:1");
    let archive = guard.dir.path().join("image.tar");

    ok(guard.docker().args(["tag", "busybox:latest", &tag]));
    ok(guard.docker().args(["save", "-o"]).arg(&archive).arg(&tag));
    let size = std::fs::metadata(&archive).expect("archive").len();
    assert!(size > 1 << 20, "the saved image is only {size} bytes");
    ok(guard.docker().args(["rmi", &tag]));
    assert!(
        !run(
            daemon.docker().args(["image", "inspect", &tag]),
            None,
            TIMEOUT
        )
        .status
        .success()
    );

    let loaded = ok(guard.docker().args(["load", "-i"]).arg(&archive));
    assert!(loaded.contains(&format!("Loaded image: {tag}")), "{loaded}");
    ok(daemon.docker().args(["image", "inspect", &tag]));
    ok(daemon.docker().args(["rmi", &tag]));
}

#[test]
fn deny_refuses_a_run_without_rm_with_the_guards_message_and_counts_it() {
    let _lock = shared_daemon();
    let daemon = dockerd::shared();
    let uid = uid("deny");
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let guard = Guard::start(
        &daemon.host(),
        &uid,
        &["--policy", "deny", "--metrics-listen", &metrics.to_string()],
    );

    let out = run(
        guard.docker().args(RUN).args(["busybox", "true"]),
        None,
        TIMEOUT,
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(DENY_MESSAGE),
        "{}",
        text(&out.stderr)
    );
    assert!(daemon_labelled(daemon, &format!("{OWNER}={uid}")).is_empty());

    ok(guard.docker().args(RUN).args(["--rm", "busybox", "true"]));

    let (status, text) = http_get(metrics, "/metrics").expect("metrics answer");
    assert_eq!(status, 200, "{text}");
    assert!(
        text.contains("podmend_guard_creates_total{decision=\"deny\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("podmend_guard_creates_total{decision=\"rm\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("podmend_guard_upstream_errors_total 0\n"),
        "{text}"
    );
    assert!(guard.log().contains("decision=deny"), "{}", guard.log());
}

#[test]
fn reap_keeps_containers_until_sigterm_then_removes_them_and_exits_zero() {
    let _lock = shared_daemon();
    let daemon = dockerd::shared();
    let uid = uid("reap");
    let mut guard = start_guard(daemon, "reap", &uid);

    ok(guard.docker().args(RUN).args(["busybox", "true"]));
    let running = ok(guard
        .docker()
        .args(RUN)
        .args(["-d", "busybox", "sleep", "300"]));
    let pod = format!("{OWNER}={uid}");
    let kept = daemon_labelled(daemon, &pod);
    assert_eq!(kept.len(), 2, "both containers stay: {kept:?}");
    for id in &kept {
        assert_eq!(
            inspect(
                daemon,
                id,
                &format!("{{{{index .Config.Labels \"{REAP}\"}}}}")
            ),
            "true"
        );
        assert_eq!(inspect(daemon, id, "{{.HostConfig.AutoRemove}}"), "false");
    }
    assert_eq!(
        inspect(daemon, running.trim(), "{{.State.Running}}"),
        "true"
    );

    let started = Instant::now();
    let status = guard.signal("-TERM");
    eprintln!(
        "shutdown with 2 containers (one running) took {:?}",
        started.elapsed()
    );
    assert!(status.success(), "exit status {status}: {}", guard.log());
    assert!(daemon_labelled(daemon, &pod).is_empty());
    assert!(guard.log().contains("removed=2"), "{}", guard.log());
    assert!(!guard.socket.exists(), "the socket is removed");
}

#[test]
fn a_restart_always_or_compose_container_under_rm_is_created_and_labelled_for_reaping() {
    let _lock = shared_daemon();
    let daemon = dockerd::shared();
    let uid = uid("restart");
    let mut guard = start_guard(daemon, "rm", &uid);

    let restarting =
        ok(guard
            .docker()
            .args(RUN)
            .args(["-d", "--restart", "always", "busybox", "sleep", "300"]));
    let restarting = restarting.trim();
    assert_eq!(
        inspect(daemon, restarting, "{{.HostConfig.RestartPolicy.Name}}"),
        "always"
    );
    assert_eq!(
        inspect(daemon, restarting, "{{.HostConfig.AutoRemove}}"),
        "false"
    );
    assert_eq!(inspect(daemon, restarting, "{{.State.Running}}"), "true");
    let compose = ok(guard.docker().args([
        "create",
        "--pull=never",
        "--network=none",
        "--label",
        "com.docker.compose.project=demo",
        "busybox",
        "true",
    ]));
    let compose = compose.trim();
    assert_eq!(
        inspect(daemon, compose, "{{.HostConfig.AutoRemove}}"),
        "false"
    );
    for id in [restarting, compose] {
        assert_eq!(
            inspect(
                daemon,
                id,
                &format!("{{{{index .Config.Labels \"{REAP}\"}}}}")
            ),
            "true"
        );
        assert_eq!(
            inspect(
                daemon,
                id,
                &format!("{{{{index .Config.Labels \"{OWNER}\"}}}}")
            ),
            uid
        );
    }
    let log = guard.log();
    assert!(log.contains("decision=restart-policy"), "{log}");
    assert!(log.contains("decision=compose"), "{log}");

    assert!(guard.signal("-TERM").success());
    assert!(!exists(daemon, restarting));
    assert!(!exists(daemon, compose));
}

#[test]
fn every_container_created_through_the_guard_carries_the_owner_label() {
    let _lock = shared_daemon();
    let daemon = dockerd::shared();
    for policy in ["rm", "deny", "reap", "audit"] {
        let uid = uid(&format!("label-{policy}"));
        let guard = start_guard(daemon, policy, &uid);
        let created = ok(guard.docker().args([
            "create",
            "--pull=never",
            "--network=none",
            "--rm",
            "--label",
            &format!("{OWNER}=forged"),
            "busybox",
            "true",
        ]));
        let running = ok(guard
            .docker()
            .args(RUN)
            .args(["-d", "--rm", "busybox", "sleep", "300"]));
        for id in [created.trim(), running.trim()] {
            let owner = inspect(
                daemon,
                id,
                &format!("{{{{index .Config.Labels \"{OWNER}\"}}}}"),
            );
            assert_eq!(owner, uid, "policy {policy}");
        }
        if policy != "deny" {
            let plain =
                ok(guard
                    .docker()
                    .args(["create", "--pull=never", "--network=none", "busybox"]));
            let owner = inspect(
                daemon,
                plain.trim(),
                &format!("{{{{index .Config.Labels \"{OWNER}\"}}}}"),
            );
            assert_eq!(owner, uid, "policy {policy}");
            let auto_remove = inspect(daemon, plain.trim(), "{{.HostConfig.AutoRemove}}");
            assert_eq!(auto_remove, (policy == "rm").to_string(), "policy {policy}");
        }
    }
}

#[test]
fn raw_bypass_attempts_on_the_create_path_all_get_the_policy() {
    let _lock = shared_daemon();
    let daemon = dockerd::shared();
    let uid = uid("bypass");
    let guard = start_guard(daemon, "deny", &uid);
    let body = r#"{"Image":"busybox:latest","Cmd":["true"],"HostConfig":{"NetworkMode":"none"}}"#;
    let two_spellings = r#"{"Image":"busybox:latest","hostconfig":{"AutoRemove":false},"HostConfig":{"AutoRemove":true}}"#;

    let table: Vec<(&str, String, Vec<u16>)> = vec![
        (
            "versioned",
            request("POST", "/v1.41/containers/create", body, true),
            vec![403],
        ),
        (
            "upper case",
            request("POST", "/V1.41/Containers/Create", body, true),
            vec![403],
        ),
        (
            "double slashes",
            request("POST", "//containers//create/", body, true),
            vec![403],
        ),
        (
            "percent-encoded slash",
            request("POST", "/containers%2Fcreate", body, true),
            vec![403],
        ),
        (
            "double-encoded slash",
            request("POST", "/containers%252Fcreate", body, true),
            vec![403],
        ),
        (
            "with a query",
            request("POST", "/v1.41/containers/create?name=x", body, true),
            vec![403],
        ),
        (
            "dot segment",
            request("POST", "/v1.41/containers/./create", body, true),
            vec![403],
        ),
        (
            "absolute-form",
            request("POST", "http://docker/v1.41/containers/create", body, true),
            vec![403],
        ),
        (
            "lower-case method",
            request("post", "/containers/create", body, true),
            vec![403],
        ),
        (
            "chunked body",
            chunked_request("/v1.41/containers/create", body),
            vec![403],
        ),
        (
            "pipelined after a ping",
            format!(
                "GET /_ping HTTP/1.1\r\nHost: docker\r\n\r\n{}",
                request("POST", "/v1.41/containers/create", body, true)
            ),
            vec![200, 403],
        ),
        (
            "pipelined after a denied create",
            format!(
                "{}{}",
                request("POST", "/containers/create", body, false),
                chunked_request("/containers%2Fcreate", body)
            ),
            vec![403, 403],
        ),
        (
            "two spellings of HostConfig",
            request("POST", "/containers/create", two_spellings, true),
            vec![400],
        ),
        (
            "Content-Length and chunked",
            format!(
                "POST /containers/create HTTP/1.1\r\nHost: docker\r\nContent-Length: {}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ),
            vec![400],
        ),
        (
            "a body over the guard's 64 MiB",
            format!(
                "POST /containers/create HTTP/1.1\r\nHost: docker\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                (64 << 20) + 1
            ),
            vec![413],
        ),
    ];
    for (case, request, expected) in table {
        let responses = raw(&guard.socket, request.as_bytes());
        let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
        assert_eq!(statuses, expected, "{case}: {responses:?}");
        for response in responses.iter().filter(|r| r.status == 403) {
            assert_eq!(response.json()["message"], DENY_MESSAGE, "{case}");
            assert!(
                response.head.contains("Content-Type: application/json"),
                "{case}"
            );
        }
    }
    assert!(daemon_labelled(daemon, &format!("{OWNER}={uid}")).is_empty());

    // Under rm, the rewritten body is what the daemon gets, however the create was spelled.
    let uid = self::uid("bypass-rm");
    let guard = start_guard(daemon, "rm", &uid);
    let lower =
        r#"{"Image":"busybox:latest","hostconfig":{"AutoRemove":false,"NetworkMode":"none"}}"#;
    let names: Vec<String> = (1..=4)
        .map(|i| format!("podmend-bypass-{uid}-{i}"))
        .collect();
    let requests = [
        chunked_request(&format!("/containers%2Fcreate?name={}", names[0]), body),
        format!(
            "GET /_ping HTTP/1.1\r\nHost: docker\r\n\r\n{}",
            request(
                "POST",
                &format!("/v1.41/containers/create?name={}", names[1]),
                body,
                true
            )
        ),
        request(
            "POST",
            &format!("/containers/create?name={}", names[2]),
            lower,
            true,
        ),
        request(
            "POST",
            &format!("http://docker/containers/create?name={}", names[3]),
            body,
            true,
        ),
    ];
    for (request, name) in requests.iter().zip(&names) {
        let responses = raw(&guard.socket, request.as_bytes());
        let created = responses.last().expect("a response");
        assert_eq!(created.status, 201, "{name}: {responses:?}");
        assert_eq!(
            inspect(daemon, name, "{{.HostConfig.AutoRemove}}"),
            "true",
            "{name}"
        );
        assert_eq!(
            inspect(
                daemon,
                name,
                &format!("{{{{index .Config.Labels \"{OWNER}\"}}}}")
            ),
            uid
        );
    }
}

#[test]
fn a_hijacked_attach_without_upgrade_relays_stdin_and_output() {
    let _lock = shared_daemon();
    let daemon = dockerd::shared();
    let guard = start_guard(daemon, "rm", &uid("hijack"));
    let body = json!({
        "Image": "busybox:latest",
        "Cmd": ["cat"],
        "OpenStdin": true,
        "StdinOnce": true,
        "AttachStdin": true,
        "AttachStdout": true,
        "HostConfig": {"NetworkMode": "none"},
    })
    .to_string();
    let created = raw(
        &guard.socket,
        request("POST", "/v1.41/containers/create", &body, true).as_bytes(),
    );
    assert_eq!(created[0].status, 201, "{created:?}");
    let id = created[0].json()["Id"].as_str().expect("Id").to_string();

    let mut attach = UnixStream::connect(&guard.socket).expect("connect");
    attach
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        attach,
        "POST /v1.41/containers/{id}/attach?stream=1&stdin=1&stdout=1 HTTP/1.1\r\nHost: docker\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        attach.read_exact(&mut byte).expect("attach response head");
        head.push(byte[0]);
    }
    let head = text(&head);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("application/vnd.docker."), "{head}");

    let started = raw(
        &guard.socket,
        request("POST", &format!("/v1.41/containers/{id}/start"), "", true).as_bytes(),
    );
    assert_eq!(started[0].status, 204, "{started:?}");
    attach.write_all(b"ping through a hijack\n").unwrap();
    attach.shutdown(std::net::Shutdown::Write).unwrap();
    let mut output = Vec::new();
    attach.read_to_end(&mut output).expect("attach output");
    // Multiplexed: an 8-byte frame header (stream 1 = stdout), then the bytes.
    assert!(
        text(&output).contains("ping through a hijack\n"),
        "{output:?}"
    );
    assert_eq!(output[0], 1, "a stdout frame: {output:?}");
}

#[test]
fn an_unreachable_daemon_is_refused_as_a_missing_daemon_is_and_every_cli_cannot_connect() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = format!("unix://{}/nowhere/docker.sock", dir.path().display());
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let guard_dir = tempfile::Builder::new()
        .prefix("podmend-guard-")
        .tempdir()
        .expect("tempdir");
    let socket = guard_dir.path().join("guard.sock");
    let listen = format!("unix://{}", socket.display());
    let guard = Guard::spawn(
        guard_dir,
        socket,
        &["--listen", &listen],
        &missing,
        &uid("unreachable"),
        &[
            "--metrics-listen",
            &metrics.to_string(),
            // A daemon not there yet is waited for: this test is about the answer after.
            "--upstream-wait",
            "0s",
        ],
    );
    guard.wait_until_started(metrics);
    // No HTTP answer: an answer would be an "Error response from daemon" to the CLI. The
    // socket is there, and refuses, as a stopped daemon's does.
    wait_until(
        "the guard refuses connections",
        Duration::from_secs(10),
        || {
            guard
                .log()
                .contains("connections are refused until it answers")
        },
    );
    assert!(guard.socket.exists());
    let refused = UnixStream::connect(&guard.socket).expect_err("refused");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    // Every CLI says and does what it does with no daemon at all.
    let info = ["info", "--format", "{{.ServerVersion}}"];
    assert_every_cli_fails_as_straight(&guard, &missing, &[&info, &["ps"]], dir.path());
    let (_, text) = http_get(metrics, "/metrics").expect("metrics");
    assert!(
        !text.contains("podmend_guard_upstream_errors_total 0\n"),
        "{text}"
    );
}

#[test]
fn the_guard_also_listens_on_tcp_for_tests_and_sidecars() {
    let _lock = shared_daemon();
    let daemon = dockerd::shared();
    let uid = uid("tcp");
    let address = format!("127.0.0.1:{}", free_port());
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(PODMEND)
        .args([
            "guard",
            "--listen",
            &format!("tcp://{address}"),
            "--upstream",
            &daemon.host(),
        ])
        .args(["--owner-pod-uid", &uid])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start podmend guard");
    wait_until("the guard listens on TCP", Duration::from_secs(20), || {
        TcpStream::connect(&address).is_ok()
    });
    let out = run(
        docker_cli(&format!("tcp://{address}"), &dir.path().join("cli"))
            .args(RUN)
            .args(["busybox", "echo", "over tcp"]),
        None,
        TIMEOUT,
    );
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let status = wait_with_timeout(&mut child, Duration::from_secs(40));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "over tcp\n");
    assert!(status.is_some_and(|s| s.success()));
    assert!(daemon_labelled(daemon, &format!("{OWNER}={uid}")).is_empty());
}

#[test]
fn the_guard_refuses_to_start_without_an_owner_pod_uid_or_with_a_bad_upstream() {
    let out = run(
        Command::new(PODMEND)
            .args([
                "guard",
                "--listen",
                "unix:///tmp/podmend-never.sock",
                "--upstream",
                "unix:///x.sock",
            ])
            .env_remove("PODMEND_OWNER_POD_UID"),
        None,
        TIMEOUT,
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--owner-pod-uid"),
        "{}",
        text(&out.stderr)
    );
    let out = run(
        Command::new(PODMEND)
            .args([
                "guard",
                "--upstream",
                "ssh://me@builder",
                "--owner-pod-uid",
                "u",
            ])
            .env_remove("PODMEND_OWNER_POD_UID"),
        None,
        TIMEOUT,
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("ssh:// is not supported"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_tls_daemon_is_verified_and_spoken_to_with_a_client_certificate() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let client_dir = dir.path().join("client");
    pki.write_client(&client_dir);
    let port = free_port();
    let tcp = format!("tcp://127.0.0.1:{port}");
    let daemon = pki.dockerd(dir.path(), port);
    let uid = uid("tls");
    let guard = Guard::start(
        &tcp,
        &uid,
        &[
            // This test was written when rm was the default; collect now is.
            "--policy",
            "rm",
            "--tls-verify",
            "--cert-path",
            &client_dir.display().to_string(),
        ],
    );
    assert_eq!(
        ok(guard.docker().args(RUN).args(["busybox", "echo", "tls-ok"])),
        "tls-ok\n"
    );
    let out = run(
        guard.docker().args(RUN).args(["-i", "busybox", "cat"]),
        Some(b"over tls\n"),
        TIMEOUT,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "over tls\n");
    wait_until(
        "the --rm container is gone",
        Duration::from_secs(20),
        || daemon_labelled(&daemon, &format!("{OWNER}={uid}")).is_empty(),
    );
    drop(guard);

    // A daemon whose certificate the CA does not vouch for gets no request.
    let other = tempfile::tempdir().expect("tempdir");
    let stranger = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    std::fs::write(other.path().join("ca.pem"), stranger.cert.pem()).unwrap();
    std::fs::copy(client_dir.join("cert.pem"), other.path().join("cert.pem")).unwrap();
    std::fs::copy(client_dir.join("key.pem"), other.path().join("key.pem")).unwrap();
    let guard = Guard::start(
        &tcp,
        &self::uid("tls-wrong-ca"),
        &[
            "--tls-verify",
            "--cert-path",
            &other.path().display().to_string(),
        ],
    );
    let responses = raw(&guard.socket, request("GET", "/_ping", "", true).as_bytes());
    assert_eq!(responses[0].status, 502, "{responses:?}");
    let message = responses[0].json()["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("certificate"), "{message}");
}

/// `podmend guard reap ...` against `daemon`.
fn reap(daemon: &Dockerd, args: &[&str]) -> Output {
    run(reap_command(&daemon.host()).args(args), None, TIMEOUT)
}

#[test]
fn guard_reap_older_than_removes_old_stopped_labelled_containers_and_leaves_the_rest() {
    let _lock = exclusive();
    let daemon = dockerd::shared();
    let uid = uid("older");
    let guard = start_guard(daemon, "reap", &uid);
    let old = ok(guard.docker().args(RUN).args(["-d", "busybox", "true"]));
    let running = ok(guard
        .docker()
        .args(RUN)
        .args(["-d", "busybox", "sleep", "300"]));
    let unlabelled = ok(daemon.docker().args([
        "create",
        "--pull=never",
        "--network=none",
        "busybox",
        "true",
    ]));
    wait_until("the old container stopped", Duration::from_secs(20), || {
        inspect(daemon, old.trim(), "{{.State.Status}}") == "exited"
    });
    std::thread::sleep(Duration::from_secs(4));
    let fresh = ok(guard.docker().args(RUN).args(["-d", "busybox", "true"]));
    wait_until(
        "the fresh container stopped",
        Duration::from_secs(20),
        || inspect(daemon, fresh.trim(), "{{.State.Status}}") == "exited",
    );
    let short = |id: &str| id.trim()[..12].to_string();

    let dry = reap(daemon, &["--older-than", "3s", "--dry-run"]);
    assert!(dry.status.success(), "{}", text(&dry.stderr));
    let lines: Vec<String> = text(&dry.stdout).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with(&format!("would remove {} ", short(&old))),
        "{lines:?}"
    );
    assert!(lines[0].contains(&format!("{OWNER}={uid}")), "{lines:?}");
    assert!(exists(daemon, old.trim()), "a dry run removes nothing");

    let done = reap(daemon, &["--older-than", "3s"]);
    assert!(done.status.success(), "{}", text(&done.stderr));
    let lines: Vec<String> = text(&done.stdout).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with(&format!("removed {} ", short(&old))),
        "{lines:?}"
    );
    assert!(!exists(daemon, old.trim()));
    for kept in [&running, &fresh, &unlabelled] {
        assert!(exists(daemon, kept.trim()), "{kept} was kept");
    }
    ok(daemon.docker().args(["rm", "-f", unlabelled.trim()]));
}

#[test]
fn guard_reap_removes_the_containers_of_pods_that_are_gone_and_dry_run_removes_nothing() {
    let _lock = exclusive();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(pods_gone());
}

async fn pods_gone() {
    let stub = ApiStub::start(Vec::new(), Vec::new()).await;
    let alive = uid("pod-alive");
    let gone = uid("pod-gone");
    let pod = |name: &str, uid: &str| {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "ci", "uid": uid},
            "spec": {"containers": [{"name": "job", "image": "docker:27-dind"}]},
        })
    };
    stub.set_objects(
        "pods",
        vec![
            pod("runner-alive", &alive),
            pod("runner-other", "someone-else"),
        ],
    );
    let kubeconfig = stub.kubeconfig_path().display().to_string();

    let (alive_ids, gone_ids, dry, done) = tokio::task::spawn_blocking(move || {
        let daemon = dockerd::shared();
        let alive_guard = start_guard(daemon, "reap", &alive);
        let gone_guard = start_guard(daemon, "reap", &gone);
        let mut alive_ids = vec![ok(alive_guard
            .docker()
            .args(RUN)
            .args(["-d", "busybox", "sleep", "300"]))];
        alive_ids.push(ok(alive_guard.docker().args([
            "create",
            "--pull=never",
            "--network=none",
            "busybox",
        ])));
        let gone_ids = vec![
            ok(gone_guard
                .docker()
                .args(RUN)
                .args(["-d", "busybox", "sleep", "300"])),
            ok(gone_guard
                .docker()
                .args(["create", "--pull=never", "--network=none", "busybox"])),
        ];
        let dry = reap(daemon, &["--kubeconfig", &kubeconfig, "--dry-run"]);
        let gone_still_there = gone_ids.iter().all(|id| exists(daemon, id.trim()));
        assert!(gone_still_there, "a dry run removes nothing");
        let done = reap(daemon, &["--kubeconfig", &kubeconfig]);
        let alive_ids: Vec<(String, bool)> = alive_ids
            .into_iter()
            .map(|id| (id.clone(), exists(daemon, id.trim())))
            .collect();
        let gone_ids: Vec<(String, bool)> = gone_ids
            .into_iter()
            .map(|id| (id.clone(), exists(daemon, id.trim())))
            .collect();
        drop(alive_guard);
        drop(gone_guard);
        (alive_ids, gone_ids, dry, done)
    })
    .await
    .expect("docker work");

    assert!(dry.status.success(), "{}", text(&dry.stderr));
    let dry_lines: Vec<String> = text(&dry.stdout).lines().map(str::to_string).collect();
    assert_eq!(dry_lines.len(), 2, "{dry_lines:?}");
    for (id, _) in &gone_ids {
        assert!(
            dry_lines
                .iter()
                .any(|l| l.starts_with(&format!("would remove {} ", &id.trim()[..12]))),
            "{dry_lines:?}"
        );
    }
    assert!(done.status.success(), "{}", text(&done.stderr));
    let lines: Vec<String> = text(&done.stdout).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines
            .iter()
            .all(|l| l.starts_with("removed ") && l.contains("owner pod no longer exists")),
        "{lines:?}"
    );
    for (id, exists) in &gone_ids {
        assert!(!exists, "{id} of the gone pod was removed");
    }
    for (id, exists) in &alive_ids {
        assert!(exists, "{id} of the live pod was kept");
    }
}

#[test]
fn guard_reap_without_a_cluster_or_older_than_explains_what_it_needs() {
    let daemon = dockerd::shared();
    let dir = tempfile::tempdir().expect("tempdir");
    let out = run(
        Command::new(PODMEND)
            .args([
                "guard",
                "reap",
                "--upstream",
                &daemon.host(),
                "--kubeconfig",
            ])
            .arg(dir.path().join("missing-kubeconfig")),
        None,
        TIMEOUT,
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--older-than"),
        "{}",
        text(&out.stderr)
    );
}

/// Writes `request` to `socket`, then half-closes (`shutdown(SHUT_WR)`, as
/// `printf ... | socat - UNIX-CONNECT:` does at the end of its input) and reads everything
/// until the other side closes.
fn half_closed(socket: &std::path::Path, request: &[u8]) -> String {
    let mut stream = UnixStream::connect(socket).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    stream.write_all(request).expect("write the request");
    stream
        .shutdown(std::net::Shutdown::Write)
        .expect("half-close");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    text(&answer)
}

#[test]
fn a_client_that_half_closes_after_its_request_gets_the_daemons_answer_through_the_guard() {
    // dockerd's Go server writes a handler's reply to a client that half-closed
    // (net/http/server.go, `connReader.backgroundRead` only cancels the request's context).
    let _lock = shared_daemon();
    let daemon = dockerd::shared();
    let guard = start_guard(daemon, "rm", &uid("half-close"));
    let ping = b"GET /_ping HTTP/1.0\r\n\r\n";
    for (who, socket) in [
        ("dockerd", daemon.socket()),
        ("guard", guard.socket.as_path()),
    ] {
        for _ in 0..5 {
            let answer = half_closed(socket, ping);
            assert!(
                answer.starts_with("HTTP/1.0 200 OK\r\n") && answer.ends_with("\r\n\r\nOK"),
                "{who}: {answer:?}"
            );
        }
    }

    // socat, as the issue's users send it: its stdin ends, it half-closes and reads on.
    let socat = dockerd::find_program("socat")
        .unwrap_or_else(|| panic!("socat is not installed: {}", dockerd::INSTALL_HINT));
    for (who, socket) in [
        ("dockerd", daemon.socket()),
        ("guard", guard.socket.as_path()),
    ] {
        for _ in 0..20 {
            let answer = run(
                Command::new(&socat)
                    .arg("-")
                    .arg(format!("UNIX-CONNECT:{}", socket.display())),
                Some(ping),
                TIMEOUT,
            );
            let answer = text(&answer.stdout);
            assert!(answer.ends_with("\r\n\r\nOK"), "{who}: {answer:?}");
        }
    }

    // A pause sent this way is answered, and the container is paused.
    let name = format!("podmend-half-close-{}", std::process::id());
    ok(guard
        .docker()
        .args(RUN)
        .args(["-d", "--rm", "--name", &name, "busybox", "sleep", "300"]));
    let pause = format!("POST /containers/{name}/pause HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
    let answer = half_closed(&guard.socket, pause.as_bytes());
    assert!(answer.starts_with("HTTP/1.0 204 "), "{answer:?}");
    assert_eq!(inspect(daemon, &name, "{{.State.Status}}"), "paused");
    ok(daemon.docker().args(["rm", "-f", &name]));
}

/// Sends a request with a head of `header_bytes` of one header to `socket`, and reads the
/// status of the answer (the writing runs on its own thread: the server may answer and stop
/// reading before the head ends).
fn status_of_a_large_head(socket: &std::path::Path, header_bytes: usize) -> Option<u16> {
    let mut stream = UnixStream::connect(socket).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut writer = stream.try_clone().expect("clone");
    let mut head = b"GET /_ping HTTP/1.1\r\nHost: docker\r\nX-Padding: ".to_vec();
    head.resize(head.len() + header_bytes, b'a');
    head.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
    let sending = std::thread::spawn(move || {
        let _ = writer.write_all(&head);
    });
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    drop(stream);
    let _ = sending.join();
    text(&answer).get(9..12)?.parse().ok()
}

#[test]
fn a_request_head_over_a_mebibyte_gets_the_431_dockerd_answers_and_one_just_under_is_served() {
    // Go's server reads a head up to DefaultMaxHeaderBytes (1 MiB) plus 4096 bytes of slack
    // and answers 431 past it (net/http/server.go, `Server.initialReadLimitSize`,
    // `conn.serve`).
    let _lock = shared_daemon();
    let daemon = dockerd::shared();
    let guard = start_guard(daemon, "rm", &uid("large-head"));
    for (who, socket) in [
        ("dockerd", daemon.socket()),
        ("guard", guard.socket.as_path()),
    ] {
        for over in [(1 << 20) + 8192, 4 << 20] {
            assert_eq!(
                status_of_a_large_head(socket, over),
                Some(431),
                "{who} {over}"
            );
        }
        assert_eq!(status_of_a_large_head(socket, 1 << 20), Some(200), "{who}");
    }
}

#[test]
fn a_create_body_over_a_mebibyte_runs_through_the_guard_as_it_does_straight_to_dockerd() {
    let _lock = shared_daemon();
    let daemon = dockerd::shared();
    let guard = start_guard(daemon, "rm", &uid("large-create"));
    let dir = tempfile::tempdir().expect("tempdir");
    let env_file = dir.path().join("env");
    let mut lines = String::new();
    for i in 0..12_000 {
        lines.push_str(&format!("PODMEND_VAR_{i}={}\n", "v".repeat(90)));
    }
    lines.push_str("PODMEND_LAST=reached\n");
    std::fs::write(&env_file, &lines).expect("write the env file");
    assert!(lines.len() > 1 << 20, "{} bytes", lines.len());
    let env_file = env_file.display().to_string();
    for (who, mut docker) in [("dockerd", daemon.docker()), ("guard", guard.docker())] {
        let out = run(
            docker.args(RUN).args([
                "--rm",
                "--env-file",
                &env_file,
                "busybox",
                "sh",
                "-c",
                "echo $PODMEND_LAST",
            ]),
            None,
            TIMEOUT,
        );
        assert!(out.status.success(), "{who}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "reached\n", "{who}");
    }
}

#[test]
fn create_bodies_dockerd_decodes_get_the_same_answer_through_the_guard() {
    // dockerd 20.10 decodes a create with one `json.Decoder.Decode` on the body
    // (runconfig/config.go, `decodeContainerConfig`): a lone surrogate escape becomes U+FFFD
    // (encoding/json/decode.go, `unquoteBytes`), what follows the object is not read, and
    // an empty body is an `io.EOF` answered 500.
    let _lock = shared_daemon();
    let daemon = dockerd::shared();
    let uid = uid("go-json");
    let guard = start_guard(daemon, "rm", &uid);
    let cases = [
        (
            "surrogate",
            r#"{"Image":"busybox","Cmd":["echo","\ud800 and \udc00"]}"#,
        ),
        (
            "trailing",
            r#"{"Image":"busybox","Cmd":["true"]} and then some"#,
        ),
        ("empty", ""),
    ];
    for (case, body) in cases {
        let mut statuses = Vec::new();
        for (who, socket) in [
            ("dockerd", daemon.socket()),
            ("guard", guard.socket.as_path()),
        ] {
            let name = format!("podmend-go-json-{case}-{who}-{}", std::process::id());
            let create = request(
                "POST",
                &format!("/containers/create?name={name}"),
                body,
                true,
            );
            let responses = raw(socket, create.as_bytes());
            statuses.push(responses[0].status);
            if responses[0].status == 201 && case == "surrogate" {
                let cmd = inspect(daemon, &name, "{{json .Config.Cmd}}");
                assert_eq!(cmd, "[\"echo\",\"\u{fffd} and \u{fffd}\"]", "{who}");
            }
            let _ = run(daemon.docker().args(["rm", "-f", &name]), None, TIMEOUT);
        }
        let expected = if case == "empty" { 500 } else { 201 };
        assert_eq!(statuses, [expected, expected], "{case}: dockerd, guard");
    }

    // docker-py sends a non-UTF-8 argument (a lone surrogate from Python's
    // surrogateescape) as a `\udcff` escape: created straight and through the guard alike.
    let python = common::python::venv_python(&["docker"]);
    let script = r#"
import sys, docker
client = docker.APIClient(base_url="unix://" + sys.argv[1])
created = client.create_container("busybox", command=["echo", "a\udcffb"], name=sys.argv[2])
print(created["Id"])
"#;
    for (who, socket) in [
        ("dockerd", daemon.socket()),
        ("guard", guard.socket.as_path()),
    ] {
        let name = format!("podmend-docker-py-{who}-{}", std::process::id());
        let created = run(
            Command::new(&python)
                .args(["-c", script])
                .arg(socket)
                .arg(&name),
            None,
            TIMEOUT,
        );
        assert!(
            created.status.success(),
            "{who}: {}{}",
            text(&created.stderr),
            guard.log()
        );
        let cmd = inspect(daemon, &name, "{{json .Config.Cmd}}");
        assert_eq!(cmd, "[\"echo\",\"a\u{fffd}b\"]", "{who}");
        let _ = run(daemon.docker().args(["rm", "-f", &name]), None, TIMEOUT);
    }
}

#[test]
fn asking_for_a_container_collect_removed_gets_a_message_naming_the_policy() {
    let _lock = shared_daemon();
    let daemon = dockerd::shared();
    let guard = Guard::start(
        &daemon.host(),
        &uid("collected"),
        &["--policy", "collect", "--min-age", "2s"],
    );
    let name = format!("podmend-collected-{}", std::process::id());
    let id = ok(guard
        .docker()
        .args(RUN)
        .args(["-d", "--name", &name, "busybox", "echo", "done"]))
    .trim()
    .to_string();
    wait_until(
        "collect removes the exited container",
        Duration::from_secs(30),
        || !exists(daemon, &name),
    );
    // Straight to the daemon: a bare "No such container".
    let out = run(daemon.docker().args(["logs", &name]), None, TIMEOUT);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(&format!("No such container: {name}"))
            && !text(&out.stderr).contains("podmend guard"),
        "{}",
        text(&out.stderr)
    );
    // Through the guard: the same, and who removed it, under which limits.
    let short = &id[..12];
    let copied = tempfile::tempdir().expect("tempdir");
    let destination = copied.path().display().to_string();
    let asks: [&[&str]; 4] = [
        &["logs", &name],
        &["logs", short],
        &["container", "inspect", &name],
        &["cp", &format!("{name}:/etc/hostname"), &destination],
    ];
    for args in asks {
        let out = run(guard.docker().args(args), None, TIMEOUT);
        assert!(!out.status.success(), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("No such container: ")
                && stderr.contains("podmend guard, policy collect")
                && stderr.contains(&format!(" {name} ({short})"))
                && stderr.contains("--min-age 2s and --max-exited 20"),
            "{args:?}: {stderr}"
        );
    }
    // A name never used is the daemon's bare answer.
    let out = run(
        guard.docker().args(["logs", &format!("{name}-never")]),
        None,
        TIMEOUT,
    );
    assert!(
        !text(&out.stderr).contains("podmend guard"),
        "{}",
        text(&out.stderr)
    );
}
