//! Node and LimitRange look-ups through `cluster::watch`, against a stub API server that
//! answers list and watch like the kube-apiserver.

mod common;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::api_stub::ApiStub;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Taint};
use kube::api::{Api, ListParams};
use podmend::cluster::ClusterView;
use podmend::cluster::watch::{self, CacheReadiness, Lookups, WatchedCluster};
use podmend::server::{self, ServeOptions};
use serde_json::{Value, json};

const TEST_TIMEOUT: Duration = Duration::from_secs(30);
const POLL_DEADLINE: Duration = Duration::from_secs(10);

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/cluster/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap()
}

fn nodes() -> Vec<Value> {
    vec![
        fixture("node-virtual-kubelet-aci.json"),
        fixture("node-kubeadm-control-plane.json"),
        fixture("node-cordoned-worker.json"),
    ]
}

fn limit_ranges() -> Vec<Value> {
    vec![
        fixture("limitrange-ci-agents-container-defaults.json"),
        fixture("limitrange-default-pod-container-pvc.json"),
    ]
}

fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
    Taint {
        key: key.to_string(),
        value: value.map(str::to_string),
        effect: effect.to_string(),
        time_added: None,
    }
}

/// Taints without `timeAdded`, which the API server sets and tests do not care about.
fn without_time(taints: Option<Vec<Taint>>) -> Option<Vec<Taint>> {
    taints.map(|ts| {
        ts.into_iter()
            .map(|t| Taint {
                time_added: None,
                ..t
            })
            .collect()
    })
}

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .expect("test took longer than its timeout");
}

async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + POLL_DEADLINE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {POLL_DEADLINE:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn started(stub: &ApiStub) -> (std::sync::Arc<WatchedCluster>, CacheReadiness) {
    let (cluster, readiness) = watch::start(stub.client().await);
    let ready = readiness.clone();
    eventually("caches ready", move || ready.is_ready()).await;
    (cluster, readiness)
}

#[tokio::test]
async fn caches_become_ready_after_the_first_list_and_answer_node_taints() {
    within(async {
        let stub = ApiStub::start(nodes(), limit_ranges()).await;
        let (cluster, readiness) = started(&stub).await;
        assert!(readiness.is_ready());
        assert!(cluster.lookups_enabled());

        assert_eq!(
            cluster.node_taints("virtual-node-aci-linux"),
            Some(vec![taint(
                "virtual-kubelet.io/provider",
                Some("azure"),
                "NoSchedule"
            )])
        );
        assert_eq!(
            cluster.node_taints("cp-1"),
            Some(vec![taint(
                "node-role.kubernetes.io/control-plane",
                None,
                "NoSchedule"
            )])
        );
        let cordoned = cluster.node_taints("worker-2");
        assert!(
            cordoned
                .as_ref()
                .and_then(|ts| ts.first())
                .is_some_and(|t| t.time_added.is_some()),
            "{cordoned:?}"
        );
        assert_eq!(
            without_time(cordoned),
            Some(vec![taint(
                "node.kubernetes.io/unschedulable",
                None,
                "NoSchedule"
            )])
        );
    })
    .await;
}

#[tokio::test]
async fn an_unknown_node_answers_none() {
    within(async {
        let stub = ApiStub::start(nodes(), limit_ranges()).await;
        let (cluster, _) = started(&stub).await;
        assert_eq!(cluster.node_taints("no-such-node"), None);
    })
    .await;
}

#[tokio::test]
async fn a_node_without_taints_answers_an_empty_list() {
    within(async {
        let mut plain = fixture("node-cordoned-worker.json");
        plain["metadata"]["name"] = json!("worker-1");
        plain["spec"] = json!({ "podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"] });
        let stub = ApiStub::start(vec![plain], vec![]).await;
        let (cluster, _) = started(&stub).await;
        assert_eq!(cluster.node_taints("worker-1"), Some(vec![]));
    })
    .await;
}

