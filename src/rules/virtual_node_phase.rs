//! `virtual-node-phase` (opt-in, off by default): on virtual-kubelet nodes (Azure ACI virtual
//! nodes) a pod can report every container running while its phase is still `Pending` for a
//! few seconds, and clients that wait for `Running` (the Jenkins kubernetes-plugin,
//! JENKINS-68649) delete it and retry, so most agents never start.
//!
//! On `UPDATE pods/status` of a pod whose node carries every label of `nodeSelector`, the
//! phase `Pending` becomes `Running` when the kubelet's own phase rule ([`kubelet_phase`],
//! `getPhase` in `pkg/kubelet/kubelet_pods.go`) says `Running` *and* every container runs:
//! regular init containers exited 0, sidecars running and started, every container running.
//! Nothing else: no other transition, no terminal phase, no pod being deleted, no node that is
//! unknown or not matched (a real kubelet owns its pods' status and would fight the change),
//! and no field but `status.phase`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodSpec, PodStatus,
};
use serde_json::Value;

use super::{RuleContext, RuleInfo, StatusRule};
use crate::config::{Mode, VirtualNodePhaseConfig};

/// The rule's id, summary and help (see [`RuleInfo`]).
pub const INFO: RuleInfo = RuleInfo {
    id: "virtual-node-phase",
    summary: "On virtual-kubelet nodes a pod can stay Pending while every container runs, and \
              clients that wait for Running kill it; podmend sets Running, as the kubelet's own \
              phase rule would.",
    help: "the virtual-kubelet provider reports Pending while every container runs; update the provider, or make the client wait for containers rather than the phase",
};
/// The rule's id.
pub const ID: &str = INFO.id;

/// A pod phase, as `getPhase` returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
        }
    }
}

pub struct VirtualNodePhase {
    config: VirtualNodePhaseConfig,
}

impl VirtualNodePhase {
    pub fn new(config: VirtualNodePhaseConfig) -> Self {
        Self { config }
    }

    fn node_matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.config
            .node_selector
            .iter()
            .all(|(key, value)| labels.get(key) == Some(value))
    }
}

impl StatusRule for VirtualNodePhase {
    fn info(&self) -> &'static RuleInfo {
        &INFO
    }

    fn mode(&self) -> Mode {
        self.config.mode
    }

    fn may_apply(&self, raw_pod: &Value) -> bool {
        raw_pod.pointer("/status/phase").and_then(Value::as_str) == Some("Pending")
            && raw_pod
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .is_some_and(|node| !node.is_empty())
    }

    fn repair(
        &self,
        pod: &Pod,
        old: Option<&Pod>,
        status: &mut PodStatus,
        cx: &RuleContext<'_>,
    ) -> Vec<String> {
        let Some(node) = pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref()) else {
            return Vec::new();
        };
        let being_deleted = |pod: &Pod| pod.metadata.deletion_timestamp.is_some();
        let stored_phase = old
            .and_then(|old| old.status.as_ref())
            .and_then(|status| status.phase.as_deref());
        // The Pod as written is checked by `is_pending_with_every_container_running`.
        if node.is_empty()
            || old.is_some_and(being_deleted)
            || matches!(stored_phase, Some("Succeeded" | "Failed"))
            || !is_pending_with_every_container_running(pod)
        {
            return Vec::new();
        }
        // An unknown node (not yet in the cache, or no look-ups) is left alone.
        let Some(labels) = cx.cluster.node_labels(node) else {
            return Vec::new();
        };
        if !self.node_matches(&labels) {
            return Vec::new();
        }
        status.phase = Some(Phase::Running.as_str().to_string());
        let containers = pod.spec.as_ref().map_or(0, |spec| spec.containers.len());
        vec![format!(
            "phase Pending → Running: all {containers} container(s) run on virtual node {node}"
        )]
    }
}

