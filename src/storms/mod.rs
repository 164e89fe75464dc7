//! `podmend clean-storms`: deletes the `Failed` pods of a kubelet rejection storm (the
//! nodeName storm that ran before podmend was installed, or while its webhook was away), all
//! but the newest few of each owner, which Kubernetes itself leaves until 12,500 terminated
//! pods pile up cluster wide (the pod GC's default threshold).
//!
//! A storm is what `audit --cluster` reports as one: the `Failed` pods of one controller with
//! one kubelet admission rejection reason ([`failed_pod_group`], [`is_admission_rejection`]),
//! at least `--threshold` of them. [`plan`] lists the `Failed` pods page by page and decides;
//! [`execute`] deletes in the plan's order through a [`TokenBucket`], each delete with a
//! precondition on the pod's UID, and posts an Event on each owner. Nothing else is ever
//! deleted: not another phase, not another reason, not an owner below the threshold, not the
//! newest `--keep`.

pub mod metrics;
pub mod ratelimit;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, PostParams, Preconditions,
};
use serde_json::Value;

use crate::audit::ObjectRef;
use crate::audit::cluster::client::{ClusterAuditError, chain};
use crate::audit::cluster::lister::Lister;
use crate::audit::cluster::symptoms::{
    controller_of, describe, failed_pod_group, is_admission_rejection,
};
use crate::audit::cluster::{text, thousands};
use ratelimit::TokenBucket;

/// The Event reason on a storm's owner.
pub const EVENT_REASON: &str = "StormCleanedUp";
/// Deletes in flight at once; the token bucket alone decides the rate.
const IN_FLIGHT: usize = 8;
/// What `clean-storms` needs when a list is forbidden.
const NEEDS: &str = "clean-storms needs list and delete on pods and create on events (the chart's storm-cleanup CronJob has them), or use -n NAMESPACE";

/// How to clean.
#[derive(Debug, Clone, PartialEq)]
pub struct CleanOptions {
    /// Only this namespace; `None` for all namespaces.
    pub namespace: Option<String>,
    /// Pods per list request.
    pub page_size: u32,
    /// An owner's Failed pods of one reason are a storm from this many on.
    pub threshold: usize,
    /// The newest this many of each storm are kept (for inspection).
    pub keep: usize,
    /// Deletes per second, at most (a token bucket of capacity 1).
    pub deletes_per_second: f64,
    /// Only list what would be deleted.
    pub dry_run: bool,
    /// Only these reasons; empty: every kubelet admission rejection.
    pub reasons: Vec<String>,
    /// Progress on stderr (a terminal).
    pub progress: bool,
}

impl Default for CleanOptions {
    fn default() -> Self {
        Self {
            namespace: None,
            page_size: 500,
            threshold: 50,
            keep: 5,
            deletes_per_second: 10.0,
            dry_run: false,
            reasons: Vec::new(),
            progress: false,
        }
    }
}

/// What can stop a clean-up, each with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum StormError {
    #[error(transparent)]
    Cluster(#[from] ClusterAuditError),
    #[error(
        "--reason {0} is not a kubelet admission rejection; clean-storms only deletes pods the kubelet refused to admit (OutOfcpu, OutOfmemory, OutOf<resource>, NodeAffinity, NodeName, NodePorts, TaintToleration, TopologyAffinityError, SMTAlignmentError, …)"
    )]
    NotARejection(String),
    #[error(
        "not allowed to delete pod {pod} (403 Forbidden: {message}); clean-storms needs delete on pods (the chart's storm-cleanup CronJob has it), or run it with --dry-run"
    )]
    DeleteForbidden { pod: String, message: String },
    #[error(transparent)]
    Metrics(#[from] metrics::MetricsError),
    #[error("cannot write the output: {0}")]
    Write(#[source] std::io::Error),
}

/// One `Failed` pod of a storm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StormPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `metadata.creationTimestamp`, RFC 3339 (empty when absent).
    pub created: String,
}

/// One owner's storm: its `Failed` pods of one reason, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Storm {
    pub owner: ObjectRef,
    /// The owner's UID, from the pods' `ownerReferences` (for the Event).
    pub owner_uid: String,
    pub reason: String,
    /// Deleted, in this order: every pod but the newest `keep`, oldest first.
    pub delete: Vec<StormPod>,
    /// The newest `keep`, kept.
    pub keep: Vec<StormPod>,
}

