//! What a pod leaves in Docker besides containers, between the real docker CLI and a real
//! dockerd: named volumes (created by `docker volume create`, by a bind of a volume name, by a
//! `--mount` of one) and networks are labelled with the owner pod under every policy and gone
//! when the pod ends, unless another container still uses them; the reaper removes those of
//! pods that are gone; networks of ended pods never exhaust the daemon's address pools;
//! `docker create`d containers that never start are collected like exited ones.

mod common;

use std::time::Duration;

use common::api_stub::ApiStub;
use common::dockerd::{self, Dockerd, text};
use common::guard::{
    Guard, OWNER, RUN, exists, free_port, metric, ok, output, reap_command, runner_pod, uid,
    wait_until,
};

/// The owner label of a volume or network (`kind`), straight from the daemon.
fn owner_of(daemon: &Dockerd, kind: &str, name: &str) -> String {
    ok(daemon.docker().args([
        kind,
        "inspect",
        "-f",
        &format!("{{{{index .Labels \"{OWNER}\"}}}}"),
        name,
    ]))
    .trim()
    .to_string()
}

/// Whether the daemon has a volume or network (`kind`) of that name.
fn has(daemon: &Dockerd, kind: &str, name: &str) -> bool {
    output(daemon.docker().args([kind, "inspect", name]))
        .status
        .success()
}

#[test]
fn named_volumes_and_networks_the_pod_creates_are_labelled_and_gone_when_it_ends_under_every_policy()
 {
    let daemon = dockerd::shared();
    for policy in ["collect", "rm", "deny", "reap", "audit"] {
        let uid = uid(&format!("leaks-{policy}"));
        let mut guard = Guard::start(&daemon.host(), &uid, &["--policy", policy]);
        let name = |what: &str| format!("{what}-{uid}");
        // A volume someone else made before: the pod uses it, it is not the pod's.
        ok(daemon.docker().args(["volume", "create", &name("cache")]));

        ok(guard.docker().args(["volume", "create", &name("created")]));
        let bind = format!("{}:/data", name("bound"));
        ok(guard.docker().args(RUN).args([
            "--rm",
            "-v",
            &bind,
            "busybox",
            "sh",
            "-c",
            "echo kept > /data/file",
        ]));
        let mount = format!("type=volume,src={},dst=/data", name("mounted"));
        ok(guard
            .docker()
            .args(RUN)
            .args(["--rm", "--mount", &mount, "busybox", "true"]));
        let cache = format!("{}:/cache", name("cache"));
        ok(guard
            .docker()
            .args(RUN)
            .args(["--rm", "-v", &cache, "busybox", "true"]));
        ok(guard.docker().args(["network", "create", &name("net")]));

        for volume in ["created", "bound", "mounted"] {
            assert_eq!(
                owner_of(daemon, "volume", &name(volume)),
                uid,
                "policy {policy}: volume {volume}"
            );
        }
        assert_eq!(owner_of(daemon, "network", &name("net")), uid, "{policy}");
        assert_eq!(owner_of(daemon, "volume", &name("cache")), "", "{policy}");
        // The workload is unchanged: what a step wrote to a named volume, the next reads.
        let read = ok(guard.docker().args(RUN).args([
            "--rm",
            "-v",
            &bind,
            "busybox",
            "cat",
            "/data/file",
        ]));
        assert_eq!(read.trim(), "kept", "policy {policy}");

        let status = guard.signal("-TERM");
        assert!(status.success(), "{status}: {}", guard.log());
        for volume in ["created", "bound", "mounted"] {
            assert!(
                !has(daemon, "volume", &name(volume)),
                "policy {policy}: volume {volume} is gone: {}",
                guard.log()
            );
        }
        assert!(!has(daemon, "network", &name("net")), "{policy}");
        assert!(has(daemon, "volume", &name("cache")), "{policy}");
        ok(daemon.docker().args(["volume", "rm", &name("cache")]));
    }
}

#[test]
fn a_volume_another_container_still_uses_stays_at_the_pods_end() {
    let daemon = dockerd::shared();
    let uid = uid("volume-in-use");
    let mut guard = Guard::start(&daemon.host(), &uid, &[]);
    let volume = format!("shared-{uid}");
    ok(guard.docker().args(["volume", "create", &volume]));
    // Outside the pod, a container of someone else mounts it.
    let other = ok(daemon.docker().args([
        "create",
        "--pull=never",
        "--network=none",
        "-v",
        &format!("{volume}:/data"),
        "busybox",
    ]));
    assert!(guard.signal("-TERM").success(), "{}", guard.log());
    assert!(has(daemon, "volume", &volume), "{}", guard.log());
    ok(daemon.docker().args(["rm", other.trim()]));
    ok(daemon.docker().args(["volume", "rm", &volume]));
}

