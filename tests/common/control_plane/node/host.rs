//! What a node changes on the host outside its directory, recorded when it starts and undone when
//! it stops: its cgroup in every cgroup v1 hierarchy, the sysctls the kubelet sets, the
//! directories the kubelet and containerd hard-code, and the mounts under its directory.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The sysctls the kubelet sets when `protectKernelDefaults` is false
/// (pkg/kubelet/cm/container_manager_linux.go, `setupKernelTunables`).
const KUBELET_SYSCTLS: &[&str] = &[
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// Paths the kubelet and containerd use whatever their configuration says: the kubelet's device
/// plugin socket (`/var/lib/kubelet/device-plugins`), its container log links
/// (`/var/log/containers`), and the runc shim's sockets (`/run/containerd/s`).
const HARD_CODED: &[&str] = &["/var/lib/kubelet", "/var/log/containers", "/run/containerd"];

/// The kubelet's device-plugin registration socket, which it leaves when it stops.
const KUBELET_DEVICE_PLUGIN_SOCKET: &str = "/var/lib/kubelet/device-plugins/kubelet.sock";

/// The host's state before the node started.
pub struct HostState {
    sysctls: Vec<(String, String)>,
    /// The hard-coded paths that did not exist: the node removes what of them is empty when it
    /// stops. Another containerd on the machine (docker.io's) may have made `/run/containerd/s`
    /// since, and keeps its shims' sockets there: those are not the node's to remove.
    absent: Vec<PathBuf>,
    /// `/sys/fs/cgroup/HIERARCHY/ROOT` for every cgroup v1 hierarchy.
    cgroups: Vec<PathBuf>,
}

impl HostState {
    /// Records the sysctls and paths, and makes cgroup `root` (a name under each hierarchy's
    /// root) in every cgroup v1 hierarchy: the kubelet checks that its `cgroupRoot` exists.
    pub fn record(root: &str) -> Result<HostState, String> {
        let mut sysctls = Vec::new();
        for name in KUBELET_SYSCTLS {
            let path = Path::new("/proc/sys").join(name);
            let value =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            sysctls.push((name.to_string(), value.trim().to_string()));
        }
        let absent = HARD_CODED
            .iter()
            .map(PathBuf::from)
            .filter(|path| !path.exists())
            .collect();
        let cgroups: Vec<PathBuf> = v1_hierarchies()?
            .into_iter()
            .map(|hierarchy| hierarchy.join(root))
            .collect();
        for cgroup in &cgroups {
            std::fs::create_dir_all(cgroup).map_err(|e| format!("{}: {e}", cgroup.display()))?;
        }
        Ok(HostState {
            sysctls,
            absent,
            cgroups,
        })
    }

    /// Undoes what the node changed; call once every process of the node has stopped.
    pub fn restore(&self, dir: &Path) {
        unmount_under(dir);
        for cgroup in &self.cgroups {
            remove_cgroup_tree(cgroup);
        }
        // The node's own entries first, then what they leave empty.
        let _ = std::fs::remove_file(KUBELET_DEVICE_PLUGIN_SOCKET);
        remove_links_into("/var/log/containers", dir);
        for path in &self.absent {
            remove_empty_dirs(path);
        }
        for (name, value) in &self.sysctls {
            let _ = std::fs::write(Path::new("/proc/sys").join(name), value);
        }
    }

    /// What is left of the node on the host after [`HostState::restore`].
    pub fn leftovers(&self, dir: &Path) -> Vec<String> {
        let mut left: Vec<String> = mounts_under(dir)
            .into_iter()
            .map(|mount| format!("mount {mount}"))
            .collect();
        left.extend(
            self.cgroups
                .iter()
                .filter(|cgroup| cgroup.exists())
                .map(|cgroup| format!("cgroup {}", cgroup.display())),
        );
        left.extend(
            self.absent
                .iter()
                .filter(|path| path.exists() && only_dirs(path))
                .map(|path| format!("{} (made by the node)", path.display())),
        );
        if Path::new(KUBELET_DEVICE_PLUGIN_SOCKET).exists() {
            left.push(KUBELET_DEVICE_PLUGIN_SOCKET.to_string());
        }
        left.extend(
            links_into("/var/log/containers", dir)
                .into_iter()
                .map(|link| format!("log link {}", link.display())),
        );
        for (name, before) in &self.sysctls {
            let now = std::fs::read_to_string(Path::new("/proc/sys").join(name))
                .unwrap_or_default()
                .trim()
                .to_string();
            if &now != before {
                left.push(format!("sysctl {name} = {now}, was {before}"));
            }
        }
        left
    }
}

/// The mount points of the cgroup v1 hierarchies (`/sys/fs/cgroup/cpu`, ...).
fn v1_hierarchies() -> Result<Vec<PathBuf>, String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")
        .map_err(|e| format!("/proc/self/mounts: {e}"))?;
    let hierarchies: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.get(2) == Some(&"cgroup")).then(|| PathBuf::from(fields[1]))
        })
        .collect();
    if hierarchies.is_empty() {
        return Err("this machine mounts no cgroup v1 hierarchy: the node's kubelet configuration is written for cgroup v1 (docs/testing.md)".into());
    }
    Ok(hierarchies)
}

