//! `audit --cluster`: the same engine over the workloads of a live cluster, listed page by
//! page ([`lister`]), plus what only a cluster shows ([`symptoms`]). The connection and its
//! errors are in [`client`]; the findings as PolicyReports or OpenReports are
//! [`crate::audit::policy_reports`]'s.

pub mod client;
pub(crate) mod lister;
pub mod symptoms;

use std::collections::HashMap;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Pod, PodTemplate, ReplicationController};
use kube::Client;
use kube::api::{Api, ApiResource, ListParams};
use serde_json::Value;

pub use client::{ClusterAuditError, client_for};
use lister::Lister;
use symptoms::{OwnerInfo, OwnerKey, PodSymptoms, owner_info};

use super::{Report, Source};
use crate::cluster::cached::{CachedLimitRange, CachedNamespace, CachedNode, Snapshot, Table as _};
use crate::engine::Engine;

/// What the audit needs when a list is forbidden.
const AUDIT_NEEDS: &str = "the audit needs list on nodes, limitranges, pods, podtemplates, replicationcontrollers, deployments, replicasets, statefulsets, daemonsets, jobs and cronjobs (the chart's reports CronJob has exactly these), or use -n NAMESPACE";

/// Objects per list request unless told otherwise: at 100,000 pods a page of 250 holds the
/// audit's peak at ~48 MiB where 500 took ~64 MiB, and lists no slower (BENCHMARKS.md).
pub const DEFAULT_PAGE_SIZE: u32 = 250;

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
            page_size: DEFAULT_PAGE_SIZE,
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
        needs: AUDIT_NEEDS,
    };
    let audit = ClusterAudit {
        client: &client,
        lister: &lister,
        engine,
        cluster: lookups(&client, &lister).await?,
    };
    let owners = audit.review_templates(report).await?;
    let symptoms = audit.review_pods(report).await?;
    for symptom in symptoms.into_symptoms(&owners) {
        report.add_symptom(symptom);
    }
    Ok(())
}

/// What the rules may ask of the cluster: every Node's taints, the LimitRanges and the
/// Namespaces' toleration whitelists (of the namespace, or all), parsed and kept only as far
/// as the rules read them.
async fn lookups(client: &Client, lister: &Lister<'_>) -> Result<Snapshot, ClusterAuditError> {
    let mut cluster = Snapshot::default();
    lister
        .list(Api::<CachedNode>::all(client.clone()), "nodes", |node| {
            cluster.nodes.insert(node);
        })
        .await?;
    let limit_ranges = match lister.namespace {
        Some(ns) => Api::<CachedLimitRange>::namespaced(client.clone(), ns),
        None => Api::<CachedLimitRange>::all(client.clone()),
    };
    lister
        .list(limit_ranges, "limitranges", |range| {
            cluster.limit_ranges.insert(range);
        })
        .await?;
    let namespaces = Api::<CachedNamespace>::all(client.clone());
    match lister.namespace {
        // One namespace: its own object, which a user allowed only that namespace may lack
        // the right to read; then its whitelist is unknown, as with no whitelist.
        Some(ns) => match namespaces.get_opt(ns).await {
            Ok(Some(namespace)) => cluster.namespaces.insert(namespace),
            Ok(None) => {}
            Err(error) => tracing::warn!(
                "cannot read namespace {ns} ({error}): its tolerationsWhitelist is not checked"
            ),
        },
        None => {
            lister
                .list(namespaces, "namespaces", |namespace| {
                    cluster.namespaces.insert(namespace);
                })
                .await?;
        }
    }
    Ok(cluster)
}

/// One cluster audit's client, lister, engine and look-ups.
struct ClusterAudit<'a> {
    client: &'a Client,
    lister: &'a Lister<'a>,
    engine: &'a Engine,
    cluster: Snapshot,
}

impl ClusterAudit<'_> {
    /// Reviews every object of [`TEMPLATE_KINDS`]; returns what failed pods' symptoms need
    /// to know of their owners.
    async fn review_templates(
        &self,
        report: &mut Report,
    ) -> Result<HashMap<OwnerKey, OwnerInfo>, ClusterAuditError> {
        let mut owners: HashMap<OwnerKey, OwnerInfo> = HashMap::new();
        for resource in TEMPLATE_KINDS.iter().map(|make| make()) {
            let plural = resource.plural.clone();
            let params = ListParams::default();
            self.lister
                .list_json(self.client, &resource, &plural, params, |object| {
                    let (key, info) = owner_info(&object, &resource);
                    owners.insert(key, info);
                    report.add_object(self.engine, &self.cluster, &object, cluster_source());
                })
                .await?;
        }
        Ok(owners)
    }

    /// Reviews every pod not in a terminal phase, without `spec.nodeName`, and collects
    /// the symptoms of all of them.
    async fn review_pods(&self, report: &mut Report) -> Result<PodSymptoms, ClusterAuditError> {
        let pods = ApiResource::erase::<Pod>(&());
        let mut symptoms = PodSymptoms::default();
        let params = ListParams::default();
        self.lister
            .list_json(self.client, &pods, "pods", params, |mut pod| {
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
                        report.add_object(self.engine, &self.cluster, &pod, cluster_source());
                    }
                }
            })
            .await?;
        Ok(symptoms)
    }
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

pub(crate) fn text<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// `1204` → `1,204`.
pub(crate) fn thousands(n: usize) -> String {
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
}
