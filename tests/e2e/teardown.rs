//! Teardown that cannot be skipped, shown: this binary, started again as a child suite, starts
//! a control plane and then panics or is killed with SIGKILL; afterwards nothing of it runs.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use crate::Suite;
use crate::common::control_plane::ControlPlane;
use crate::common::control_plane::process::processes_mentioning;

/// Set to `panic` or `kill`: the binary is a child suite (see the module's documentation).
const CHILD: &str = "PODMEND_E2E_CHILD";

/// In a child suite: starts a control plane, says so on stdout, waits for a line on stdin and
/// panics (`panic`), or waits to be killed (`kill`). `None` in the real suite.
pub fn child_mode() -> Option<ExitCode> {
    let mode = std::env::var(CHILD).ok()?;
    crate::common::server::install_crypto_provider();
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let plane = runtime
        .block_on(ControlPlane::start())
        .unwrap_or_else(|error| panic!("the child suite's control plane: {error}"));
    println!("started {}", plane.dir().display());
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    if mode == "panic" {
        panic!("the child suite panics with its control plane running, as a failing test would");
    }
    std::thread::sleep(Duration::from_secs(600));
    drop(plane);
    Some(ExitCode::FAILURE)
}

pub fn a_suite_that_panics_or_is_killed_leaves_no_component_running(_suite: &Suite) {
    for mode in ["panic", "kill"] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut child = Command::new(std::env::current_exe().expect("this binary"))
            .env(CHILD, mode)
            .env("TMPDIR", tmp.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the child suite");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("the child's first line");
        assert!(
            line.starts_with("started "),
            "the child suite ({mode}) did not start its control plane: {line:?}"
        );
        let running = processes_mentioning(tmp.path());
        assert!(
            running.len() >= 2,
            "the child suite ({mode}) runs etcd and kube-apiserver, but these run under {}: {running:?}",
            tmp.path().display()
        );
        if mode == "panic" {
            writeln!(child.stdin.as_mut().expect("stdin")).expect("tell the child to panic");
            let status = child.wait().expect("the child exits");
            assert!(
                !status.success(),
                "the child suite panicked, yet exited {status}"
            );
        } else {
            child.kill().expect("SIGKILL the child suite");
            let _ = child.wait();
        }
        let left = wait_until_gone(tmp.path(), Duration::from_secs(30));
        assert!(
            left.is_empty(),
            "after the child suite {}, these still run:\n{}",
            if mode == "panic" {
                "panicked"
            } else {
                "was killed"
            },
            left.join("\n")
        );
    }
}

/// The processes still mentioning `dir` once none does or `within` passed.
fn wait_until_gone(dir: &Path, within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    loop {
        let left = processes_mentioning(dir);
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