#[tokio::test]
async fn limit_range_items_are_returned_for_their_namespace_only() {
    within(async {
        let stub = ApiStub::start(nodes(), limit_ranges()).await;
        let (cluster, _) = started(&stub).await;

        let items = cluster.limit_range_items("ci-agents");
        assert_eq!(items.len(), 1, "{items:?}");
        let item = &items[0];
        assert_eq!(item.type_, "Container");
        let get = |map: &Option<std::collections::BTreeMap<_, _>>, key: &str| {
            map.as_ref()
                .and_then(|m| m.get(key))
                .map(|q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| q.0.clone())
        };
        assert_eq!(get(&item.min, "cpu").as_deref(), Some("50m"));
        assert_eq!(
            get(&item.max_limit_request_ratio, "cpu").as_deref(),
            Some("4")
        );
        // Defaults are LimitRanger's to apply; rules never read them, so the cache keeps none.
        assert!(
            item.default.is_none() && item.default_request.is_none(),
            "{item:?}"
        );

        let types: Vec<String> = cluster
            .limit_range_items("default")
            .into_iter()
            .map(|i| i.type_)
            .collect();
        // In the order of the LimitRanges' names; PersistentVolumeClaim items are not kept.
        assert_eq!(types, vec!["Pod", "Container"]);

        assert!(cluster.limit_range_items("kube-system").is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_modified_watch_event_with_a_new_taint_is_seen_by_node_taints() {
    within(async {
        let stub = ApiStub::start(nodes(), limit_ranges()).await;
        let (cluster, _) = started(&stub).await;

        let mut node = fixture("node-kubeadm-control-plane.json");
        node["spec"]["taints"]
            .as_array_mut()
            .unwrap()
            .push(json!({ "key": "dedicated", "value": "ci", "effect": "NoExecute" }));
        stub.push_node_event("MODIFIED", node);

        let expected = vec![
            taint("node-role.kubernetes.io/control-plane", None, "NoSchedule"),
            taint("dedicated", Some("ci"), "NoExecute"),
        ];
        eventually("the new taint is seen", || {
            cluster.node_taints("cp-1").as_ref() == Some(&expected)
        })
        .await;
        // Delivered by the open watch, not by a re-list.
        let lists = stub
            .requests()
            .into_iter()
            .filter(|r| r.starts_with("/api/v1/nodes?") && !r.contains("watch="))
            .count();
        assert_eq!(lists, 1);
    })
    .await;
}

#[tokio::test]
async fn added_and_deleted_watch_events_change_which_nodes_are_known() {
    within(async {
        let stub = ApiStub::start(nodes(), vec![]).await;
        let (cluster, _) = started(&stub).await;

        stub.push_node_event("DELETED", fixture("node-cordoned-worker.json"));
        let mut added = fixture("node-cordoned-worker.json");
        added["metadata"]["name"] = json!("worker-3");
        stub.push_node_event("ADDED", added);

        eventually("worker-2 gone and worker-3 known", || {
            cluster.node_taints("worker-2").is_none() && cluster.node_taints("worker-3").is_some()
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn caches_get_ready_once_a_failing_api_server_recovers() {
    within(async {
        let stub = ApiStub::start(nodes(), limit_ranges()).await;
        stub.set_failing(true);
        let (cluster, readiness) = watch::start(stub.client().await);

        eventually("the node list was retried", || {
            stub.requests()
                .iter()
                .filter(|r| r.starts_with("/api/v1/nodes?"))
                .count()
                >= 2
        })
        .await;
        assert!(!readiness.is_ready());
        assert_eq!(cluster.node_taints("cp-1"), None);

        stub.set_failing(false);
        eventually("caches ready after recovery", || readiness.is_ready()).await;
        assert!(cluster.node_taints("cp-1").is_some());
    })
    .await;
}

#[tokio::test]
async fn the_watcher_lists_in_pages_then_watches_from_the_list_resource_version() {
    within(async {
        let stub = ApiStub::start(nodes(), limit_ranges()).await;
        let (_cluster, _) = started(&stub).await;
        let list_rv = stub.resource_version();
        eventually("both watches opened", || {
            let requests = stub.requests();
            ["/api/v1/nodes?", "/api/v1/limitranges?"].iter().all(|p| {
                requests
                    .iter()
                    .any(|r| r.starts_with(p) && r.contains("watch=true"))
            })
        })
        .await;

        let requests = stub.requests();
        for resource in ["nodes", "limitranges"] {
            let path = format!("/api/v1/{resource}?");
            let mine: Vec<&String> = requests.iter().filter(|r| r.starts_with(&path)).collect();
            assert!(mine.len() >= 2, "{mine:?}");
            assert_eq!(mine[0], &format!("{path}&limit=100"), "{requests:?}");
            let watch = mine[1];
            assert!(watch.contains("watch=true"), "{watch}");
            assert!(
                watch.contains(&format!("resourceVersion={list_rv}")),
                "{watch}"
            );
            assert!(watch.contains("allowWatchBookmarks=true"), "{watch}");
            assert!(watch.contains("timeoutSeconds=290"), "{watch}");
            assert!(!watch.contains("sendInitialEvents"), "{watch}");
        }
    })
    .await;
}

#[tokio::test]
async fn the_stub_pages_lists_with_limit_and_continue() {
    within(async {
        let stub = ApiStub::start(vec![], vec![]).await;
        let pods: Vec<Value> = (0..5)
            .map(|i| {
                json!({
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": { "name": format!("agent-{i}"), "namespace": "ci-agents" },
                    "spec": { "containers": [{ "name": "jnlp", "image": "jenkins/inbound-agent" }] },
                })
            })
            .collect();
        stub.set_objects("pods", pods);
        let api: Api<Pod> = Api::all(stub.client().await);

        let mut names = Vec::new();
        let mut params = ListParams::default().limit(2);
        let mut pages = 0;
        loop {
            let page = api.list(&params).await.unwrap();
            pages += 1;
            names.extend(page.items.iter().filter_map(|p| p.metadata.name.clone()));
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => {
                    assert!(page.metadata.remaining_item_count.is_some());
                    params = params.continue_token(&token);
                }
                None => break,
            }
        }
        assert_eq!(pages, 3);
        assert_eq!(
            names,
            ["agent-0", "agent-1", "agent-2", "agent-3", "agent-4"]
        );
        let requests = stub.requests();
        assert!(
            requests
                .iter()
                .filter(|r| r.starts_with("/api/v1/pods?"))
                .skip(1)
                .all(|r| r.contains("continue=")),
            "{requests:?}"
        );

        let other_ns: Api<Pod> = Api::namespaced(stub.client().await, "default");
        assert!(other_ns.list(&ListParams::default()).await.unwrap().items.is_empty());
    })
    .await;
}

#[tokio::test]
async fn the_stub_answers_unknown_resources_with_a_not_found_status() {
    within(async {
        let stub = ApiStub::start(vec![], vec![]).await;
        let api: Api<ConfigMap> = Api::namespaced(stub.client().await, "default");
        match api.list(&ListParams::default()).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 404);
                assert_eq!(status.reason, "NotFound");
            }
            other => panic!("expected a 404 Status, got {other:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn lookups_from_the_stub_kubeconfig_are_on_and_fill_the_caches() {
    within(async {
        let stub = ApiStub::start(nodes(), limit_ranges()).await;
        let client = match watch::lookups_from_kubeconfig(stub.kubeconfig_path()).await {
            Lookups::On(client) => client,
            off => panic!("expected On, got {off:?}"),
        };
        let (cluster, readiness) = watch::start(client);
        eventually("caches ready", || readiness.is_ready()).await;
        assert!(cluster.node_taints("cp-1").is_some());
    })
    .await;
}

#[tokio::test]
async fn lookups_from_a_missing_kubeconfig_are_off_with_a_reason_naming_the_file() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-kubeconfig.yaml");
        match watch::lookups_from_kubeconfig(&path).await {
            Lookups::Off { reason } => {
                assert!(reason.contains(&path.display().to_string()), "{reason}");
            }
            on => panic!("expected Off, got {on:?}"),
        }
    })
    .await;
}

/// The lists `serve`'s after-list hook has seen (one test counts them).
static LISTS_SEEN: AtomicUsize = AtomicUsize::new(0);

#[tokio::test]
async fn serve_runs_its_after_list_hook_once_each_cache_has_had_its_list() {
    within(async {
        common::server::install_crypto_provider();
        let stub = ApiStub::start(nodes(), limit_ranges()).await;
        let dir = tempfile::tempdir().expect("tempdir");
        common::server::write_certs(dir.path());
        let options = ServeOptions {
            after_cache_list: || {
                LISTS_SEEN.fetch_add(1, Ordering::SeqCst);
            },
            ..common::server::in_process_options(dir.path(), stub.kubeconfig_path())
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server::serve(options, async move {
            let _ = stopped.await;
        }));
        eventually("the Node, LimitRange and Namespace lists", || {
            LISTS_SEEN.load(Ordering::SeqCst) >= 3
        })
        .await;
        let _ = stop.send(());
        let result = serving.await.expect("serve did not panic");
        assert!(result.is_ok(), "serve stopped cleanly: {result:?}");
        // One call per list the API server answered: the Nodes', LimitRanges' and Namespaces'.
        let lists = |resource: &str| {
            stub.requests()
                .iter()
                .filter(|r| r.starts_with(&format!("/api/v1/{resource}?")) && !r.contains("watch="))
                .count()
        };
        assert_eq!(
            (lists("nodes"), lists("limitranges"), lists("namespaces")),
            (1, 1, 1)
        );
        assert_eq!(LISTS_SEEN.load(Ordering::SeqCst), 3);
    })
    .await;
}
