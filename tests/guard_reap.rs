//! `podmend guard reap` as a node's DaemonSet runs it, against a real dockerd: the long-
//! running mode (`--interval`, the node's pods only, metrics, SIGTERM) removes what guards
//! killed with SIGKILL left behind once the API says their pods are gone or finished, and the
//! image budget removes unused images least recently used first, never one in use.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::api_stub::ApiStub;
use common::dockerd::{Dockerd, run, text, wait_with_timeout};
use common::guard::{
    Guard, OWNER, RUN, TIMEOUT, daemon_labelled, exists, free_port, http_get, image_exists, metric,
    ok, reap_command, runner_pod, uid, wait_until,
};
use serde_json::{Value, json};

/// `GET path` straight to the daemon's socket (HTTP/1.0: the body ends with the connection).
fn api_get(daemon: &Dockerd, path: &str) -> Value {
    let mut stream = UnixStream::connect(daemon.socket()).expect("connect to dockerd");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n").expect("request");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).expect("answer");
    let answer = text(&answer);
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head");
    assert!(head.starts_with("HTTP/1.0 200"), "{head}");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

#[test]
fn containers_a_sigkilled_guard_left_are_removed_by_the_reaper_once_the_api_says_the_pod_is_gone() {
    // Its own daemon: the reaper works across the whole daemon.
    let daemon = Dockerd::start_with(&[]);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let stub = runtime.block_on(ApiStub::start(Vec::new(), Vec::new()));
    let (killed, finished, alive) = (uid("killed"), uid("finished"), uid("alive"));
    stub.set_objects(
        "pods",
        vec![
            runner_pod("runner-alive", &alive, "node-a", Some("Running")),
            runner_pod("runner-finished", &finished, "node-a", Some("Succeeded")),
            runner_pod("elsewhere", "uid-on-node-b", "node-b", Some("Running")),
        ],
    );

    // Two guards die with SIGKILL: no clean-up runs, their containers stay.
    let mut killed_guard = Guard::start(&daemon.host(), &killed, &[]);
    killed_guard.keep_leftovers();
    let mut doomed = vec![ok(killed_guard
        .docker()
        .args(RUN)
        .args(["-d", "busybox", "sleep", "300"]))];
    ok(killed_guard.docker().args(RUN).args([
        "--name",
        &format!("exited-{killed}"),
        "busybox",
        "true",
    ]));
    doomed.push(format!("exited-{killed}"));
    doomed.push(ok(killed_guard.docker().args([
        "create",
        "--pull=never",
        "--network=none",
        "busybox",
    ])));
    let mut finished_guard = Guard::start(&daemon.host(), &finished, &[]);
    finished_guard.keep_leftovers();
    doomed.push(ok(finished_guard
        .docker()
        .args(RUN)
        .args(["-d", "busybox", "sleep", "300"])));
    let alive_guard = Guard::start(&daemon.host(), &alive, &[]);
    let kept = [
        ok(alive_guard
            .docker()
            .args(RUN)
            .args(["-d", "busybox", "sleep", "300"])),
        ok(daemon
            .docker()
            .args(RUN)
            .args(["-d", "busybox", "sleep", "300"])),
    ];
    for guard in [&mut killed_guard, &mut finished_guard] {
        let status = guard.signal("-KILL");
        assert!(!status.success());
    }
    assert_eq!(
        inspect_state(&daemon, doomed[0].trim()),
        "running",
        "no clean-up ran after SIGKILL"
    );

    // A misspelt node name lists no pod: nothing is removed.
    let typo = run(
        reap_command(&daemon.host())
            .arg("--kubeconfig")
            .arg(stub.kubeconfig_path())
            .env("NODE_NAME", "node-z"),
        None,
        TIMEOUT,
    );
    assert!(!typo.status.success());
    assert!(
        text(&typo.stderr).contains("--node-name"),
        "{}",
        text(&typo.stderr)
    );
    assert!(doomed.iter().all(|id| exists(&daemon, id.trim())));

    // The node's reaper: a pass every second, this node's pods only (NODE_NAME, as the
    // DaemonSet sets it from the downward API).
    let metrics = format!("127.0.0.1:{}", free_port());
    let out_dir = tempfile::tempdir().expect("tempdir");
    let out = std::fs::File::create(out_dir.path().join("out")).expect("out");
    let mut reaper = reap_command(&daemon.host())
        .arg("--kubeconfig")
        .arg(stub.kubeconfig_path())
        .args(["--interval", "1s", "--metrics-listen", &metrics])
        .env("NODE_NAME", "node-a")
        .env("RUST_LOG", "info")
        .stdout(out)
        .stderr(Stdio::piped())
        .spawn()
        .expect("podmend guard reap");
    wait_until(
        "the reaper removed the dead pods' containers",
        Duration::from_secs(30),
        || doomed.iter().all(|id| !exists(&daemon, id.trim())),
    );
    for id in &kept {
        assert!(exists(&daemon, id.trim()), "{id} was kept");
    }
    let metrics = metrics.parse().expect("address");
    assert_eq!(
        metric(
            metrics,
            "podmend_guard_containers_removed_total{reason=\"owner-gone\"}"
        ),
        Some(doomed.len() as u64)
    );
    assert_eq!(http_get(metrics, "/healthz").map(|r| r.0), Some(200));
    assert_eq!(http_get(metrics, "/readyz").map(|r| r.0), Some(200));
    assert!(
        stub.requests()
            .iter()
            .any(|r| r.contains("fieldSelector=spec.nodeName%3Dnode-a")),
        "{:?}",
        stub.requests()
    );
    let sent = Command::new("kill")
        .arg("-TERM")
        .arg(reaper.id().to_string())
        .status()
        .expect("kill");
    assert!(sent.success());
    let status = wait_with_timeout(&mut reaper, Duration::from_secs(20)).expect("reaper exits");
    let mut stderr = String::new();
    let _ = reaper
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr);
    assert!(status.success(), "{status}: {stderr}");
    let lines = std::fs::read_to_string(out_dir.path().join("out")).expect("out");
    assert_eq!(lines.lines().count(), doomed.len(), "{lines}");
    assert!(
        lines.lines().all(|l| l.starts_with("removed ")
            && (l.contains(&format!("{OWNER}={killed}"))
                || l.contains(&format!("{OWNER}={finished}")))),
        "{lines}"
    );
    assert_eq!(
        daemon_labelled(&daemon, &format!("{OWNER}={killed}")),
        Vec::<String>::new()
    );
    drop(alive_guard);
    drop(runtime);
}

