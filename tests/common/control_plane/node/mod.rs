//! A real node registered to the suite's control plane: containerd 2.x and the kubelet, both in
//! a network namespace the test creates ([`netns`]), with a pause and a busybox image made here
//! and imported ([`image`]). Settings and why: [`config`] and docs/testing.md.
//!
//! - The kubelet's pods go under a cgroup of the node's own in every cgroup v1 hierarchy; the
//!   sysctls the kubelet sets are put back, and the paths it and containerd hard-code are removed
//!   when the node made them ([`host`]).
//! - The kubelet authenticates to the API server with the admin's certificate (there is no node
//!   authorizer in this control plane) and accepts the API server's, for `kubectl logs`.
//! - One node runs on the machine at a time, across suites: a node holds
//!   [`host::MACHINE_LOCK`] from before it touches the host until after it restored it.
//! - [`Node::stop`] (also on drop) stops the kubelet, kills what containers are left, stops
//!   containerd, and undoes everything above; [`Node::leftovers`] says what is still there.

pub mod config;
pub mod host;
pub mod image;
pub mod netns;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::api::Api;

use self::config::{BUSYBOX_IMAGE, KubeletSettings, PAUSE_IMAGE};
use self::host::{HostState, MachineLock};
use self::image::run;
use self::netns::NetNs;
use super::ControlPlane;
use super::binaries::NodeBinaries;
use super::process::{Process, processes_mentioning};

/// How long containerd and the kubelet may take to come up.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a node waits for another suite's node on the machine to stop.
const LOCK_TIMEOUT: Duration = Duration::from_secs(600);

/// CPU the node's pods may request, in millicores: allocatable is capacity minus the rest.
pub const ALLOCATABLE_MILLICPU: u64 = 500;

/// A running node; stopped (and the host restored) when dropped.
pub struct Node {
    pub name: String,
    pub dir: PathBuf,
    pub binaries: NodeBinaries,
    netns: Option<NetNs>,
    host: Option<HostState>,
    forwarder: Option<tokio::task::JoinHandle<()>>,
    containerd: Option<Process>,
    kubelet: Option<Process>,
    /// The admin kubeconfig, to delete the Node object when the node stops.
    kubectl: Option<Command>,
    /// Held from before the host is touched until the node is dropped (declared last, so after
    /// `Drop::drop` stopped everything): a [`Node::leftovers`] check after [`Node::stop`] sees
    /// no other suite's node.
    lock: Option<MachineLock>,
}

impl Node {
    /// Starts containerd and a kubelet registered as Node `name`, and waits until the Node
    /// reports its allocatable resources. Needs root (cgroups, network namespaces, mounts).
    pub async fn start(plane: &ControlPlane, name: &str) -> Result<Node, String> {
        let binaries = NodeBinaries::find()?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err("a real node needs root (cgroups, network namespaces, mounts): run the end-to-end suite as root, as scripts/test does on CI".into());
        }
        let lock = MachineLock::acquire(LOCK_TIMEOUT).await?;
        let dir = plane.dir().join(format!("node-{name}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut node = Node {
            name: name.to_string(),
            dir,
            binaries,
            netns: None,
            host: None,
            forwarder: None,
            containerd: None,
            kubelet: None,
            kubectl: Some(plane.kubectl()),
            lock: Some(lock),
        };
        match node.bring_up(plane).await {
            Ok(()) => Ok(node),
            Err(error) => {
                let report = node.report();
                node.stop();
                Err(format!("the node {name} did not start: {error}\n{report}"))
            }
        }
    }

