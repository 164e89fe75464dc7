//! `audit --cluster`: the same engine over the workloads of a live cluster (listed page by
//! page), plus what only a cluster shows ([`SymptomKind`]); and the findings as
//! `wgpolicyk8s.io/v1alpha2` PolicyReports, printed or server-side applied.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{LimitRange, Node, Pod, PodTemplate, ReplicationController};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Resource};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::{ObjectRef, Report, Source, Symptom, SymptomKind};
use crate::cluster::StaticCluster;
use crate::config::Mode;
use crate::engine::Engine;
use crate::rules::virtual_node_phase;

/// What can stop `audit --cluster`, each with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ClusterAuditError {
    #[error(
        "cannot use kubeconfig {}{}: {detail}; check --kubeconfig / KUBECONFIG and --context (`kubectl config get-contexts`)",
        shown_path(.path.as_deref()),
        shown_context(.context.as_deref())
    )]
    Kubeconfig {
        path: Option<PathBuf>,
        context: Option<String>,
        detail: String,
    },
    #[error(
        "no cluster found: no usable kubeconfig ({kubeconfig}) and not running in a cluster ({in_cluster}); set KUBECONFIG or pass --kubeconfig / --context"
    )]
    NoCluster {
        kubeconfig: String,
        in_cluster: String,
    },
    #[error(
        "cannot build a Kubernetes client for {url}: {detail}; check the kubeconfig's cluster and user entries"
    )]
    Client { url: String, detail: String },
    #[error(
        "cannot reach the cluster{}: {detail}; check --context / KUBECONFIG and that the API server is up",
        at_url(.url.as_deref())
    )]
    Unreachable { url: Option<String>, detail: String },
    #[error(
        "the cluster{} rejected the credentials (401 Unauthorized: {message}); log in again or check the kubeconfig user",
        at_url(.url.as_deref())
    )]
    Unauthorized {
        url: Option<String>,
        message: String,
    },
    #[error(
        "not allowed to list {resource} {scope} (403 Forbidden: {message}); the audit needs get/list on nodes, limitranges, pods, deployments, replicasets, statefulsets, daemonsets, jobs and cronjobs, or use -n NAMESPACE"
    )]
    Forbidden {
        resource: String,
        scope: String,
        message: String,
    },
    #[error(
        "listing {resource} {scope} expired while paging (410 Gone: {message}); run the audit again, or with a larger --page-size"
    )]
    ListExpired {
        resource: String,
        scope: String,
        message: String,
    },
    #[error("listing {resource} {scope} failed ({code} {reason}: {message})")]
    List {
        resource: String,
        scope: String,
        code: u16,
        reason: String,
        message: String,
    },
    #[error("cannot read the {resource} list {scope}: {detail}")]
    Decode {
        resource: String,
        scope: String,
        detail: String,
    },
    #[error(
        "the {kind} CRD (wgpolicyk8s.io/v1alpha2) is not installed in the cluster (404); install the wg-policy PolicyReport CRDs (kubernetes-sigs/wg-policy-prototypes, policy-report/crd; Kyverno ships them too), or print the reports without applying them"
    )]
    PolicyReportCrdMissing { kind: String },
    #[error("cannot apply {kind} {name} ({code} {reason}: {message})")]
    Apply {
        kind: String,
        name: String,
        code: u16,
        reason: String,
        message: String,
    },
    #[error(
        "not a PolicyReport or ClusterPolicyReport of wgpolicyk8s.io/v1alpha2 with a name: {0}"
    )]
    NotAPolicyReport(String),
}

/// An error and its sources in one line (the variants carry no `source`, so that a caller
/// printing the chain does not print it twice).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

fn shown_path(path: Option<&Path>) -> String {
    path.map_or_else(
        || "(KUBECONFIG or ~/.kube/config)".to_string(),
        |p| p.display().to_string(),
    )
}

fn shown_context(context: Option<&str>) -> String {
    context.map_or_else(String::new, |c| format!(" with context {c:?}"))
}

fn at_url(url: Option<&str>) -> String {
    url.map_or_else(String::new, |u| format!(" at {u}"))
}