#[test]
fn networks_of_ended_pods_never_exhaust_the_daemons_address_pools() {
    // Its own daemon: its default pools (172.17-31/16 and 192.168/16 in /20s) hold 31
    // networks, and nothing else uses them. Policy `reap`, where networks were kept before.
    let daemon = Dockerd::start_with(&[]);
    for pod in 0..32 {
        let uid = uid(&format!("pools-{pod}"));
        let mut guard = Guard::start(&daemon.host(), &uid, &["--policy", "reap"]);
        // Every CI job names its network the same.
        let created = output(guard.docker().args(["network", "create", "ci-net-1"]));
        assert!(
            created.status.success(),
            "pod {pod}: {}{}",
            text(&created.stderr),
            guard.log()
        );
        assert!(guard.signal("-TERM").success(), "{}", guard.log());
    }
    let left = ok(daemon.docker().args([
        "network",
        "ls",
        "-q",
        "--filter",
        "label=podmend.io/owner-pod",
    ]));
    assert_eq!(left.trim(), "", "no network of an ended pod is left");
}

#[test]
fn volumes_and_networks_of_pods_that_are_gone_are_removed_by_the_reaper() {
    let daemon = Dockerd::start_with(&[]);
    let (gone, alive) = (uid("reap-gone"), uid("reap-alive"));
    let mut gone_guard = Guard::start(&daemon.host(), &gone, &[]);
    gone_guard.keep_leftovers();
    let alive_guard = Guard::start(&daemon.host(), &alive, &[]);
    for (guard, uid) in [(&gone_guard, &gone), (&alive_guard, &alive)] {
        ok(guard
            .docker()
            .args(["volume", "create", &format!("vol-{uid}")]));
        ok(guard
            .docker()
            .args(["network", "create", &format!("net-{uid}")]));
    }
    // The alive pod still runs a container; the gone one's guard was killed (OOM, a node
    // crash): no clean-up ran.
    ok(alive_guard
        .docker()
        .args(RUN)
        .args(["-d", "busybox", "sleep", "300"]));
    assert!(!gone_guard.signal("-KILL").success());
    assert!(has(&daemon, "volume", &format!("vol-{gone}")));

    // The node's reaper, as the DaemonSet runs it: the API lists the alive pod only.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let stub = runtime.block_on(ApiStub::start(Vec::new(), Vec::new()));
    stub.set_objects(
        "pods",
        vec![runner_pod(
            "runner-alive",
            &alive,
            "node-a",
            Some("Running"),
        )],
    );
    let reaped = ok(reap_command(&daemon.host())
        .arg("--kubeconfig")
        .arg(stub.kubeconfig_path())
        .env("NODE_NAME", "node-a"));
    assert!(!has(&daemon, "volume", &format!("vol-{gone}")), "{reaped}");
    assert!(!has(&daemon, "network", &format!("net-{gone}")), "{reaped}");
    assert!(has(&daemon, "volume", &format!("vol-{alive}")), "{reaped}");
    assert!(has(&daemon, "network", &format!("net-{alive}")), "{reaped}");
    for line in [
        format!("removed volume vol-{gone} {OWNER}={gone} (its owner pod no longer exists)"),
        format!("removed network net-{gone} {OWNER}={gone} (its owner pod no longer exists)"),
    ] {
        assert!(reaped.contains(&line), "{line}: {reaped}");
    }
    drop(alive_guard);
    drop(runtime);
}

#[test]
fn a_created_container_that_never_starts_is_collected_after_the_minimum_age() {
    let daemon = dockerd::shared();
    let uid = uid("never-started");
    let metrics = format!("127.0.0.1:{}", free_port());
    let guard = Guard::start(
        &daemon.host(),
        &uid,
        &["--min-age", "2s", "--metrics-listen", &metrics],
    );
    let metrics = metrics.parse().expect("address");
    guard.wait_until_started(metrics);
    let idle = ok(guard.docker().args([
        "create",
        "--pull=never",
        "--network=none",
        "busybox",
        "true",
    ]));
    // `docker create`, then `docker start` within the minimum age: it runs as always.
    let started = ok(guard.docker().args([
        "create",
        "--pull=never",
        "--network=none",
        "busybox",
        "sleep",
        "300",
    ]));
    ok(guard.docker().args(["start", started.trim()]));
    wait_until(
        "the never-started container is collected",
        Duration::from_secs(20),
        || !exists(daemon, idle.trim()),
    );
    assert!(exists(daemon, started.trim()), "{}", guard.log());
    assert_eq!(
        metric(
            metrics,
            "podmend_guard_containers_removed_total{reason=\"min-age\"}"
        ),
        Some(1)
    );
}