    async fn bring_up(&mut self, plane: &ControlPlane) -> Result<(), String> {
        static NODES: AtomicU32 = AtomicU32::new(0);
        let key = (std::process::id() << 4) | (NODES.fetch_add(1, Ordering::Relaxed) & 0xf);
        let cgroup_root = format!(
            "{}-{}",
            plane
                .dir()
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_else(|| "podmend-e2e".into()),
            self.name
        );
        self.host = Some(HostState::record(&cgroup_root)?);
        let netns = NetNs::create(self.binaries.ip.clone(), key & 0xff_ffff)?;
        let node_address = netns.node_address;
        let apiserver: SocketAddr = plane
            .server
            .trim_start_matches("https://")
            .parse()
            .map_err(|e| format!("the API server's address {}: {e}", plane.server))?;
        let (forwarded, task) = netns.forward_loopback(apiserver)?;
        self.forwarder = Some(task);
        let netns_path = netns.path();
        self.netns = Some(netns);

        self.start_containerd(&netns_path).await?;
        self.import_images()?;
        let settings = KubeletSettings {
            dir: &self.dir,
            client_ca: &plane.pki.ca_cert,
            address: node_address,
            cgroup_root: &format!("/{cgroup_root}"),
            reserved_millicpu: reserved_millicpu(),
        };
        let kubeconfig = self.dir.join("kubelet.kubeconfig");
        write(
            &kubeconfig,
            &plane
                .pki
                .admin_kubeconfig(&format!("https://{forwarded}"))?,
        )?;
        let config = self.dir.join("kubelet.yaml");
        write(&config, &config::kubelet_yaml(&settings))?;
        let kubelet_root = self.dir.join("kubelet");
        let command = vec![
            self.binaries.kubelet.display().to_string(),
            format!("--config={}", config.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", kubelet_root.display()),
            format!("--cert-dir={}", kubelet_root.join("pki").display()),
            format!("--hostname-override={}", self.name),
            format!("--node-ip={node_address}"),
            "--v=2".into(),
        ];
        self.kubelet = Some(self.start_inside(&netns_path, "kubelet", &command)?);
        self.wait_for_registration(plane).await
    }

    /// Starts containerd in the namespace, its own runc shim first on its PATH, and waits until
    /// `ctr version` answers on its socket.
    async fn start_containerd(&mut self, netns: &Path) -> Result<(), String> {
        let toml = self.dir.join("containerd.toml");
        write(
            &toml,
            &config::containerd_toml(&self.dir, &self.binaries.runc),
        )?;
        let path = format!(
            "PATH={}:{}",
            self.binaries.containerd_dir.display(),
            std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into())
        );
        let command = vec![
            "env".to_string(),
            path,
            self.binaries.containerd.display().to_string(),
            "--config".to_string(),
            toml.display().to_string(),
        ];
        self.containerd = Some(self.start_inside(netns, "containerd", &command)?);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if self.ctr(&["version"]).is_ok() {
                return Ok(());
            }
            if self.containerd.as_mut().is_some_and(|p| !p.running()) {
                return Err("containerd exited".into());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "containerd did not answer within {} s",
                    START_TIMEOUT.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Runs `command` (a program and its arguments) in the node's network namespace under a
    /// watchdog, as `name`.
    fn start_inside(
        &self,
        netns: &Path,
        name: &str,
        command: &[String],
    ) -> Result<Process, String> {
        let mut args = vec![format!("--net={}", netns.display()), "--".into()];
        args.extend(command.iter().cloned());
        Process::start(name, &self.binaries.nsenter, &args, &self.dir)
    }

    /// Writes the pause and busybox images and imports them into containerd's `k8s.io`
    /// namespace, the one the CRI plugin uses.
    fn import_images(&self) -> Result<(), String> {
        let images = self.dir.join("images");
        let pause =
            image::write_archive(&images, "pause", PAUSE_IMAGE, &["/bin/sleep", "2147483647"])?;
        let busybox = image::write_archive(&images, "busybox", BUSYBOX_IMAGE, &["/bin/sh"])?;
        for archive in [pause, busybox] {
            let archive = archive.display().to_string();
            self.ctr(&["-n", "k8s.io", "images", "import", &archive])?;
        }
        Ok(())
    }

    /// Runs `ctr` against the node's containerd.
    pub fn ctr(&self, args: &[&str]) -> Result<String, String> {
        let socket = self.dir.join("containerd.sock");
        run(Command::new(&self.binaries.ctr)
            .arg("--address")
            .arg(&socket)
            .args(args))
    }

    /// Waits until the kubelet registered the Node and reported its allocatable CPU.
    async fn wait_for_registration(&mut self, plane: &ControlPlane) -> Result<(), String> {
        let nodes: Api<NodeObject> = Api::all(plane.client().await);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(node)) = nodes.get_opt(&self.name).await
                && node
                    .status
                    .and_then(|status| status.allocatable)
                    .is_some_and(|allocatable| allocatable.contains_key("cpu"))
            {
                return Ok(());
            }
            for process in [&mut self.containerd, &mut self.kubelet]
                .into_iter()
                .flatten()
            {
                if !process.running() {
                    return Err(format!("{} exited", process.name));
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the kubelet did not register Node {} within {} s",
                    self.name,
                    START_TIMEOUT.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// containerd's and the kubelet's command lines and last log lines.
    pub fn report(&self) -> String {
        [&self.containerd, &self.kubelet]
            .into_iter()
            .flatten()
            .map(Process::report)
            .collect()
    }

    /// Stops the kubelet, kills and removes the containers left, stops containerd, deletes the
    /// Node object, and restores the host. Safe to call twice.
    pub fn stop(&mut self) {
        if let Some(mut kubelet) = self.kubelet.take() {
            kubelet.stop();
        }
        if let Some(mut containerd) = self.containerd.take() {
            self.remove_containers();
            containerd.stop();
        }
        if let Some(task) = self.forwarder.take() {
            task.abort();
        }
        if let Some(mut kubectl) = self.kubectl.take() {
            let _ = kubectl
                .args([
                    "delete",
                    "node",
                    &self.name,
                    "--ignore-not-found",
                    "--wait=false",
                ])
                .output();
        }
        if let Some(host) = &self.host {
            host.restore(&self.dir);
        }
        if let Some(netns) = &self.netns {
            netns.delete();
        }
    }

    /// Kills every task in containerd's `k8s.io` namespace and removes every container: the
    /// runc shims (and the containers under them) outlive containerd otherwise.
    fn remove_containers(&self) {
        let ids = |kind: &str| -> Vec<String> {
            self.ctr(&["-n", "k8s.io", kind, "ls", "-q"])
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string)
                .collect()
        };
        for id in ids("tasks") {
            let _ = self.ctr(&["-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", &id]);
            let _ = self.ctr(&["-n", "k8s.io", "tasks", "delete", "-f", &id]);
        }
        for id in ids("containers") {
            let _ = self.ctr(&["-n", "k8s.io", "containers", "delete", &id]);
        }
    }

    /// What the stopped node left: processes mentioning its directory (containerd, the kubelet,
    /// runc shims), mounts under it, its cgroups (which hold any container process left), its
    /// network namespace and link, hard-coded paths it made, log links, changed sysctls.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left: Vec<String> = processes_mentioning(&self.dir)
            .into_iter()
            .map(|process| format!("process {process}"))
            .collect();
        if let Some(host) = &self.host {
            left.extend(host.leftovers(&self.dir));
        }
        if let Some(netns) = &self.netns {
            left.extend(netns.leftovers());
        }
        left
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

/// CPU to reserve so that allocatable is [`ALLOCATABLE_MILLICPU`] whatever the machine has.
fn reserved_millicpu() -> u64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    (cores * 1000).saturating_sub(ALLOCATABLE_MILLICPU)
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}