/// Finds a cluster as kubectl would: the kubeconfig at `kubeconfig`, else `KUBECONFIG` or
/// `~/.kube/config`, with `context` or the current one; without a context asked for, the
/// in-cluster service account when no kubeconfig works. Then checks the API server answers
/// (`GET /version`; any HTTP answer but 401 counts).
pub async fn client_for(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<Client, ClusterAuditError> {
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..KubeConfigOptions::default()
    };
    let kubeconfig_error = |path: Option<&Path>| {
        let path = path.map(Path::to_path_buf);
        let context = context.map(str::to_string);
        move |error: KubeconfigError| ClusterAuditError::Kubeconfig {
            path,
            context,
            detail: chain(&error),
        }
    };
    let mut config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path).map_err(kubeconfig_error(Some(path)))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(kubeconfig_error(Some(path)))?
        }
        None => match kube::Config::from_kubeconfig(&options).await {
            Ok(config) => config,
            Err(source) if context.is_some() => return Err(kubeconfig_error(None)(source)),
            Err(kubeconfig) => {
                kube::Config::incluster().map_err(|in_cluster| ClusterAuditError::NoCluster {
                    kubeconfig: chain(&kubeconfig),
                    in_cluster: chain(&in_cluster),
                })?
            }
        },
    };
    config.apply_debug_overrides();
    let url = config.cluster_url.to_string();
    let client = Client::try_from(config).map_err(|error| ClusterAuditError::Client {
        url: url.clone(),
        detail: chain(&error),
    })?;
    match client.apiserver_version().await {
        Ok(_) => Ok(client),
        Err(kube::Error::Api(status)) if status.code == 401 => {
            Err(ClusterAuditError::Unauthorized {
                url: Some(url),
                message: status.message,
            })
        }
        // Any other answer means the server is there (a stub or a proxy may not serve /version).
        Err(kube::Error::Api(_) | kube::Error::SerdeError(_)) => Ok(client),
        Err(error) => Err(ClusterAuditError::Unreachable {
            url: Some(url),
            detail: chain(&error),
        }),
    }
}

/// What to audit and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterAuditOptions {
    /// Only this namespace; `None` for all namespaces.
    pub namespace: Option<String>,
    /// Objects per list request (`limit`); 0 counts as 1.
    pub page_size: u32,
    /// Write `\rlisting pods… N` to stderr while listing (the caller ends the line).
    pub progress: bool,
}

impl Default for ClusterAuditOptions {
    fn default() -> Self {
        Self {
            namespace: None,
            page_size: 500,
            progress: false,
        }
    }
}

/// The workload kinds with pod templates, listed before pods so that failed pods can name
/// what their owner's template pins.
const TEMPLATE_KINDS: &[fn() -> ApiResource] = &[
    || ApiResource::erase::<PodTemplate>(&()),
    || ApiResource::erase::<ReplicationController>(&()),
    || ApiResource::erase::<Deployment>(&()),
    || ApiResource::erase::<ReplicaSet>(&()),
    || ApiResource::erase::<StatefulSet>(&()),
    || ApiResource::erase::<DaemonSet>(&()),
    || ApiResource::erase::<Job>(&()),
    || ApiResource::erase::<CronJob>(&()),
];

