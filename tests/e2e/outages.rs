//! podmend unreachable, as the real API server sees it: the suite's `podmend serve` (the one
//! the chart's webhook configuration calls) stopped, then hung, then restarted, while pods are
//! created through kube-apiserver with the chart's `failurePolicy: Ignore`.
//!
//! What the API server does is in apiserver
//! `pkg/admission/plugin/webhook/mutating/dispatcher.go`: `callAttrMutatingHook` wraps the call
//! in `context.WithTimeout(ctx, TimeoutSeconds)`, so a webhook that never answers costs the
//! request exactly that long; `dispatch` then, for a call error (refused connection, timeout)
//! and `failurePolicy: Ignore`, logs "failing open", counts it in
//! `apiserver_admission_webhook_fail_open_count{name=WEBHOOK,type="admit"}`
//! (`ObserveWebhookFailOpen`; the metric is defined in `pkg/admission/metrics/metrics.go`,
//! `newAdmissionMetrics`) and admits the object as it was. Each test reads that counter from
//! the API server's /metrics, so a pod stored unrepaired for any other reason (podmend
//! answering "no change") does not pass for an outage, and one repaired after the restart
//! proves the API server called podmend rather than failing open.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::Suite;
use crate::install::{ensure_installed, kubectl, kubectl_json, kubectl_stdin, of_kind};
use crate::node_affinity::wait_until_podmend_knows;
use crate::pinniped::create_node;

const NS: &str = "podmend-outages";
const NODE: &str = "outages-node";
/// The chart's mutating webhook (`webhooks[0].name`): the name the API server's metrics use.
const WEBHOOK: &str = "mutate.podmend.io";

/// The API server's count of calls to `webhook` that failed open, from its /metrics (0 before
/// the first: a counter without samples is not printed).
pub fn fail_open_count(suite: &Suite, webhook: &str) -> u64 {
    let metrics = kubectl(suite, &["get", "--raw", "/metrics"]);
    let name = format!("name=\"{webhook}\"");
    metrics
        .lines()
        .filter(|line| line.starts_with("apiserver_admission_webhook_fail_open_count{"))
        .filter(|line| line.contains(&name) && line.contains("type=\"admit\""))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|count| count as u64)
        .sum()
}

/// The chart's MutatingWebhookConfiguration as the API server stores it.
fn chart_webhook(suite: &Suite) -> Value {
    let name = {
        let podmend = crate::lock(&suite.podmend);
        let installed = podmend.as_ref().expect("installed");
        of_kind(&installed.manifest, "MutatingWebhookConfiguration")["metadata"]["name"]
            .as_str()
            .expect("the configuration's name")
            .to_string()
    };
    kubectl_json(
        suite,
        &["get", "mutatingwebhookconfiguration", &name, "-o", "json"],
    )
}