#[test]
fn a_guard_starting_on_its_pods_own_daemon_removes_what_earlier_pods_left_on_its_storage() {
    // A DinD daemon whose /var/lib/docker outlives its pods (a PVC for the layer cache): the
    // earlier pod's daemon was stopped before its guard could clean (the kubelet stops a
    // regular daemon container before the guard sidecar), so its `--restart always`
    // container comes back with the daemon, and its exited ones stay.
    let mut daemon = Dockerd::start_with(&[]);
    let earlier = uid("earlier-pod");
    let mut guard = Guard::start(&daemon.host(), &earlier, &[]);
    guard.keep_leftovers();
    let restarting =
        ok(guard
            .docker()
            .args(RUN)
            .args(["-d", "--restart", "always", "busybox", "sleep", "300"]));
    ok(guard
        .docker()
        .args(RUN)
        .args(["--name", &format!("exited-{earlier}"), "busybox", "true"]));
    ok(guard
        .docker()
        .args(["volume", "create", &format!("vol-{earlier}")]));
    ok(guard
        .docker()
        .args(["network", "create", &format!("net-{earlier}")]));
    let cached = format!("cache-{earlier}:1");
    ok(guard.docker().args(["tag", "busybox", &cached]));
    daemon.stop();
    // The guard is told last: the daemon is gone, nothing can be cleaned.
    let _ = guard.signal("-TERM");
    daemon.start_again();
    wait_until(
        "the --restart always container runs again with the daemon",
        Duration::from_secs(20),
        || {
            output(
                daemon
                    .docker()
                    .args(["inspect", "-f", "{{.State.Running}}", restarting.trim()]),
            )
            .stdout
            .starts_with(b"true")
        },
    );
    // Someone outside any guard uses the daemon too: not the guard's to touch.
    let unlabelled =
        ok(daemon
            .docker()
            .args(["create", "--pull=never", "--network=none", "busybox"]));

    let next = uid("next-pod");
    let metrics = format!("127.0.0.1:{}", free_port());
    let guard = Guard::start(
        &daemon.host(),
        &next,
        &["--daemon-in-pod", "--metrics-listen", &metrics],
    );
    wait_until(
        "what the earlier pod left is gone",
        Duration::from_secs(20),
        || {
            !exists(&daemon, restarting.trim())
                && !exists(&daemon, &format!("exited-{earlier}"))
                && !has(&daemon, "volume", &format!("vol-{earlier}"))
                && !has(&daemon, "network", &format!("net-{earlier}"))
        },
    );
    assert!(exists(&daemon, unlabelled.trim()), "{}", guard.log());
    let images = ok(daemon
        .docker()
        .args(["images", "--format", "{{.Repository}}:{{.Tag}}"]));
    assert!(
        images.lines().any(|i| i == cached),
        "the layer cache stays: {images}"
    );
    assert_eq!(
        metric(
            metrics.parse().expect("address"),
            "podmend_guard_containers_removed_total{reason=\"owner-gone\"}"
        ),
        Some(2)
    );
    // This pod's own work goes on as always.
    let echoed = ok(guard
        .docker()
        .args(RUN)
        .args(["--rm", "busybox", "echo", "fine"]));
    assert_eq!(echoed.trim(), "fine");
}