/// Audits the cluster behind `client`: Nodes and LimitRanges answer the rules' look-ups, then
/// every workload and pod (in `options.namespace`, or everywhere) goes through `engine` into
/// `report`, followed by the symptoms.
///
/// Pods are reviewed without `spec.nodeName` (the scheduler sets it on every scheduled pod;
/// a pinned one shows on the pod's template), and pods in a terminal phase are not reviewed,
/// only counted for symptoms.
pub async fn audit_cluster(
    client: Client,
    engine: &Engine,
    options: &ClusterAuditOptions,
    report: &mut Report,
) -> Result<(), ClusterAuditError> {
    let lister = Lister {
        page_size: options.page_size.max(1),
        namespace: options.namespace.as_deref(),
        progress: options.progress,
    };

    let mut cluster = StaticCluster::empty();
    lister
        .list(Api::<Node>::all(client.clone()), "nodes", |node: Node| {
            let name = node.metadata.name.unwrap_or_default();
            let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
            cluster.nodes.insert(name, taints);
        })
        .await?;
    let limit_ranges = match lister.namespace {
        Some(ns) => Api::<LimitRange>::namespaced(client.clone(), ns),
        None => Api::<LimitRange>::all(client.clone()),
    };
    lister
        .list(limit_ranges, "limitranges", |lr: LimitRange| {
            let namespace = lr.metadata.namespace.unwrap_or_default();
            let items = lr.spec.map(|s| s.limits).unwrap_or_default();
            cluster
                .limit_ranges
                .entry(namespace)
                .or_default()
                .extend(items);
        })
        .await?;

    let mut owners: HashMap<OwnerKey, OwnerInfo> = HashMap::new();
    for resource in TEMPLATE_KINDS.iter().map(|make| make()) {
        let api = lister.dynamic_api(&client, &resource);
        let plural = resource.plural.clone();
        lister
            .list(api, &plural, |object: DynamicObject| {
                let object = to_json(object, &resource);
                let (key, info) = owner_info(&object, &resource);
                owners.insert(key, info);
                report.add_object(engine, &cluster, &object, cluster_source());
            })
            .await?;
    }

    let pods = ApiResource::erase::<Pod>(&());
    let api = lister.dynamic_api(&client, &pods);
    let mut symptoms = PodSymptoms::default();
    lister
        .list(api, "pods", |object: DynamicObject| {
            let mut pod = to_json(object, &pods);
            let phase = pod
                .pointer("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("");
            match phase {
                "Failed" => symptoms.failed(&pod),
                "Succeeded" => {}
                _ => {
                    symptoms.pending_with_running_containers(&pod);
                    symptoms.host_docker_socket(&pod);
                    if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
                        spec.remove("nodeName");
                    }
                    report.add_object(engine, &cluster, &pod, cluster_source());
                }
            }
        })
        .await?;

    for symptom in symptoms.into_symptoms(&owners) {
        report.add_symptom(symptom);
    }
    Ok(())
}

fn cluster_source() -> Source {
    Source {
        file: "cluster".to_string(),
        document: 0,
        line: 0,
        helm_source: None,
        list_item: None,
    }
}

/// Lists page by page, reporting progress.
struct Lister<'a> {
    page_size: u32,
    namespace: Option<&'a str>,
    progress: bool,
}

impl Lister<'_> {
    fn dynamic_api(&self, client: &Client, resource: &ApiResource) -> Api<DynamicObject> {
        match self.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
            None => Api::all_with(client.clone(), resource),
        }
    }

    /// Calls `each` on every object of `api`, `page_size` at a time, following `continue`.
    async fn list<K>(
        &self,
        api: Api<K>,
        what: &str,
        mut each: impl FnMut(K),
    ) -> Result<usize, ClusterAuditError>
    where
        K: Resource + Clone + DeserializeOwned + Debug,
    {
        let scope = match (what, self.namespace) {
            ("nodes", _) => "of the cluster".to_string(),
            (_, Some(ns)) => format!("in namespace {ns}"),
            (_, None) => "in all namespaces".to_string(),
        };
        let mut params = ListParams::default().limit(self.page_size);
        let mut count = 0usize;
        self.show(what, count);
        loop {
            let page = api
                .list(&params)
                .await
                .map_err(|error| list_error(what, &scope, error))?;
            for item in page.items {
                each(item);
                count += 1;
            }
            self.show(what, count);
            match page.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        Ok(count)
    }

    fn show(&self, what: &str, count: usize) {
        if self.progress {
            let line = format!("listing {what}… {}", thousands(count));
            let mut stderr = std::io::stderr().lock();
            // Pad so a shorter line covers a longer one before it; progress is best effort.
            let _ = write!(stderr, "\r{line:<40}");
            let _ = stderr.flush();
        }
    }
}

