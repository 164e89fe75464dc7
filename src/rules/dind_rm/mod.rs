//! `dind-rm`: containers a pod's `docker run` leaves on a Docker daemon in the pod (a dind
//! sidecar) or on the node (a hostPath `docker.sock`) outlive the pod, pin images and fill the
//! node's disk, and Kubernetes never sees them. This rule puts `podmend guard`, a Docker API
//! proxy that collects what the pod leaves behind, where the daemon stood. It only changes
//! the pod; the guard itself is `podmend guard` (`crate::guard`), and the command line between
//! them is the contract in `crate::dind`.
//!
//! - [`detection`]: who is who: daemons (by what they run), clients, node agents, the
//!   node's socket.
//! - [`daemon`]: what a daemon container serves, and its command moved to the private socket.
//! - [`placement`]: where the guard stands: in the daemon's place, in front of the node's
//!   socket, or (when neither can be done safely) in front of what clients used, reached by
//!   `DOCKER_HOST`.
//! - [`injection`]: the guard container and the changes to the pod that carry a placement out.
//! - [`resources`]: the guard's requests and limits within the namespace's LimitRanges.
//! - [`mounts`]: which mount holds a path of a container.
//!
//! [`DindRm::repair`](Rule::repair) runs them in that order; this file also holds the
//! policy annotation and the messages' length.

mod daemon;
mod detection;
mod injection;
mod mounts;
mod placement;
mod resources;

pub use detection::glob_match;
pub use injection::{
    CERTS_VOLUME, HEALTH_PORT, HEALTH_PORT_NAME, HOST_NETWORK_PORTS, POD_IP_ENV, RUN_VOLUME,
};
use k8s_openapi::api::core::v1::{LimitRangeItem, PodSpec, ResourceRequirements};

use super::{Modes, PodMeta, Rule, RuleContext, RuleInfo};
use crate::config::DindRmConfig;
use crate::dind::{GUARD_CONTAINER, POLICY_ANNOTATION, Policy, is_docker_image};
use crate::engine::document::View;
use detection::Survey;
use injection::GuardSettings;

/// The rule's id, summary and help (see [`RuleInfo`]).
pub const INFO: RuleInfo = RuleInfo {
    id: "dind-rm",
    summary: "Containers a Docker-in-Docker pod's docker commands leave behind outlive it on the \
              daemon, pin images and fill the node's disk; podmend puts its Docker guard where \
              the daemon stood, and the guard collects them.",
    help: "remove the containers a job starts (docker run --rm, docker rm), or set the pod's \
         podmend.io/dind-policy annotation; prefer a dind sidecar to the node's docker.sock",
};
/// The rule's id.
pub const ID: &str = INFO.id;

const MAX_MESSAGE: usize = 120;

pub struct DindRm {
    config: DindRmConfig,
}

impl DindRm {
    pub fn new(config: DindRmConfig) -> Self {
        Self { config }
    }

    /// Whether `image` (a digest is ignored) matches one of the configured daemon images.
    pub fn is_daemon_image(&self, image: &str) -> bool {
        detection::is_daemon_image(&self.config, image)
    }

    /// The policy for this pod: `None` when the annotation turns the rule off; a note when the
    /// annotation holds a value podmend does not know.
    fn policy(&self, meta: &PodMeta) -> Option<(Policy, Option<String>)> {
        let Some(value) = meta.annotations.get(POLICY_ANNOTATION) else {
            return Some((self.config.policy, None));
        };
        let value = value.trim().to_ascii_lowercase();
        if value == "off" {
            return None;
        }
        Some(match Policy::parse(&value) {
            Some(policy) => (policy, None),
            None => (
                self.config.policy,
                Some(format!(
                    "{POLICY_ANNOTATION} {value:?} is not {} or off: using policy {}",
                    Policy::names(),
                    self.config.policy.as_str()
                )),
            ),
        })
    }
}

