//! The configuration file: typed, strict (unknown keys are errors), with defaults that
//! equal the commented YAML `podmend config` prints.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::dind::{DEFAULT_MAX_EXITED, DEFAULT_MIN_AGE, Policy};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Serialize};

/// What a rule does when it finds something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Repair the object (JSON Patch) and say so in a warning.
    Enforce,
    /// Change nothing; return a warning saying what would be repaired.
    Warn,
    /// Reject the object with a message saying what to change.
    Deny,
    /// Do nothing.
    Off,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Warn => "warn",
            Mode::Deny => "deny",
            Mode::Off => "off",
        }
    }
}

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Config {
    /// Namespaces podmend never changes (the chart's namespaceSelector excludes them too).
    pub exclude_namespaces: Vec<String>,
    pub rules: RulesConfig,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RulesConfig {
    #[serde(rename = "node-affinity")]
    pub node_affinity: NodeAffinityConfig,
    #[serde(rename = "agent-requests")]
    pub agent_requests: AgentRequestsConfig,
    #[serde(rename = "dind-rm")]
    pub dind_rm: DindRmConfig,
    #[serde(rename = "virtual-node-phase")]
    pub virtual_node_phase: VirtualNodePhaseConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct NodeAffinityConfig {
    pub mode: Mode,
    pub templates: Mode,
    /// Tolerate the node's NoSchedule taints, which `nodeName` ignored.
    pub tolerate_node_taints: bool,
    /// Taints never tolerated, beside Kubernetes' own (`node.kubernetes.io/*`), which never are.
    pub ignore_taints: Vec<String>,
    /// The schedulers known to honour `matchFields` on `metadata.name`: a pod for another
    /// scheduler is left as it is.
    pub schedulers: Vec<String>,
    /// Rewrite pods with required pod (anti-)affinity or `DoNotSchedule` topology spread
    /// too, which the scheduler enforces and the kubelet never did; off: left as they are.
    pub rewrite_constrained_pods: bool,
    /// Leave pods with a `priorityClassName` as they are: as node affinity they could
    /// preempt the node's pods, which a `nodeName` pod never did.
    pub skip_priority_classes: bool,
}

impl Default for NodeAffinityConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Enforce,
            templates: Mode::Warn,
            tolerate_node_taints: true,
            ignore_taints: Vec::new(),
            schedulers: vec!["default-scheduler".to_string()],
            rewrite_constrained_pods: false,
            skip_priority_classes: false,
        }
    }
}

/// Built-in agent selectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// Pinniped's kube-cert-agent pods: label `kube-cert-agent.pinniped.dev`.
    PinnipedKubeCertAgent,
    /// Jenkins kubernetes-plugin agents: label `jenkins/label`.
    JenkinsAgent,
}

impl Preset {
    /// The label key whose presence marks a pod as this kind of agent.
    pub fn label_key(self) -> &'static str {
        match self {
            Preset::PinnipedKubeCertAgent => "kube-cert-agent.pinniped.dev",
            Preset::JenkinsAgent => "jenkins/label",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct AgentRequestsConfig {
    pub mode: Mode,
    pub templates: Mode,
    /// Built-in selectors. Only Pinniped's by default: the Jenkins preset matches every
    /// kubernetes-plugin pod, build pods included, whose requests the scheduler needs.
    pub presets: Vec<Preset>,
    pub selectors: Vec<LabelSelector>,
    pub resources: Vec<String>,
    /// Only pods pinned to one node (`spec.nodeName`, or required node affinity on
    /// `metadata.name` naming one node) are repaired: a pod the scheduler may place anywhere
    /// fits somewhere without help, and zeroing its requests only overpacks nodes. The
    /// `podmend.io/agent: "true"` annotation selects a pod whether it is pinned or not.
    pub only_pinned: bool,
    /// A request without a limit is copied into the limit before it is zeroed. Off by default:
    /// the invented limit throttles and OOM-kills the container where it could burst before;
    /// such a request is kept. Never with pod-level limits, which already bound the pod.
    pub limit_from_request: bool,
    /// Zero the requests of Guaranteed pods whose CPU requests are whole numbers too. Off by
    /// default: under the static CPU manager policy those containers get exclusive cores,
    /// which a Burstable pod loses.
    pub zero_exclusive_cpus: bool,
}

impl Default for AgentRequestsConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Enforce,
            templates: Mode::Warn,
            presets: vec![Preset::PinnipedKubeCertAgent],
            selectors: Vec::new(),
            resources: vec!["cpu".to_string(), "memory".to_string()],
            only_pinned: true,
            limit_from_request: false,
            zero_exclusive_cpus: false,
        }
    }
}