fn list_error(what: &str, scope: &str, error: kube::Error) -> ClusterAuditError {
    let (resource, scope) = (what.to_string(), scope.to_string());
    match error {
        kube::Error::Api(status) => match status.code {
            401 => ClusterAuditError::Unauthorized {
                url: None,
                message: status.message,
            },
            403 => ClusterAuditError::Forbidden {
                resource,
                scope,
                message: status.message,
            },
            410 => ClusterAuditError::ListExpired {
                resource,
                scope,
                message: status.message,
            },
            code => ClusterAuditError::List {
                resource,
                scope,
                code,
                reason: status.reason,
                message: status.message,
            },
        },
        error @ kube::Error::SerdeError(_) => ClusterAuditError::Decode {
            resource,
            scope,
            detail: chain(&error),
        },
        error => ClusterAuditError::Unreachable {
            url: None,
            detail: chain(&error),
        },
    }
}

/// A listed object as the JSON the API server would show for it alone: list items come
/// without `apiVersion` and `kind`. `managedFields` are dropped (rules never read them).
fn to_json(mut object: DynamicObject, resource: &ApiResource) -> Value {
    object.metadata.managed_fields = None;
    let mut map = Map::new();
    map.insert("apiVersion".into(), resource.api_version.clone().into());
    map.insert("kind".into(), resource.kind.clone().into());
    map.insert(
        "metadata".into(),
        serde_json::to_value(&object.metadata).unwrap_or_else(|_| json!({})),
    );
    if let Value::Object(data) = object.data {
        for (key, value) in data {
            if !matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                map.insert(key, value);
            }
        }
    }
    Value::Object(map)
}

fn text<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// `namespace`, `kind`, `name` of a workload.
type OwnerKey = (String, String, String);

/// What failed pods' messages say about their owner.
#[derive(Debug, Clone, Default)]
struct OwnerInfo {
    api_version: String,
    /// `spec.nodeName` of the owner's pod template, when set.
    template_node: Option<String>,
    /// The owner's own controller (a ReplicaSet's Deployment, a Job's CronJob): kind, name.
    controller: Option<(String, String)>,
}

fn owner_info(object: &Value, resource: &ApiResource) -> (OwnerKey, OwnerInfo) {
    let key = (
        text(object, "/metadata/namespace").to_string(),
        resource.kind.clone(),
        text(object, "/metadata/name").to_string(),
    );
    let template_node = crate::target::for_kind(&resource.group, &resource.kind)
        .and_then(|target| object.pointer(&format!("{}/nodeName", target.spec)))
        .and_then(Value::as_str)
        .filter(|name| !name.is_empty())
        .map(str::to_string);
    let controller = controller_of(object).map(|owner| (owner.kind, owner.name));
    let info = OwnerInfo {
        api_version: resource.api_version.clone(),
        template_node,
        controller,
    };
    (key, info)
}

struct Owner {
    api_version: String,
    kind: String,
    name: String,
}

/// The `ownerReferences` entry with `controller: true`.
fn controller_of(object: &Value) -> Option<Owner> {
    object
        .pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|owner| owner.get("controller").and_then(Value::as_bool) == Some(true))
        .map(|owner| Owner {
            api_version: text(owner, "/apiVersion").to_string(),
            kind: text(owner, "/kind").to_string(),
            name: text(owner, "/name").to_string(),
        })
}

/// The pod's controller, or the pod itself.
fn owner_or_self(pod: &Value) -> ObjectRef {
    let namespace = text(pod, "/metadata/namespace").to_string();
    match controller_of(pod) {
        Some(owner) => ObjectRef {
            api_version: owner.api_version,
            kind: owner.kind,
            namespace,
            name: owner.name,
        },
        None => ObjectRef::of(pod),
    }
}

/// One group of Failed pods: same namespace, owner and reason.
#[derive(Debug)]
struct FailedGroup {
    owner: ObjectRef,
    count: usize,
    /// The pods' common `spec.nodeName`: `Some(Some(n))` while all agree so far.
    node: Option<Option<String>>,
}