#[test]
fn images_a_buildx_build_writes_through_the_guard_are_removed_when_the_pod_ends() {
    // Its own daemon: the test lists every image. Docker CLI 28 with buildx runs `docker
    // build` on the daemon's BuildKit over `POST /grpc`; the guard reads the build's answer.
    let daemon = Dockerd::start_with(&[]);
    let uid = uid("buildx");
    let mut guard = Guard::start(&daemon.host(), &uid, &[]);
    common::guard::install_buildx(&guard.dir.path().join("cli-config"));
    let context = guard.dir.path().join("context");
    std::fs::create_dir_all(&context).expect("context");
    std::fs::write(
        context.join("Dockerfile"),
        format!("FROM busybox\nRUN echo {uid} > /built\nLABEL team=ci\n"),
    )
    .expect("Dockerfile");
    let version = ok(guard.docker().args(["buildx", "version"]));
    assert!(version.contains("v0."), "{version}");
    let built = output(
        guard
            .docker()
            .args(["build", "--network=none", "-t", "app:1", "-t", "app:ci"])
            .arg(&context),
    );
    assert!(
        built.status.success(),
        "{}{}",
        text(&built.stderr),
        guard.log()
    );
    // BuildKit, not the classic builder, made it: the guard never saw `POST /build`.
    assert!(
        text(&built.stderr).contains("naming to docker.io/library/app:1"),
        "{}",
        text(&built.stderr)
    );
    // The workload: the image runs.
    let ran = ok(guard
        .docker()
        .args(RUN)
        .args(["--rm", "app:ci", "cat", "/built"]));
    assert_eq!(ran.trim(), uid);
    // An image built straight on the daemon, outside the pod, is not the pod's.
    let outside = daemon.dir().join("outside");
    std::fs::create_dir_all(&outside).expect("context");
    std::fs::write(
        outside.join("Dockerfile"),
        "FROM busybox\nLABEL outside=1\n",
    )
    .expect("Dockerfile");
    ok(daemon
        .docker()
        .env("DOCKER_BUILDKIT", "0")
        .args(["build", "-q", "-t", "outside:1"])
        .arg(&outside));

    assert!(guard.signal("-TERM").success(), "{}", guard.log());
    let images = ok(daemon
        .docker()
        .args(["images", "--format", "{{.Repository}}:{{.Tag}}"]));
    for gone in ["app:1", "app:ci"] {
        assert!(
            !images.lines().any(|i| i == gone),
            "{gone}: {images}{}",
            guard.log()
        );
    }
    for kept in ["busybox:latest", "outside:1"] {
        assert!(images.lines().any(|i| i == kept), "{kept}: {images}");
    }
}

#[test]
fn a_container_that_binds_the_daemons_socket_reaches_the_guard_and_what_it_creates_is_the_pods() {
    // Testcontainers in a job container, Jenkins' `.inside('-v /var/run/docker.sock:...')`:
    // the daemon resolves the bind in its own filesystem, where its own socket is.
    let daemon = dockerd::shared();
    let uid = uid("nested-socket");
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("guard.sock");
    let daemon_socket = daemon.socket().display().to_string();
    let mut guard = Guard::spawn(
        dir,
        socket.clone(),
        &["--listen", &format!("unix://{}", socket.display())],
        &daemon.host(),
        &uid,
        &[
            "--daemon-socket-path",
            &daemon_socket,
            "--guard-socket-for-daemon",
            &socket.display().to_string(),
        ],
    );
    guard.wait_for_socket();
    // The docker CLI inside the container is the static one on the test machine.
    let cli = dockerd::find_program("docker").expect("docker CLI");
    let cli_bind = format!("{}:/usr/bin/docker:ro", cli.display());
    let inner = ok(guard.docker().args(RUN).args([
        "--rm",
        "-v",
        &format!("{daemon_socket}:/var/run/docker.sock"),
        "-v",
        &cli_bind,
        "busybox",
        "docker",
        "run",
        "-d",
        "--pull=never",
        "--network=none",
        "busybox",
        "sleep",
        "300",
    ]));
    let inner = inner.trim();
    assert_eq!(
        common::guard::inspect(
            daemon,
            inner,
            &format!("{{{{index .Config.Labels \"{OWNER}\"}}}}")
        ),
        uid,
        "the inner container was created through the guard"
    );
    // A `--mount` of the socket reaches the guard too.
    let mount = format!("type=bind,src={daemon_socket},dst=/var/run/docker.sock");
    let listed = ok(guard.docker().args(RUN).args([
        "--rm",
        "--mount",
        &mount,
        "-v",
        &cli_bind,
        "busybox",
        "docker",
        "ps",
        "-q",
        "--no-trunc",
    ]));
    assert!(listed.lines().any(|id| id == inner), "{listed}");
    assert!(guard.signal("-TERM").success(), "{}", guard.log());
    assert!(
        !exists(daemon, inner),
        "the inner container goes with the pod"
    );
}

#[test]
fn a_bind_of_the_daemons_socket_is_refused_with_a_message_when_the_guard_has_none_to_give() {
    let daemon = dockerd::shared();
    let uid = uid("socket-refused");
    let daemon_socket = daemon.socket().display().to_string();
    let guard = Guard::start(
        &daemon.host(),
        &uid,
        &["--daemon-socket-path", &daemon_socket],
    );
    let refused = output(guard.docker().args(RUN).args([
        "--rm",
        "-v",
        &format!("{daemon_socket}:/var/run/docker.sock"),
        "busybox",
        "true",
    ]));
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("may not bind the Docker daemon's socket"),
        "{}",
        text(&refused.stderr)
    );
    // Any other bind is as before.
    let fine = ok(guard.docker().args(RUN).args([
        "--rm",
        "-v",
        "/etc/hostname:/x:ro",
        "busybox",
        "cat",
        "/x",
    ]));
    assert!(!fine.is_empty());
}