impl Storm {
    pub fn count(&self) -> usize {
        self.delete.len() + self.keep.len()
    }
}

/// What a clean-up will do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupPlan {
    /// Biggest first; ties by namespace, owner kind, owner name, reason.
    pub storms: Vec<Storm>,
    /// `Failed` pods listed (the API server's `status.phase=Failed` selection).
    pub listed: usize,
    /// Groups of storm pods below the threshold (left alone).
    pub below_threshold: usize,
    /// List requests sent.
    pub list_requests: usize,
}

impl CleanupPlan {
    /// The pods to delete, in the order the real run deletes them.
    pub fn deletions(&self) -> impl Iterator<Item = (&Storm, &StormPod)> {
        self.storms
            .iter()
            .flat_map(|storm| storm.delete.iter().map(move |pod| (storm, pod)))
    }
}

/// Decides from `pods` (JSON objects as the API server shows them) what to delete: pods in
/// phase `Failed` with a kubelet admission rejection reason (only `options.reasons` when
/// given), grouped by their controller and reason as the audit groups them; a group of at
/// least `options.threshold` is a storm and loses all but its newest `options.keep`
/// (by `creationTimestamp`, ties by name). Pods without a controller are never a storm:
/// nothing recreates them.
pub fn plan_from_pods<'a>(
    pods: impl IntoIterator<Item = &'a Value>,
    options: &CleanOptions,
) -> CleanupPlan {
    let mut grouper = StormGrouper::new(options);
    for pod in pods {
        grouper.add(pod);
    }
    grouper.plan()
}

/// One controller's `Failed` pods of one reason.
struct OwnerGroup {
    owner: ObjectRef,
    owner_uid: String,
    pods: Vec<StormPod>,
}

/// (namespace, owner kind, owner name, reason).
type GroupKey = (String, String, String, String);

/// Groups `Failed` pods one at a time as they are listed, keeping of each selected pod only
/// what the clean-up uses ([`StormPod`], and its owner and reason once per group): a storm
/// of 12,560 pods is never held as 12,560 whole pods (BENCHMARKS.md, storm clean-up memory).
pub struct StormGrouper<'a> {
    options: &'a CleanOptions,
    groups: BTreeMap<GroupKey, OwnerGroup>,
    listed: usize,
}

impl<'a> StormGrouper<'a> {
    pub fn new(options: &'a CleanOptions) -> Self {
        Self {
            options,
            groups: BTreeMap::new(),
            listed: 0,
        }
    }

    /// Counts `pod` and, when it is selected (phase `Failed`, a wanted reason, a
    /// controller), keeps what the clean-up needs of it.
    pub fn add(&mut self, pod: &Value) {
        self.listed += 1;
        let Some((owner, reason)) = failed_pod_group(pod) else {
            return;
        };
        let wanted = if self.options.reasons.is_empty() {
            is_admission_rejection(&reason)
        } else {
            self.options.reasons.contains(&reason)
        };
        let Some(controller) = controller_of(pod) else {
            return;
        };
        if !wanted {
            return;
        }
        let key = (
            owner.namespace.clone(),
            owner.kind.clone(),
            owner.name.clone(),
            reason,
        );
        let group = self.groups.entry(key).or_insert_with(|| OwnerGroup {
            owner,
            owner_uid: controller.uid.clone(),
            pods: Vec::new(),
        });
        group.pods.push(StormPod {
            namespace: text(pod, "/metadata/namespace").to_string(),
            name: text(pod, "/metadata/name").to_string(),
            uid: text(pod, "/metadata/uid").to_string(),
            created: text(pod, "/metadata/creationTimestamp").to_string(),
        });
    }