#[derive(Debug, Default)]
struct PodSymptoms {
    /// Keyed (namespace, owner kind, owner name, reason).
    failed: BTreeMap<(String, String, String, String), FailedGroup>,
    pending: Vec<Symptom>,
    /// Keyed (namespace, owner kind, owner name).
    docker: BTreeMap<OwnerKey, DockerGroup>,
}

/// Pods of one owner on the host's Docker socket.
#[derive(Debug)]
struct DockerGroup {
    owner: ObjectRef,
    count: usize,
    /// The hostPath paths seen, each once.
    paths: Vec<String>,
}

const DOCKER_SOCKETS: &[&str] = &["/var/run/docker.sock", "/run/docker.sock"];
const DOCKER_SOCKET_DIRS: &[&str] = &["/var/run", "/run"];

impl PodSymptoms {
    fn failed(&mut self, pod: &Value) {
        // A pod whose containers simply failed (a failed CI job) has no reason: that is not
        // the rejection storm this reports (OutOfcpu, NodeAffinity, Evicted, …).
        let reason = text(pod, "/status/reason").to_string();
        if reason.is_empty() {
            return;
        }
        let owner = owner_or_self(pod);
        let node = text(pod, "/spec/nodeName");
        let node = (!node.is_empty()).then(|| node.to_string());
        let key = (
            owner.namespace.clone(),
            owner.kind.clone(),
            owner.name.clone(),
            reason,
        );
        let group = self.failed.entry(key).or_insert_with(|| FailedGroup {
            owner,
            count: 0,
            node: Some(node.clone()),
        });
        group.count += 1;
        if group.node.as_ref().is_some_and(|n| *n != node) {
            group.node = None;
        }
    }

    /// Phase `Pending` while every container runs (the kubelet's phase rule says `Running`):
    /// the case the opt-in `virtual-node-phase` rule corrects, reported whether it is on or not.
    fn pending_with_running_containers(&mut self, pod: &Value) {
        if text(pod, "/status/phase") != "Pending" {
            return;
        }
        let Ok(typed) = Pod::deserialize(pod) else {
            return;
        };
        if !virtual_node_phase::is_pending_with_every_container_running(&typed) {
            return;
        }
        let containers = typed.spec.as_ref().map_or(0, |spec| spec.containers.len());
        let object = ObjectRef::of(pod);
        let node = match text(pod, "/spec/nodeName") {
            "" => "no node".to_string(),
            node => format!("node {node}"),
        };
        let message = format!(
            "Pod {}/{}: phase Pending while all {} container(s) are running, on {node}; clients that wait for Running (e.g. Jenkins agents) time out",
            object.namespace, object.name, containers
        );
        self.pending.push(Symptom {
            kind: SymptomKind::PendingWithRunningContainers,
            object,
            count: 1,
            reason: String::new(),
            message,
        });
    }

    /// A hostPath volume on the node's Docker socket, or on its directory mounted by a
    /// `docker:*` container.
    fn host_docker_socket(&mut self, pod: &Value) {
        let volumes = pod
            .pointer("/spec/volumes")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let mut paths = Vec::new();
        for volume in volumes {
            let path = text(volume, "/hostPath/path");
            if path.is_empty() {
                continue;
            }
            let trimmed = match path.trim_end_matches('/') {
                "" => "/",
                trimmed => trimmed,
            };
            let hit = DOCKER_SOCKETS.contains(&trimmed)
                || (DOCKER_SOCKET_DIRS.contains(&trimmed)
                    && mounted_by_docker_image(pod, text(volume, "/name")));
            if hit && !paths.iter().any(|p| p == path) {
                paths.push(path.to_string());
            }
        }
        if paths.is_empty() {
            return;
        }
        let owner = owner_or_self(pod);
        let key = (
            owner.namespace.clone(),
            owner.kind.clone(),
            owner.name.clone(),
        );
        let group = self.docker.entry(key).or_insert_with(|| DockerGroup {
            owner,
            count: 0,
            paths: Vec::new(),
        });
        group.count += 1;
        for path in paths {
            if !group.paths.contains(&path) {
                group.paths.push(path);
            }
        }
    }