impl Rule for DindRm {
    fn info(&self) -> &'static RuleInfo {
        &INFO
    }

    fn modes(&self) -> Modes {
        Modes {
            pods: self.config.mode,
            templates: self.config.templates,
        }
    }

    fn may_apply(&self, raw_spec: &dyn View, meta: &PodMeta) -> bool {
        if self.policy(meta).is_none() {
            return false;
        }
        let containers: Vec<&dyn View> = ["containers", "initContainers"]
            .iter()
            .filter_map(|list| raw_spec.field(list)?.items())
            .flatten()
            .collect();
        if containers
            .iter()
            .any(|c| c.string("name") == Some(GUARD_CONTAINER))
        {
            return false;
        }
        let docker = containers.iter().any(|c| {
            let image = c.string("image").unwrap_or("");
            is_docker_image(image)
                || detection::is_daemon_image(&self.config, image)
                || detection::raw_runs_daemon(*c)
        });
        docker
            || raw_spec
                .field("volumes")
                .and_then(|volumes| volumes.items())
                .into_iter()
                .flatten()
                .filter_map(|v| v.field("hostPath")?.string("path"))
                .any(detection::is_host_docker_socket)
    }

    fn repair(&self, spec: &mut PodSpec, meta: &PodMeta, cx: &RuleContext<'_>) -> Vec<String> {
        let Some((policy, policy_note)) = self.policy(meta) else {
            return Vec::new();
        };
        if detection::all_slots(spec)
            .iter()
            .any(|(_, c)| c.name == GUARD_CONTAINER)
        {
            return Vec::new();
        }
        let survey = detection::survey(&self.config, spec, meta);
        if !survey.has_docker() {
            return Vec::new();
        }
        if survey.daemon_set {
            return vec![truncate(format!(
                "{GUARD_CONTAINER} not injected: a DaemonSet's pods are node agents, not CI (nodeAgents: skip)"
            ))];
        }
        if let Some(note) = missing_pull_secret(&self.config, spec) {
            return vec![truncate(note)];
        }
        let placement = placement::decide(&self.config, spec, &survey);
        let injects = placement.injects();
        let settings = GuardSettings {
            config: &self.config,
            policy,
            resources: guard_resources(spec, cx, &self.config.guard_cpu_limit),
        };
        let mut messages = match injection::inject(spec, placement, &settings) {
            Ok(messages) => messages,
            Err(message) => vec![message],
        };
        messages.extend(agent_notes(&survey));
        if injects {
            messages.extend(policy_note);
        }
        messages.into_iter().map(truncate).collect()
    }
}

/// The guard's requests and limits within the namespace's Container LimitRanges; none with
/// pod-level `spec.resources`, where the guard shares the pod's budget, as containers there
/// may: its requests would raise the containers' aggregate above the pod's request, and the
/// API would reject the pod.
fn guard_resources(
    spec: &PodSpec,
    cx: &RuleContext<'_>,
    cpu_limit: &str,
) -> Option<ResourceRequirements> {
    if spec.resources.is_some() {
        return None;
    }
    let limit_ranges: Vec<LimitRangeItem> = cx
        .cluster
        .limit_range_items(cx.namespace)
        .into_iter()
        .filter(|item| item.type_ == "Container")
        .collect();
    Some(resources::guard_resources(&limit_ranges, cpu_limit))
}

/// Why the guard is not injected into a pod without `imagePullSecrets` when its image needs
/// one: the pod would wait in `Init:ErrImagePull` for ever (or its guard container would, in
/// container mode). The ServiceAccount admission plugin, which runs before the webhooks, has
/// already copied the ServiceAccount's pull secrets into a pod that names none (kubernetes
/// `plugin/pkg/admission/serviceaccount/admission.go`, `Plugin.Admit`), so an empty list here
/// is what the kubelet will have.
fn missing_pull_secret(config: &DindRmConfig, spec: &PodSpec) -> Option<String> {
    let has_secret = spec
        .image_pull_secrets
        .as_ref()
        .is_some_and(|secrets| !secrets.is_empty());
    (config.guard_image_needs_pull_secret && !has_secret).then(|| {
        format!(
            "{GUARD_CONTAINER} not injected: its image needs a pull secret and the pod has no \
             imagePullSecrets"
        )
    })
}

/// One line for each container left alone as a node agent.
fn agent_notes(survey: &Survey) -> Vec<String> {
    survey
        .agents
        .iter()
        .map(|(name, path)| {
            format!(
                "left {name} alone: a node agent (the node's Docker socket at {path}; nodeAgents: skip)"
            )
        })
        .collect()
}

/// Up to three names, then how many more.
pub(super) fn names(list: &[String]) -> String {
    match list.len() {
        0..=3 => list.join(", "),
        n => format!("{} and {} more", list[..2].join(", "), n - 2),
    }
}

/// A message cut to [`MAX_MESSAGE`] characters, `…` last.
pub(super) fn truncate(message: String) -> String {
    if message.chars().count() <= MAX_MESSAGE {
        return message;
    }
    let mut short: String = message.chars().take(MAX_MESSAGE - 1).collect();
    short.push('…');
    short
}

#[cfg(test)]
mod tests;