/// How the guard runs beside the pod's containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SidecarMode {
    /// An init container with `restartPolicy: Always` (Kubernetes ≥ 1.29): starts first,
    /// stops last, never keeps a finished pod running.
    Native,
    /// A regular container, for older clusters.
    Container,
}

/// The kubelet's default `--root-dir`.
pub const DEFAULT_KUBELET_ROOT_DIR: &str = "/var/lib/kubelet";

/// The guard image of this podmend release.
pub const DEFAULT_GUARD_IMAGE: &str =
    concat!("ghcr.io/podmend/podmend:", env!("CARGO_PKG_VERSION"));

/// The guard's cpu limit: one core. Every build context and image a pod sends passes through
/// the guard; a core keeps that at the rate of the copy (a 10m limit made a 1 GiB
/// `docker load` six times slower), and the limit lets a `limits.cpu` ResourceQuota admit
/// the pod.
pub const DEFAULT_GUARD_CPU_LIMIT: &str = "1";

/// Images that run a Docker daemon: the official `docker` image's dind tags (`dind`,
/// `27-dind`, `dind-rootless`, `27.3.1-dind-alpine3.20`, ...), bare or from any registry.
pub const DEFAULT_DAEMON_IMAGES: &[&str] = &["docker:*dind*", "*/docker:*dind*"];

/// What the rule does with node agents: pods of a DaemonSet, and containers that read the
/// node's Docker socket at a fixed path of their own (monitoring, log shippers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeAgents {
    /// Leave them alone, and say so in the finding: they are node infrastructure, not CI.
    Skip,
    /// Guard them like any other Docker client.
    Guard,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct DindRmConfig {
    pub mode: Mode,
    pub templates: Mode,
    pub policy: Policy,
    /// Policy collect: an exited container is removed once it has been exited this long.
    #[serde(with = "duration_text")]
    pub min_age: Duration,
    /// Policy collect: how many exited containers a pod keeps; beyond, the oldest go.
    pub max_exited: u32,
    pub node_agents: NodeAgents,
    pub guard_image: String,
    /// The guard image's registry needs a pull secret: a pod without `imagePullSecrets` is
    /// left alone, since its guard could not be pulled.
    pub guard_image_needs_pull_secret: bool,
    /// The guard's cpu limit (a quantity: `1`, `500m`); empty: none. A namespace whose
    /// ResourceQuota covers `limits.cpu` refuses a pod with a container without one, unless
    /// a LimitRange gives it a default.
    pub guard_cpu_limit: String,
    pub sidecar_mode: SidecarMode,
    /// Glob patterns (`*` only) on the image reference, digest ignored.
    pub daemon_images: Vec<String>,
    /// The kubelet's `--root-dir`: where the node's Docker daemon finds a pod's emptyDir
    /// volumes, so that a container's bind of the node's socket can be given the guard's.
    pub kubelet_root_dir: String,
}

