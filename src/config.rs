//! The configuration file: typed, strict (unknown keys are errors), with defaults that
//! equal the commented YAML `podmend config` prints.

use std::path::Path;

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
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct NodeAffinityConfig {
    pub mode: Mode,
    pub templates: Mode,
    pub tolerate_node_taints: bool,
    pub ignore_taints: Vec<String>,
}

impl Default for NodeAffinityConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Enforce,
            templates: Mode::Warn,
            tolerate_node_taints: true,
            ignore_taints: vec!["node.kubernetes.io/unschedulable".to_string()],
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
    pub presets: Vec<Preset>,
    pub selectors: Vec<LabelSelector>,
    pub resources: Vec<String>,
    pub limit_from_request: bool,
}

impl Default for AgentRequestsConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Enforce,
            templates: Mode::Warn,
            presets: vec![Preset::PinnipedKubeCertAgent, Preset::JenkinsAgent],
            selectors: Vec::new(),
            resources: vec!["cpu".to_string(), "memory".to_string()],
            limit_from_request: true,
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
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            origin: origin.to_string(),
            key: key.to_string(),
            message,
        };
        let agent = &self.rules.agent_requests;
        for (index, resource) in agent.resources.iter().enumerate() {
            if !OVERCOMMITTABLE_RESOURCES.contains(&resource.as_str()) {
                return Err(invalid(
                    &format!("rules.agent-requests.resources[{index}]"),
                    format!(
                        "{resource:?} cannot be zeroed: the API requires requests to equal limits for \
                         hugepages and extended resources; use one of {OVERCOMMITTABLE_RESOURCES:?}"
                    ),
                ));
            }
        }
        for (index, selector) in agent.selectors.iter().enumerate() {
            let key = format!("rules.agent-requests.selectors[{index}]");
            if selector.match_labels.as_ref().is_none_or(|m| m.is_empty())
                && selector
                    .match_expressions
                    .as_ref()
                    .is_none_or(|e| e.is_empty())
            {
                return Err(invalid(
                    &key,
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
                    return Err(invalid(
                        &format!("{key}.matchExpressions[{expr_index}]"),
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

/// The default configuration, commented; `podmend config` prints it, and a test checks it
/// parses to `Config::default()`.
pub const DEFAULT_CONFIG_YAML: &str = r#"# podmend configuration. Every key is optional; these are the defaults.
# Modes: enforce (repair the object), warn (change nothing, warn what would be repaired),
#        deny (reject with what to change), off.

# Namespaces podmend never changes, in addition to the chart's namespaceSelector.
excludeNamespaces: []

rules:
  # spec.nodeName bypasses the scheduler: a node without room rejects the pod (OutOfcpu) and
  # its controller recreates it at once, without backoff. Required node affinity on
  # metadata.name keeps the placement but lets the scheduler wait (Pending) instead.
  node-affinity:
    mode: enforce          # for Pods on CREATE
    templates: warn        # for Deployment/StatefulSet/DaemonSet/Job/CronJob/ReplicaSet templates
    tolerateNodeTaints: true   # add tolerations for the node's NoSchedule taints (nodeName ignored them)
    ignoreTaints:              # never tolerated: the cordon taint keeps meaning "do not place here"
      - node.kubernetes.io/unschedulable

  # Small agent pods must land on a given node even when its resources are fully requested:
  # requests become an explicit "0" (or the LimitRange minimum), limits are kept (Burstable).
  agent-requests:
    mode: enforce
    templates: warn
    presets:                   # built-in agent selectors
      - pinniped-kube-cert-agent   # label kube-cert-agent.pinniped.dev
      - jenkins-agent              # label jenkins/label
    selectors: []              # more agents: label selectors ({matchLabels: {...}, matchExpressions: [...]})
    resources: [cpu, memory]   # which requests to zero; only cpu, memory, ephemeral-storage
    limitFromRequest: true     # a request without a limit first becomes the limit, so the container keeps a bound
"#;

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
    fn an_empty_selector_is_refused() {
        let error = Config::from_yaml("rules:\n  agent-requests:\n    selectors: [{}]\n", "x")
            .expect_err("empty selector");
        assert!(error.to_string().contains("selectors[0]"), "{error}");
    }
}
