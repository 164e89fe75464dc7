//! Policy `collect`: the pod's dead containers are removed the way the kubelet collects
//! dead containers. An exited container the client did not remove stays (its logs, files
//! and exit code readable) until it has been exited for `--min-age`, or until the pod has
//! more than `--max-exited` dead containers (the oldest go first). A container created and
//! never started (`docker create`) is dead from its creation, as the kubelet counts one
//! (`evictableContainers` in pkg/kubelet/kuberuntime/kuberuntime_gc.go takes every container
//! not running, aged from its creation time). Containers started with `--rm` and `docker
//! compose` containers (kept until `compose down` or the pod's end) are not collected here.
//! Removal is without force, so a container started in the meantime is refused by the
//! daemon and kept.
//!
//! Driven by the daemon's events (`create`, `die`, `start`, `destroy` of the pod's
//! containers), with a full listing after every (re)connection, and a timer for the age
//! limit. [`Ledger`] is the
//! decision, free of I/O; [`run`] feeds it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;

use super::collected::Collected;
use super::docker::{DockerClient, DockerError, Event, Removal};
use super::metrics::{GuardMetrics, Reason};
use super::policy::{COMPOSE_PROJECT_LABEL, OWNER_LABEL, REAP_LABEL};

/// Longest pause before reconnecting to the event stream.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The timer never sleeps longer than this (clock changes, a very long `--min-age`).
const MAX_SLEEP: Duration = Duration::from_secs(3600);

/// The collection limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub min_age: Duration,
    pub max_exited: u32,
}

/// Whether a container with `labels` is collected once exited: created through the guard
/// without `--rm` (the guard labelled it `podmend.io/reap=true`) and not by `docker compose`.
pub fn collectable(labels: &BTreeMap<String, String>) -> bool {
    labels.get(REAP_LABEL).map(String::as_str) == Some("true")
        && !labels.contains_key(COMPOSE_PROJECT_LABEL)
}

/// The pod's collectable exited containers and when each exited.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Ledger {
    exited: HashMap<String, SystemTime>,
}

impl Ledger {
    /// `id` exited at `at`.
    pub fn exited(&mut self, id: &str, at: SystemTime) {
        self.exited.insert(id.to_string(), at);
    }

    /// `id` runs again, was removed, or is being removed: not exited any more.
    pub fn forget(&mut self, id: &str) {
        self.exited.remove(id);
    }

    /// Everything the daemon listed, replacing what was known.
    pub fn replace(&mut self, exited: HashMap<String, SystemTime>) {
        self.exited = exited;
    }

    pub fn len(&self) -> usize {
        self.exited.len()
    }

    pub fn is_empty(&self) -> bool {
        self.exited.is_empty()
    }

    /// What to remove at `now`, oldest first: every container exited for `min_age` or
    /// longer, then, of the rest, the oldest beyond `max_exited`.
    pub fn due(&self, now: SystemTime, limits: Limits) -> Vec<(String, Reason)> {
        let mut by_age: Vec<(&String, &SystemTime)> = self.exited.iter().collect();
        by_age.sort_by(|a, b| a.1.cmp(b.1).then_with(|| a.0.cmp(b.0)));
        let (old, young): (Vec<_>, Vec<_>) = by_age.into_iter().partition(|(_, at)| {
            now.duration_since(**at)
                .is_ok_and(|exited_for| exited_for >= limits.min_age)
        });
        let beyond = young.len().saturating_sub(limits.max_exited as usize);
        old.into_iter()
            .map(|(id, _)| (id.clone(), Reason::MinAge))
            .chain(
                young
                    .into_iter()
                    .take(beyond)
                    .map(|(id, _)| (id.clone(), Reason::MaxExited)),
            )
            .collect()
    }

    /// When the next container reaches `min_age`.
    pub fn next_deadline(&self, min_age: Duration) -> Option<SystemTime> {
        self.exited.values().min().map(|at| *at + min_age)
    }
}