/// Whether `pod` is the virtual-kubelet quirk: phase `Pending`, not being deleted, every
/// regular init container terminated with exit code 0, every sidecar running and started,
/// every container running, so that the kubelet's phase rule says `Running`. `audit --cluster`
/// reports such pods whether or not the rule is on.
pub fn is_pending_with_every_container_running(pod: &Pod) -> bool {
    let (Some(spec), Some(status)) = (pod.spec.as_ref(), pod.status.as_ref()) else {
        return false;
    };
    if status.phase.as_deref() != Some("Pending")
        || pod.metadata.deletion_timestamp.is_some()
        || spec.containers.is_empty()
    {
        return false;
    }
    let lookup = StatusLookup::new(status);
    let init_done = spec.init_containers.iter().flatten().all(|container| {
        let state = lookup.state(&container.name);
        if is_sidecar(container) {
            state.is_some_and(|(state, started)| state.running.is_some() && started)
        } else {
            state
                .and_then(|(state, _)| state.terminated.as_ref())
                .is_some_and(|terminated| terminated.exit_code == 0)
        }
    });
    let all_running = spec.containers.iter().all(|container| {
        lookup
            .state(&container.name)
            .is_some_and(|(state, _)| state.running.is_some())
    });
    init_done
        && all_running
        && kubelet_phase(
            spec,
            status,
            false,
            has_any_regular_container_started(spec, status),
        ) == Phase::Running
}

/// The kubelet's `getPhase` (K8S-FACTS §6.2, the `ContainerRestartRules` gate off), on the
/// container statuses of the API object. `pod_is_terminal` and `pod_has_initialized` are the
/// kubelet's own inputs; [`has_any_regular_container_started`] computes the latter from the
/// API statuses. As in the kubelet: count the regular init containers, the restartable ones
/// (sidecars) and the regular containers, then decide from the counters.
pub fn kubelet_phase(
    spec: &PodSpec,
    status: &PodStatus,
    pod_is_terminal: bool,
    pod_has_initialized: bool,
) -> Phase {
    let lookup = StatusLookup::new(status);
    let mut counters = PhaseCounters::default();
    for container in spec.init_containers.iter().flatten() {
        let status = lookup.status(&container.name);
        if is_sidecar(container) {
            counters.count_restartable_init_container(status);
        } else {
            counters.count_regular_init_container(status);
        }
    }
    for container in &spec.containers {
        counters.count_regular_container(lookup.status(&container.name));
    }
    let restart_policy = spec.restart_policy.as_deref().unwrap_or("Always");
    counters.phase(restart_policy, pod_is_terminal, pod_has_initialized)
}

/// `getPhase`'s counters, each named as the kubelet names it.
#[derive(Debug, Default)]
struct PhaseCounters {
    /// `pendingRegularInitContainers`
    pending_regular_init: u32,
    /// `failedInitialization`
    failed_initialization: u32,
    /// `pendingRestartableInitContainers`
    pending_restartable: u32,
    unknown: u32,
    running: u32,
    waiting: u32,
    stopped: u32,
    succeeded: u32,
}

impl PhaseCounters {
    /// A regular init container: pending until it terminated; failed initialization when it
    /// (or, waiting to retry, its last run) exited non-zero.
    fn count_regular_init_container(&mut self, status: Option<&ContainerStatus>) {
        let Some(status) = status else {
            self.pending_regular_init += 1;
            return;
        };
        match status.state.as_ref().map(state_kind) {
            Some(StateKind::Running) => self.pending_regular_init += 1,
            Some(StateKind::Terminated(exit_code)) => {
                if exit_code != 0 {
                    self.failed_initialization += 1;
                }
            }
            Some(StateKind::Waiting) => match last_terminated(status) {
                Some(last) if last.exit_code != 0 => self.failed_initialization += 1,
                Some(_) => {}
                None => self.pending_regular_init += 1,
            },
            Some(StateKind::None) | None => self.pending_regular_init += 1,
        }
    }

    /// A restartable init container (a sidecar): running counts, not yet started is pending;
    /// terminated, or waiting after a run, does not count towards the phase.
    fn count_restartable_init_container(&mut self, status: Option<&ContainerStatus>) {
        let Some(status) = status else {
            self.unknown += 1;
            return;
        };
        match status.state.as_ref().map(state_kind) {
            Some(StateKind::Running) => {
                if status.started != Some(true) {
                    self.pending_restartable += 1;
                }
                self.running += 1;
            }
            Some(StateKind::Terminated(_)) => {}
            Some(StateKind::Waiting) if last_terminated(status).is_some() => {}
            Some(StateKind::Waiting) => {
                self.pending_restartable += 1;
                self.waiting += 1;
            }
            Some(StateKind::None) | None => {
                self.pending_restartable += 1;
                self.unknown += 1;
            }
        }
    }

