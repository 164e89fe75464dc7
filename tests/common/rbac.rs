//! An RBAC authorizer for tests, following the API server's rule semantics exactly
//! (`plugin/pkg/auth/authorizer/rbac/rbac.go` `RuleAllows`, `pkg/apis/rbac/v1/
//! evaluation_helpers.go`, `pkg/registry/rbac/validation/rule.go` `VisitRulesFor` and
//! `appliesToUser`):
//!
//! - a rule allows a request when its verbs hold the verb or `*`, its apiGroups the group or
//!   `*`, its resources `*`, `resource`, `resource/subresource` or `*/subresource`, and its
//!   resourceNames are empty or hold the name (a request without a name, a list or a create,
//!   matches no rule with resourceNames); a non-resource request needs a matching
//!   nonResourceURL (`*`, exact, or a `prefix*`);
//! - a ClusterRoleBinding grants its ClusterRole's rules everywhere; a RoleBinding grants
//!   its Role's (same namespace) or ClusterRole's rules in its own namespace only, so never
//!   for cluster-scoped requests nor lists across all namespaces;
//! - a ServiceAccount subject is user `system:serviceaccount:NS:NAME` (its namespace defaults
//!   to the RoleBinding's), in the groups `system:serviceaccounts`,
//!   `system:serviceaccounts:NS` and `system:authenticated`.
//!
//! The cluster's bootstrap policy for every authenticated user (`system:discovery`,
//! `system:public-info-viewer`: `GET /version`, `/api`, `/apis`, `/healthz`, …) is added
//! with [`Policy::with_bootstrap`]. [`Policy::permissions_of`] lists what the chart grants one
//! account, each (binding, rule, verb, group, resource, name) on its own, so a test can
//! prove every one of them is used.
//!
//! Only `tests/rbac.rs` includes this file (`#[path]`): its unit tests below would otherwise
//! run in every test binary.

use std::fmt;

use serde_json::Value;

/// `*` in verbs, apiGroups, resources and nonResourceURLs.
const ALL: &str = "*";

/// One `PolicyRule`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    pub verbs: Vec<String>,
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub resource_names: Vec<String>,
    pub non_resource_urls: Vec<String>,
}

/// A request as the authorizer sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    pub resource_request: bool,
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    /// Empty for cluster-scoped requests and lists across all namespaces.
    pub namespace: String,
    pub name: String,
    /// For non-resource requests.
    pub path: String,
}

impl Request {
    /// A resource request.
    pub fn resource(verb: &str, group: &str, resource: &str, namespace: &str, name: &str) -> Self {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        Self {
            resource_request: true,
            verb: verb.to_string(),
            group: group.to_string(),
            resource: resource.to_string(),
            subresource: subresource.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            path: String::new(),
        }
    }

    /// A non-resource request (`GET /version`).
    pub fn non_resource(verb: &str, path: &str) -> Self {
        Self {
            resource_request: false,
            verb: verb.to_string(),
            path: path.to_string(),
            ..Self::default()
        }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.resource_request {
            return write!(f, "{} {}", self.verb, self.path);
        }
        write!(f, "{} {}", self.verb, self.resource)?;
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        if !self.subresource.is_empty() {
            write!(f, "/{}", self.subresource)?;
        }
        if !self.name.is_empty() {
            write!(f, " {:?}", self.name)?;
        }
        if self.namespace.is_empty() {
            write!(f, " cluster-wide")
        } else {
            write!(f, " in {}", self.namespace)
        }
    }
}

/// `VerbMatches`.
fn verb_matches(rule: &Rule, verb: &str) -> bool {
    rule.verbs.iter().any(|v| v == ALL || v == verb)
}

/// `APIGroupMatches`.
fn group_matches(rule: &Rule, group: &str) -> bool {
    rule.api_groups.iter().any(|g| g == ALL || g == group)
}