/// The `timeoutSeconds` and `failurePolicy` of the chart's webhook [`WEBHOOK`], as stored.
fn stored_timeout_and_policy(suite: &Suite) -> (Duration, String) {
    let configuration = chart_webhook(suite);
    let webhook = configuration["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|w| w["name"] == WEBHOOK)
        .unwrap_or_else(|| panic!("no webhook {WEBHOOK} in {configuration}"));
    let seconds = webhook["timeoutSeconds"].as_u64().expect("timeoutSeconds");
    let policy = webhook["failurePolicy"].as_str().unwrap_or_default();
    (Duration::from_secs(seconds), policy.to_string())
}

/// podmend installed, this file's namespace and node, and podmend's Node cache holding it.
fn setup(suite: &Suite) {
    ensure_installed(suite);
    let missing = |kind: &str, name: &str| {
        kubectl(
            suite,
            &["get", kind, name, "--ignore-not-found", "-o", "name"],
        )
        .trim()
        .is_empty()
    };
    if missing("namespace", NS) {
        suite
            .block_on(suite.plane.create_namespace(NS))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    if missing("node", NODE) {
        create_node(suite, NODE, "");
    }
    wait_until_podmend_knows(suite, NS, NODE);
}

/// A pod pinned to [`NODE`] with `nodeName`: podmend rewrites that into required node
/// affinity and marks the pod `podmend.io/mutated`.
fn pinned(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": NS},
           "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "c", "image": "busybox"}]}})
}

/// Creates `pod` with the real `kubectl`: how long the create took, and the pod read back.
fn create_timed(suite: &Suite, pod: &Value) -> (Duration, Value) {
    let began = Instant::now();
    kubectl_stdin(suite, &["create", "-f", "-"], pod);
    let took = began.elapsed();
    let name = pod["metadata"]["name"].as_str().expect("a name");
    let stored = kubectl_json(suite, &["get", "pod", name, "-n", NS, "-o", "json"]);
    (took, stored)
}

fn assert_unrepaired(pod: &Value) {
    assert_eq!(
        pod["spec"]["nodeName"], NODE,
        "stored with its nodeName: {}",
        pod["spec"]
    );
    assert!(
        pod["metadata"]["annotations"]["podmend.io/mutated"].is_null()
            && pod["spec"]["affinity"].is_null(),
        "stored as created, without podmend's repair: {pod}"
    );
}

/// The suite's `podmend serve` made unreachable; serving again by [`Outage::end`], or when
/// dropped (also while a failed test unwinds), so that later tests find it serving.
struct Outage<'a> {
    suite: &'a Suite,
    hung: bool,
    ended: bool,
}

impl<'a> Outage<'a> {
    /// Kills podmend: its port refuses connections.
    fn stopped(suite: &'a Suite) -> Self {
        server_do(suite, |server| server.kill());
        Outage {
            suite,
            hung: false,
            ended: false,
        }
    }

    /// Stops podmend with SIGSTOP: its socket still accepts connections, nothing answers.
    fn hung(suite: &'a Suite) -> Self {
        server_do(suite, |server| signal(server.pid(), "STOP"));
        Outage {
            suite,
            hung: true,
            ended: false,
        }
    }

    /// podmend serving again: resumed (SIGCONT) or restarted, and /readyz answering.
    fn resume(&mut self) -> Result<(), String> {
        self.ended = true;
        let hung = self.hung;
        server_do(self.suite, |server| {
            if !hung {
                return server.restart();
            }
            signal(server.pid(), "CONT");
            let deadline = Instant::now() + Duration::from_secs(20);
            while !matches!(server.metrics_get("/readyz"), Ok((200, _))) {
                if Instant::now() >= deadline {
                    return Err(format!(
                        "podmend did not answer /readyz within 20 s of SIGCONT; log:\n{}",
                        server.log_text()
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(())
        })
    }

    fn end(mut self) {
        self.resume().unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Drop for Outage<'_> {
    fn drop(&mut self) {
        if !self.ended
            && let Err(error) = self.resume()
        {
            eprintln!("after an outage test: {error}");
        }
    }
}

/// Runs `action` on the suite's `podmend serve`.
fn server_do<T>(suite: &Suite, action: impl FnOnce(&mut crate::common::server::Server) -> T) -> T {
    let mut podmend = crate::lock(&suite.podmend);
    action(&mut podmend.as_mut().expect("installed").server)
}

/// Sends SIG`name` to `pid`.
fn signal(pid: u32, name: &str) {
    let _ = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status();
}

pub fn during_a_podmend_outage_with_podmend_stopped_a_pod_is_stored_unrepaired_well_within_the_webhook_timeout(
    suite: &Suite,
) {
    setup(suite);
    let (timeout, policy) = stored_timeout_and_policy(suite);
    assert_eq!(policy, "Ignore", "the chart's default failure policy");
    let failed_open = fail_open_count(suite, WEBHOOK);
    let outage = Outage::stopped(suite);
    // A refused connection fails the call at once: the create does not wait for the timeout.
    let (took, pod) = create_timed(suite, &pinned("while-stopped"));
    outage.end();
    println!(
        "(created in {:.2} s with podmend stopped; timeoutSeconds {})",
        took.as_secs_f64(),
        timeout.as_secs()
    );
    // Had podmend answered, the pod would carry its repair; had the API server not failed
    // open, the create would have been refused.
    assert_unrepaired(&pod);
    assert!(
        took < timeout,
        "the create took {took:?}, not less than the webhook's timeout {timeout:?}"
    );
    assert!(
        fail_open_count(suite, WEBHOOK) > failed_open,
        "the API server counted the failed call to {WEBHOOK} as failing open"
    );
}

pub fn during_a_podmend_outage_with_podmend_hung_the_api_server_gives_up_at_the_webhook_timeout_and_stores_the_pod_unrepaired(
    suite: &Suite,
) {
    setup(suite);
    let (timeout, _) = stored_timeout_and_policy(suite);
    let failed_open = fail_open_count(suite, WEBHOOK);
    let outage = Outage::hung(suite);
    let (took, pod) = create_timed(suite, &pinned("while-hung"));
    outage.end();
    println!(
        "(created in {:.2} s with podmend hung; timeoutSeconds {})",
        took.as_secs_f64(),
        timeout.as_secs()
    );
    assert_unrepaired(&pod);
    // The API server waits the whole timeout (a hung webhook is not seen as down sooner),
    // and not much longer: kubectl's own start and the write take well under 3 s here.
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(3),
        "the create took {took:?}; the webhook's timeout is {timeout:?}"
    );
    assert!(
        fail_open_count(suite, WEBHOOK) > failed_open,
        "the API server counted the timed-out call to {WEBHOOK} as failing open"
    );
}

pub fn after_a_podmend_outage_podmend_restarted_repairs_the_next_pod(suite: &Suite) {
    setup(suite);
    let outage = Outage::stopped(suite);
    outage.end();
    let failed_open = fail_open_count(suite, WEBHOOK);
    let (_, pod) = create_timed(suite, &pinned("after-restart"));
    // Without podmend serving again, the pod would be stored as created, as in the outage.
    assert!(
        pod["metadata"]["annotations"]["podmend.io/mutated"]
            .as_str()
            .is_some_and(|rules| rules.contains("node-affinity")),
        "the pod carries podmend's repair: {pod}"
    );
    assert_eq!(
        pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
        json!({"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [NODE]}
        ]}]}),
        "nodeName became required node affinity on metadata.name"
    );
    assert_eq!(
        fail_open_count(suite, WEBHOOK),
        failed_open,
        "no call to {WEBHOOK} failed open after the restart"
    );
}
