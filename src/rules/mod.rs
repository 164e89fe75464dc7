//! The rules and their one ordered registry. A rule sees a pod spec, the pod's labels and
//! annotations, and a [`ClusterView`]; it edits the spec in place and says what it did.
//! It knows nothing of HTTP, JSON Patch or workload kinds.
//!
//! | rule | effect |
//! | --- | --- |
//! | `node-affinity` | `spec.nodeName` → required node affinity on `metadata.name` (+ tolerations for the node's NoSchedule taints) |
//! | `dind-rm` | pods running a Docker daemon or mounting the node's `docker.sock`: `podmend guard` injected where the daemon stood (the daemon moved to a socket only the guard reaches), collecting what the pod's docker commands leave behind |
//! | `agent-requests` | agent pods: cpu/memory requests → `"0"` (or the LimitRange floor), limits kept |
//! | `virtual-node-phase` | opt-in, on `UPDATE pods/status`: phase `Pending` → `Running` on virtual-kubelet nodes when every container runs |
//!
//! The first three are [`Rule`]s on a pod spec; `virtual-node-phase` is a [`StatusRule`]: it
//! sees the whole Pod and may change only its status.

pub mod agent_requests;
pub mod dind_rm;
pub mod node_affinity;
pub mod virtual_node_phase;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use serde_json::Value;

use crate::cluster::ClusterView;
use crate::config::{Config, Mode};
use crate::engine::document::{Shape, View};

/// The labels and annotations that go with a pod spec: the Pod's own, or its template's;
/// and the kind of the controller its pods have.
#[derive(Debug, Clone, Default)]
pub struct PodMeta {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The kind of the object that controls the pods: for a Pod, its `ownerReferences` entry
    /// with `controller: true` (`DaemonSet`, `ReplicaSet`, `Job`, a CRD such as `TaskRun`);
    /// for a template, the workload's own kind (a DaemonSet's template gives `DaemonSet`).
    /// `None` for a bare Pod or a `PodTemplate`.
    pub controller_kind: Option<String>,
}

/// What a rule says of itself, declared once beside its code: everything that lists rules
/// (SARIF's `tool.driver.rules`, the audit table's legend, warnings, deny messages) reads it
/// from here, through [`catalog`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleInfo {
    /// The rule's name in config, annotations, warnings and metrics.
    pub id: &'static str,
    /// One sentence: what goes wrong, and what the rule does about it.
    pub summary: &'static str,
    /// How to fix the source, for `deny` messages, audit findings and SARIF's help.
    pub help: &'static str,
}

/// What a rule may consult besides the pod itself.
pub struct RuleContext<'a> {
    pub namespace: &'a str,
    pub cluster: &'a dyn ClusterView,
}

/// The mode a rule acts in for Pods and for pod templates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Modes {
    pub pods: Mode,
    pub templates: Mode,
}

impl Modes {
    /// The mode for a Pod or a template; `off` for pods turns the rule off everywhere.
    pub fn for_target(self, is_template: bool) -> Mode {
        match (self.pods, is_template) {
            (Mode::Off, _) => Mode::Off,
            (mode, false) => mode,
            (_, true) => self.templates,
        }
    }
}

pub trait Rule: Send + Sync {
    /// The rule's id, summary and help.
    fn info(&self) -> &'static RuleInfo;
    /// The rule's name in config, annotations, warnings and metrics.
    fn id(&self) -> &'static str {
        self.info().id
    }
    fn modes(&self) -> Modes;
    /// A cheap look at the raw spec: false when `repair` could not find anything, so most
    /// pods never pay for a typed decode. It may read podmend's own annotations
    /// (`podmend.io/…`) but no others, and only the spec fields `engine::document`'s sketch
    /// keeps: the webhook decides on the sketch which rules run on the whole object.
    fn may_apply(&self, raw_spec: &dyn View, meta: &PodMeta) -> bool;
    /// The parts of a pod spec `repair` reads or changes, when it reads only some; `None` (the
    /// default) for the whole spec. When every rule that may act names its parts, the engine
    /// builds only those (and each container's name, which a spec needs to decode): the rest
    /// of a large pod is never built. `repair` then sees a spec without the other fields, so
    /// a field it reads must be named here; debug builds check that `repair` finds the same on
    /// the whole spec.
    fn reads(&self) -> Option<&'static Shape> {
        None
    }
    /// Repairs `spec` in place and returns one short message per change (≤ 120 characters
    /// where possible); an empty list means there was nothing to repair.
    fn repair(&self, spec: &mut PodSpec, meta: &PodMeta, cx: &RuleContext<'_>) -> Vec<String>;
}

