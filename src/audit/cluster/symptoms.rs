//! What only a live cluster shows ([`SymptomKind`]): Failed pods grouped by owner and reason
//! (the nodeName storm), pods `Pending` while every container runs, Docker-in-Docker pods on
//! the node's Docker socket. The grouping of Failed pods ([`failed_pod_group`]) and the storm
//! reasons ([`is_admission_rejection`]) are shared with `clean-storms`, so the audit and the
//! clean-up always agree on what a storm is.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Pod;
use kube::api::ApiResource;
use serde::Deserialize;
use serde_json::Value;

use super::{text, thousands};
use crate::audit::{ObjectRef, Symptom, SymptomKind};
use crate::rules::virtual_node_phase;

/// The reasons the kubelet gives a pod it refuses to admit, besides `OutOf<resource>`. A
/// rejected pod is `Failed` at once, and its controller replaces it at once: the storm.
///
/// - `pkg/kubelet/lifecycle/predicate.go` (`predicateAdmitHandler.Admit`, `generalFilter`):
///   the scheduler plugins it re-runs (`NodeAffinity`, `NodeName`, `NodePorts`), the
///   NoExecute taint check (`TaintToleration`) and the checks before them.
/// - `pkg/kubelet/lifecycle/handlers.go`: `AppArmorNotAdmittedReason`,
///   `PodLevelResourcesNotAdmittedReason`, `PodFeatureUnsupported`.
/// - `pkg/kubelet/cm/admission/errors.go` (`GetPodAdmitResult`): the resource managers'
///   rejections carry their error's `Type()`: `TopologyAffinityError`
///   (`pkg/kubelet/cm/topologymanager/topology_manager.go`, `ErrorTopologyAffinity`),
///   `SMTAlignmentError` (`pkg/kubelet/cm/cpumanager/policy_static.go`, `ErrorSMTAlignment`),
///   and `UnexpectedAdmissionError` for any other error (a device plugin gone, …).
/// - `pkg/kubelet/sysctl/allowlist.go` (`ForbiddenReason`) and
///   `pkg/kubelet/nodeshutdown` (`NodeShutdownNotAdmittedReason`).
///
/// The kubelet's own list, `admissionRejectionReasons` in `pkg/kubelet/kubelet.go` (the
/// reasons of `kubelet_admission_rejections_total`), also has the eviction manager's
/// `Evicted`, left out here: evicted pods that ran carry it too.
pub const ADMISSION_REJECTIONS: &[&str] = &[
    "NodeAffinity",
    "NodeName",
    "NodePorts",
    "TaintToleration",
    "PodOSSelectorNodeLabelDoesNotMatch",
    "PodOSNotSupported",
    "InvalidNodeInfo",
    "InitContainerRestartPolicyForbidden",
    "SupplementalGroupsPolicyNotSupported",
    "UnexpectedAdmissionError",
    "UnknownReason",
    "UnexpectedPredicateFailureType",
    "AppArmor",
    "PodLevelResourcesNotSupported",
    "PodFeatureUnsupported",
    "TopologyAffinityError",
    "SMTAlignmentError",
    "SysctlForbidden",
    "NodeShutdown",
];

/// Whether a `Failed` pod's `status.reason` is a kubelet admission rejection: `OutOfcpu`,
/// `OutOfmemory`, `OutOf<resource>`, or one of [`ADMISSION_REJECTIONS`]. `Evicted`,
/// `DeadlineExceeded` and the like are not (their pods ran).
pub fn is_admission_rejection(reason: &str) -> bool {
    (reason.len() > "OutOf".len() && reason.starts_with("OutOf"))
        || ADMISSION_REJECTIONS.contains(&reason)
}