    fn into_symptoms(self, owners: &HashMap<OwnerKey, OwnerInfo>) -> Vec<Symptom> {
        let mut failed: Vec<(String, FailedGroup)> = self
            .failed
            .into_iter()
            .map(|((_, _, _, reason), group)| (reason, group))
            .collect();
        // Biggest storms first; the map's order breaks ties.
        failed.sort_by_key(|(_, group)| std::cmp::Reverse(group.count));
        let mut symptoms = Vec::new();
        for (reason, group) in failed {
            symptoms.push(failed_symptom(reason, group, owners));
        }
        symptoms.extend(self.pending);
        for DockerGroup {
            owner,
            count,
            paths,
        } in self.docker.into_values()
        {
            let message = format!(
                "{}: {} mount{} the node's Docker socket through hostPath {} (Docker-in-Docker on the host daemon: root on the node)",
                describe(&owner),
                pods(count),
                if count == 1 { "s" } else { "" },
                paths.join(", ")
            );
            symptoms.push(Symptom {
                kind: SymptomKind::DindHostSocket,
                object: owner,
                count,
                reason: String::new(),
                message,
            });
        }
        symptoms
    }
}

fn failed_symptom(
    reason: String,
    group: FailedGroup,
    owners: &HashMap<OwnerKey, OwnerInfo>,
) -> Symptom {
    let FailedGroup {
        mut owner,
        count,
        node,
    } = group;
    let info = owners.get(&(
        owner.namespace.clone(),
        owner.kind.clone(),
        owner.name.clone(),
    ));
    if owner.api_version.is_empty()
        && let Some(info) = info
    {
        owner.api_version = info.api_version.clone();
    }
    let mut subject = describe(&owner);
    if let Some((kind, name)) = info.and_then(|i| i.controller.as_ref()) {
        subject.push_str(&format!(" (owned by {kind} {name})"));
    }
    let cause = match (info.and_then(|i| i.template_node.as_deref()), node) {
        (Some(pinned), _) => format!(" — its template pins spec.nodeName={pinned}"),
        (None, Some(Some(node))) => {
            let all = if count == 1 { "it was" } else { "all were" };
            format!(" — {all} on node {node}")
        }
        _ => String::new(),
    };
    let message = format!(
        "{subject}: {} Failed pod{} ({reason}){cause}",
        thousands(count),
        if count == 1 { "" } else { "s" }
    );
    Symptom {
        kind: SymptomKind::FailedPods,
        object: owner,
        count,
        reason,
        message,
    }
}

/// `Kind ns/name`.
fn describe(object: &ObjectRef) -> String {
    if object.namespace.is_empty() {
        format!("{} {}", object.kind, object.name)
    } else {
        format!("{} {}/{}", object.kind, object.namespace, object.name)
    }
}

fn pods(count: usize) -> String {
    match count {
        1 => "1 pod".to_string(),
        n => format!("{} pods", thousands(n)),
    }
}

/// Whether a container whose image is `docker` (any registry, any tag) mounts `volume`.
fn mounted_by_docker_image(pod: &Value, volume: &str) -> bool {
    ["/spec/containers", "/spec/initContainers"]
        .iter()
        .filter_map(|p| pod.pointer(p).and_then(Value::as_array))
        .flatten()
        .filter(|c| is_docker_image(text(c, "/image")))
        .filter_map(|c| c.get("volumeMounts").and_then(Value::as_array))
        .flatten()
        .any(|mount| text(mount, "/name") == volume)
}

/// `docker:*`: the repository's last segment is `docker` (`docker:24-dind`,
/// `docker.io/library/docker:dind`, `docker@sha256:…`).
fn is_docker_image(image: &str) -> bool {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    last.split(':').next() == Some("docker")
}

/// `1204` → `1,204`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

const POLICY_REPORT_API_VERSION: &str = "wgpolicyk8s.io/v1alpha2";
const POLICY_REPORT_NAME: &str = "podmend-audit";
const FIELD_MANAGER: &str = "podmend";