    /// The plan: each group of at least the threshold a storm, biggest first.
    pub fn plan(self) -> CleanupPlan {
        let options = self.options;
        let mut plan = CleanupPlan {
            listed: self.listed,
            ..CleanupPlan::default()
        };
        for ((_, _, _, reason), group) in self.groups {
            let OwnerGroup {
                owner,
                owner_uid,
                mut pods,
            } = group;
            if pods.len() < options.threshold.max(1) {
                plan.below_threshold += 1;
                continue;
            }
            pods.sort_by(|a, b| {
                created_at(&a.created)
                    .cmp(&created_at(&b.created))
                    .then_with(|| a.name.cmp(&b.name))
            });
            let keep = pods.split_off(pods.len().saturating_sub(options.keep));
            plan.storms.push(Storm {
                owner,
                owner_uid,
                reason,
                delete: pods,
                keep,
            });
        }
        // Biggest first; the map's order breaks ties (a stable sort).
        plan.storms
            .sort_by_key(|storm| std::cmp::Reverse(storm.count()));
        plan
    }
}

/// A creation time for ordering: parsed, so that any RFC 3339 spelling orders right; an
/// absent or unreadable one first (the oldest: deleted first, never the one kept).
fn created_at(text: &str) -> Option<Timestamp> {
    text.parse().ok()
}

/// Lists the `Failed` pods (`fieldSelector=status.phase=Failed`, page by page) and plans.
pub async fn plan(client: &Client, options: &CleanOptions) -> Result<CleanupPlan, StormError> {
    for reason in &options.reasons {
        if !is_admission_rejection(reason) {
            return Err(StormError::NotARejection(reason.clone()));
        }
    }
    let lister = Lister {
        page_size: options.page_size.max(1),
        namespace: options.namespace.as_deref(),
        progress: options.progress,
        needs: NEEDS,
    };
    let resource = ApiResource::erase::<Pod>(&());
    let mut grouper = StormGrouper::new(options);
    let params = ListParams::default().fields("status.phase=Failed");
    let (_, requests) = lister
        .list_json(client, &resource, "Failed pods", params, |pod| {
            grouper.add(&pod)
        })
        .await?;
    if options.progress {
        eprintln!();
    }
    let mut plan = grouper.plan();
    plan.list_requests = requests;
    Ok(plan)
}

/// Per reason, what the run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReasonCounts {
    pub selected: usize,
    pub deleted: usize,
    pub kept: usize,
}

/// What a clean-up did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CleanupOutcome {
    pub dry_run: bool,
    pub storms: usize,
    pub by_reason: BTreeMap<String, ReasonCounts>,
    pub deleted: usize,
    pub kept: usize,
    /// Already deleted when its turn came (404).
    pub gone: usize,
    /// A pod of the same name with another UID (409 on the UID precondition): left alone.
    pub recreated: usize,
    /// Refused by the API server for another reason.
    pub failed: usize,
    pub events_posted: usize,
    pub events_failed: usize,
    pub api_requests: usize,
    pub duration: Duration,
    pub finished_unix: u64,
    /// The run stopped on an error before it finished.
    pub stopped: bool,
}

impl CleanupOutcome {
    /// Before anything is deleted: the plan's storms, what each reason selects and keeps,
    /// and its list requests.
    fn planned(plan: &CleanupPlan, dry_run: bool) -> Self {
        let mut outcome = CleanupOutcome {
            dry_run,
            storms: plan.storms.len(),
            api_requests: plan.list_requests,
            ..CleanupOutcome::default()
        };
        for storm in &plan.storms {
            let counts = outcome.by_reason.entry(storm.reason.clone()).or_default();
            counts.selected += storm.delete.len();
            counts.kept += storm.keep.len();
            outcome.kept += storm.keep.len();
        }
        outcome
    }

    /// Counts how one delete ended (a failure also on stderr); true when `pod` was deleted.
    fn count(&mut self, pod: &StormPod, deleted: Deleted) -> bool {
        match deleted {
            Deleted::Yes => {
                self.deleted += 1;
                return true;
            }
            Deleted::Gone => self.gone += 1,
            Deleted::Recreated => self.recreated += 1,
            Deleted::Failed(why) => {
                self.failed += 1;
                eprintln!(
                    "podmend clean-storms: pod {}/{}: {why}",
                    pod.namespace, pod.name
                );
            }
        }
        false
    }

    /// A run that stopped on an error after `duration`: nothing counted, not a success.
    fn stopped(dry_run: bool, duration: Duration) -> Self {
        CleanupOutcome {
            dry_run,
            duration,
            finished_unix: unix_now(),
            stopped: true,
            ..CleanupOutcome::default()
        }
    }