impl Default for DindRmConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Enforce,
            templates: Mode::Warn,
            policy: Policy::Collect,
            min_age: DEFAULT_MIN_AGE,
            max_exited: DEFAULT_MAX_EXITED,
            node_agents: NodeAgents::Skip,
            guard_image: DEFAULT_GUARD_IMAGE.to_string(),
            guard_image_needs_pull_secret: false,
            guard_cpu_limit: DEFAULT_GUARD_CPU_LIMIT.to_string(),
            sidecar_mode: SidecarMode::Native,
            daemon_images: DEFAULT_DAEMON_IMAGES
                .iter()
                .map(|p| p.to_string())
                .collect(),
            kubelet_root_dir: DEFAULT_KUBELET_ROOT_DIR.to_string(),
        }
    }
}

/// A duration written as the guard's flags take it (`90s`, `5m`, `1h30m`).
mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    use crate::dind::{format_duration, parse_duration};

    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format_duration(*value))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

/// The opt-in `virtual-node-phase` rule. It acts on `UPDATE pods/status`, where there is no
/// template and nothing to deny, so it has one mode: enforce, warn or off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct VirtualNodePhaseConfig {
    pub mode: Mode,
    /// Labels a node must all carry for the rule to act on its pods: the virtual-kubelet
    /// nodes, never a node a real kubelet runs (it owns its pods' status).
    pub node_selector: BTreeMap<String, String>,
}

impl Default for VirtualNodePhaseConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Off,
            node_selector: BTreeMap::from([("type".to_string(), "virtual-kubelet".to_string())]),
        }
    }
}

/// Resources whose request may legally differ from the limit (`IsOvercommitAllowed`).
pub const OVERCOMMITTABLE_RESOURCES: &[&str] = &["cpu", "memory", "ephemeral-storage"];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}; pass --config with a readable YAML file")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "invalid config {origin}: {message}; `podmend config` prints every key with its default"
    )]
    Parse { origin: String, message: String },
    #[error("invalid config {origin}: {key}: {message}")]
    Invalid {
        origin: String,
        key: String,
        message: String,
    },
}

impl Config {
    /// Reads, parses and validates a config file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_yaml(&text, &path.display().to_string())
    }

    /// Parses and validates YAML; `origin` names the source in error messages.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let config: Config = if text.trim().is_empty() {
            Config::default()
        } else {
            let deserializer = serde_yaml_ng::Deserializer::from_str(text);
            serde_path_to_error::deserialize(deserializer).map_err(|error| {
                let path = error.path().to_string();
                let inner = error.into_inner();
                let message = if path == "." || path.is_empty() {
                    inner.to_string()
                } else {
                    format!("{path}: {inner}")
                };
                ConfigError::Parse {
                    origin: origin.to_string(),
                    message,
                }
            })?
        };
        config.validate(origin)?;
        Ok(config)
    }

    /// Checks what the types cannot say.
    pub fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let invalid = |(key, message): (String, String)| ConfigError::Invalid {
            origin: origin.to_string(),
            key,
            message,
        };
        self.rules.agent_requests.validate().map_err(invalid)?;
        self.rules.dind_rm.validate().map_err(invalid)?;
        self.rules.virtual_node_phase.validate().map_err(invalid)
    }
}

/// What is wrong with a configuration: the key (its path from the top) and why.
type KeyError = (String, String);