/// A rule on `UPDATE pods/status`. The API server keeps only status (and metadata) edits on
/// this subresource, so a status rule is given the Pod to read and its status to change.
pub trait StatusRule: Send + Sync {
    /// The rule's id, summary and help.
    fn info(&self) -> &'static RuleInfo;
    /// The rule's name in config, annotations, warnings and metrics.
    fn id(&self) -> &'static str {
        self.info().id
    }
    /// `enforce`, `warn` or `off` (there is no `deny` for a status write).
    fn mode(&self) -> Mode;
    /// A cheap look at the raw Pod: false when `repair` could not find anything, so most
    /// status writes never pay for a typed decode.
    fn may_apply(&self, raw_pod: &Value) -> bool;
    /// Repairs `status` (a copy of `pod`'s) in place and returns one short message per change;
    /// `old` is the Pod as stored.
    fn repair(
        &self,
        pod: &Pod,
        old: Option<&Pod>,
        status: &mut PodStatus,
        cx: &RuleContext<'_>,
    ) -> Vec<String>;
}

/// Every rule, in the order they run. `agent-requests` leaves the guard `dind-rm` injects
/// alone (every build context and image passes through it: it must not be throttled), so
/// their order does not change the result.
pub fn registry(config: &Config) -> Vec<Box<dyn Rule>> {
    vec![
        Box::new(node_affinity::NodeAffinity::new(
            config.rules.node_affinity.clone(),
        )),
        Box::new(dind_rm::DindRm::new(config.rules.dind_rm.clone())),
        Box::new(agent_requests::AgentRequests::new(
            config.rules.agent_requests.clone(),
        )),
    ]
}

/// Every status rule, in the order they run.
pub fn status_registry(config: &Config) -> Vec<Box<dyn StatusRule>> {
    vec![Box::new(virtual_node_phase::VirtualNodePhase::new(
        config.rules.virtual_node_phase.clone(),
    ))]
}

/// Every rule's id, summary and help, in registry order (status rules last): read off the
/// registries, so a rule added there is listed everywhere.
pub fn catalog() -> Vec<&'static RuleInfo> {
    let config = Config::default();
    let spec_rules = registry(&config).into_iter().map(|rule| rule.info());
    let status_rules = status_registry(&config).into_iter().map(|rule| rule.info());
    spec_rules.chain(status_rules).collect()
}

/// The rule with this id.
pub fn info(id: &str) -> Option<&'static RuleInfo> {
    catalog().into_iter().find(|info| info.id == id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_describes_itself_with_a_distinct_id_a_summary_and_help() {
        let catalog = catalog();
        assert_eq!(
            catalog.iter().map(|info| info.id).collect::<Vec<_>>(),
            [
                "node-affinity",
                "dind-rm",
                "agent-requests",
                "virtual-node-phase"
            ]
        );
        for info in catalog {
            assert!(info.summary.len() > 40, "{}: summary too short", info.id);
            assert!(info.help.len() > 20, "{}: help too short", info.id);
            assert!(!info.summary.contains('\n') && !info.help.contains('\n'));
            assert!(
                info.summary.ends_with('.'),
                "{}: summary is a sentence",
                info.id
            );
        }
    }
}