fn inspect_state(daemon: &Dockerd, id: &str) -> String {
    ok(daemon
        .docker()
        .args(["inspect", "-f", "{{.State.Status}}", id]))
    .trim()
    .to_string()
}

/// Imports an image of one file of `mib` MiB of random data, as a pull would put it there.
fn import_random(daemon: &Dockerd, dir: &Path, name: &str, mib: usize) {
    let rootfs = dir.join(name.replace([':', '/'], "-"));
    std::fs::create_dir_all(&rootfs).expect("rootfs");
    let mut data = vec![0u8; mib << 20];
    let mut state: u64 = name.bytes().fold(0x9E37_79B9_7F4A_7C15, |s, b| {
        s.rotate_left(5) ^ u64::from(b)
    });
    for chunk in data.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
    std::fs::write(rootfs.join("data"), &data).expect("data");
    let tar = rootfs.with_extension("tar");
    ok(Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .arg("-cf")
        .arg(&tar)
        .arg("."));
    ok(daemon
        .docker()
        .args(["import", "--change", "CMD [\"/data\"]"])
        .arg(&tar)
        .arg(name));
}

/// `podmend guard reap` with no cluster (no labelled containers here) and `args`.
fn reap_images(daemon: &Dockerd, args: &[&str]) -> String {
    let out = run(
        reap_command(&daemon.host())
            .args(["--older-than", "1000d", "--image-min-age", "0s"])
            .args(args),
        None,
        TIMEOUT,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

#[test]
fn the_image_budget_removes_the_least_recently_used_unused_image_first_and_never_one_in_use() {
    let daemon = Dockerd::start_with(&[]);
    let dir = tempfile::tempdir().expect("tempdir");
    // busybox (imported first, the oldest) and A are used by stopped containers.
    ok(daemon
        .docker()
        .args(["create", "--network=none", "busybox", "true"]));
    for name in ["used:a", "unused:b", "unused:c"] {
        import_random(&daemon, dir.path(), name, 2);
        std::thread::sleep(Duration::from_millis(1100));
    }
    ok(daemon.docker().args(["create", "--network=none", "used:a"]));

    let usage = api_get(&daemon, "/system/df");
    let layers = usage["LayersSize"].as_u64().expect("LayersSize");
    let size = |tag: &str| {
        usage["Images"]
            .as_array()
            .expect("Images")
            .iter()
            .find(|i| {
                i["RepoTags"]
                    .as_array()
                    .is_some_and(|t| t.contains(&json!(tag)))
            })
            .and_then(|i| i["Size"].as_u64())
            .unwrap_or_else(|| panic!("{tag} in {usage}"))
    };
    let (b, c) = (size("unused:b"), size("unused:c"));
    let short = |tag: &str| {
        let id = api_get(&daemon, &format!("/images/{tag}/json"))["Id"]
            .as_str()
            .expect("Id")
            .to_string();
        id.trim_start_matches("sha256:")[..12].to_string()
    };
    let (id_b, id_c) = (short("unused:b"), short("unused:c"));
    // Over the high mark; removing B alone gets under the low one.
    let high = (layers - 1).to_string();
    let low = (layers - b + c / 2).to_string();
    let budget = ["--images-high", high.as_str(), "--images-low", low.as_str()];

    let dry = reap_images(&daemon, &[&budget[..], &["--dry-run"]].concat());
    let lines: Vec<&str> = dry.lines().collect();
    assert_eq!(lines.len(), 1, "{dry}");
    assert!(
        lines[0].starts_with(&format!("would remove image {id_b} unused:b ")),
        "{dry}"
    );
    assert!(
        image_exists(&daemon, "unused:b"),
        "a dry run removes nothing"
    );

    let done = reap_images(&daemon, &budget);
    assert!(
        done.starts_with(&format!("removed image {id_b} unused:b (last used ")),
        "{done}"
    );
    assert_eq!(done.lines().count(), 1, "{done}");
    assert!(!image_exists(&daemon, "unused:b"));
    for kept in ["used:a", "unused:c", "busybox:latest"] {
        assert!(image_exists(&daemon, kept), "{kept} was kept");
    }

    // A budget nothing can meet: every unused image goes, the used ones never.
    let all = reap_images(&daemon, &["--images-high", "1", "--images-low", "0"]);
    let lines: Vec<&str> = all.lines().collect();
    assert!(
        lines[0].starts_with(&format!("removed image {id_c} unused:c ")),
        "{all}"
    );
    assert!(
        lines
            .last()
            .is_some_and(|l| l.contains("above the low mark")),
        "{all}"
    );
    assert!(!image_exists(&daemon, "unused:c"));
    assert!(image_exists(&daemon, "used:a"));
    assert!(image_exists(&daemon, "busybox:latest"));
}