    /// The run finished, and no delete and no Event failed.
    pub fn succeeded(&self) -> bool {
        !self.stopped && self.failed == 0 && self.events_failed == 0
    }

    /// The one line a run ends with.
    pub fn summary(&self) -> String {
        let storms = match self.storms {
            1 => "1 storm".to_string(),
            n => format!("{} storms", thousands(n)),
        };
        let selected: usize = self.by_reason.values().map(|c| c.selected).sum();
        let took = format!("{:.1} s", self.duration.as_secs_f64());
        if self.dry_run {
            return format!(
                "clean-storms (dry run): {storms}, {} Failed pods would be deleted, {} kept, nothing deleted ({} API requests, {took})",
                thousands(selected),
                thousands(self.kept),
                thousands(self.api_requests)
            );
        }
        format!(
            "clean-storms: {storms}, {} Failed pods deleted, {} kept, {} already gone, {} recreated (left alone), {} failed; {} Events posted ({} API requests, {took})",
            thousands(self.deleted),
            thousands(self.kept),
            thousands(self.gone),
            thousands(self.recreated),
            thousands(self.failed),
            thousands(self.events_posted),
            thousands(self.api_requests)
        )
    }
}

/// One line per pod the plan deletes, in the order the real run deletes them.
pub fn dry_run_lines(plan: &CleanupPlan) -> impl Iterator<Item = String> + '_ {
    plan.deletions().map(|(storm, pod)| {
        let created = if pod.created.is_empty() {
            "no creation time".to_string()
        } else {
            format!("created {}", pod.created)
        };
        format!(
            "would delete pod {}/{} ({}, {created}, of {})",
            pod.namespace,
            pod.name,
            storm.reason,
            describe(&storm.owner)
        )
    })
}

/// How one delete ended.
enum Deleted {
    Yes,
    Gone,
    Recreated,
    Failed(String),
}

/// Carries out `plan`: deletes each pod (UID precondition) through the token bucket, in the
/// plan's order, then posts one Event per storm on its owner. Writes one line per storm to
/// `out` and a line per failure to stderr. With `options.dry_run` it deletes nothing and
/// writes [`dry_run_lines`] instead.
pub async fn execute(
    client: &Client,
    plan: &CleanupPlan,
    options: &CleanOptions,
    out: &mut dyn Write,
) -> Result<CleanupOutcome, StormError> {
    let started = Instant::now();
    let mut outcome = CleanupOutcome::planned(plan, options.dry_run);
    let write =
        |out: &mut dyn Write, line: String| writeln!(out, "{line}").map_err(StormError::Write);
    if options.dry_run {
        for line in dry_run_lines(plan) {
            write(out, line)?;
        }
    } else {
        let mut cleaner = Cleaner {
            client,
            options,
            bucket: Arc::new(tokio::sync::Mutex::new(TokenBucket::new(
                options.deletes_per_second,
                1.0,
                Instant::now(),
            ))),
            total: plan.storms.iter().map(|s| s.delete.len()).sum(),
            done: 0,
        };
        for storm in &plan.storms {
            let deleted = cleaner.clean(storm, &mut outcome).await?;
            write(
                out,
                format!(
                    "{}: deleted {} Failed pod{} ({}), kept the newest {}",
                    describe(&storm.owner),
                    thousands(deleted),
                    if deleted == 1 { "" } else { "s" },
                    storm.reason,
                    storm.keep.len()
                ),
            )?;
        }
    }
    outcome.duration = started.elapsed();
    outcome.finished_unix = unix_now();
    Ok(outcome)
}

/// What the deletes of one run share: the rate limit and the progress count.
struct Cleaner<'a> {
    client: &'a Client,
    options: &'a CleanOptions,
    bucket: Arc<tokio::sync::Mutex<TokenBucket>>,
    /// Pods the plan deletes, and deletes sent so far.
    total: usize,
    done: usize,
}