/// Follows the daemon's events for the pod `owner` and removes its exited containers by
/// `limits` until aborted. Never returns: connection failures are logged and retried.
/// What it removes is remembered in `collected`.
pub async fn run(
    client: DockerClient,
    owner: String,
    limits: Limits,
    metrics: Arc<GuardMetrics>,
    collected: Arc<Collected>,
) {
    let label = format!("{OWNER_LABEL}={owner}");
    let filters = json!({"type": ["container"], "label": [label]});
    let mut ledger = Ledger::default();
    let mut backoff = Duration::from_millis(100);
    let mut warned = false;
    loop {
        let mut stream = match client.events(&filters).await {
            Ok(stream) => stream,
            Err(error) => {
                if !warned {
                    tracing::warn!(%error, "cannot follow the daemon's events to collect exited containers; retrying");
                    warned = true;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        // Subscribed first, listed second: nothing that happens in between is missed.
        match resync(&client, &label).await {
            Ok(exited) => ledger.replace(exited),
            Err(error) => {
                tracing::warn!(%error, "cannot list the pod's containers; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        }
        if warned {
            tracing::info!("following the daemon's events again");
            warned = false;
        }
        backoff = Duration::from_millis(100);
        collect_due(&client, &mut ledger, limits, &metrics, &collected).await;
        loop {
            let sleep = ledger.next_deadline(limits.min_age).map(|deadline| {
                deadline
                    .duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO)
                    .min(MAX_SLEEP)
            });
            tokio::select! {
                event = stream.next() => match event {
                    Ok(Some(event)) => {
                        apply(&mut ledger, &event);
                        collected.saw(&event);
                        collect_due(&client, &mut ledger, limits, &metrics, &collected).await;
                    }
                    Ok(None) | Err(_) => {
                        tracing::debug!("the daemon's event stream ended; reconnecting");
                        break;
                    }
                },
                () = tokio::time::sleep(sleep.unwrap_or(MAX_SLEEP)), if sleep.is_some() => {
                    collect_due(&client, &mut ledger, limits, &metrics, &collected).await;
                }
            }
        }
    }
}

/// One event into the ledger.
fn apply(ledger: &mut Ledger, event: &Event) {
    if event.kind != "container" {
        return;
    }
    let id = event.actor.id.as_str();
    match event.action.as_str() {
        "create" | "die" if collectable(&event.actor.attributes) => {
            let at = u64::try_from(event.time_nano)
                .ok()
                .filter(|n| *n > 0)
                .map_or_else(SystemTime::now, |n| UNIX_EPOCH + Duration::from_nanos(n));
            ledger.exited(id, at);
        }
        "start" | "restart" | "destroy" => ledger.forget(id),
        _ => {}
    }
}

/// The pod's collectable exited containers as the daemon lists them, each with the time
/// it exited.
async fn resync(
    client: &DockerClient,
    label: &str,
) -> Result<HashMap<String, SystemTime>, DockerError> {
    let mut exited = HashMap::new();
    for container in client.containers_with_label(label).await? {
        let labels = container.labels.clone().unwrap_or_default();
        if !matches!(container.state.as_str(), "created" | "exited" | "dead")
            || !collectable(&labels)
        {
            continue;
        }
        let finished = match client.finished_at(&container.id).await {
            Ok(finished) => finished.unwrap_or(container.created),
            Err(DockerError::Status { status: 404, .. }) => continue,
            Err(error) => return Err(error),
        };
        let at = UNIX_EPOCH + Duration::from_secs(u64::try_from(finished).unwrap_or(0));
        exited.insert(container.id, at);
    }
    Ok(exited)
}

/// Removes what is due, logs and counts it.
async fn collect_due(
    client: &DockerClient,
    ledger: &mut Ledger,
    limits: Limits,
    metrics: &GuardMetrics,
    collected: &Collected,
) {
    for (id, reason) in ledger.due(SystemTime::now(), limits) {
        ledger.forget(&id);
        let short = id.get(..12).unwrap_or(&id);
        match client.remove_stopped(&id).await {
            Ok(Removal::Removed) => {
                metrics.container_removed(reason);
                collected.removed(&id);
                tracing::info!(id = short, %reason, "removed an exited container of this pod");
            }
            Ok(Removal::AlreadyGone) => {}
            Ok(Removal::InUse) => {
                tracing::info!(id = short, %reason, "kept a container: it runs again")
            }
            Err(error) => {
                tracing::warn!(%error, id = short, "cannot remove an exited container of this pod")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    fn ledger(entries: &[(&str, u64)]) -> Ledger {
        let mut ledger = Ledger::default();
        for (id, exited) in entries {
            ledger.exited(id, at(*exited));
        }
        ledger
    }

    #[test]
    fn exited_containers_go_by_age_then_beyond_the_count_oldest_first() {
        let limits = |min_age, max_exited| Limits {
            min_age: Duration::from_secs(min_age),
            max_exited,
        };
        let reasons = |due: Vec<(String, Reason)>| -> Vec<(String, &'static str)> {
            due.into_iter().map(|(id, r)| (id, r.as_str())).collect()
        };
        let owned = |pairs: &[(&str, &'static str)]| -> Vec<(String, &'static str)> {
            pairs.iter().map(|(id, r)| (id.to_string(), *r)).collect()
        };
        let three = ledger(&[("c", 300), ("a", 100), ("b", 200)]);
        // (ledger, now, limits, expected)
        let table = [
            (three.clone(), 250, limits(300, 20), vec![]),
            (three.clone(), 400, limits(300, 20), vec![("a", "min-age")]),
            (
                three.clone(),
                600,
                limits(300, 20),
                vec![("a", "min-age"), ("b", "min-age"), ("c", "min-age")],
            ),
            (
                three.clone(),
                301,
                limits(300, 2),
                vec![("a", "max-exited")],
            ),
            (
                three.clone(),
                301,
                limits(300, 0),
                vec![
                    ("a", "max-exited"),
                    ("b", "max-exited"),
                    ("c", "max-exited"),
                ],
            ),
            (
                three.clone(),
                450,
                limits(300, 1),
                vec![("a", "min-age"), ("b", "max-exited")],
            ),
            (
                three.clone(),
                300,
                limits(0, 20),
                vec![("a", "min-age"), ("b", "min-age"), ("c", "min-age")],
            ),
            // Exited "in the future" (clocks apart): young.
            (ledger(&[("x", 900)]), 100, limits(300, 20), vec![]),
            (Ledger::default(), 100, limits(0, 0), vec![]),
        ];
        for (ledger, now, limits, expected) in table {
            assert_eq!(
                reasons(ledger.due(at(now), limits)),
                owned(&expected),
                "now {now}, {limits:?}, {ledger:?}"
            );
        }
    }

    #[test]
    fn the_timer_wakes_when_the_oldest_reaches_the_minimum_age() {
        let ledger = ledger(&[("b", 200), ("a", 100)]);
        assert_eq!(ledger.next_deadline(Duration::from_secs(60)), Some(at(160)));
        assert_eq!(
            Ledger::default().next_deadline(Duration::from_secs(60)),
            None
        );
    }

    fn event(action: &str, id: &str, labels: &[(&str, &str)], time_nano: i64) -> Event {
        Event {
            kind: "container".to_string(),
            action: action.to_string(),
            actor: super::super::docker::Actor {
                id: id.to_string(),
                attributes: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            },
            time_nano,
        }
    }

    #[test]
    fn die_records_start_and_destroy_forget_and_only_collectable_containers_count() {
        let reap = [(REAP_LABEL, "true"), ("name", "b")];
        let compose = [(REAP_LABEL, "true"), (COMPOSE_PROJECT_LABEL, "p")];
        let mut ledger = Ledger::default();
        apply(&mut ledger, &event("die", "a", &reap, 5_000_000_000));
        assert_eq!(ledger, self::ledger(&[("a", 5)]));
        apply(&mut ledger, &event("die", "rm", &[("name", "x")], 6));
        apply(&mut ledger, &event("die", "compose", &compose, 6));
        assert_eq!(
            ledger.len(),
            1,
            "--rm and compose containers are not collected"
        );
        apply(&mut ledger, &event("start", "a", &reap, 7));
        assert!(ledger.is_empty());
        apply(&mut ledger, &event("die", "a", &reap, 8_000_000_000));
        apply(&mut ledger, &event("destroy", "a", &reap, 9));
        assert!(ledger.is_empty());
    }

    #[test]
    fn a_created_container_counts_as_dead_from_its_creation_until_it_starts() {
        let reap = [(REAP_LABEL, "true")];
        let mut ledger = Ledger::default();
        apply(&mut ledger, &event("create", "c", &reap, 3_000_000_000));
        assert_eq!(ledger, self::ledger(&[("c", 3)]));
        apply(&mut ledger, &event("start", "c", &reap, 4_000_000_000));
        assert!(ledger.is_empty());
        apply(&mut ledger, &event("create", "rm", &[], 5));
        assert!(ledger.is_empty(), "--rm containers are not collected");
    }
}