/// The report as `wgpolicyk8s.io/v1alpha2` reports: one `PolicyReport` named `podmend-audit`
/// per namespace, and one `ClusterPolicyReport` for objects without a namespace. Findings are
/// `fail` (enforce, deny) or `warn`; symptoms are `warn`.
pub fn policy_reports(report: &Report) -> Vec<Value> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let timestamp = json!({"seconds": now.as_secs(), "nanos": now.subsec_nanos()});
    let result = |rule: &str, outcome: &str, message: &str, object: &ObjectRef| {
        let mut resource = Map::new();
        resource.insert("apiVersion".into(), object.api_version.clone().into());
        resource.insert("kind".into(), object.kind.clone().into());
        resource.insert("name".into(), object.name.clone().into());
        if !object.namespace.is_empty() {
            resource.insert("namespace".into(), object.namespace.clone().into());
        }
        json!({
            "policy": "podmend",
            "rule": rule,
            "result": outcome,
            "message": message,
            "source": "podmend",
            "scored": true,
            "timestamp": timestamp,
            "resources": [resource],
        })
    };
    // Namespace ("" for cluster-scoped) → results.
    let mut by_namespace: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    for finding in &report.findings {
        let outcome = match finding.mode {
            Mode::Enforce | Mode::Deny => "fail",
            Mode::Warn => "warn",
            Mode::Off => "skip",
        };
        let message = if finding.advice.is_empty() {
            finding.message.clone()
        } else {
            format!("{}; fix: {}", finding.message, finding.advice)
        };
        by_namespace
            .entry(&finding.object.namespace)
            .or_default()
            .push(result(&finding.rule, outcome, &message, &finding.object));
    }
    for symptom in &report.symptoms {
        let rule = serde_json::to_value(symptom.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        by_namespace
            .entry(&symptom.object.namespace)
            .or_default()
            .push(result(&rule, "warn", &symptom.message, &symptom.object));
    }
    let mut reports = Vec::new();
    let mut cluster_scoped = None;
    for (namespace, results) in by_namespace {
        let count = |outcome: &str| results.iter().filter(|r| r["result"] == outcome).count();
        let summary = json!({
            "pass": count("pass"),
            "fail": count("fail"),
            "warn": count("warn"),
            "error": count("error"),
            "skip": count("skip"),
        });
        let mut metadata = json!({
            "name": POLICY_REPORT_NAME,
            "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER},
        });
        let kind = if namespace.is_empty() {
            "ClusterPolicyReport"
        } else {
            metadata["namespace"] = namespace.into();
            "PolicyReport"
        };
        let object = json!({
            "apiVersion": POLICY_REPORT_API_VERSION,
            "kind": kind,
            "metadata": metadata,
            "summary": summary,
            "results": results,
        });
        if namespace.is_empty() {
            cluster_scoped = Some(object);
        } else {
            reports.push(object);
        }
    }
    reports.extend(cluster_scoped);
    reports
}