/// The group a `Failed` pod belongs to, as the audit reports it: its controller (or the pod
/// itself when it has none) and its `status.reason`. `None` for a pod that is not `Failed` or
/// failed without a reason (its containers simply exited with errors: a failed CI job, not a
/// rejection storm).
pub fn failed_pod_group(pod: &Value) -> Option<(ObjectRef, String)> {
    if text(pod, "/status/phase") != "Failed" {
        return None;
    }
    let reason = text(pod, "/status/reason");
    if reason.is_empty() {
        return None;
    }
    Some((owner_or_self(pod), reason.to_string()))
}

/// `namespace`, `kind`, `name` of a workload.
pub(crate) type OwnerKey = (String, String, String);

/// What failed pods' messages say about their owner.
#[derive(Debug, Clone, Default)]
pub(crate) struct OwnerInfo {
    api_version: String,
    /// `spec.nodeName` of the owner's pod template, when set.
    template_node: Option<String>,
    /// The owner's own controller (a ReplicaSet's Deployment, a Job's CronJob): kind, name.
    controller: Option<(String, String)>,
}

pub(crate) fn owner_info(object: &Value, resource: &ApiResource) -> (OwnerKey, OwnerInfo) {
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

pub(crate) struct Owner {
    pub uid: String,
    pub api_version: String,
    pub kind: String,
    pub name: String,
}

/// The `ownerReferences` entry with `controller: true`.
pub(crate) fn controller_of(object: &Value) -> Option<Owner> {
    object
        .pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|owner| owner.get("controller").and_then(Value::as_bool) == Some(true))
        .map(|owner| Owner {
            uid: text(owner, "/uid").to_string(),
            api_version: text(owner, "/apiVersion").to_string(),
            kind: text(owner, "/kind").to_string(),
            name: text(owner, "/name").to_string(),
        })
}

/// The pod's controller, or the pod itself.
pub(crate) fn owner_or_self(pod: &Value) -> ObjectRef {
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
pub(crate) struct PodSymptoms {
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
    pub(crate) fn failed(&mut self, pod: &Value) {
        // A pod whose containers simply failed (a failed CI job) has no reason: that is not
        // the rejection storm this reports (OutOfcpu, NodeAffinity, Evicted, …).
        let Some((owner, reason)) = failed_pod_group(pod) else {
            return;
        };
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
    pub(crate) fn pending_with_running_containers(&mut self, pod: &Value) {
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
    pub(crate) fn host_docker_socket(&mut self, pod: &Value) {
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

    pub(crate) fn into_symptoms(self, owners: &HashMap<OwnerKey, OwnerInfo>) -> Vec<Symptom> {
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
pub(crate) fn describe(object: &ObjectRef) -> String {
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

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

    #[test]
    fn admission_rejections_are_the_kubelets_reasons_and_nothing_else() {
        for reason in [
            "OutOfcpu",
            "OutOfmemory",
            "OutOfpods",
            "OutOfephemeral-storage",
            "OutOfnvidia.com/gpu",
            "NodeAffinity",
            "TaintToleration",
            "NodePorts",
        ] {
            assert!(is_admission_rejection(reason), "{reason}");
        }
        for reason in [
            "",
            "OutOf",
            "Evicted",
            "DeadlineExceeded",
            "Shutdown",
            "NodeLost",
            "Terminated",
            "outofcpu",
        ] {
            assert!(!is_admission_rejection(reason), "{reason}");
        }
    }

    #[test]
    fn a_failed_pod_groups_by_its_controller_and_reason() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u1", "controller": true}]},
            "status": {"phase": "Failed", "reason": "OutOfcpu"}});
        let (owner, reason) = failed_pod_group(&pod).expect("a group");
        assert_eq!(owner.display(), "ReplicaSet/ns/rs");
        assert_eq!(reason, "OutOfcpu");
        let mut running = pod.clone();
        running["status"]["phase"] = json!("Running");
        assert_eq!(failed_pod_group(&running), None);
        let mut no_reason = pod;
        no_reason["status"] = json!({"phase": "Failed"});
        assert_eq!(failed_pod_group(&no_reason), None);
    }
}