/// `ResourceMatches`: `*`, the combined `resource/subresource`, or `*/subresource`.
fn resource_matches(rule: &Rule, combined: &str, subresource: &str) -> bool {
    rule.resources.iter().any(|r| {
        r == ALL
            || r == combined
            || (!subresource.is_empty()
                && r.len() == subresource.len() + 2
                && r.starts_with("*/")
                && r.ends_with(subresource))
    })
}

/// `ResourceNameMatches`.
fn name_matches(rule: &Rule, name: &str) -> bool {
    rule.resource_names.is_empty() || rule.resource_names.iter().any(|n| n == name)
}

/// `NonResourceURLMatches`.
fn url_matches(rule: &Rule, path: &str) -> bool {
    rule.non_resource_urls.iter().any(|u| {
        u == ALL || u == path || (u.ends_with('*') && path.starts_with(u.trim_end_matches('*')))
    })
}

/// `RuleAllows`.
pub fn rule_allows(rule: &Rule, request: &Request) -> bool {
    if request.resource_request {
        let combined = if request.subresource.is_empty() {
            request.resource.clone()
        } else {
            format!("{}/{}", request.resource, request.subresource)
        };
        verb_matches(rule, &request.verb)
            && group_matches(rule, &request.group)
            && resource_matches(rule, &combined, &request.subresource)
            && name_matches(rule, &request.name)
    } else {
        verb_matches(rule, &request.verb) && url_matches(rule, &request.path)
    }
}

/// A binding subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    pub kind: String,
    pub name: String,
    pub namespace: String,
}

/// A RoleBinding (with a namespace) or a ClusterRoleBinding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub kind: String,
    pub name: String,
    /// Empty for a ClusterRoleBinding.
    pub namespace: String,
    pub role_kind: String,
    pub role_name: String,
    pub subjects: Vec<Subject>,
}

impl fmt::Display for Binding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)?;
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)?;
        }
        write!(f, " of {} {}", self.role_kind, self.role_name)
    }
}

/// A Role (with a namespace) or a ClusterRole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Role {
    pub kind: String,
    pub name: String,
    pub namespace: String,
    pub rules: Vec<Rule>,
}

/// Who is asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    /// A ServiceAccount's identity, as its token authenticates.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Self {
            name: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".to_string(),
            ],
        }
    }
}

/// `appliesToUser`: whether `subject` of a binding in `namespace` ("" for a
/// ClusterRoleBinding) is `user`.
fn applies_to(user: &User, subject: &Subject, namespace: &str) -> bool {
    match subject.kind.as_str() {
        "User" => user.name == subject.name,
        "Group" => user.groups.contains(&subject.name),
        "ServiceAccount" => {
            let sa_namespace = if subject.namespace.is_empty() {
                namespace
            } else {
                &subject.namespace
            };
            !sa_namespace.is_empty()
                && user.name == format!("system:serviceaccount:{sa_namespace}:{}", subject.name)
        }
        _ => false,
    }
}

/// Which binding and rule allowed a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub binding: String,
    pub rule: Rule,
}

/// The RBAC objects of a cluster.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub roles: Vec<Role>,
    pub bindings: Vec<Binding>,
}

