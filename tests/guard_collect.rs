//! Policy `collect`, the guard's default, between the real docker CLI and a real dockerd:
//! every step a pipeline runs straight against dockerd works the same through the guard
//! (exited containers stay readable), exited containers are collected after `--min-age` or
//! beyond `--max-exited`, and at SIGTERM everything the pod created is gone: containers,
//! networks, and the images it built, committed or tagged (unless a container still uses
//! them), while pulled and loaded images stay.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::dockerd::{self, Dockerd, text};
use common::guard::{
    BUILT_BY, Guard, OWNER, RUN, daemon_labelled, exists, free_port, image_exists, inspect, metric,
    ok, output, uid, wait_until,
};

/// One step's outcome: (step, exit code, stdout, stderr).
type Outcome = (&'static str, Option<i32>, String, String);

/// The steps pipelines run after a container exits, against the CLI `docker`, with names
/// ending in `suffix`; files copied out land in `dir`.
fn pipeline(docker: &dyn Fn() -> Command, suffix: &str, dir: &Path) -> Vec<Outcome> {
    let build = format!("build-{suffix}");
    let test = format!("test-{suffix}");
    let image = format!("committed-{suffix}:1");
    let out = dir.join(format!("out-{suffix}"));
    let mut outcomes = Vec::new();
    let mut step = |name: &'static str, args: &[&str]| {
        let result = output(docker().args(args));
        outcomes.push((
            name,
            result.status.code(),
            text(&result.stdout),
            text(&result.stderr),
        ));
    };
    let run = |extra: &[&str]| -> Vec<String> {
        RUN.iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    };
    let args = run(&[
        "--name",
        &build,
        "busybox",
        "sh",
        "-c",
        "echo artefact > /out",
    ]);
    step(
        "run a build",
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let from = format!("{build}:/out");
    step(
        "docker cp the artefact",
        &["cp", &from, &out.display().to_string()],
    );
    let args = run(&[
        "--name",
        &test,
        "busybox",
        "sh",
        "-c",
        "echo failing; echo oops >&2; exit 3",
    ]);
    step(
        "run a failing test",
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    step("docker logs of the failed test", &["logs", &test]);
    step("docker wait for its exit code", &["wait", &test]);
    step(
        "docker inspect its exit code",
        &[
            "inspect",
            "-f",
            "{{.State.ExitCode}} {{.State.Status}}",
            &test,
        ],
    );
    step("docker start -a it again", &["start", "-a", &test]);
    step("docker commit the build", &["commit", &build, &image]);
    let args = run(&["--rm", &image, "cat", "/out"]);
    step(
        "run the committed image",
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let copied = std::fs::read_to_string(&out).unwrap_or_else(|e| format!("not copied: {e}"));
    outcomes.push(("the copied file", Some(0), copied, String::new()));
    outcomes
}

#[test]
fn every_pipeline_step_works_through_the_guard_on_the_default_policy_as_straight_to_dockerd() {
    let daemon = dockerd::shared();
    let uid = uid("pipeline");
    let dir = tempfile::tempdir().expect("tempdir");
    let direct = pipeline(&|| daemon.docker(), &format!("direct-{uid}"), dir.path());
    let mut guard = Guard::start(&daemon.host(), &uid, &[]);
    let guarded = pipeline(&|| guard.docker(), &format!("guard-{uid}"), dir.path());

    // Same exit codes and output; only the commit's new image id differs.
    for (direct, guarded) in direct.iter().zip(&guarded) {
        let (step, code, stdout, stderr) = direct;
        assert_eq!(code, &guarded.1, "{step}: exit code ({guarded:?})");
        if *step != "docker commit the build" {
            let strip = |s: &str| s.replace(&format!("direct-{uid}"), "X");
            let strip_guard = |s: &str| s.replace(&format!("guard-{uid}"), "X");
            assert_eq!(strip(stdout), strip_guard(&guarded.2), "{step}: stdout");
            assert_eq!(strip(stderr), strip_guard(&guarded.3), "{step}: stderr");
        }
    }
    let expected: [(&str, i32, &str); 10] = [
        ("run a build", 0, ""),
        ("docker cp the artefact", 0, ""),
        ("run a failing test", 3, "failing\n"),
        ("docker logs of the failed test", 0, "failing\n"),
        ("docker wait for its exit code", 0, "3\n"),
        ("docker inspect its exit code", 0, "3 exited\n"),
        ("docker start -a it again", 3, "failing\n"),
        ("docker commit the build", 0, ""),
        ("run the committed image", 0, "artefact\n"),
        ("the copied file", 0, "artefact\n"),
    ];
    for ((step, code, stdout), outcome) in expected.iter().zip(&guarded) {
        assert_eq!(*step, outcome.0);
        assert_eq!(Some(*code), outcome.1, "{step}: {outcome:?}");
        if *step != "docker commit the build" {
            assert_eq!(*stdout, outcome.2, "{step}: {outcome:?}");
        }
    }
    assert_eq!(guarded[3].3, "oops\n", "docker logs relays stderr too");

    // The pod's exited containers are still there (the minimum age is 5 minutes)...
    let suffix = format!("guard-{uid}");
    for name in [format!("build-{suffix}"), format!("test-{suffix}")] {
        assert!(exists(daemon, &name), "{name} is kept for now");
    }
    // ...and gone with the committed image when the pod ends.
    let status = guard.signal("-TERM");
    assert!(status.success(), "{status}: {}", guard.log());
    assert!(daemon_labelled(daemon, &format!("{OWNER}={uid}")).is_empty());
    assert!(!image_exists(daemon, &format!("committed-{suffix}:1")));

    let suffix = format!("direct-{uid}");
    ok(daemon.docker().args([
        "rm",
        "-f",
        &format!("build-{suffix}"),
        &format!("test-{suffix}"),
    ]));
    ok(daemon
        .docker()
        .args(["rmi", &format!("committed-{suffix}:1")]));
}

fn metrics_address() -> SocketAddr {
    format!("127.0.0.1:{}", free_port())
        .parse()
        .expect("address")
}

#[test]
fn exited_and_never_started_containers_go_after_the_minimum_age_and_compose_and_running_ones_stay()
{
    let daemon = dockerd::shared();
    let uid = uid("min-age");
    let metrics = metrics_address();
    let mut guard = Guard::start(
        &daemon.host(),
        &uid,
        &["--min-age", "3s", "--metrics-listen", &metrics.to_string()],
    );
    let name = |n: &str| format!("{n}-{uid}");
    let compose_label = "com.docker.compose.project=ci";
    let running = ok(guard.docker().args(RUN).args([
        "-d",
        "--name",
        &name("running"),
        "busybox",
        "sleep",
        "300",
    ]));
    ok(guard.docker().args([
        "create",
        "--pull=never",
        "--network=none",
        "--name",
        &name("never-started"),
        "busybox",
        "true",
    ]));
    ok(guard.docker().args([
        "create",
        "--pull=never",
        "--network=none",
        "--label",
        compose_label,
        "--name",
        &name("compose"),
        "busybox",
        "true",
    ]));
    ok(guard.docker().args(["start", "-a", &name("compose")]));
    // The minimum age counts from the container's exit, which the daemon records before
    // `docker run` returns: from before the run is the earliest it can have exited.
    let run_started = Instant::now();
    ok(guard
        .docker()
        .args(RUN)
        .args(["--name", &name("exited"), "busybox", "true"]));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        exists(daemon, &name("exited")),
        "an exited container is kept until the minimum age"
    );
    wait_until(
        "the exited and the never-started containers are collected",
        Duration::from_secs(30),
        || !exists(daemon, &name("exited")) && !exists(daemon, &name("never-started")),
    );
    assert!(
        run_started.elapsed() >= Duration::from_secs(3),
        "collected {:?} after the run started",
        run_started.elapsed()
    );
    std::thread::sleep(Duration::from_secs(1));
    for kept in ["compose", "running"] {
        assert!(
            exists(daemon, &name(kept)),
            "{kept} stays until the pod ends"
        );
    }
    assert_eq!(
        inspect(daemon, running.trim(), "{{.State.Running}}"),
        "true"
    );
    assert_eq!(
        metric(
            metrics,
            "podmend_guard_containers_removed_total{reason=\"min-age\"}"
        ),
        Some(2)
    );
    assert_eq!(
        metric(metrics, "podmend_guard_creates_total{decision=\"collect\"}"),
        Some(3)
    );
    assert_eq!(
        metric(metrics, "podmend_guard_creates_total{decision=\"compose\"}"),
        Some(1)
    );
    assert!(
        guard.log().contains("reason=min-age"),
        "removal is logged: {}",
        guard.log()
    );

    // A container started again before its age is up is not collected while it runs.
    ok(guard.docker().args([
        "create",
        "--pull=never",
        "--network=none",
        "--name",
        &name("again"),
        "busybox",
        "sh",
        "-c",
        "test -f /ran && sleep 300; touch /ran",
    ]));
    ok(guard.docker().args(["start", "-a", &name("again")]));
    ok(guard.docker().args(["start", &name("again")]));
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        inspect(daemon, &name("again"), "{{.State.Running}}"),
        "true"
    );

    assert!(guard.signal("-TERM").success(), "{}", guard.log());
    assert!(daemon_labelled(daemon, &format!("{OWNER}={uid}")).is_empty());
}

#[test]
fn with_max_exited_2_the_oldest_exited_containers_go_first() {
    let daemon = dockerd::shared();
    let uid = uid("max-exited");
    let metrics = metrics_address();
    let mut guard = Guard::start(
        &daemon.host(),
        &uid,
        &[
            "--max-exited",
            "2",
            "--metrics-listen",
            &metrics.to_string(),
        ],
    );
    let name = |i: usize| format!("exited-{i}-{uid}");
    for i in 1..=4 {
        ok(guard
            .docker()
            .args(RUN)
            .args(["--name", &name(i), "busybox", "true"]));
        std::thread::sleep(Duration::from_millis(300));
    }
    wait_until(
        "only the two newest exited containers are left",
        Duration::from_secs(20),
        || !exists(daemon, &name(1)) && !exists(daemon, &name(2)),
    );
    assert!(exists(daemon, &name(3)));
    assert!(exists(daemon, &name(4)));
    assert_eq!(
        metric(
            metrics,
            "podmend_guard_containers_removed_total{reason=\"max-exited\"}"
        ),
        Some(2)
    );
    assert!(guard.signal("-TERM").success(), "{}", guard.log());
    assert_eq!(
        daemon_labelled(daemon, &format!("{OWNER}={uid}")),
        Vec::<String>::new()
    );
}

#[test]
fn at_sigterm_every_container_and_network_the_pod_created_is_gone() {
    let daemon = dockerd::shared();
    let uid = uid("pod-end");
    let mut guard = Guard::start(&daemon.host(), &uid, &[]);
    let network = format!("net-{uid}");
    ok(guard.docker().args(["network", "create", &network]));
    assert_eq!(
        ok(daemon.docker().args([
            "network",
            "inspect",
            "-f",
            &format!("{{{{index .Labels \"{OWNER}\"}}}}"),
            &network,
        ]))
        .trim(),
        uid,
        "the network carries the owner label"
    );
    let ids = [
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
        ok(guard.docker().args(RUN).args(["-d", "busybox", "true"])),
    ];
    // Someone else's network and container on the same daemon stay.
    let other_network = format!("other-net-{uid}");
    ok(daemon.docker().args(["network", "create", &other_network]));
    let other = ok(daemon
        .docker()
        .args(["create", "--pull=never", "--network=none", "busybox"]));

    let status = guard.signal("-TERM");
    assert!(status.success(), "{status}: {}", guard.log());
    for id in &ids {
        assert!(!exists(daemon, id.trim()), "{id} was removed");
    }
    let networks = ok(daemon
        .docker()
        .args(["network", "ls", "--format", "{{.Name}}"]));
    assert!(!networks.lines().any(|n| n == network), "{networks}");
    assert!(networks.lines().any(|n| n == other_network), "{networks}");
    assert!(exists(daemon, other.trim()));
    assert!(guard.log().contains("removed=4"), "{}", guard.log());
    ok(daemon.docker().args(["rm", other.trim()]));
    ok(daemon.docker().args(["network", "rm", &other_network]));
}

/// A build context whose image differs by `marker`.
fn context(dir: &Path, marker: &str) -> String {
    let context = dir.join(marker);
    std::fs::create_dir_all(&context).expect("context dir");
    std::fs::write(
        context.join("Dockerfile"),
        format!("FROM busybox\nLABEL team=ci\nRUN echo {marker} > /built\n"),
    )
    .expect("Dockerfile");
    context.display().to_string()
}

/// A tiny image imported straight into the daemon, as a pull puts one there.
fn import(daemon: &Dockerd, dir: &Path, name: &str) {
    let rootfs = dir.join(format!("rootfs-{}", name.replace([':', '/'], "-")));
    std::fs::create_dir_all(&rootfs).expect("rootfs");
    std::fs::write(rootfs.join("hello"), name).expect("file");
    let tar = rootfs.with_extension("tar");
    ok(Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .arg("-cf")
        .arg(&tar)
        .arg("."));
    ok(daemon
        .docker()
        .args(["import", "--change", "CMD [\"/hello\"]"])
        .arg(&tar)
        .arg(name));
}

#[test]
fn an_image_built_through_the_guard_goes_at_pod_end_unless_a_container_uses_it_and_pulled_images_stay()
 {
    let daemon = dockerd::shared();
    let uid = uid("images");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut guard = Guard::start(&daemon.host(), &uid, &[]);
    let unused = format!("built-unused-{uid}:1");
    let used = format!("built-used-{uid}:1");
    let pulled = format!("pulled-{uid}:1");
    let loaded = format!("loaded-{uid}:1");
    let tagged = format!("tagged-{uid}:1");

    // Two classic builds through the guard (the 20.10 CLI's builder: POST /build).
    for (tag, marker) in [(&unused, "unused"), (&used, "used")] {
        ok(guard
            .docker_2010()
            .args([
                "build",
                "-q",
                "--network",
                "none",
                "--label",
                "stage=test",
                "-t",
                tag,
            ])
            .arg(context(dir.path(), &format!("{marker}-{uid}"))));
    }
    let labels = inspect(daemon, &unused, "{{json .Config.Labels}}");
    let labels: serde_json::Value = serde_json::from_str(&labels).expect("labels");
    assert_eq!(labels[BUILT_BY], uid.as_str(), "{labels}");
    assert_eq!(
        labels["team"], "ci",
        "the Dockerfile's labels stay: {labels}"
    );
    assert_eq!(
        labels["stage"], "test",
        "the client's labels stay: {labels}"
    );
    // A container of someone else uses one of them.
    let user = ok(daemon.docker().args(["create", "--network=none", &used]));

    // A pulled image the pod runs, a loaded one, and a tag of the pod's on a pulled one.
    import(daemon, dir.path(), &pulled);
    ok(guard
        .docker()
        .args(["create", "--pull=never", "--network=none", &pulled]));
    import(daemon, dir.path(), &loaded);
    let archive = dir.path().join("loaded.tar");
    ok(daemon
        .docker()
        .args(["save", "-o"])
        .arg(&archive)
        .arg(&loaded));
    ok(daemon.docker().args(["rmi", &loaded]));
    ok(guard.docker().args(["load", "-q", "-i"]).arg(&archive));
    ok(guard.docker().args(["tag", &pulled, &tagged]));

    let status = guard.signal("-TERM");
    assert!(status.success(), "{status}: {}", guard.log());
    assert!(
        !image_exists(daemon, &unused),
        "the unused built image is gone"
    );
    assert!(
        image_exists(daemon, &used),
        "the built image a container uses stays: {}",
        guard.log()
    );
    assert!(image_exists(daemon, &pulled), "a pulled image stays");
    assert!(image_exists(daemon, &loaded), "a loaded image stays");
    assert!(!image_exists(daemon, &tagged), "the pod's tag is gone");
    assert!(image_exists(daemon, "busybox:latest"));
    assert!(
        guard.log().contains("kept an image of this pod"),
        "{}",
        guard.log()
    );

    ok(daemon.docker().args(["rm", user.trim()]));
    ok(daemon.docker().args(["rmi", &used, &pulled, &loaded]));
}

#[test]
fn after_the_daemon_restarts_the_collector_lists_again_and_collects_what_exited_meanwhile() {
    // Its own daemon: this one is stopped and started again. Containers stop within 1 s.
    let mut daemon = Dockerd::start_with(&["--shutdown-timeout", "1"]);
    let uid = uid("resync");
    let guard = Guard::start(&daemon.host(), &uid, &["--min-age", "4s"]);
    let name = format!("stopped-by-the-restart-{uid}");
    ok(guard
        .docker()
        .args(RUN)
        .args(["-d", "--name", &name, "busybox", "sleep", "300"]));
    daemon.stop();
    daemon.start_again();
    assert_eq!(
        inspect(&daemon, &name, "{{.State.Status}}"),
        "exited",
        "the restart stopped it"
    );
    wait_until(
        "the container the restart stopped is collected",
        Duration::from_secs(40),
        || !exists(&daemon, &name),
    );
    let log = guard.log();
    assert!(log.contains("following the daemon's events again"), "{log}");
    assert!(log.contains("reason=min-age"), "{log}");
}