    /// A regular container: running, stopped (terminated, or waiting after a run), waiting,
    /// or unknown.
    fn count_regular_container(&mut self, status: Option<&ContainerStatus>) {
        let Some(status) = status else {
            self.unknown += 1;
            return;
        };
        match status.state.as_ref().map(state_kind) {
            Some(StateKind::Running) => self.running += 1,
            Some(StateKind::Terminated(exit_code)) => {
                self.stopped += 1;
                if exit_code == 0 {
                    self.succeeded += 1;
                }
            }
            Some(StateKind::Waiting) if last_terminated(status).is_some() => self.stopped += 1,
            Some(StateKind::Waiting) => self.waiting += 1,
            Some(StateKind::None) | None => self.unknown += 1,
        }
    }

    /// The phase from the counters, in `getPhase`'s order (K8S-FACTS §6.2, results 1 to 5).
    fn phase(
        &self,
        restart_policy: &str,
        pod_is_terminal: bool,
        pod_has_initialized: bool,
    ) -> Phase {
        if self.failed_initialization > 0 && restart_policy == "Never" {
            return Phase::Failed;
        }
        if self.pending_regular_init > 0
            || (self.pending_restartable > 0 && !pod_has_initialized)
            || self.waiting > 0
        {
            return Phase::Pending;
        }
        if self.running > 0 && self.unknown == 0 {
            return Phase::Running;
        }
        if self.running == 0 && self.stopped > 0 && self.unknown == 0 {
            return self.stopped_phase(restart_policy, pod_is_terminal);
        }
        Phase::Pending
    }

    /// Result 4: every container stopped (none running, none unknown).
    fn stopped_phase(&self, restart_policy: &str, pod_is_terminal: bool) -> Phase {
        let all_succeeded = self.stopped == self.succeeded;
        if pod_is_terminal {
            if all_succeeded {
                Phase::Succeeded
            } else {
                Phase::Failed
            }
        } else if restart_policy == "Always" {
            Phase::Running
        } else if all_succeeded {
            Phase::Succeeded
        } else if restart_policy == "Never" {
            Phase::Failed
        } else {
            Phase::Running
        }
    }
}

/// The state a container's last run ended in (`lastState.terminated`), if any.
fn last_terminated(status: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    status.last_state.as_ref()?.terminated.as_ref()
}

/// `HasAnyRegularContainerStarted` (`pkg/kubelet/container/helpers.go`) on the API statuses:
/// some regular container is running or has terminated, so initialization is over. The
/// kubelet itself asks the runtime (`HasAnyActiveRegularContainerStarted`); this is the
/// closest reading of the API object, and it cannot change the rule's decision, which
/// requires every sidecar started anyway.
pub fn has_any_regular_container_started(spec: &PodSpec, status: &PodStatus) -> bool {
    status.container_statuses.iter().flatten().any(|s| {
        spec.containers.iter().any(|c| c.name == s.name)
            && s.state
                .as_ref()
                .is_some_and(|state| state.running.is_some() || state.terminated.is_some())
    })
}

/// A restartable init container (`restartPolicy: Always`): a sidecar.
fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

enum StateKind {
    Running,
    /// With its exit code.
    Terminated(i32),
    Waiting,
    /// No state set.
    None,
}

/// The state the kubelet's `switch` picks: running first, then terminated, then waiting.
fn state_kind(state: &ContainerState) -> StateKind {
    if state.running.is_some() {
        StateKind::Running
    } else if let Some(terminated) = &state.terminated {
        StateKind::Terminated(terminated.exit_code)
    } else if state.waiting.is_some() {
        StateKind::Waiting
    } else {
        StateKind::None
    }
}

/// `GetContainerStatus` over the regular and init container statuses together: the first
/// status with the name.
struct StatusLookup<'a> {
    statuses: Vec<&'a ContainerStatus>,
}

