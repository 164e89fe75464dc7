//! The node's network: a network namespace the test creates, joined to the host by one veth pair
//! on a /30 of 198.18.0.0/15 (RFC 2544's benchmarking range, routed nowhere). containerd, the
//! kubelet and the node's `hostNetwork` pods run inside it; nothing in it has a route beyond the
//! pair. The kubelet reaches the API server (which listens on the host's loopback only) through a
//! forwarder: a socket listening on the namespace's loopback, opened by a thread of the test that
//! entered the namespace, whose connections the test relays to the API server. The API server
//! reaches the kubelet at the node's address over the pair.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;
use std::process::Command;

use super::image::run;

/// A network namespace with a veth pair; deleted (and the pair with it) by [`NetNs::delete`].
pub struct NetNs {
    pub name: String,
    /// The host's end of the pair.
    pub host_link: String,
    /// The host's address on the pair.
    pub host_address: Ipv4Addr,
    /// The node's address: the kubelet's `--node-ip`.
    pub node_address: Ipv4Addr,
    ip: PathBuf,
}

impl NetNs {
    /// Creates namespace `podmend-node-KEY` and the pair `pmhKEY` (host) / `pmnKEY` (inside),
    /// both up, with addresses on the /30 `KEY` picks.
    pub fn create(ip: PathBuf, key: u32) -> Result<NetNs, String> {
        let subnet = u32::from(Ipv4Addr::new(198, 18, 0, 0)) + (key % 32768) * 4;
        let netns = NetNs {
            name: format!("podmend-node-{key:x}"),
            host_link: format!("pmh{key:x}"),
            host_address: Ipv4Addr::from(subnet + 1),
            node_address: Ipv4Addr::from(subnet + 2),
            ip,
        };
        let inside = format!("pmn{key:x}");
        let host = format!("{}/30", netns.host_address);
        let node = format!("{}/30", netns.node_address);
        let n = netns.name.as_str();
        let h = netns.host_link.as_str();
        let steps: [&[&str]; 8] = [
            &["netns", "add", n],
            &["link", "add", h, "type", "veth", "peer", "name", &inside],
            &["link", "set", &inside, "netns", n],
            &["addr", "add", &host, "dev", h],
            &["link", "set", h, "up"],
            &["-n", n, "addr", "add", &node, "dev", &inside],
            &["-n", n, "link", "set", &inside, "up"],
            &["-n", n, "link", "set", "lo", "up"],
        ];
        for step in steps {
            if let Err(error) = run(Command::new(&netns.ip).args(step)) {
                netns.delete();
                return Err(format!("cannot make the node's network namespace: {error}"));
            }
        }
        Ok(netns)
    }

    /// The namespace's file, for `nsenter --net=`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// Deletes the namespace and the pair (deleting either end removes both).
    pub fn delete(&self) {
        let _ = run(Command::new(&self.ip).args(["link", "del", &self.host_link]));
        let _ = run(Command::new(&self.ip).args(["netns", "del", &self.name]));
    }

    /// What is left of the namespace and the pair, for the teardown check.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        if self.path().exists() {
            left.push(format!("network namespace {}", self.name));
        }
        if PathBuf::from("/sys/class/net")
            .join(&self.host_link)
            .exists()
        {
            left.push(format!("link {}", self.host_link));
        }
        left
    }

    /// Listens on the namespace's `127.0.0.1` (a free port) and relays each connection to
    /// `target` on the host; the relay stops when the returned task is aborted.
    pub fn forward_loopback(
        &self,
        target: SocketAddr,
    ) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), String> {
        let listener = self.listen_inside()?;
        let address = listener
            .local_addr()
            .map_err(|e| format!("forwarder address: {e}"))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("forwarder: {e}"))?;
        let listener =
            tokio::net::TcpListener::from_std(listener).map_err(|e| format!("forwarder: {e}"))?;
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Ok((address, task))
    }

    /// A listener on the namespace's loopback: a new thread enters the namespace and binds it
    /// there (a socket stays in the namespace it was made in); the test's other threads never
    /// leave the host's.
    fn listen_inside(&self) -> Result<std::net::TcpListener, String> {
        let path = self.path();
        std::thread::spawn(move || {
            let file =
                std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            // SAFETY: setns only reads the descriptor, which `file` keeps open for the call; it
            // changes the network namespace of this thread alone, which ends right after.
            let entered = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            if entered != 0 {
                return Err(format!(
                    "cannot enter {}: {}",
                    path.display(),
                    std::io::Error::last_os_error()
                ));
            }
            std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .map_err(|e| format!("cannot listen in {}: {e}", path.display()))
        })
        .join()
        .map_err(|_| "the thread that enters the node's namespace panicked".to_string())?
    }
}