impl AgentRequestsConfig {
    /// Resources that can be zeroed; selectors that select something, with valid
    /// expressions.
    fn validate(&self) -> Result<(), KeyError> {
        for (index, resource) in self.resources.iter().enumerate() {
            if !OVERCOMMITTABLE_RESOURCES.contains(&resource.as_str()) {
                return Err((
                    format!("rules.agent-requests.resources[{index}]"),
                    format!(
                        "{resource:?} cannot be zeroed: the API requires requests to equal limits for \
                         hugepages and extended resources; use one of {OVERCOMMITTABLE_RESOURCES:?}"
                    ),
                ));
            }
        }
        for (index, selector) in self.selectors.iter().enumerate() {
            let key = format!("rules.agent-requests.selectors[{index}]");
            if selector.match_labels.as_ref().is_none_or(|m| m.is_empty())
                && selector
                    .match_expressions
                    .as_ref()
                    .is_none_or(|e| e.is_empty())
            {
                return Err((
                    key,
                    "an empty selector would select every pod; give matchLabels or matchExpressions"
                        .to_string(),
                ));
            }
            for (expr_index, expr) in selector.match_expressions.iter().flatten().enumerate() {
                let values = expr.values.as_ref().map_or(0, Vec::len);
                let ok = match expr.operator.as_str() {
                    "In" | "NotIn" => values > 0,
                    "Exists" | "DoesNotExist" => values == 0,
                    _ => false,
                };
                if !ok {
                    return Err((
                        format!("{key}.matchExpressions[{expr_index}]"),
                        format!(
                            "operator {:?} with {values} values: In/NotIn need values, Exists/DoesNotExist take none",
                            expr.operator
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

impl DindRmConfig {
    /// An image reference for the guard; daemon image patterns that can match.
    fn validate(&self) -> Result<(), KeyError> {
        if self.guard_image.trim().is_empty() || self.guard_image.contains(char::is_whitespace) {
            return Err((
                "rules.dind-rm.guardImage".to_string(),
                format!(
                    "{:?} is not an image reference; e.g. {DEFAULT_GUARD_IMAGE}",
                    self.guard_image
                ),
            ));
        }
        if !self.guard_cpu_limit.is_empty()
            && crate::quantity::parse_milli(&self.guard_cpu_limit).is_none_or(|milli| milli <= 0)
        {
            return Err((
                "rules.dind-rm.guardCpuLimit".to_string(),
                format!(
                    "{:?} is not a cpu quantity above zero; e.g. {DEFAULT_GUARD_CPU_LIMIT} or 500m, \
                     or \"\" for no limit",
                    self.guard_cpu_limit
                ),
            ));
        }
        for (index, pattern) in self.daemon_images.iter().enumerate() {
            if let Some(message) = daemon_image_pattern_error(pattern) {
                return Err((
                    format!("rules.dind-rm.daemonImages[{index}]"),
                    format!("{pattern:?}: {message}"),
                ));
            }
        }
        if !self.kubelet_root_dir.starts_with('/') {
            return Err((
                "rules.dind-rm.kubeletRootDir".to_string(),
                format!(
                    "{:?} is not an absolute path; the kubelet's --root-dir, e.g. {DEFAULT_KUBELET_ROOT_DIR}",
                    self.kubelet_root_dir
                ),
            ));
        }
        Ok(())
    }
}

impl VirtualNodePhaseConfig {
    /// No deny mode; a node selector that names the virtual nodes.
    fn validate(&self) -> Result<(), KeyError> {
        if self.mode == Mode::Deny {
            return Err((
                "rules.virtual-node-phase.mode".to_string(),
                "deny would refuse the node's status writes; use enforce, warn or off".to_string(),
            ));
        }
        if self.node_selector.is_empty() {
            return Err((
                "rules.virtual-node-phase.nodeSelector".to_string(),
                "an empty selector would match nodes a real kubelet runs, and the kubelet owns \
                 their pods' phase; give the virtual nodes' labels, e.g. {type: virtual-kubelet}"
                    .to_string(),
            ));
        }
        Ok(())
    }
}

/// Why a `daemonImages` pattern is refused, if it is.
fn daemon_image_pattern_error(pattern: &str) -> Option<&'static str> {
    if pattern.is_empty() {
        Some("an empty pattern matches no image")
    } else if pattern.chars().all(|c| c == '*') {
        Some("matches every image, so every pod would count as Docker-in-Docker")
    } else if pattern.contains(char::is_whitespace) {
        Some("image references contain no whitespace")
    } else if pattern.contains(['?', '[', ']', '{', '}']) {
        Some("`*` is the only wildcard (it matches any characters, `/` included)")
    } else {
        None
    }
}

/// The default configuration, commented; `podmend config` prints it, and a test checks it
/// parses to `Config::default()`.
pub const DEFAULT_CONFIG_YAML: &str = concat!(
    r#"# podmend configuration. Every key is optional; these are the defaults.
# Modes: enforce (repair the object), warn (change nothing, warn what would be repaired),
#        deny (reject with what to change), off.

# Namespaces podmend never changes, in addition to the chart's namespaceSelector.
excludeNamespaces: []

rules:
  # spec.nodeName bypasses the scheduler: a node without room rejects the pod (OutOfcpu) and
  # its controller recreates it at once, without backoff. Required node affinity on
  # metadata.name keeps the placement but lets the scheduler wait (Pending) instead. A pod is
  # rewritten only where it keeps what it could do; otherwise it is left as it is and the
  # warning says why: its node's taints are not known (no look-ups, or the node is missing),
  # it has schedulingGates, another scheduler, or a constraint below.
  node-affinity:
    mode: enforce          # for Pods on CREATE
    templates: warn        # for the pod templates of workloads (Deployment, Job, CronJob, ...)
    tolerateNodeTaints: true   # add tolerations for the node's NoSchedule taints (nodeName ignored them),
                               # never for Kubernetes' own node.kubernetes.io/* taints (conditions such
                               # as disk-pressure, the cordon): those keep the pod Pending, as they should
    ignoreTaints: []           # more taints never tolerated
    schedulers:                # schedulers known to honour matchFields on metadata.name; pods
      - default-scheduler      # for any other schedulerName are left as they are
    rewriteConstrainedPods: false  # required pod (anti-)affinity or DoNotSchedule topology spread:
                                   # the kubelet never enforced them for a nodeName pod, the scheduler
                                   # would, and replicas pinned side by side could wait forever
    skipPriorityClasses: false # true: leave pods with a priorityClassName as they are (as node affinity
                               # they could preempt the node's pods; a nodeName pod never did)

  # Small agent pods pinned to a node must land there even when its resources are fully
  # requested: requests become an explicit "0" (or the LimitRange minimum), limits are kept.
  # The pod is then Burstable, not Guaranteed, and with a memory request of 0 its memory use
  # always exceeds its request: under memory pressure the kubelet evicts it in the first
  # group (beside BestEffort pods, by priority, then usage), and its OOM score adj is 999.
  # The annotation podmend.io/agent: "true" selects any pod, pinned or not.
  agent-requests:
    mode: enforce
    templates: warn
    presets:                   # built-in agent selectors
      - pinniped-kube-cert-agent   # label kube-cert-agent.pinniped.dev
                                   # also: jenkins-agent (label jenkins/label; it matches build pods too)
    selectors: []              # more agents: label selectors ({matchLabels: {...}, matchExpressions: [...]})
    resources: [cpu, memory]   # which requests to zero; only cpu, memory, ephemeral-storage
    onlyPinned: true           # only pods pinned to one node (spec.nodeName, or required node affinity
                               # matchFields metadata.name In [one node]); false: every selected agent
    limitFromRequest: false    # true: a request without a limit first becomes the limit (throttled and
                               # OOM-killed at its request); false: such a request is kept. Never with
                               # pod-level limits (spec.resources.limits): they bound the pod already
    zeroExclusiveCpus: false   # true: zero Guaranteed pods with whole-number CPU requests too (they lose
                               # their exclusive cores under the static CPU manager policy)

  # Docker-in-Docker: containers a pod's `docker run` leaves behind outlive the pod on the
  # daemon, pin images and fill the node's disk. In pods that run a Docker daemon (found by
  # what it runs: dockerd, the docker:dind entrypoint, a docker image running privileged
  # with no command; or by daemonImages) or mount the node's docker.sock, podmend-guard
  # (`podmend guard`) takes the daemon's place: it listens where the daemon listened (its
  # TCP port, with the same TLS tree, and its socket in the shared volume; or the node's
  # socket at the path the client mounted it), and the daemon moves to a socket only the
  # guard mounts (/podmend/daemon/docker.sock). Clients keep their DOCKER_HOST. Where the
  # daemon cannot be moved safely, clients are pointed at the guard instead, the finding's
  # first words say the guard can be bypassed, and why, and the audit counts it not repaired.
  dind-rm:
    mode: enforce
    templates: warn
    policy: collect            # collect: keep exited containers (docker logs/cp still work), remove
                               # them after minAge or beyond maxExited, everything at pod end;
                               # rm (force --rm), deny (refuse a create without --rm),
                               # reap (remove only at pod end), audit (count, remove nothing);
                               # per pod: annotation podmend.io/dind-policy (or "off")
    minAge: 5m                 # collect: an exited container goes once exited this long (90s, 5m, 1h)
    maxExited: 20              # collect: exited containers a pod keeps; beyond, the oldest go first
    nodeAgents: skip           # pods of DaemonSets and containers reading the node's docker.sock at a
                               # path of their own (monitoring, log shippers): skip (left alone, the
                               # finding says so) or guard (treated as Docker clients)
    guardImage: ghcr.io/podmend/podmend:"#,
    env!("CARGO_PKG_VERSION"),
    r#"
    guardImageNeedsPullSecret: false  # guardImage's registry needs a pull secret: pods without
                               # imagePullSecrets (their own or their ServiceAccount's) are
                               # left alone, and the finding says why
    guardCpuLimit: "1"         # the guard's cpu limit ("" for none); a ResourceQuota on limits.cpu
                               # refuses a pod whose containers lack one
    sidecarMode: native        # native: init container with restartPolicy Always (Kubernetes >= 1.29),
                               # first of all, so every client starts after it;
                               # container: a regular container, for older clusters (init containers
                               # run before it starts, so they keep their direct access)
    daemonImages:              # images that run dockerd (`*` matches anything); what a container
                               # runs counts too, so a digest-pinned docker:dind is found
      - docker:*dind*          # docker:dind, docker:27-dind, docker:dind-rootless, docker:27.3.1-dind-alpine3.20
      - "*/docker:*dind*"      # the same from a registry or mirror: docker.io/library/docker:dind
    kubeletRootDir: /var/lib/kubelet  # the kubelet's --root-dir: a container that a pod on the node's
                               # socket starts with that socket bound in gets the guard's socket,
                               # which the node's daemon finds in the pod's emptyDir under it

  # Opt-in. On virtual-kubelet nodes (Azure ACI virtual nodes) a pod can report every container
  # running while its phase is still Pending; clients that wait for Running (the Jenkins
  # kubernetes-plugin, JENKINS-68649) then delete it. On UPDATE pods/status of pods on matching
  # nodes, Pending becomes Running when the kubelet's own phase rule says Running: regular init
  # containers exited 0, sidecars running and started, every container running. Nothing else
  # is ever changed. The chart adds the pods/status webhook rule only while this is not off.
  virtual-node-phase:
    mode: off                  # enforce | warn | off (no deny: it would refuse status writes)
    nodeSelector:              # labels the node must all carry (from the Node cache)
      type: virtual-kubelet
"#
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_printed_defaults_parse_to_the_built_in_defaults() {
        let parsed = Config::from_yaml(DEFAULT_CONFIG_YAML, "defaults").expect("defaults parse");
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn an_empty_file_means_the_defaults() {
        assert_eq!(Config::from_yaml("", "x").ok(), Some(Config::default()));
    }

    #[test]
    fn a_partial_file_keeps_defaults_for_the_rest() {
        let config = Config::from_yaml("rules:\n  node-affinity:\n    templates: enforce\n", "x")
            .expect("parses");
        assert_eq!(config.rules.node_affinity.templates, Mode::Enforce);
        assert_eq!(config.rules.node_affinity.mode, Mode::Enforce);
        assert_eq!(config.rules.agent_requests, AgentRequestsConfig::default());
    }

    #[test]
    fn an_unknown_key_is_an_error_naming_the_key() {
        let error = Config::from_yaml(
            "rules:\n  node-affinity:\n    tolerateTaints: true\n",
            "f.yaml",
        )
        .expect_err("unknown key");
        let text = error.to_string();
        assert!(text.contains("rules.node-affinity"), "{text}");
        assert!(text.contains("tolerateTaints"), "{text}");
        assert!(text.contains("f.yaml"), "{text}");
    }

    #[test]
    fn an_unknown_mode_is_an_error_listing_the_modes() {
        let error = Config::from_yaml("rules:\n  agent-requests:\n    mode: fix\n", "x")
            .expect_err("bad mode");
        let text = error.to_string();
        assert!(text.contains("rules.agent-requests.mode"), "{text}");
        assert!(text.contains("enforce"), "{text}");
    }

    #[test]
    fn zeroing_an_extended_resource_is_refused() {
        let error = Config::from_yaml(
            "rules:\n  agent-requests:\n    resources: [cpu, nvidia.com/gpu]\n",
            "x",
        )
        .expect_err("gpu refused");
        assert!(error.to_string().contains("resources[1]"), "{error}");
    }

    #[test]
    fn the_dind_rule_reads_its_section() {
        let config = Config::from_yaml(
            "rules:\n  dind-rm:\n    policy: reap\n    sidecarMode: container\n    daemonImages: [\"registry.local/ci/dind:*\"]\n",
            "x",
        )
        .expect("parses");
        let dind = &config.rules.dind_rm;
        assert_eq!(dind.policy, Policy::Reap);
        assert_eq!(dind.sidecar_mode, SidecarMode::Container);
        assert_eq!(dind.daemon_images, vec!["registry.local/ci/dind:*"]);
        assert_eq!(dind.guard_image, DEFAULT_GUARD_IMAGE);
        assert_eq!(dind.mode, Mode::Enforce);
        assert_eq!(dind.templates, Mode::Warn);
    }

    #[test]
    fn the_dind_rule_collects_by_default_and_reads_its_collection_keys() {
        let defaults = Config::default().rules.dind_rm;
        assert_eq!(defaults.policy, Policy::Collect);
        assert_eq!(defaults.min_age, DEFAULT_MIN_AGE);
        assert_eq!(defaults.max_exited, DEFAULT_MAX_EXITED);
        assert_eq!(defaults.node_agents, NodeAgents::Skip);
        let config = Config::from_yaml(
            "rules:\n  dind-rm:\n    minAge: 1h30m\n    maxExited: 3\n    nodeAgents: guard\n",
            "x",
        )
        .expect("parses");
        let dind = &config.rules.dind_rm;
        assert_eq!(dind.min_age, Duration::from_secs(5400));
        assert_eq!(dind.max_exited, 3);
        assert_eq!(dind.node_agents, NodeAgents::Guard);
        let written = serde_yaml_ng::to_string(&config).expect("serializes");
        assert!(written.contains("minAge: 90m"), "{written}");
    }

    #[test]
    fn a_bad_min_age_or_node_agents_value_is_an_error_naming_the_key() {
        for (yaml, key, says) in [
            ("minAge: 5", "rules.dind-rm.minAge", "90s, 5m"),
            ("nodeAgents: ignore", "rules.dind-rm.nodeAgents", "skip"),
            ("maxExited: -1", "rules.dind-rm.maxExited", "-1"),
        ] {
            let error = Config::from_yaml(&format!("rules:\n  dind-rm:\n    {yaml}\n"), "x")
                .expect_err(yaml)
                .to_string();
            assert!(error.contains(key), "{error}");
            assert!(error.contains(says), "{error}");
        }
    }

    #[test]
    fn the_printed_defaults_document_every_dind_key() {
        let section = &DEFAULT_CONFIG_YAML[DEFAULT_CONFIG_YAML
            .find("  dind-rm:")
            .expect("dind-rm section")..];
        let written = serde_json::to_value(DindRmConfig::default()).expect("serializes");
        for key in written.as_object().expect("an object").keys() {
            assert!(
                section.contains(&format!("    {key}:")),
                "podmend config does not document rules.dind-rm.{key}"
            );
        }
    }

    #[test]
    fn the_default_guard_image_is_this_release() {
        assert_eq!(
            DEFAULT_GUARD_IMAGE,
            format!("ghcr.io/podmend/podmend:{}", env!("CARGO_PKG_VERSION"))
        );
        assert!(DEFAULT_CONFIG_YAML.contains(DEFAULT_GUARD_IMAGE));
    }

    #[test]
    fn an_unknown_dind_policy_is_an_error_listing_the_policies() {
        let error = Config::from_yaml("rules:\n  dind-rm:\n    policy: remove\n", "x")
            .expect_err("bad policy");
        let text = error.to_string();
        assert!(text.contains("rules.dind-rm.policy"), "{text}");
        assert!(text.contains("reap"), "{text}");
    }

    #[test]
    fn dind_policies_round_trip_through_their_names() {
        for policy in Policy::ALL {
            assert_eq!(Policy::parse(policy.as_str()), Some(policy));
        }
        assert_eq!(Policy::parse("off"), None);
    }

    #[test]
    fn an_empty_guard_image_is_refused() {
        let error = Config::from_yaml("rules:\n  dind-rm:\n    guardImage: \" \"\n", "x")
            .expect_err("empty image");
        assert!(
            error.to_string().contains("rules.dind-rm.guardImage"),
            "{error}"
        );
    }

    #[test]
    fn daemon_image_patterns_are_checked() {
        for (pattern, refused) in [
            ("*", true),
            ("", true),
            ("docker:2?-dind", true),
            ("docker :dind", true),
            ("docker:[0-9]*-dind", true),
            ("*/docker:*dind*", false),
            ("ghcr.io/acme/buildkit-dind:*", false),
        ] {
            let yaml = format!("rules:\n  dind-rm:\n    daemonImages: [{pattern:?}]\n");
            let result = Config::from_yaml(&yaml, "x");
            assert_eq!(result.is_err(), refused, "{pattern:?}: {result:?}");
            if let Err(error) = result {
                assert!(error.to_string().contains("daemonImages[0]"), "{error}");
            }
        }
    }

    #[test]
    fn an_empty_selector_is_refused() {
        let error = Config::from_yaml("rules:\n  agent-requests:\n    selectors: [{}]\n", "x")
            .expect_err("empty selector");
        assert!(error.to_string().contains("selectors[0]"), "{error}");
    }

    #[test]
    fn virtual_node_phase_is_off_by_default_and_reads_its_section() {
        let defaults = Config::default().rules.virtual_node_phase;
        assert_eq!(defaults.mode, Mode::Off);
        assert_eq!(
            defaults.node_selector,
            BTreeMap::from([("type".to_string(), "virtual-kubelet".to_string())])
        );
        let config = Config::from_yaml(
            "rules:\n  virtual-node-phase:\n    mode: warn\n    nodeSelector: {kubernetes.azure.com/role: agent}\n",
            "x",
        )
        .expect("parses");
        let phase = &config.rules.virtual_node_phase;
        assert_eq!(phase.mode, Mode::Warn);
        assert_eq!(phase.node_selector.len(), 1);
    }

    #[test]
    fn virtual_node_phase_refuses_deny_and_an_empty_node_selector() {
        for (yaml, key) in [
            ("mode: deny", "virtual-node-phase.mode"),
            ("nodeSelector: {}", "virtual-node-phase.nodeSelector"),
        ] {
            let error =
                Config::from_yaml(&format!("rules:\n  virtual-node-phase:\n    {yaml}\n"), "x")
                    .expect_err("refused");
            assert!(error.to_string().contains(key), "{error}");
        }
    }
}