impl<'a> StatusLookup<'a> {
    fn new(status: &'a PodStatus) -> Self {
        Self {
            statuses: status
                .container_statuses
                .iter()
                .flatten()
                .chain(status.init_container_statuses.iter().flatten())
                .collect(),
        }
    }

    fn status(&self, name: &str) -> Option<&'a ContainerStatus> {
        self.statuses.iter().copied().find(|s| s.name == name)
    }

    /// The current state and whether the container has `started`; `None` without a status.
    fn state(&self, name: &str) -> Option<(&'a ContainerState, bool)> {
        let status = self.status(name)?;
        Some((status.state.as_ref()?, status.started == Some(true)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::StaticCluster;
    use serde_json::json;

    fn pod(value: Value) -> Pod {
        serde_json::from_value(value).expect("a Pod")
    }

    fn running(name: &str) -> Value {
        json!({"name": name, "image": "i", "imageID": "", "ready": true, "started": true, "restartCount": 0,
               "state": {"running": {"startedAt": "2022-05-30T10:01:10Z"}}})
    }

    fn running_not_started(name: &str) -> Value {
        json!({"name": name, "image": "i", "imageID": "", "ready": false, "started": false, "restartCount": 0,
               "state": {"running": {}}})
    }

    fn waiting(name: &str) -> Value {
        json!({"name": name, "image": "i", "imageID": "", "ready": false, "restartCount": 0,
               "state": {"waiting": {"reason": "ContainerCreating"}}})
    }

    fn crash_looping(name: &str, last_exit: i32) -> Value {
        json!({"name": name, "image": "i", "imageID": "", "ready": false, "restartCount": 3,
               "state": {"waiting": {"reason": "CrashLoopBackOff"}},
               "lastState": {"terminated": {"exitCode": last_exit}}})
    }

    fn terminated(name: &str, exit_code: i32) -> Value {
        json!({"name": name, "image": "i", "imageID": "", "ready": false, "restartCount": 0,
               "state": {"terminated": {"exitCode": exit_code}}})
    }

    fn no_state(name: &str) -> Value {
        json!({"name": name, "image": "i", "imageID": "", "ready": false, "restartCount": 0, "state": {}})
    }

    /// A pod with containers `c1..cN`, regular init containers `i1..`, sidecars `s1..`.
    fn spec(containers: usize, inits: usize, sidecars: usize, restart_policy: &str) -> PodSpec {
        let named = |prefix: &str, n: usize, sidecar: bool| -> Vec<Value> {
            (1..=n)
                .map(|i| {
                    let mut c = json!({"name": format!("{prefix}{i}"), "image": "i"});
                    if sidecar {
                        c["restartPolicy"] = json!("Always");
                    }
                    c
                })
                .collect()
        };
        let mut init = named("s", sidecars, true);
        init.extend(named("i", inits, false));
        serde_json::from_value(json!({
            "containers": named("c", containers, false),
            "initContainers": init,
            "restartPolicy": restart_policy,
        }))
        .expect("a PodSpec")
    }

    fn status(containers: Vec<Value>, inits: Vec<Value>) -> PodStatus {
        serde_json::from_value(json!({
            "phase": "Pending",
            "containerStatuses": containers,
            "initContainerStatuses": inits,
        }))
        .expect("a PodStatus")
    }

    /// The cases of the kubelet's `getPhase` tests (`TestPodPhaseWithRestartAlways`,
    /// `...Never`, `...OnFailure`, `...InitContainers`, `...RestartableInitContainers`),
    /// rebuilt from the rules in K8S-FACTS §6.2.
    #[test]
    fn kubelet_phase_follows_the_kubelets_get_phase_table() {
        use Phase::*;
        struct Case {
            name: &'static str,
            spec: PodSpec,
            status: PodStatus,
            terminal: bool,
            initialized: bool,
            want: Phase,
        }
        let case = |name, spec, status, want| Case {
            name,
            spec,
            status,
            terminal: false,
            initialized: false,
            want,
        };
        #[rustfmt::skip]
        let cases = vec![
            // restartPolicy Always
            case("always: all running", spec(2, 0, 0, "Always"), status(vec![running("c1"), running("c2")], vec![]), Running),
            case("always: all stopped", spec(2, 0, 0, "Always"), status(vec![terminated("c1", 0), terminated("c2", 0)], vec![]), Running),
            case("always: running and stopped", spec(2, 0, 0, "Always"), status(vec![running("c1"), terminated("c2", 1)], vec![]), Running),
            case("always: running and waiting", spec(2, 0, 0, "Always"), status(vec![running("c1"), waiting("c2")], vec![]), Pending),
            case("always: running and no status", spec(2, 0, 0, "Always"), status(vec![running("c1")], vec![]), Pending),
            case("always: running and crash looping", spec(2, 0, 0, "Always"), status(vec![running("c1"), crash_looping("c2", 1)], vec![]), Running),
            case("always: a container with an empty state", spec(2, 0, 0, "Always"), status(vec![running("c1"), no_state("c2")], vec![]), Pending),
            case("always: no status at all", spec(1, 0, 0, "Always"), status(vec![], vec![]), Pending),
            // restartPolicy Never
            case("never: all running", spec(2, 0, 0, "Never"), status(vec![running("c1"), running("c2")], vec![]), Running),
            case("never: all succeeded", spec(2, 0, 0, "Never"), status(vec![terminated("c1", 0), terminated("c2", 0)], vec![]), Succeeded),
            case("never: one failed", spec(2, 0, 0, "Never"), status(vec![terminated("c1", 0), terminated("c2", 1)], vec![]), Failed),
            case("never: running and succeeded", spec(2, 0, 0, "Never"), status(vec![running("c1"), terminated("c2", 0)], vec![]), Running),
            case("never: running and waiting", spec(2, 0, 0, "Never"), status(vec![running("c1"), waiting("c2")], vec![]), Pending),
            // restartPolicy OnFailure
            case("on-failure: all succeeded", spec(2, 0, 0, "OnFailure"), status(vec![terminated("c1", 0), terminated("c2", 0)], vec![]), Succeeded),
            case("on-failure: one failed, restarting", spec(2, 0, 0, "OnFailure"), status(vec![terminated("c1", 0), terminated("c2", 1)], vec![]), Running),
            case("on-failure: crash looping", spec(1, 0, 0, "OnFailure"), status(vec![crash_looping("c1", 1)], vec![]), Running),
            // regular init containers
            case("init: still running", spec(1, 1, 0, "Always"), status(vec![], vec![running("i1")]), Pending),
            case("init: no status", spec(1, 1, 0, "Always"), status(vec![], vec![]), Pending),
            case("init: waiting first time", spec(1, 1, 0, "Always"), status(vec![], vec![waiting("i1")]), Pending),
            case("init: done, container waiting", spec(1, 1, 0, "Always"), status(vec![waiting("c1")], vec![terminated("i1", 0)]), Pending),
            case("init: done, container running", spec(1, 1, 0, "Always"), status(vec![running("c1")], vec![terminated("i1", 0)]), Running),
            case("init: failed, restartPolicy Never", spec(1, 1, 0, "Never"), status(vec![], vec![terminated("i1", 1)]), Failed),
            case("init: failed and waiting to retry, Never", spec(1, 1, 0, "Never"), status(vec![], vec![crash_looping("i1", 1)]), Failed),
            case("init: failed, restartPolicy Always retries", spec(1, 1, 0, "Always"), status(vec![waiting("c1")], vec![crash_looping("i1", 1)]), Pending),
            case("init: succeeded before, waiting again", spec(1, 1, 0, "Always"), status(vec![running("c1")], vec![crash_looping("i1", 0)]), Running),
            // sidecars (restartable init containers)
            case("sidecar: running and started, container running", spec(1, 0, 1, "Always"), status(vec![running("c1")], vec![running("s1")]), Running),
            case("sidecar: not started, pod not initialized", spec(1, 0, 1, "Always"), status(vec![], vec![running_not_started("s1")]), Pending),
            Case { initialized: true, ..case("sidecar: not started, pod initialized", spec(1, 0, 1, "Always"), status(vec![running("c1")], vec![running_not_started("s1")]), Running) },
            case("sidecar: no status", spec(1, 0, 1, "Always"), status(vec![running("c1")], vec![]), Pending),
            case("sidecar: waiting first time", spec(1, 0, 1, "Always"), status(vec![running("c1")], vec![waiting("s1")]), Pending),
            case("sidecar: terminated is ignored", spec(1, 0, 1, "Never"), status(vec![terminated("c1", 0)], vec![terminated("s1", 137)]), Succeeded),
            case("sidecar: crash looping is ignored", spec(1, 0, 1, "Always"), status(vec![running("c1")], vec![crash_looping("s1", 1)]), Running),
            case("sidecar: only the sidecar runs, container has no status", spec(1, 0, 1, "Always"), status(vec![], vec![running("s1")]), Pending),
            // a pod the kubelet has decided is terminal
            Case { terminal: true, ..case("terminal: all stopped, restartPolicy Always, succeeded", spec(2, 0, 0, "Always"), status(vec![terminated("c1", 0), terminated("c2", 0)], vec![]), Succeeded) },
            Case { terminal: true, ..case("terminal: all stopped, restartPolicy Always, one failed", spec(2, 0, 0, "Always"), status(vec![terminated("c1", 0), terminated("c2", 1)], vec![]), Failed) },
        ];
        for case in cases {
            let got = kubelet_phase(&case.spec, &case.status, case.terminal, case.initialized);
            assert_eq!(got, case.want, "{}", case.name);
        }
    }

    #[test]
    fn a_pod_has_initialized_once_a_regular_container_ran() {
        let spec = spec(1, 0, 1, "Always");
        assert!(!has_any_regular_container_started(
            &spec,
            &status(vec![], vec![running("s1")])
        ));
        assert!(!has_any_regular_container_started(
            &spec,
            &status(vec![waiting("c1")], vec![])
        ));
        assert!(has_any_regular_container_started(
            &spec,
            &status(vec![running("c1")], vec![])
        ));
        assert!(has_any_regular_container_started(
            &spec,
            &status(vec![terminated("c1", 0)], vec![])
        ));
    }

    fn virtual_pod(containers: Vec<Value>, inits: Vec<Value>) -> Pod {
        pod(json!({
            "metadata": {"name": "agent", "namespace": "ci"},
            "spec": {
                "nodeName": "virtual-node-aci-linux",
                "restartPolicy": "Never",
                "initContainers": [{"name": "s1", "image": "i", "restartPolicy": "Always"}, {"name": "i1", "image": "i"}],
                "containers": [{"name": "c1", "image": "i"}, {"name": "c2", "image": "i"}],
            },
            "status": {"phase": "Pending", "containerStatuses": containers, "initContainerStatuses": inits},
        }))
    }

    fn all_running() -> Pod {
        virtual_pod(
            vec![running("c1"), running("c2")],
            vec![running("s1"), terminated("i1", 0)],
        )
    }

    #[test]
    fn every_container_running_under_pending_is_the_quirk() {
        assert!(is_pending_with_every_container_running(&all_running()));
    }

    #[test]
    fn anything_short_of_every_container_running_is_not_the_quirk() {
        let cases = [
            (
                "a container waiting",
                virtual_pod(
                    vec![running("c1"), waiting("c2")],
                    vec![running("s1"), terminated("i1", 0)],
                ),
            ),
            (
                "a container without a status",
                virtual_pod(
                    vec![running("c1")],
                    vec![running("s1"), terminated("i1", 0)],
                ),
            ),
            (
                "a container terminated",
                virtual_pod(
                    vec![running("c1"), terminated("c2", 0)],
                    vec![running("s1"), terminated("i1", 0)],
                ),
            ),
            (
                "an init container still running",
                virtual_pod(
                    vec![running("c1"), running("c2")],
                    vec![running("s1"), running("i1")],
                ),
            ),
            (
                "an init container that failed",
                virtual_pod(
                    vec![running("c1"), running("c2")],
                    vec![running("s1"), terminated("i1", 2)],
                ),
            ),
            (
                "a sidecar not started",
                virtual_pod(
                    vec![running("c1"), running("c2")],
                    vec![running_not_started("s1"), terminated("i1", 0)],
                ),
            ),
            (
                "a sidecar terminated",
                virtual_pod(
                    vec![running("c1"), running("c2")],
                    vec![terminated("s1", 0), terminated("i1", 0)],
                ),
            ),
        ];
        for (name, pod) in cases {
            assert!(!is_pending_with_every_container_running(&pod), "{name}");
        }
        for phase in ["Running", "Succeeded", "Failed", "Unknown"] {
            let mut pod = all_running();
            pod.status.as_mut().expect("status").phase = Some(phase.to_string());
            assert!(!is_pending_with_every_container_running(&pod), "{phase}");
        }
        let mut deleting = all_running();
        deleting.metadata.deletion_timestamp =
            serde_json::from_value(json!("2022-05-30T10:02:00Z")).ok();
        assert!(deleting.metadata.deletion_timestamp.is_some());
        assert!(!is_pending_with_every_container_running(&deleting));
    }

    fn rule() -> VirtualNodePhase {
        VirtualNodePhase::new(VirtualNodePhaseConfig {
            mode: Mode::Enforce,
            ..VirtualNodePhaseConfig::default()
        })
    }

    fn repair(cluster: &StaticCluster, pod: &Pod, old: Option<&Pod>) -> (PodStatus, Vec<String>) {
        let mut status = pod.status.clone().unwrap_or_default();
        let cx = RuleContext {
            namespace: "ci",
            cluster,
        };
        let messages = rule().repair(pod, old, &mut status, &cx);
        (status, messages)
    }

    fn virtual_cluster() -> StaticCluster {
        StaticCluster::empty().with_labeled_node(
            "virtual-node-aci-linux",
            &[("type", "virtual-kubelet"), ("kubernetes.io/role", "agent")],
        )
    }

    #[test]
    fn a_matching_node_gets_the_phase_running_and_nothing_else() {
        let pod = all_running();
        let (status, messages) = repair(&virtual_cluster(), &pod, Some(&pod));
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let mut expected = pod.status.clone().expect("status");
        expected.phase = Some("Running".to_string());
        assert_eq!(status, expected);
        assert_eq!(messages.len(), 1);
        assert!(
            messages[0].contains("virtual-node-aci-linux"),
            "{messages:?}"
        );
        assert!(messages[0].len() <= 120, "{}", messages[0]);
    }

    #[test]
    fn an_unknown_or_unmatched_node_is_left_alone() {
        let pod = all_running();
        let real = StaticCluster::empty()
            .with_labeled_node("virtual-node-aci-linux", &[("kubernetes.io/role", "agent")]);
        for cluster in [StaticCluster::offline(), StaticCluster::empty(), real] {
            let (status, messages) = repair(&cluster, &pod, None);
            assert_eq!(status.phase.as_deref(), Some("Pending"));
            assert!(messages.is_empty());
        }
    }

    #[test]
    fn a_pod_being_deleted_or_stored_terminal_is_left_alone() {
        let pod = all_running();
        let mut deleting = pod.clone();
        deleting.metadata.deletion_timestamp =
            serde_json::from_value(json!("2022-05-30T10:02:00Z")).ok();
        let mut terminal = pod.clone();
        terminal.status.as_mut().expect("status").phase = Some("Failed".to_string());
        for old in [&deleting, &terminal] {
            let (status, messages) = repair(&virtual_cluster(), &pod, Some(old));
            assert_eq!(status.phase.as_deref(), Some("Pending"));
            assert!(messages.is_empty());
        }
    }

    #[test]
    fn may_apply_only_looks_at_pending_pods_with_a_node() {
        let rule = rule();
        assert!(
            rule.may_apply(&json!({"spec": {"nodeName": "n"}, "status": {"phase": "Pending"}}))
        );
        assert!(
            !rule.may_apply(&json!({"spec": {"nodeName": "n"}, "status": {"phase": "Running"}}))
        );
        assert!(
            !rule.may_apply(&json!({"spec": {"nodeName": ""}, "status": {"phase": "Pending"}}))
        );
        assert!(!rule.may_apply(&json!({"spec": {}, "status": {"phase": "Pending"}})));
    }
}