/// The mount points under `dir`, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.display().to_string();
    let mut found: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4).map(str::to_string))
        .filter(|point| point == &prefix || point.starts_with(&format!("{prefix}/")))
        .collect();
    found.sort_by_key(|point| std::cmp::Reverse(point.len()));
    found.dedup();
    found
}

/// Unmounts everything under `dir` (the kubelet bind-mounts its root directory onto itself;
/// a pod's volumes and a sandbox's /dev/shm are mounts too).
fn unmount_under(dir: &Path) {
    for _ in 0..5 {
        let points = mounts_under(dir);
        if points.is_empty() {
            return;
        }
        for point in points {
            let _ = Command::new("umount").arg(&point).output();
        }
    }
}

/// Removes the cgroup `root` and every cgroup under it, deepest first (a cgroup is removed
/// with rmdir, and only once it has no children and no processes).
fn remove_cgroup_tree(root: &Path) {
    // A cgroup's files are not files on disk: rmdir removes a cgroup with them.
    remove_empty_dirs(root);
}

fn collect_dirs(dir: &Path, found: &mut Vec<PathBuf>) {
    if !dir.is_dir() {
        return;
    }
    found.push(dir.to_path_buf());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                collect_dirs(&entry.path(), found);
            }
        }
    }
}

/// Removes `root`'s empty directories, deepest first, `root` too when it ends up empty.
fn remove_empty_dirs(root: &Path) {
    let mut dirs = Vec::new();
    collect_dirs(root, &mut dirs);
    dirs.sort_by_key(|dir| std::cmp::Reverse(dir.components().count()));
    for dir in dirs {
        let _ = std::fs::remove_dir(&dir);
    }
}

/// Whether `root` holds directories only (nothing of another program's in it).
fn only_dirs(root: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(root) else {
        return true;
    };
    entries
        .flatten()
        .all(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()) && only_dirs(&entry.path()))
}

/// The symbolic links in `links` that point under `dir`.
fn links_into(links: &str, dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(links) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|link| std::fs::read_link(link).is_ok_and(|target| target.starts_with(dir)))
        .collect()
}

fn remove_links_into(links: &str, dir: &Path) {
    for link in links_into(links, dir) {
        let _ = std::fs::remove_file(link);
    }
}

/// The file whose lock a running node holds: one node per machine at a time, whichever suite
/// runs it. Two would share the kubelet's hard-coded paths, and the second would record the
/// sysctls the first's kubelet set and write those back.
pub const MACHINE_LOCK: &str = "/run/lock/podmend-real-node.lock";

/// The machine's node lock, held until dropped (the kernel releases it when the file closes,
/// also when the process dies).
pub struct MachineLock {
    _file: std::fs::File,
}

impl MachineLock {
    /// Takes the lock, or says it is held.
    pub fn try_acquire() -> Result<MachineLock, String> {
        use std::os::fd::AsRawFd as _;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(MACHINE_LOCK)
            .map_err(|e| format!("{MACHINE_LOCK}: {e}"))?;
        // SAFETY: flock only reads the descriptor, which `file` keeps open for the call.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if locked == 0 {
            Ok(MachineLock { _file: file })
        } else {
            Err(format!(
                "another real node runs on this machine (it holds {MACHINE_LOCK}: {})",
                std::io::Error::last_os_error()
            ))
        }
    }

    /// Takes the lock, waiting up to `timeout` for another suite's node to stop.
    pub async fn acquire(timeout: std::time::Duration) -> Result<MachineLock, String> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match MachineLock::try_acquire() {
                Ok(lock) => return Ok(lock),
                Err(error) if std::time::Instant::now() >= deadline => {
                    return Err(format!("{error}; waited {} s", timeout.as_secs()));
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
            }
        }
    }
}
