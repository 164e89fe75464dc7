//! A real Kubernetes control plane for the end-to-end tests, built from its Go modules by
//! `scripts/build-control-plane`: etcd and kube-apiserver on loopback ports in a temporary
//! directory, and kube-controller-manager and kube-scheduler once a test asks for them.
//!
//! - The admin is a client certificate in `system:masters`; authorization is the Node
//!   authorizer and RBAC, with the NodeRestriction admission plugin, so a request as a node
//!   identity is judged as a kubelet's; the API server signs service-account tokens with a key
//!   pair of the suite's own.
//! - etcd runs with `--unsafe-no-fsync` (its data directory is on disk, but nothing waits for
//!   the disk): figures measured through this control plane divide by that setting.
//! - The controller-manager runs every controller but the node-lifecycle controller. Test
//!   Nodes have no kubelet, so that controller would taint each `not-ready`/`unreachable` and
//!   podmend would then be judged on Nodes no real cluster schedules to. [`ControlPlane::create_node`]
//!   also removes the `not-ready` taint the `TaintNodesByCondition` admission plugin puts on
//!   every new Node: test Nodes are Ready and stay so because nothing says otherwise.
//! - Every component runs under a watchdog ([`process`]), so none outlives the test binary.

pub mod binaries;
pub mod node;
pub mod pki;
pub mod process;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use self::binaries::Binaries;
use self::pki::Pki;
use self::process::Process;
use super::net::free_port;

/// How long a component may take to become ready.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A running control plane; every component stops when it is dropped.
pub struct ControlPlane {
    pub binaries: Binaries,
    pub pki: Pki,
    /// The admin's kubeconfig.
    pub kubeconfig: PathBuf,
    /// `https://127.0.0.1:PORT`.
    pub server: String,
    /// The API server's `gitVersion` (`v1.37.2`).
    pub version: String,
    // Stopped in reverse order of start by `Drop`: dependents before etcd.
    scheduler: Mutex<Option<Process>>,
    controller_manager: Mutex<Option<Process>>,
    apiserver: Mutex<Option<Process>>,
    etcd: Mutex<Option<Process>>,
    /// Last: removed after every process stopped.
    dir: tempfile::TempDir,
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver and waits until `/readyz` answers and the `default`
    /// namespace exists. On failure, the error holds each component's command line and
    /// last log lines.
    pub async fn start() -> Result<ControlPlane, String> {
        Self::start_with_apiserver_args(&[]).await
    }

    /// [`Self::start`], with `extra` on kube-apiserver's command line (a test that needs a
    /// setting the suite's control plane must not have, e.g. a short
    /// `--etcd-compaction-interval`, starts a control plane of its own).
    pub async fn start_with_apiserver_args(extra: &[&str]) -> Result<ControlPlane, String> {
        let binaries = Binaries::find()?;
        let dir = tempfile::Builder::new()
            .prefix("podmend-e2e-")
            .tempdir()
            .map_err(|e| format!("cannot make a temporary directory: {e}"))?;
        let pki = Pki::write(&dir.path().join("pki"))?;

        let etcd_client = free_port();
        let etcd_peer = free_port();
        let etcd = start_etcd(&binaries.etcd, dir.path(), etcd_client, etcd_peer)?;
        let mut plane = ControlPlane {
            kubeconfig: dir.path().join("admin.kubeconfig"),
            server: String::new(),
            version: String::new(),
            scheduler: Mutex::new(None),
            controller_manager: Mutex::new(None),
            apiserver: Mutex::new(None),
            etcd: Mutex::new(Some(etcd)),
            binaries,
            pki,
            dir,
        };
        plane.wait_for_etcd(etcd_client).await?;

        let port = free_port().port();
        plane.server = format!("https://127.0.0.1:{port}");
        std::fs::write(
            &plane.kubeconfig,
            plane.pki.admin_kubeconfig(&plane.server)?,
        )
        .map_err(|e| format!("{}: {e}", plane.kubeconfig.display()))?;
        let apiserver = Process::start(
            "kube-apiserver",
            &plane.binaries.kube_apiserver,
            &[
                apiserver_args(&plane.pki, port, etcd_client),
                extra.iter().map(|arg| arg.to_string()).collect(),
            ]
            .concat(),
            plane.dir.path(),
        )?;
        *lock(&plane.apiserver) = Some(apiserver);
        plane.wait_for_apiserver().await?;
        Ok(plane)
    }