impl Cleaner<'_> {
    /// Deletes one storm's pods, counting each result in `outcome`, then posts the Event on
    /// its owner if any pod was deleted; returns how many were.
    async fn clean(
        &mut self,
        storm: &Storm,
        outcome: &mut CleanupOutcome,
    ) -> Result<usize, StormError> {
        let pods: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &storm.owner.namespace,
            &ApiResource::erase::<Pod>(&()),
        );
        let mut results = futures::stream::iter(storm.delete.iter())
            .map(|pod| {
                let (pods, bucket) = (pods.clone(), self.bucket.clone());
                async move {
                    // The stream polls in the plan's order and the lock is fair, so deletes
                    // take their tokens, and go out, in that order; the lock is held while
                    // waiting, so that each goes out a full interval after the one before.
                    bucket.lock().await.acquire().await;
                    (pod, delete_pod(&pods, pod).await)
                }
            })
            .buffered(IN_FLIGHT);
        let mut deleted = 0;
        while let Some((pod, result)) = results.next().await {
            outcome.api_requests += 1;
            self.done += 1;
            if outcome.count(pod, result?) {
                deleted += 1;
            }
            if self.options.progress {
                eprint!(
                    "\rdeleting… {}/{}",
                    thousands(self.done),
                    thousands(self.total)
                );
            }
        }
        if let Some(counts) = outcome.by_reason.get_mut(&storm.reason) {
            counts.deleted += deleted;
        }
        if deleted > 0 {
            self.post_event(storm, deleted, outcome).await;
        }
        if self.options.progress {
            eprintln!();
        }
        Ok(deleted)
    }

    /// Posts the Event on the storm's owner; a failure is counted and reported on stderr.
    async fn post_event(&self, storm: &Storm, deleted: usize, outcome: &mut CleanupOutcome) {
        outcome.api_requests += 1;
        match post_event(self.client, storm, deleted, self.options).await {
            Ok(()) => outcome.events_posted += 1,
            Err(why) => {
                outcome.events_failed += 1;
                eprintln!(
                    "podmend clean-storms: no Event on {}: {why}",
                    describe(&storm.owner)
                );
            }
        }
    }
}

async fn delete_pod(api: &Api<DynamicObject>, pod: &StormPod) -> Result<Deleted, StormError> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(pod.uid.clone()).filter(|uid| !uid.is_empty()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&pod.name, &params).await {
        Ok(_) => Ok(Deleted::Yes),
        Err(kube::Error::Api(status)) => match status.code {
            404 => Ok(Deleted::Gone),
            409 => Ok(Deleted::Recreated),
            401 => Err(ClusterAuditError::Unauthorized {
                url: None,
                message: status.message,
            }
            .into()),
            403 => Err(StormError::DeleteForbidden {
                pod: format!("{}/{}", pod.namespace, pod.name),
                message: status.message,
            }),
            code => Ok(Deleted::Failed(format!(
                "delete refused ({code} {}: {})",
                status.reason, status.message
            ))),
        },
        Err(error) => Ok(Deleted::Failed(format!("delete failed: {}", chain(&error)))),
    }
}

/// The Event's message: what was deleted, what was kept, and why.
pub fn event_message(storm: &Storm, deleted: usize, options: &CleanOptions) -> String {
    format!(
        "podmend deleted {} Failed pod{} ({}: rejected by the kubelet at admission) of this {}, keeping the newest {}: {} such pods reached the threshold of {} (podmend clean-storms); Kubernetes garbage-collects terminated pods only above 12,500 cluster wide",
        thousands(deleted),
        if deleted == 1 { "" } else { "s" },
        storm.reason,
        storm.owner.kind,
        storm.keep.len(),
        thousands(storm.count()),
        thousands(options.threshold)
    )
}

