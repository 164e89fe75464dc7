//! The configuration files of a real node: containerd's `config.toml` and the kubelet's
//! `KubeletConfiguration`. docs/testing.md says why each setting is there; the comments here say
//! what each keeps true.

use std::path::Path;

/// The sandbox ("pause") image every pod's sandbox runs: built here and imported, never pulled.
pub const PAUSE_IMAGE: &str = "localhost/podmend/pause:test";

/// The image test pods run (`imagePullPolicy: Never`): Debian's static busybox.
pub const BUSYBOX_IMAGE: &str = "localhost/podmend/busybox:test";

/// containerd's configuration (version 3): everything under `dir`, its own sockets, the CRI
/// plugin with the local pause image and Debian's runc.
pub fn containerd_toml(dir: &Path, runc: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 3
root = "{d}/containerd/root"
state = "{d}/containerd/state"
temp = "{d}/containerd/tmp"
# NRI would listen on /var/run/nri/nri.sock, a path shared with any other containerd.
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "{d}/containerd.sock"

[ttrpc]
  address = "{d}/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # The machine's bounding set has no CAP_SYS_RESOURCE: runc cannot lower a container's
  # oom_score_adj below its own (the kubelet asks -997 for Guaranteed pods and the sandbox).
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{d}/containerd/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{d}/cni/bin"]
    conf_dir = "{d}/cni/conf"

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#,
        runc = runc.display()
    )
}

/// What the kubelet's configuration depends on.
pub struct KubeletSettings<'a> {
    pub dir: &'a Path,
    /// The suite's CA: the kubelet accepts client certificates it signed (the API server's).
    pub client_ca: &'a Path,
    /// The node's address in its network namespace: where the kubelet listens.
    pub address: std::net::Ipv4Addr,
    /// The cgroup (cgroupfs path) the node's pods go under.
    pub cgroup_root: &'a str,
    /// CPU kept from pods, in millicores: allocatable is capacity minus this.
    pub reserved_millicpu: u64,
}

/// The kubelet's `KubeletConfiguration`.
pub fn kubelet_yaml(settings: &KubeletSettings) -> String {
    let d = settings.dir.display();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The machine runs cgroup v1; kubelet 1.35 and later refuse it unless told not to (KEP-5573).
failCgroupV1: false
# PID 1 is not systemd.
cgroupDriver: cgroupfs
cgroupsPerQOS: true
cgroupRoot: {cgroup_root}
containerRuntimeEndpoint: unix://{d}/containerd.sock
address: {address}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
podLogsDir: {d}/pod-logs
# The host's iptables are not the test's to change.
makeIPTablesUtilChains: false
# With true the kubelet refuses to start on this machine's sysctls; with false it sets them, and
# the test puts them back when the node stops.
protectKernelDefaults: false
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: {client_ca}
authorization:
  mode: AlwaysAllow
systemReserved:
  cpu: {reserved}m
  memory: 256Mi
# Explicit, and far below the defaults (nodefs 10 %, imagefs 15 %): these machines have been seen
# with a fifth of their disk free, where the defaults would put the node under DiskPressure.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
  imagefs.inodesFree: 1%
# Image garbage collection never starts: the imported images cannot be pulled back.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusUpdateFrequency: 2s
"#,
        cgroup_root = settings.cgroup_root,
        address = settings.address,
        client_ca = settings.client_ca.display(),
        reserved = settings.reserved_millicpu,
    )
}