    /// The suite's directory: every component's files and logs are under it, and its path is
    /// on every component's command line.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A client for the admin.
    pub async fn client(&self) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)
            .unwrap_or_else(|e| panic!("{}: {e}", self.kubeconfig.display()));
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .expect("the admin kubeconfig");
        kube::Client::try_from(config).expect("a client for the control plane")
    }

    /// The real `kubectl`, as the admin.
    pub fn kubectl(&self) -> std::process::Command {
        let mut command = std::process::Command::new(&self.binaries.kubectl);
        command.arg("--kubeconfig").arg(&self.kubeconfig);
        command
    }

    /// The real `helm`, as the admin, with its configuration, cache and data in the suite's
    /// directory.
    pub fn helm(&self) -> std::process::Command {
        let mut command = std::process::Command::new(&self.binaries.helm);
        let home = self.dir.path().join("helm");
        command
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"));
        command
    }

    /// Starts kube-controller-manager unless it runs, and waits until it made the `default`
    /// ServiceAccount of the `default` namespace.
    pub async fn ensure_controller_manager(&self) -> Result<(), String> {
        {
            let mut slot = lock(&self.controller_manager);
            if slot.is_some() {
                return Ok(());
            }
            *slot = Some(Process::start(
                "kube-controller-manager",
                &self.binaries.kube_controller_manager,
                &self.controller_manager_args(),
                self.dir.path(),
            )?);
        }
        let client = self.client().await;
        let accounts: Api<ServiceAccount> = Api::namespaced(client, "default");
        self.wait_until("kube-controller-manager", || async {
            matches!(accounts.get_opt("default").await, Ok(Some(_)))
        })
        .await
    }

    /// Starts kube-scheduler unless it runs, and waits until it listens on its port.
    pub async fn ensure_scheduler(&self) -> Result<(), String> {
        let port = {
            let mut slot = lock(&self.scheduler);
            if slot.is_some() {
                return Ok(());
            }
            let port = free_port();
            *slot = Some(Process::start(
                "kube-scheduler",
                &self.binaries.kube_scheduler,
                &[
                    self.flag("kubeconfig"),
                    self.flag("authentication-kubeconfig"),
                    self.flag("authorization-kubeconfig"),
                    "--leader-elect=false".into(),
                    "--bind-address=127.0.0.1".into(),
                    format!("--secure-port={}", port.port()),
                ],
                self.dir.path(),
            )?);
            port
        };
        self.wait_until("kube-scheduler", || async {
            tokio::net::TcpStream::connect(port).await.is_ok()
        })
        .await
    }

    /// Creates namespace `name` and waits for its `default` ServiceAccount (the
    /// controller-manager makes it; pods created before it are refused).
    pub async fn create_namespace(&self, name: &str) -> Result<(), String> {
        self.ensure_controller_manager().await?;
        let client = self.client().await;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
        }))
        .map_err(|e| e.to_string())?;
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .map_err(|e| format!("cannot create namespace {name}: {e}"))?;
        let accounts: Api<ServiceAccount> = Api::namespaced(client, name);
        self.wait_until("the namespace's default ServiceAccount", || async {
            matches!(accounts.get_opt("default").await, Ok(Some(_)))
        })
        .await
    }

    /// Creates a Ready Node `name` with `cpu` and `memory` allocatable, room for 110 pods and
    /// `taints` (JSON taints), and removes the `not-ready` taint the API server adds to every new
    /// Node (there is no kubelet to clear it).
    pub async fn create_node(
        &self,
        name: &str,
        cpu: &str,
        memory: &str,
        taints: Value,
    ) -> Result<Node, String> {
        let client = self.client().await;
        let nodes: Api<Node> = Api::all(client);
        let resources = json!({"cpu": cpu, "memory": memory, "pods": "110"});
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {"taints": taints},
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "a test Node without a kubelet"}]
            }
        }))
        .map_err(|e| e.to_string())?;
        nodes
            .create(&PostParams::default(), &node)
            .await
            .map_err(|e| format!("cannot create Node {name}: {e}"))?;
        nodes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": taints}})),
            )
            .await
            .map_err(|e| format!("cannot set Node {name}'s taints: {e}"))
    }

    /// Every component's command line and last log lines.
    pub fn report(&self) -> String {
        [
            &self.etcd,
            &self.apiserver,
            &self.controller_manager,
            &self.scheduler,
        ]
        .iter()
        .filter_map(|slot| lock(slot).as_ref().map(Process::report))
        .collect()
    }

    /// Stops every component, dependents first.
    pub fn stop(&self) {
        for slot in [
            &self.scheduler,
            &self.controller_manager,
            &self.apiserver,
            &self.etcd,
        ] {
            if let Some(mut process) = lock(slot).take() {
                process.stop();
            }
        }
    }

    /// `--NAME=<the admin kubeconfig>`.
    fn flag(&self, name: &str) -> String {
        format!("--{name}={}", self.kubeconfig.display())
    }

    fn controller_manager_args(&self) -> Vec<String> {
        vec![
            self.flag("kubeconfig"),
            self.flag("authentication-kubeconfig"),
            self.flag("authorization-kubeconfig"),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", free_port().port()),
            // Test Nodes have no kubelet: see the module's documentation.
            "--controllers=*,-node-lifecycle-controller".into(),
            format!(
                "--service-account-private-key-file={}",
                self.pki.service_account_key.display()
            ),
            format!("--root-ca-file={}", self.pki.ca_cert.display()),
            "--allocate-node-cidrs=false".into(),
        ]
    }

    async fn wait_for_etcd(&self, client: std::net::SocketAddr) -> Result<(), String> {
        self.wait_until("etcd", || async move {
            tokio::task::spawn_blocking(move || {
                super::net::http_get(
                    client,
                    "/health",
                    Duration::from_secs(1),
                    Duration::from_secs(2),
                )
            })
            .await
            .ok()
            .and_then(Result::ok)
            .is_some_and(|(status, body)| status == 200 && body.contains("true"))
        })
        .await
    }

    async fn wait_for_apiserver(&mut self) -> Result<(), String> {
        let client = self.client().await;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        self.wait_until("kube-apiserver", || async {
            let ready = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("request");
            matches!(client.request_text(ready).await.as_deref(), Ok("ok"))
                && matches!(namespaces.get_opt("default").await, Ok(Some(_)))
        })
        .await?;
        self.version = client
            .apiserver_version()
            .await
            .map_err(|e| format!("GET /version: {e}"))?
            .git_version;
        Ok(())
    }

    /// Polls `ready` every 100 ms until it holds; Err with every component's report when a
    /// component exited or [`START_TIMEOUT`] passed.
    async fn wait_until<F, Fut>(&self, what: &str, ready: F) -> Result<(), String>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if ready().await {
                return Ok(());
            }
            let exited: Vec<String> = [
                &self.etcd,
                &self.apiserver,
                &self.controller_manager,
                &self.scheduler,
            ]
            .iter()
            .filter_map(|slot| {
                let mut slot = lock(slot);
                let process = slot.as_mut()?;
                (!process.running()).then(|| process.name.clone())
            })
            .collect();
            if !exited.is_empty() || Instant::now() >= deadline {
                let why = if exited.is_empty() {
                    format!("not ready within {} s", START_TIMEOUT.as_secs())
                } else {
                    format!("{} exited", exited.join(", "))
                };
                return Err(format!(
                    "the control plane did not start: waiting for {what}, {why}\n{}",
                    self.report()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn start_etcd(
    etcd: &Path,
    dir: &Path,
    client: std::net::SocketAddr,
    peer: std::net::SocketAddr,
) -> Result<Process, String> {
    let client_url = format!("http://{client}");
    let peer_url = format!("http://{peer}");
    Process::start(
        "etcd",
        etcd,
        &[
            "--name=e2e".into(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=e2e={peer_url}"),
            // Nothing waits for the disk: see the module's documentation.
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ],
        dir,
    )
}

fn apiserver_args(pki: &Pki, port: u16, etcd: std::net::SocketAddr) -> Vec<String> {
    let file = |flag: &str, path: &Path| format!("--{flag}={}", path.display());
    vec![
        format!("--etcd-servers=http://{etcd}"),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        // The `kubernetes` Service would need a non-loopback endpoint: it gets none.
        "--endpoint-reconciler-type=none".into(),
        format!("--secure-port={port}"),
        file("tls-cert-file", &pki.serving_cert),
        file("tls-private-key-file", &pki.serving_key),
        file("client-ca-file", &pki.ca_cert),
        // The Node authorizer and NodeRestriction, as kubeadm sets them: a request as a node
        // identity (`system:node:NAME`, group `system:nodes`) is judged as a kubelet's.
        "--authorization-mode=Node,RBAC".into(),
        file("service-account-key-file", &pki.service_account_public),
        file("service-account-signing-key-file", &pki.service_account_key),
        format!("--service-account-issuer=https://127.0.0.1:{port}"),
        // Only an API object's field: no test dials a Service address.
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        "--allow-privileged=true".into(),
        // Off by default in kube-apiserver, on in some distributions: node-affinity must never
        // add a toleration it would refuse. Only namespaces that name a whitelist are affected.
        "--enable-admission-plugins=PodTolerationRestriction,NodeRestriction".into(),
        // `kubectl logs` reaches a real node's kubelet at its InternalIP (an address in the
        // network namespace the node test made); the default order tries the node's hostname
        // first, which would send a DNS query off the machine.
        "--kubelet-preferred-address-types=InternalIP".into(),
        // The kubelet trusts client certificates of the suite's CA; the admin's is in
        // `system:masters`.
        file("kubelet-client-certificate", &pki.admin_cert),
        file("kubelet-client-key", &pki.admin_key),
    ]
}