async fn post_event(
    client: &Client,
    storm: &Storm,
    deleted: usize,
    options: &CleanOptions,
) -> Result<(), String> {
    let now = Timestamp::now();
    let owner = &storm.owner;
    let event = Event {
        metadata: ObjectMeta {
            name: Some(format!(
                "{}.{:x}",
                owner.name,
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos()
            )),
            namespace: Some(owner.namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some(owner.api_version.clone()).filter(|v| !v.is_empty()),
            kind: Some(owner.kind.clone()),
            name: Some(owner.name.clone()),
            namespace: Some(owner.namespace.clone()),
            uid: Some(storm.owner_uid.clone()).filter(|uid| !uid.is_empty()),
            ..ObjectReference::default()
        },
        reason: Some(EVENT_REASON.to_string()),
        message: Some(event_message(storm, deleted, options)),
        type_: Some("Normal".to_string()),
        source: Some(EventSource {
            component: Some("podmend".to_string()),
            host: None,
        }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        ..Event::default()
    };
    let api: Api<Event> = Api::namespaced(client.clone(), &owner.namespace);
    match api.create(&PostParams::default(), &event).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => Err(format!(
            "{} {}: {}{}",
            status.code,
            status.reason,
            status.message,
            if status.code == 403 {
                "; clean-storms needs create on events"
            } else {
                ""
            }
        )),
        Err(error) => Err(chain(&error)),
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// Everything `podmend clean-storms` is told.
#[derive(Debug, Clone, PartialEq)]
pub struct CleanStormsOptions {
    /// Kubeconfig file; `None`: `$KUBECONFIG`, `~/.kube/config`, in-cluster.
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context; `None`: the current one.
    pub context: Option<String>,
    /// What to clean and how.
    pub clean: CleanOptions,
    /// Write the run's metrics to this file (Prometheus text format).
    pub metrics_file: Option<PathBuf>,
    /// Push the run's metrics to this Pushgateway (`http://HOST:PORT`).
    pub pushgateway: Option<String>,
}

/// Runs `podmend clean-storms`: plans, cleans (or lists, with `--dry-run`), prints the summary
/// line, hands the metrics over. True when nothing failed. A run that stops on an error
/// (the API server unreachable, a list or delete forbidden, a bad `--reason`) still hands
/// over metrics, with `success` 0, so that the last success does not stand for it.
pub async fn clean_command(
    options: &CleanStormsOptions,
    out: &mut dyn Write,
) -> Result<bool, StormError> {
    let started = Instant::now();
    match clean_and_summarize(options, out).await {
        Ok(outcome) => {
            hand_over_metrics(options, &outcome).await?;
            Ok(outcome.succeeded())
        }
        Err(error) => {
            let stopped = CleanupOutcome::stopped(options.clean.dry_run, started.elapsed());
            if let Err(metrics_error) = hand_over_metrics(options, &stopped).await {
                eprintln!("podmend clean-storms: {metrics_error}");
            }
            Err(error)
        }
    }
}

/// Plans, cleans and prints the summary line.
async fn clean_and_summarize(
    options: &CleanStormsOptions,
    out: &mut dyn Write,
) -> Result<CleanupOutcome, StormError> {
    let clean = &options.clean;
    let client = crate::audit::cluster::client_for(
        options.kubeconfig.as_deref(),
        options.context.as_deref(),
    )
    .await?;
    let plan = plan(&client, clean).await?;
    let mut outcome = execute(&client, &plan, clean, out).await?;
    // client_for's GET /version, which checks the API server answers.
    outcome.api_requests += 1;
    writeln!(out, "{}", outcome.summary()).map_err(StormError::Write)?;
    Ok(outcome)
}

/// Writes the metrics file and pushes to the Pushgateway, as the options ask.
async fn hand_over_metrics(
    options: &CleanStormsOptions,
    outcome: &CleanupOutcome,
) -> Result<(), StormError> {
    let text = metrics::render(outcome);
    if let Some(path) = &options.metrics_file {
        metrics::write_file(path, &text)?;
    }
    if let Some(url) = &options.pushgateway {
        metrics::push(url, options.clean.namespace.as_deref(), &text).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str, owner: Option<&str>, phase: &str, reason: &str, created: &str) -> Value {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "creationTimestamp": created},
            "status": {"phase": phase, "reason": reason}});
        if let Some(owner) = owner {
            pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": owner, "uid": format!("uid-{owner}"), "controller": true}]);
        }
        pod
    }

    fn options(threshold: usize, keep: usize) -> CleanOptions {
        CleanOptions {
            threshold,
            keep,
            ..CleanOptions::default()
        }
    }

    #[test]
    fn a_storm_keeps_its_newest_pods_and_deletes_the_rest_oldest_first() {
        let pods: Vec<Value> = (0..6)
            .map(|i| {
                pod(
                    &format!("p{i}"),
                    Some("rs"),
                    "Failed",
                    "OutOfcpu",
                    &format!("2025-06-02T10:00:0{}Z", 5 - i),
                )
            })
            .collect();
        let plan = plan_from_pods(&pods, &options(3, 2));
        assert_eq!(plan.storms.len(), 1);
        let storm = &plan.storms[0];
        let names = |pods: &[StormPod]| pods.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&storm.delete), ["p5", "p4", "p3", "p2"]);
        assert_eq!(names(&storm.keep), ["p1", "p0"]);
        assert_eq!(storm.owner_uid, "uid-rs");
    }

    #[test]
    fn equal_creation_times_order_by_name() {
        let pods: Vec<Value> = ["b", "a", "c"]
            .iter()
            .map(|n| {
                pod(
                    n,
                    Some("rs"),
                    "Failed",
                    "OutOfmemory",
                    "2025-06-02T10:00:00Z",
                )
            })
            .collect();
        let plan = plan_from_pods(&pods, &options(1, 1));
        let storm = &plan.storms[0];
        assert_eq!(
            storm
                .delete
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(storm.keep[0].name, "c");
    }

    #[test]
    fn other_phases_reasons_bare_pods_and_small_groups_are_never_selected() {
        let mut pods = vec![
            pod("running", Some("rs"), "Running", "", "2025-06-02T10:00:00Z"),
            pod(
                "evicted",
                Some("rs"),
                "Failed",
                "Evicted",
                "2025-06-02T10:00:00Z",
            ),
            pod(
                "no-reason",
                Some("rs"),
                "Failed",
                "",
                "2025-06-02T10:00:00Z",
            ),
            pod("bare", None, "Failed", "OutOfcpu", "2025-06-02T10:00:00Z"),
            pod(
                "small",
                Some("other"),
                "Failed",
                "OutOfcpu",
                "2025-06-02T10:00:00Z",
            ),
        ];
        pods.extend((0..3).map(|i| {
            pod(
                &format!("s{i}"),
                Some("rs"),
                "Failed",
                "NodeAffinity",
                "2025-06-02T10:00:00Z",
            )
        }));
        let plan = plan_from_pods(&pods, &options(2, 0));
        assert_eq!(plan.storms.len(), 1);
        assert_eq!(plan.storms[0].reason, "NodeAffinity");
        assert_eq!(plan.storms[0].delete.len(), 3);
        assert_eq!(plan.below_threshold, 1, "the other ReplicaSet's single pod");
    }

    #[test]
    fn only_the_reasons_asked_for_are_selected() {
        let pods: Vec<Value> = (0..4)
            .map(|i| {
                pod(
                    &format!("p{i}"),
                    Some("rs"),
                    "Failed",
                    if i % 2 == 0 { "OutOfcpu" } else { "OutOfpods" },
                    "2025-06-02T10:00:00Z",
                )
            })
            .collect();
        let mut only = options(1, 0);
        only.reasons = vec!["OutOfpods".to_string()];
        let plan = plan_from_pods(&pods, &only);
        assert_eq!(plan.storms.len(), 1);
        assert_eq!(plan.storms[0].reason, "OutOfpods");
    }

    #[test]
    fn the_dry_run_lists_the_plan_in_order_and_the_event_says_what_and_why() {
        let pods: Vec<Value> = (0..3)
            .map(|i| {
                pod(
                    &format!("p{i}"),
                    Some("rs"),
                    "Failed",
                    "OutOfcpu",
                    &format!("2025-06-02T10:00:0{i}Z"),
                )
            })
            .collect();
        let plan = plan_from_pods(&pods, &options(2, 1));
        let lines: Vec<String> = dry_run_lines(&plan).collect();
        assert_eq!(
            lines,
            [
                "would delete pod ns/p0 (OutOfcpu, created 2025-06-02T10:00:00Z, of ReplicaSet ns/rs)",
                "would delete pod ns/p1 (OutOfcpu, created 2025-06-02T10:00:01Z, of ReplicaSet ns/rs)",
            ]
        );
        let message = event_message(&plan.storms[0], 2, &options(2, 1));
        assert!(
            message.starts_with("podmend deleted 2 Failed pods (OutOfcpu"),
            "{message}"
        );
        assert!(message.contains("keeping the newest 1"), "{message}");
        assert!(message.contains("threshold of 2"), "{message}");
    }
}