fn strings(value: &Value, key: &str) -> Vec<String> {
    value
        .get(key)
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn text(value: &Value, pointer: &str) -> String {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

fn rules(object: &Value) -> Vec<Rule> {
    object
        .get("rules")
        .and_then(Value::as_array)
        .map(|rules| {
            rules
                .iter()
                .map(|r| Rule {
                    verbs: strings(r, "verbs"),
                    api_groups: strings(r, "apiGroups"),
                    resources: strings(r, "resources"),
                    resource_names: strings(r, "resourceNames"),
                    non_resource_urls: strings(r, "nonResourceURLs"),
                })
                .collect()
        })
        .unwrap_or_default()
}

impl Policy {
    /// The `rbac.authorization.k8s.io/v1` objects among `objects` (others are ignored).
    pub fn from_objects<'a>(objects: impl IntoIterator<Item = &'a Value>) -> Self {
        let mut policy = Self::default();
        for object in objects {
            if text(object, "/apiVersion") != "rbac.authorization.k8s.io/v1" {
                continue;
            }
            let kind = text(object, "/kind");
            let name = text(object, "/metadata/name");
            let namespace = text(object, "/metadata/namespace");
            match kind.as_str() {
                "Role" | "ClusterRole" => policy.roles.push(Role {
                    namespace: if kind == "Role" {
                        namespace
                    } else {
                        String::new()
                    },
                    kind,
                    name,
                    rules: rules(object),
                }),
                "RoleBinding" | "ClusterRoleBinding" => {
                    let subjects = object
                        .get("subjects")
                        .and_then(Value::as_array)
                        .map(|subjects| {
                            subjects
                                .iter()
                                .map(|s| Subject {
                                    kind: text(s, "/kind"),
                                    name: text(s, "/name"),
                                    namespace: text(s, "/namespace"),
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    policy.bindings.push(Binding {
                        namespace: if kind == "RoleBinding" {
                            namespace
                        } else {
                            String::new()
                        },
                        kind,
                        name,
                        role_kind: text(object, "/roleRef/kind"),
                        role_name: text(object, "/roleRef/name"),
                        subjects,
                    });
                }
                _ => {}
            }
        }
        policy
    }

    /// Adds the default cluster roles every authenticated user has
    /// (`plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go`): `system:discovery` and
    /// `system:public-info-viewer`, non-resource reads only.
    pub fn with_bootstrap(mut self) -> Self {
        let get = |urls: &[&str]| Rule {
            verbs: vec!["get".to_string()],
            non_resource_urls: urls.iter().map(|u| u.to_string()).collect(),
            ..Rule::default()
        };
        let group = |name: &str| Subject {
            kind: "Group".to_string(),
            name: name.to_string(),
            namespace: String::new(),
        };
        for (name, urls, groups) in [
            (
                "system:discovery",
                &[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ][..],
                &["system:authenticated"][..],
            ),
            (
                "system:public-info-viewer",
                &["/healthz", "/livez", "/readyz", "/version", "/version/"][..],
                &["system:authenticated", "system:unauthenticated"][..],
            ),
        ] {
            self.roles.push(Role {
                kind: "ClusterRole".to_string(),
                name: name.to_string(),
                namespace: String::new(),
                rules: vec![get(urls)],
            });
            self.bindings.push(Binding {
                kind: "ClusterRoleBinding".to_string(),
                name: name.to_string(),
                namespace: String::new(),
                role_kind: "ClusterRole".to_string(),
                role_name: name.to_string(),
                subjects: groups.iter().map(|g| group(g)).collect(),
            });
        }
        self
    }

    /// `GetRoleReferenceRules`: the rules a binding refers to (none when the role is missing).
    fn rules_of(&self, binding: &Binding) -> Vec<Rule> {
        self.roles
            .iter()
            .find(|r| {
                r.kind == binding.role_kind
                    && r.name == binding.role_name
                    && (r.kind == "ClusterRole" || r.namespace == binding.namespace)
            })
            .map(|r| r.rules.clone())
            .unwrap_or_default()
    }

    /// The bindings that apply to `user` for a request in `namespace` (`VisitRulesFor`):
    /// every ClusterRoleBinding naming them, then, for a namespaced request, the
    /// RoleBindings of that namespace naming them.
    fn bindings_for<'a>(
        &'a self,
        user: &'a User,
        namespace: &'a str,
    ) -> impl Iterator<Item = &'a Binding> + 'a {
        self.bindings.iter().filter(move |b| {
            let scope_ok = if b.kind == "ClusterRoleBinding" {
                true
            } else {
                !namespace.is_empty() && b.namespace == namespace
            };
            scope_ok && b.subjects.iter().any(|s| applies_to(user, s, &b.namespace))
        })
    }

    /// The binding and rule that allow `request` for `user`, if any.
    pub fn authorize(&self, user: &User, request: &Request) -> Option<Grant> {
        for binding in self.bindings_for(user, &request.namespace) {
            for rule in self.rules_of(binding) {
                if rule_allows(&rule, request) {
                    return Some(Grant {
                        binding: binding.to_string(),
                        rule,
                    });
                }
            }
        }
        None
    }

    /// Every permission the policy grants `user` (its own bindings; the bootstrap roles
    /// left out), one per binding, rule, verb, apiGroup, resource and resourceName.
    pub fn permissions_of(&self, user: &User) -> Vec<Permission> {
        let mut out = Vec::new();
        for binding in self
            .bindings
            .iter()
            .filter(|b| !b.name.starts_with("system:"))
            .filter(|b| b.subjects.iter().any(|s| applies_to(user, s, &b.namespace)))
        {
            for rule in self.rules_of(binding) {
                for verb in &rule.verbs {
                    for url in &rule.non_resource_urls {
                        out.push(Permission {
                            binding: binding.to_string(),
                            namespace: binding.namespace.clone(),
                            verb: verb.clone(),
                            group: String::new(),
                            resource: String::new(),
                            name: None,
                            url: Some(url.clone()),
                        });
                    }
                    for group in &rule.api_groups {
                        for resource in &rule.resources {
                            let names: Vec<Option<String>> = if rule.resource_names.is_empty() {
                                vec![None]
                            } else {
                                rule.resource_names.iter().cloned().map(Some).collect()
                            };
                            for name in names {
                                out.push(Permission {
                                    binding: binding.to_string(),
                                    namespace: binding.namespace.clone(),
                                    verb: verb.clone(),
                                    group: group.clone(),
                                    resource: resource.clone(),
                                    name,
                                    url: None,
                                });
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

/// One thing a binding lets a subject do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permission {
    pub binding: String,
    /// The RoleBinding's namespace; empty for a ClusterRoleBinding (everywhere).
    pub namespace: String,
    pub verb: String,
    pub group: String,
    /// `pods`, `pods/status`, `*`, `*/status`.
    pub resource: String,
    pub name: Option<String>,
    pub url: Option<String>,
}

impl Permission {
    /// Whether `request` needs this very permission (it would be allowed by a rule holding
    /// only it, in the binding's scope).
    pub fn used_by(&self, request: &Request) -> bool {
        if !self.namespace.is_empty() && self.namespace != request.namespace {
            return false;
        }
        let rule = Rule {
            verbs: vec![self.verb.clone()],
            api_groups: vec![self.group.clone()],
            resources: if self.url.is_some() {
                vec![]
            } else {
                vec![self.resource.clone()]
            },
            resource_names: self.name.iter().cloned().collect(),
            non_resource_urls: self.url.iter().cloned().collect(),
        };
        rule_allows(&rule, request)
    }

    /// Whether a justification marker covers this permission: a marker names the verb and
    /// the resource as `resource` or `resource.group`.
    pub fn justified_by(&self, marker: &Justification) -> bool {
        let resource = if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        };
        marker.verbs.contains(&self.verb) && marker.resources.contains(&resource)
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(url) = &self.url {
            return write!(f, "{} {url} ({})", self.verb, self.binding);
        }
        write!(f, "{} {}", self.verb, self.resource)?;
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        if let Some(name) = &self.name {
            write!(f, " {name:?}")?;
        }
        write!(f, " ({})", self.binding)
    }
}

/// The comment in the chart's RBAC templates that says why a permission a component never
/// uses in the tests is there anyway:
/// `# rbac-unused-ok: VERB[,VERB] RESOURCE[.GROUP][,RESOURCE[.GROUP]]: WHY`.
pub const JUSTIFICATION_MARKER: &str = "# rbac-unused-ok:";

/// One parsed justification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Justification {
    pub verbs: Vec<String>,
    pub resources: Vec<String>,
    pub why: String,
}

/// Every justification in `text` (rendered template text, comments kept); a marker without
/// verbs, resources or a reason is an error.
pub fn justifications(text: &str) -> Result<Vec<Justification>, String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.trim_start().strip_prefix(JUSTIFICATION_MARKER) else {
            continue;
        };
        let mut parts = rest.trim().splitn(2, ' ');
        let verbs = parts.next().unwrap_or("");
        let rest = parts.next().unwrap_or("");
        let (resources, why) = rest.split_once(':').unwrap_or((rest, ""));
        let split = |s: &str| -> Vec<String> {
            s.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        };
        let marker = Justification {
            verbs: split(verbs),
            resources: split(resources),
            why: why.trim().to_string(),
        };
        if marker.verbs.is_empty() || marker.resources.is_empty() || marker.why.is_empty() {
            return Err(format!(
                "{line:?}: a justification is `{JUSTIFICATION_MARKER} VERBS RESOURCES: WHY`"
            ));
        }
        out.push(marker);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rule(verbs: &[&str], groups: &[&str], resources: &[&str], names: &[&str]) -> Rule {
        let own = |items: &[&str]| items.iter().map(|s| s.to_string()).collect();
        Rule {
            verbs: own(verbs),
            api_groups: own(groups),
            resources: own(resources),
            resource_names: own(names),
            non_resource_urls: vec![],
        }
    }

    fn get(resource: &str, name: &str) -> Request {
        Request::resource("get", "", resource, "ns", name)
    }

    #[test]
    fn verbs_match_exactly_or_by_star() {
        let r = rule(&["get", "list"], &[""], &["pods"], &[]);
        assert!(rule_allows(&r, &get("pods", "p")));
        assert!(!rule_allows(
            &r,
            &Request::resource("watch", "", "pods", "ns", "")
        ));
        let star = rule(&["*"], &[""], &["pods"], &[]);
        assert!(rule_allows(
            &star,
            &Request::resource("deletecollection", "", "pods", "ns", "")
        ));
    }

    #[test]
    fn api_groups_match_exactly_or_by_star_and_core_is_the_empty_group() {
        let core = rule(&["get"], &[""], &["deployments"], &[]);
        assert!(!rule_allows(
            &core,
            &Request::resource("get", "apps", "deployments", "ns", "d")
        ));
        let apps = rule(&["get"], &["apps"], &["deployments"], &[]);
        assert!(rule_allows(
            &apps,
            &Request::resource("get", "apps", "deployments", "ns", "d")
        ));
        let any = rule(&["get"], &["*"], &["deployments"], &[]);
        assert!(rule_allows(
            &any,
            &Request::resource("get", "extensions", "deployments", "ns", "d")
        ));
    }

    #[test]
    fn resources_match_by_name_star_and_subresource() {
        let pods = rule(&["get"], &[""], &["pods"], &[]);
        assert!(
            !rule_allows(&pods, &get("pods/status", "p")),
            "a subresource is its own resource"
        );
        let status = rule(&["get"], &[""], &["pods/status"], &[]);
        assert!(rule_allows(&status, &get("pods/status", "p")));
        assert!(!rule_allows(&status, &get("pods", "p")));
        let any_status = rule(&["get"], &[""], &["*/status"], &[]);
        assert!(rule_allows(&any_status, &get("pods/status", "p")));
        assert!(rule_allows(&any_status, &get("nodes/status", "n")));
        assert!(!rule_allows(&any_status, &get("pods/log", "p")));
        assert!(!rule_allows(&any_status, &get("pods", "p")));
        let star = rule(&["get"], &[""], &["*"], &[]);
        assert!(
            rule_allows(&star, &get("pods/exec", "p")),
            "* covers subresources too"
        );
    }

    #[test]
    fn resource_names_limit_named_requests_and_never_match_lists_or_creates() {
        let one = rule(&["get", "list", "create"], &[""], &["secrets"], &["tls"]);
        assert!(rule_allows(&one, &get("secrets", "tls")));
        assert!(!rule_allows(&one, &get("secrets", "other")));
        assert!(!rule_allows(
            &one,
            &Request::resource("list", "", "secrets", "ns", "")
        ));
        assert!(!rule_allows(
            &one,
            &Request::resource("create", "", "secrets", "ns", "")
        ));
    }

    #[test]
    fn non_resource_urls_match_exactly_by_star_or_by_prefix() {
        let r = Rule {
            verbs: vec!["get".into()],
            non_resource_urls: vec!["/version".into(), "/apis/*".into()],
            ..Rule::default()
        };
        assert!(rule_allows(&r, &Request::non_resource("get", "/version")));
        assert!(rule_allows(
            &r,
            &Request::non_resource("get", "/apis/apps/v1")
        ));
        assert!(!rule_allows(&r, &Request::non_resource("get", "/api")));
        assert!(!rule_allows(&r, &Request::non_resource("post", "/version")));
        let resource_rule = rule(&["*"], &["*"], &["*"], &[]);
        assert!(
            !rule_allows(&resource_rule, &Request::non_resource("get", "/version")),
            "resource rules grant no URLs"
        );
    }

    fn policy() -> Policy {
        Policy::from_objects(&[
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "read-pods"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "secrets", "namespace": "a"},
                "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "secrets", "namespace": "b"},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}),
            // A RoleBinding of the ClusterRole: pods in namespace a only.
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "pods-in-a", "namespace": "a"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "read-pods"},
                "subjects": [{"kind": "ServiceAccount", "name": "job", "namespace": "sys"}]}),
            // A RoleBinding of the Role of its own namespace (a's, not b's of the same name);
            // its subject's namespace left out defaults to the binding's.
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "secrets", "namespace": "a"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "secrets"},
                "subjects": [{"kind": "ServiceAccount", "name": "local"}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "pods-everywhere"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "read-pods"},
                "subjects": [{"kind": "Group", "name": "system:serviceaccounts:ops"}, {"kind": "User", "name": "alice"}]}),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "job", "namespace": "sys"}}),
        ])
    }

    #[test]
    fn a_role_binding_grants_only_in_its_namespace_even_for_a_cluster_role() {
        let policy = policy();
        let job = User::service_account("sys", "job");
        assert!(
            policy
                .authorize(&job, &Request::resource("list", "", "pods", "a", ""))
                .is_some()
        );
        assert!(
            policy
                .authorize(&job, &Request::resource("list", "", "pods", "b", ""))
                .is_none()
        );
        assert!(
            policy
                .authorize(&job, &Request::resource("list", "", "pods", "", ""))
                .is_none(),
            "not across all namespaces"
        );
        assert!(
            policy
                .authorize(&job, &Request::resource("get", "", "nodes", "", "n"))
                .is_none()
        );
    }

    #[test]
    fn a_role_binding_refers_to_the_role_of_its_own_namespace() {
        let policy = policy();
        let local = User::service_account("a", "local");
        assert!(
            policy
                .authorize(&local, &Request::resource("get", "", "secrets", "a", "s"))
                .is_some()
        );
        assert!(
            policy
                .authorize(
                    &local,
                    &Request::resource("get", "", "configmaps", "a", "c")
                )
                .is_none()
        );
        let elsewhere = User::service_account("b", "local");
        assert!(
            policy
                .authorize(
                    &elsewhere,
                    &Request::resource("get", "", "secrets", "a", "s")
                )
                .is_none(),
            "the subject's namespace defaulted to a"
        );
    }

    #[test]
    fn a_cluster_role_binding_grants_everywhere_to_users_groups_and_service_accounts() {
        let policy = policy();
        let ops = User::service_account("ops", "anyone");
        assert!(
            policy
                .authorize(&ops, &Request::resource("list", "", "pods", "", ""))
                .is_some()
        );
        assert!(
            policy
                .authorize(&ops, &Request::resource("get", "", "pods", "x", "p"))
                .is_some()
        );
        let alice = User {
            name: "alice".into(),
            groups: vec!["system:authenticated".into()],
        };
        assert!(
            policy
                .authorize(&alice, &Request::resource("get", "", "pods", "x", "p"))
                .is_some()
        );
        let bob = User {
            name: "bob".into(),
            groups: vec!["system:authenticated".into()],
        };
        assert!(
            policy
                .authorize(&bob, &Request::resource("get", "", "pods", "x", "p"))
                .is_none()
        );
        let other_sa = User::service_account("sys", "other");
        assert!(
            policy
                .authorize(&other_sa, &Request::resource("list", "", "pods", "a", ""))
                .is_none()
        );
    }

    #[test]
    fn every_authenticated_user_may_read_version_and_discovery_and_nothing_else() {
        let policy = Policy::default().with_bootstrap();
        let anyone = User::service_account("x", "y");
        assert!(
            policy
                .authorize(&anyone, &Request::non_resource("get", "/version"))
                .is_some()
        );
        assert!(
            policy
                .authorize(&anyone, &Request::non_resource("get", "/apis/apps/v1"))
                .is_some()
        );
        assert!(
            policy
                .authorize(&anyone, &Request::non_resource("get", "/metrics"))
                .is_none()
        );
        assert!(
            policy
                .authorize(&anyone, &Request::resource("list", "", "pods", "", ""))
                .is_none()
        );
        assert!(
            policy.permissions_of(&anyone).is_empty(),
            "bootstrap grants are not the chart's"
        );
    }

    #[test]
    fn permissions_expand_each_verb_resource_and_name_and_know_what_uses_them() {
        let policy = Policy::from_objects(&[
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "r", "namespace": "a"},
                "rules": [{"apiGroups": [""], "resources": ["secrets", "configmaps"], "resourceNames": ["x"], "verbs": ["get", "update"]}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "r", "namespace": "a"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
                "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "a"}]}),
        ]);
        let perms = policy.permissions_of(&User::service_account("a", "sa"));
        assert_eq!(perms.len(), 4);
        let get_secret = perms
            .iter()
            .find(|p| p.verb == "get" && p.resource == "secrets")
            .unwrap();
        assert!(get_secret.used_by(&Request::resource("get", "", "secrets", "a", "x")));
        assert!(
            !get_secret.used_by(&Request::resource("get", "", "secrets", "b", "x")),
            "another namespace"
        );
        assert!(
            !get_secret.used_by(&Request::resource("get", "", "secrets", "a", "y")),
            "another name"
        );
        assert!(!get_secret.used_by(&Request::resource("update", "", "secrets", "a", "x")));
        assert_eq!(
            get_secret.to_string(),
            "get secrets \"x\" (RoleBinding a/r of Role r)"
        );
    }

    #[test]
    fn justification_markers_name_verbs_and_resources_and_need_a_reason() {
        let text = "rules:\n  # rbac-unused-ok: get,watch nodes,leases.coordination.k8s.io: the cache re-lists after a 410\n  - apiGroups: [\"\"]\n";
        let markers = justifications(text).expect("parsed");
        assert_eq!(markers.len(), 1);
        assert_eq!(markers[0].verbs, ["get", "watch"]);
        assert_eq!(
            markers[0].resources,
            ["nodes", "leases.coordination.k8s.io"]
        );
        assert_eq!(markers[0].why, "the cache re-lists after a 410");
        let perm = |verb: &str, group: &str, resource: &str| Permission {
            binding: "b".into(),
            namespace: String::new(),
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            name: None,
            url: None,
        };
        assert!(perm("watch", "", "nodes").justified_by(&markers[0]));
        assert!(perm("get", "coordination.k8s.io", "leases").justified_by(&markers[0]));
        assert!(!perm("list", "", "nodes").justified_by(&markers[0]));
        assert!(
            !perm("get", "", "leases").justified_by(&markers[0]),
            "the group is part of the name"
        );
        assert!(
            justifications("# rbac-unused-ok: get nodes\n").is_err(),
            "no reason"
        );
        assert!(justifications("# rbac-unused-ok:\n").is_err());
    }
}
