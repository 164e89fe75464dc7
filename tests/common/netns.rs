//! A network namespace a test creates for itself (`ip netns add`), with its loopback up and an
//! IPv6 unique-local address on it: a test runs a server inside and reaches it over IPv6 and
//! IPv4 without sending anything outside the namespace. Deleted on drop.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The IPv6 address the namespace's loopback carries besides `::1`.
pub const IPV6: &str = "fd00:53::1";

pub struct NetNs {
    pub name: String,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip").args(args).output().map_err(|error| {
        format!("cannot run `ip` ({error}): install iproute2 (scripts/setup does, as root)")
    })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}(network namespaces need root)",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

impl NetNs {
    /// Creates the namespace; panics saying what is missing (root, iproute2) when it cannot.
    pub fn create() -> NetNs {
        let name = format!(
            "podmend-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let netns = NetNs { name };
        let setup = ip(&["netns", "add", &netns.name])
            .and_then(|()| netns.ip(&["link", "set", "lo", "up"]))
            .and_then(|()| netns.ip(&["-6", "addr", "add", &format!("{IPV6}/128"), "dev", "lo"]));
        if let Err(error) = setup {
            panic!("cannot set up network namespace {}: {error}", netns.name);
        }
        netns
    }

    /// `ip ARGS` run inside the namespace.
    pub fn ip(&self, args: &[&str]) -> Result<(), String> {
        let mut all = vec!["netns", "exec", &self.name, "ip"];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Sets a sysctl inside the namespace (`net.ipv6.*` ones are the namespace's own).
    pub fn sysctl(&self, setting: &str) {
        let output = self
            .command("sysctl")
            .args(["-w", setting])
            .output()
            .expect("run sysctl");
        assert!(
            output.status.success(),
            "sysctl -w {setting} in {}: {}",
            self.name,
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// `program` run inside the namespace (`ip netns exec` execs it, keeping the pid).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name]).arg(program);
        command
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = ip(&["netns", "delete", &self.name]);
    }
}
