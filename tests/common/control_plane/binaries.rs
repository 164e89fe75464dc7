//! Where the control plane's binaries are: the cache `scripts/build-control-plane` fills, one
//! directory per version pinned in `tools/*/go.mod`, or `$PODMEND_CONTROL_PLANE_BIN`. A missing
//! binary is an error that names the command that builds it; never a skip.

use std::path::{Path, PathBuf};

/// What to run when a binary is missing.
pub const BUILD_HINT: &str = "run scripts/setup (scripts/test does; it runs scripts/build-control-plane, which builds the control plane from the Go module proxy into ~/.cache/podmend/bin), or set PODMEND_CONTROL_PLANE_BIN to a directory holding kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet, etcd, helm, containerd, containerd-shim-runc-v2 and ctr";

/// The binaries of one control plane.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub kube_scheduler: PathBuf,
    pub kubectl: PathBuf,
    pub helm: PathBuf,
}

impl Binaries {
    /// Finds every binary, or says which are missing and how to build them.
    pub fn find() -> Result<Binaries, String> {
        let dir_of = |tool: &str| -> Result<PathBuf, String> {
            if let Some(dir) = std::env::var_os("PODMEND_CONTROL_PLANE_BIN") {
                return Ok(PathBuf::from(dir));
            }
            let version = pinned_version(tool)?;
            Ok(cache_dir().join("bin").join(format!("{tool}-{version}")))
        };
        let kubernetes = dir_of("kubernetes")?;
        let binaries = Binaries {
            etcd: dir_of("etcd")?.join("etcd"),
            kube_apiserver: kubernetes.join("kube-apiserver"),
            kube_controller_manager: kubernetes.join("kube-controller-manager"),
            kube_scheduler: kubernetes.join("kube-scheduler"),
            kubectl: kubernetes.join("kubectl"),
            helm: dir_of("helm")?.join("helm"),
        };
        let missing: Vec<String> = binaries
            .all()
            .into_iter()
            .filter(|path| !path.is_file())
            .map(|path| path.display().to_string())
            .collect();
        if missing.is_empty() {
            Ok(binaries)
        } else {
            Err(format!("missing: {}: {BUILD_HINT}", missing.join(", ")))
        }
    }

    /// Every binary.
    pub fn all(&self) -> Vec<&Path> {
        vec![
            &self.etcd,
            &self.kube_apiserver,
            &self.kube_controller_manager,
            &self.kube_scheduler,
            &self.kubectl,
            &self.helm,
        ]
    }
}

/// What a real node runs: the kubelet of the control plane's build, containerd 2.x with its runc
/// shim and `ctr` (built by `scripts/build-control-plane`), Debian's `runc`, and the tools that
/// make its network namespace (`ip`, `nsenter`).
#[derive(Debug, Clone)]
pub struct NodeBinaries {
    pub kubelet: PathBuf,
    pub containerd: PathBuf,
    /// The directory of `containerd-shim-runc-v2`: first on containerd's PATH, so it finds its
    /// own shim and not the one Debian's docker.io brings.
    pub containerd_dir: PathBuf,
    pub ctr: PathBuf,
    pub runc: PathBuf,
    pub ip: PathBuf,
    pub nsenter: PathBuf,
}

impl NodeBinaries {
    /// Finds every binary, or says which are missing and how to get them.
    pub fn find() -> Result<NodeBinaries, String> {
        let (kubernetes, containerd_dir) = match std::env::var_os("PODMEND_CONTROL_PLANE_BIN") {
            Some(dir) => (PathBuf::from(&dir), PathBuf::from(dir)),
            None => (
                cache_dir()
                    .join("bin")
                    .join(format!("kubernetes-{}", pinned_version("kubernetes")?)),
                cache_dir()
                    .join("bin")
                    .join(format!("containerd-{}", pinned_version("containerd")?)),
            ),
        };
        let system = |program: &str| {
            ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
                .iter()
                .map(|dir| Path::new(dir).join(program))
                .find(|path| path.is_file())
                .unwrap_or_else(|| PathBuf::from(format!("/usr/sbin/{program}")))
        };
        let binaries = NodeBinaries {
            kubelet: kubernetes.join("kubelet"),
            containerd: containerd_dir.join("containerd"),
            ctr: containerd_dir.join("ctr"),
            runc: system("runc"),
            ip: system("ip"),
            nsenter: system("nsenter"),
            containerd_dir,
        };
        let mut missing: Vec<String> = [
            &binaries.kubelet,
            &binaries.containerd,
            &binaries.containerd_dir.join("containerd-shim-runc-v2"),
            &binaries.ctr,
        ]
        .into_iter()
        .filter(|path| !path.is_file())
        .map(|path| format!("{}: {BUILD_HINT}", path.display()))
        .collect();
        for (path, package) in [
            (&binaries.runc, "runc"),
            (&binaries.ip, "iproute2"),
            (&binaries.nsenter, "util-linux"),
        ] {
            if !path.is_file() {
                missing.push(format!(
                    "{}: run scripts/setup (it installs Debian's {package})",
                    path.display()
                ));
            }
        }
        if missing.is_empty() {
            Ok(binaries)
        } else {
            Err(format!("missing: {}", missing.join("; ")))
        }
    }
}

/// `$PODMEND_CACHE`, else `$XDG_CACHE_HOME/podmend`, else `~/.cache/podmend`: the same rule as
/// `scripts/build-control-plane`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PODMEND_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache"));
    base.join("podmend")
}

/// The version `tools/<tool>/go.mod` pins: the version its requirement of the tool's module names.
pub fn pinned_version(tool: &str) -> Result<String, String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tools")
        .join(tool)
        .join("go.mod");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}; restore it from git", path.display()))?;
    let module = match tool {
        "kubernetes" => "k8s.io/kubernetes",
        "etcd" => "go.etcd.io/etcd/server/v3",
        "helm" => "helm.sh/helm/v4",
        "containerd" => "github.com/containerd/containerd/v2",
        "buildx" => "github.com/docker/buildx",
        other => return Err(format!("no wrapper module is named {other}")),
    };
    text.lines()
        .map(str::trim)
        .map(|line| line.strip_prefix("require ").unwrap_or(line))
        .find_map(|line| {
            let (name, version) = line.split_once(' ')?;
            // `v1.37.2`, or `v1.37.2 // indirect` after `go mod tidy`.
            let version = version.split_whitespace().next()?;
            (name == module).then(|| version.to_string())
        })
        .ok_or_else(|| format!("{} does not require {module}", path.display()))
}