/// Server-side applies `reports` (from [`policy_reports`]) as field manager `podmend`
/// (forced: podmend owns these objects). Returns how many were applied.
pub async fn apply_policy_reports(
    client: Client,
    reports: &[Value],
) -> Result<usize, ClusterAuditError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut applied = 0;
    for report in reports {
        let kind = text(report, "/kind");
        let name = text(report, "/metadata/name");
        let namespace = text(report, "/metadata/namespace");
        let plural = match kind {
            "PolicyReport" if !namespace.is_empty() => "policyreports",
            "ClusterPolicyReport" => "clusterpolicyreports",
            _ => {
                return Err(ClusterAuditError::NotAPolicyReport(format!(
                    "kind {kind:?} in namespace {namespace:?}"
                )));
            }
        };
        if text(report, "/apiVersion") != POLICY_REPORT_API_VERSION || name.is_empty() {
            return Err(ClusterAuditError::NotAPolicyReport(format!(
                "{kind} {name:?} of apiVersion {:?}",
                text(report, "/apiVersion")
            )));
        }
        let resource = ApiResource {
            group: "wgpolicyk8s.io".to_string(),
            version: "v1alpha2".to_string(),
            api_version: POLICY_REPORT_API_VERSION.to_string(),
            kind: kind.to_string(),
            plural: plural.to_string(),
        };
        let api: Api<DynamicObject> = if namespace.is_empty() {
            Api::all_with(client.clone(), &resource)
        } else {
            Api::namespaced_with(client.clone(), namespace, &resource)
        };
        let shown = if namespace.is_empty() {
            name.to_string()
        } else {
            format!("{namespace}/{name}")
        };
        match api.patch(name, &params, &Patch::Apply(report)).await {
            Ok(_) => applied += 1,
            // A missing namespace is a 404 too, naming the namespace in its details.
            Err(kube::Error::Api(status))
                if status.code == 404
                    && status
                        .details
                        .as_ref()
                        .is_none_or(|d| d.kind != "namespaces") =>
            {
                return Err(ClusterAuditError::PolicyReportCrdMissing {
                    kind: kind.to_string(),
                });
            }
            Err(kube::Error::Api(status)) if status.code == 401 => {
                return Err(ClusterAuditError::Unauthorized {
                    url: None,
                    message: status.message,
                });
            }
            Err(kube::Error::Api(status)) => {
                return Err(ClusterAuditError::Apply {
                    kind: kind.to_string(),
                    name: shown,
                    code: status.code,
                    reason: status.reason,
                    message: status.message,
                });
            }
            Err(error) => {
                return Err(ClusterAuditError::Unreachable {
                    url: None,
                    detail: chain(&error),
                });
            }
        }
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators_go_every_three_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn docker_images_match_by_their_last_repository_segment() {
        assert!(is_docker_image("docker:19.03.1"));
        assert!(is_docker_image("docker:dind"));
        assert!(is_docker_image("docker.io/library/docker:24-dind"));
        assert!(is_docker_image("docker"));
        assert!(!is_docker_image("docker.io/library/alpine:3"));
        assert!(!is_docker_image("summerwind/actions-runner:latest"));
        assert!(!is_docker_image("mydocker:1"));
    }

    #[test]
    fn a_run_directory_counts_only_when_a_docker_container_mounts_it() {
        let pod = |image: &str| {
            json!({"metadata": {"name": "p", "namespace": "ci"}, "spec": {
                "containers": [{"name": "c", "image": image, "volumeMounts": [{"name": "run", "mountPath": "/var/run"}]}],
                "volumes": [{"name": "run", "hostPath": {"path": "/var/run/"}}]}})
        };
        let mut symptoms = PodSymptoms::default();
        symptoms.host_docker_socket(&pod("busybox"));
        assert!(symptoms.docker.is_empty());
        symptoms.host_docker_socket(&pod("docker:24"));
        assert_eq!(symptoms.docker.len(), 1);
    }

    #[test]
    fn a_pending_pod_missing_a_container_status_is_not_reported() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Pending", "containerStatuses": [
                {"name": "a", "state": {"running": {"startedAt": "2024-01-01T00:00:00Z"}}}]}});
        let mut symptoms = PodSymptoms::default();
        symptoms.pending_with_running_containers(&pod);
        assert!(symptoms.pending.is_empty());
    }

    #[test]
    fn a_pending_pod_whose_init_container_still_runs_is_not_reported() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"initContainers": [{"name": "init"}], "containers": [{"name": "a"}]},
            "status": {"phase": "Pending",
                "initContainerStatuses": [{"name": "init", "image": "x", "imageID": "", "ready": false, "restartCount": 0, "state": {"running": {}}}],
                "containerStatuses": [{"name": "a", "image": "x", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}}]}});
        let mut symptoms = PodSymptoms::default();
        symptoms.pending_with_running_containers(&pod);
        assert!(symptoms.pending.is_empty());
    }

    #[test]
    fn failed_pods_on_different_nodes_name_no_node() {
        let pod = |node: &str| {
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": node},
                "status": {"phase": "Failed", "reason": "OutOfmemory"}})
        };
        let mut symptoms = PodSymptoms::default();
        symptoms.failed(&pod("n1"));
        symptoms.failed(&pod("n2"));
        let out = symptoms.into_symptoms(&HashMap::new());
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].message, "Pod ns/p: 2 Failed pods (OutOfmemory)");
    }
}
