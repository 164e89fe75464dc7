//! What policy `collect` removed, remembered so that a client asking for one of those
//! containers afterwards (`docker logs`, `docker cp`, `docker inspect` of a container it ran
//! minutes ago) learns from the daemon's "No such container" that the guard removed it, and
//! under which limits, rather than searching for what else did. The collector
//! ([`collect`](super::collect)) feeds it; the relay ([`proxy`](super::proxy)) reads it.
//! Bounded: the most recent [`REMEMBERED`] removals.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use super::docker::Event;

/// How many removed containers are remembered.
pub const REMEMBERED: usize = 1000;

/// The containers policy `collect` removed, by id and name.
#[derive(Debug)]
pub struct Collected {
    /// The policy's limits, as the message says them.
    limits: String,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Names of the pod's containers, from their events, until removed.
    names: HashMap<String, String>,
    /// Removed containers, oldest first: (id, name).
    removed: VecDeque<(String, String)>,
}

impl Collected {
    pub fn new(min_age: Duration, max_exited: u32) -> Self {
        Self {
            limits: format!(
                "--min-age {} and --max-exited {max_exited}",
                crate::dind::format_duration(min_age)
            ),
            inner: Mutex::new(Inner::default()),
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Learns a container's name from one of its events (`create`, `die` carry it).
    pub fn saw(&self, event: &Event) {
        if event.kind != "container" {
            return;
        }
        let Some(name) = event.actor.attributes.get("name") else {
            return;
        };
        let mut inner = self.inner();
        if event.action == "destroy" {
            inner.names.remove(&event.actor.id);
        } else if inner.names.len() < 4 * REMEMBERED || inner.names.contains_key(&event.actor.id) {
            inner.names.insert(
                event.actor.id.clone(),
                name.trim_start_matches('/').to_string(),
            );
        }
    }

    /// Remembers that the collector removed the container `id`.
    pub fn removed(&self, id: &str) {
        let mut inner = self.inner();
        let name = inner.names.remove(id).unwrap_or_default();
        if inner.removed.len() >= REMEMBERED {
            inner.removed.pop_front();
        }
        inner.removed.push_back((id.to_string(), name));
    }

    /// The message for a request about `reference` (a name, an id or an id prefix, in any
    /// case) when it names a container the collector removed.
    pub fn message(&self, reference: &str) -> Option<String> {
        let reference = reference.trim_start_matches('/').to_ascii_lowercase();
        if reference.is_empty() {
            return None;
        }
        let inner = self.inner();
        let is_hex = reference.bytes().all(|b| b.is_ascii_hexdigit());
        let (id, name) = inner.removed.iter().rev().find(|(id, name)| {
            name.to_ascii_lowercase() == reference || (is_hex && id.starts_with(&reference))
        })?;
        let short = id.get(..12).unwrap_or(id);
        let called = if name.is_empty() {
            String::new()
        } else {
            format!(" {name}")
        };
        Some(format!(
            "No such container: {reference} (podmend guard, policy collect: this pod's exited container{called} ({short}) was removed by the guard's collection of exited containers ({}); read its logs and files before then, run it with a name and remove it yourself, or ask for the pod annotation podmend.io/dind-policy: reap to keep exited containers until the pod ends)",
            self.limits
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::docker::Actor;

    fn event(action: &str, id: &str, name: &str) -> Event {
        Event {
            kind: "container".to_string(),
            action: action.to_string(),
            actor: Actor {
                id: id.to_string(),
                attributes: [("name".to_string(), name.to_string())].into(),
            },
            time_nano: 0,
        }
    }

    #[test]
    fn a_removed_container_is_found_by_name_id_or_id_prefix_and_others_are_not() {
        let collected = Collected::new(Duration::from_secs(300), 20);
        collected.saw(&event("die", "abcdef0123456789", "build-1"));
        collected.saw(&event("die", "fedcba9876543210", "kept"));
        collected.removed("abcdef0123456789");
        for reference in ["build-1", "/build-1", "BUILD-1", "abcdef0123456789", "abc"] {
            let message = collected.message(reference).expect(reference);
            assert!(message.contains("policy collect"), "{message}");
            assert!(message.contains("--min-age 5m"), "{message}");
            assert!(message.contains("--max-exited 20"), "{message}");
            assert!(message.contains(" build-1 "), "{message}");
        }
        for reference in ["kept", "fedcba", "build", "", "abcdef01234567890"] {
            assert_eq!(collected.message(reference), None, "{reference}");
        }
    }

    #[test]
    fn only_the_most_recent_removals_are_remembered() {
        let collected = Collected::new(Duration::from_secs(300), 20);
        for i in 0..=REMEMBERED {
            collected.removed(&format!("{i:016x}"));
        }
        assert_eq!(collected.message(&format!("{:016x}", 0)), None);
        assert!(collected.message(&format!("{REMEMBERED:016x}")).is_some());
    }
}
