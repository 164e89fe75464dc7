//! The webhook reviews a request's raw objects, deciding on a sketch of each (only the fields
//! scope and the rules' cheap look read) and parsing the whole object only when a rule may act;
//! `audit` reviews parsed objects. For every object of every fixture, under configurations
//! that turn every rule on, both must come to the same outcome: same skip, same findings,
//! same patches. (The property tests and the `review` fuzz target check the same on generated
//! pods and on arbitrary bodies.)

mod common;

use std::path::Path;

use common::server::{create_review, review_of};
use podmend::admission;
use podmend::cluster::StaticCluster;
use podmend::config::{Config, Mode};
use podmend::engine::{Engine, Subject, WholeObjects};
use serde_json::Value;

/// Every AdmissionReview the fixtures make: their captures as they are, and a CREATE of every
/// object of every YAML document, once as written and once pinned with `nodeName` (so that a
/// rule acts on every pod spec).
fn reviews() -> Vec<(String, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut reviews = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(_) => continue,
        };
        if name.starts_with("admissionrequest-") {
            let request: Value = serde_json::from_str(&text).expect("fixture JSON");
            reviews.push((name, review_of(request)));
        } else if name.starts_with("admissionreview-") {
            reviews.push((name, serde_json::from_str(&text).expect("fixture JSON")));
        } else if name.ends_with(".yaml") {
            for (index, document) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
                let Ok(object) = <Value as serde::Deserialize>::deserialize(document) else {
                    continue;
                };
                if !object.is_object() || object.get("kind").is_none() {
                    continue;
                }
                let label = format!("{name}#{index}");
                reviews.push((label.clone(), create_review("uid", &object, "ci")));
                reviews.push((
                    format!("{label}+nodeName"),
                    create_review("uid", &pinned(object), "ci"),
                ));
            }
        }
    }
    reviews
}

/// The object with `nodeName` set on its pod spec, wherever that is.
fn pinned(mut object: Value) -> Value {
    let kind = object["kind"].as_str().unwrap_or_default().to_string();
    let api_version = object["apiVersion"].as_str().unwrap_or("v1").to_string();
    if let Some(target) = podmend::target::for_api_version(&api_version, &kind)
        && let Some(spec) = object.pointer_mut(target.spec)
        && let Some(spec) = spec.as_object_mut()
    {
        spec.insert("nodeName".into(), Value::from("worker-1"));
    }
    object
}

fn engines() -> Vec<(&'static str, Engine)> {
    let mut everything = Config::default();
    let rules = &mut everything.rules;
    rules.node_affinity.templates = Mode::Enforce;
    rules.agent_requests.templates = Mode::Enforce;
    rules.dind_rm.templates = Mode::Enforce;
    rules.virtual_node_phase.mode = Mode::Enforce;
    vec![
        ("default", Engine::new(&Config::default())),
        ("everything enforced", Engine::new(&everything)),
    ]
}

#[test]
fn the_raw_review_of_every_fixture_equals_the_review_of_its_parsed_objects() {
    let reviews = reviews();
    assert!(reviews.len() > 40, "{} reviews", reviews.len());
    let cluster = StaticCluster::empty()
        .with_node("worker-1", vec![])
        .with_labeled_node("virtual-node-aci-linux", &[("type", "virtual-kubelet")]);
    let mut acted = 0;
    for (name, review) in &reviews {
        let body = serde_json::to_vec(review).expect("JSON");
        let request = admission::decode(&body).unwrap_or_else(|e| panic!("{name}: {e}"));
        let raw = request.subject();
        let (object, old_object) = request.read_whole().expect("the objects parse");
        let parsed = Subject {
            operation: raw.operation,
            group: raw.group,
            kind: raw.kind,
            sub_resource: raw.sub_resource,
            namespace: raw.namespace,
            object: object.as_ref(),
            old_object: old_object.as_ref(),
        };
        for (config, engine) in engines() {
            let from_raw = engine.review_raw(&raw, &cluster);
            let from_parsed = engine.review(&parsed, &cluster);
            assert_eq!(from_raw, from_parsed, "{name} ({config})");
            acted += usize::from(!from_raw.findings.is_empty());
        }
    }
    assert!(
        acted > 20,
        "only {acted} reviews had findings: the comparison says little"
    );
}

/// A cluster whose node `worker-1`, tainted, reaches the cache after the first look-up: as
/// a watch event can bring it while a review runs.
struct NodeArrivesDuringTheReview {
    asked: std::sync::atomic::AtomicUsize,
}

impl podmend::cluster::ClusterView for NodeArrivesDuringTheReview {
    fn lookups_enabled(&self) -> bool {
        true
    }
    fn node_taints(&self, _: &str) -> Option<Vec<k8s_openapi::api::core::v1::Taint>> {
        let asked = self
            .asked
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        (asked > 0).then(|| {
            vec![k8s_openapi::api::core::v1::Taint {
                key: "example.com/arrived".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]
        })
    }
    fn node_labels(&self, _: &str) -> Option<std::collections::BTreeMap<String, String>> {
        None
    }
    fn limit_range_items(&self, _: &str) -> Vec<k8s_openapi::api::core::v1::LimitRangeItem> {
        Vec::new()
    }
}

#[test]
fn a_node_that_reaches_the_cache_during_a_review_is_seen_the_same_by_its_whole_review() {
    // Debug builds repair a pinned pod from its sketch and again from the object read whole,
    // and compare: both must see the cluster as it was at the first look-up.
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ci"},
        "spec": {"nodeName": "worker-1", "containers": [{"name": "c", "image": "nginx"}]}
    });
    let body = serde_json::to_vec(&create_review("uid", &pod, "ci")).expect("JSON");
    let request = admission::decode(&body).expect("decodes");
    let cluster = NodeArrivesDuringTheReview {
        asked: Default::default(),
    };
    let outcome = Engine::new(&Config::default()).review_raw(&request.subject(), &cluster);
    let finding = outcome
        .findings
        .first()
        .expect("the pinned pod is repaired");
    let messages = finding.messages.join("\n");
    assert!(
        messages.contains("node worker-1 is not known"),
        "{messages}"
    );
}
