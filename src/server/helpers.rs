//! Threads that take reviews off the worker that read them while reviews are repairs, so that
//! repairs spread over the cores while cheap reviews stay where they were read.
//!
//! Why not a worker per core: on two cores shared with other busy processes (the API server's
//! host, or a load generator beside the webhook), a second busy worker costs the cheap reviews
//! more than it gives. Three busy threads on two cores are switched in and out every few
//! milliseconds, and a review waits for its worker's turn: the typical pod's p99 was 3.4-4.6 ms
//! with two workers and 1.2-1.5 ms with one (BENCHMARKS.md, issue 17, twenty-seventh pass).
//! A repair costs about three typical reviews, so there one worker alone leaves the second
//! core idle (0.38× nginx against 0.53×). With one worker and one helper, a worker whose last
//! review was cheap answers the next itself and the helper sleeps; while rules act, the worker
//! hands each review it reads to a free helper, and answers it itself when none is free: on two
//! shared cores, the typical pod at 1.1-1.2× nginx and the repair at 0.59-0.66× (twenty-eighth
//! pass). Over a single HTTP/2 connection the hand-over brought no more repairs a second there
//! and cost each a fifth to a third more CPU: the worker then often idles until the answer.
//!
//! Which reviews are handed over is a guess from the last review answered: the object's
//! sketch, which says whether a rule may act, borrows the body, and a helper would have to
//! read the body again (a quarter of a repair's cost). A wrong guess only moves a review to
//! another thread: its answer is the same.

use std::io;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};

/// A review handed to a helper, with where its answer goes.
type Job = Box<dyn FnOnce() + Send>;

/// How many reviews each helper may hold, the one it runs included: two, so that a helper
/// finds the next one waiting while the worker is busy answering another itself.
const HELD_PER_HELPER: usize = 2;

/// The helper threads, the reviews they hold, and whether rules acted on the last review.
pub(super) struct Helpers {
    queue: Option<Sender<Job>>,
    held: Arc<AtomicUsize>,
    capacity: usize,
    repairs_lately: AtomicBool,
}

impl Helpers {
    /// `count` helper threads; none runs every review where it was read.
    pub(super) fn start(count: usize) -> io::Result<Self> {
        let mut helpers = Self {
            queue: None,
            held: Arc::new(AtomicUsize::new(0)),
            capacity: count * HELD_PER_HELPER,
            repairs_lately: AtomicBool::new(false),
        };
        if count == 0 {
            return Ok(helpers);
        }
        let (queue, jobs) = channel::<Job>();
        let jobs = Arc::new(Mutex::new(jobs));
        for index in 0..count {
            let jobs = jobs.clone();
            // Detached: a helper ends when the last sender is dropped with the routes.
            std::thread::Builder::new()
                .name(format!("podmend-review-{index}"))
                .spawn(move || run_jobs(&jobs))?;
        }
        helpers.queue = Some(queue);
        Ok(helpers)
    }

    pub(super) fn count(&self) -> usize {
        self.capacity / HELD_PER_HELPER
    }

    /// Runs `review` on a helper when the last review answered was one rules acted on and a
    /// helper has room, and here otherwise. `None` when `review` panicked on a helper, which a
    /// review that catches its own panics never does.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        review: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let Some(queue) = self.queue.as_ref().filter(|_| self.hand_over()) else {
            return Some(review());
        };
        let (answer, answered) = tokio::sync::oneshot::channel();
        let held = self.held.clone();
        let job: Job = Box::new(move || {
            let reviewed = std::panic::catch_unwind(AssertUnwindSafe(review));
            // The place is free before the answer is: whoever reads the answer may hand over
            // another review at once.
            held.fetch_sub(1, Ordering::Relaxed);
            if let Ok(reviewed) = reviewed {
                let _ = answer.send(reviewed);
            }
        });
        if let Err(refused) = queue.send(job) {
            // Every helper thread is gone: the review is answered here, as without helpers.
            tracing::warn!("review helpers gone; answering on the worker");
            (refused.0)();
        }
        answered.await.ok()
    }

    /// Says whether rules acted on the review just answered: the next one is handed over only
    /// if they did.
    pub(super) fn rules_acted(&self, acted: bool) {
        // Written only when it changes: the workers share the line, and most reviews repeat it.
        if self.repairs_lately.load(Ordering::Relaxed) != acted {
            self.repairs_lately.store(acted, Ordering::Relaxed);
        }
    }

    /// Whether the next review goes to a helper, and if so its place taken.
    fn hand_over(&self) -> bool {
        self.repairs_lately.load(Ordering::Relaxed)
            && self
                .held
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                    (held < self.capacity).then_some(held + 1)
                })
                .is_ok()
    }
}

/// A helper's loop: the next job, until the queue's senders are gone. A job catches its
/// review's panic (its caller is told the review went unanswered), so a helper outlives it.
fn run_jobs(jobs: &Mutex<Receiver<Job>>) {
    loop {
        let next = jobs.lock().unwrap_or_else(|e| e.into_inner()).recv();
        let Ok(job) = next else { return };
        job();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread_name() -> String {
        std::thread::current()
            .name()
            .unwrap_or_default()
            .to_string()
    }

    #[tokio::test]
    async fn a_review_after_cheap_ones_is_answered_where_it_was_read() {
        let helpers = Helpers::start(1).expect("helpers start");
        let here = thread_name();
        assert_eq!(helpers.run(thread_name).await, Some(here.clone()));
        helpers.rules_acted(false);
        assert_eq!(helpers.run(thread_name).await, Some(here));
    }

    #[tokio::test]
    async fn a_review_after_a_repair_goes_to_a_helper() {
        let helpers = Helpers::start(1).expect("helpers start");
        helpers.rules_acted(true);
        let ran = helpers.run(thread_name).await;
        assert_eq!(ran.as_deref(), Some("podmend-review-0"));
        helpers.rules_acted(false);
        assert_ne!(helpers.run(thread_name).await, ran);
    }

    #[tokio::test]
    async fn a_review_is_answered_where_it_was_read_while_the_helpers_are_full() {
        let helpers = Arc::new(Helpers::start(1).expect("helpers start"));
        helpers.rules_acted(true);
        // Two reviews that wait for the test fill the helper's places.
        let mut releases = Vec::new();
        let mut held = Vec::new();
        for _ in 0..HELD_PER_HELPER {
            let (release, released) = std::sync::mpsc::channel::<()>();
            releases.push(release);
            let helpers = helpers.clone();
            held.push(tokio::spawn(async move {
                helpers
                    .run(move || {
                        let _ = released.recv();
                        thread_name()
                    })
                    .await
            }));
        }
        while helpers.held.load(Ordering::Relaxed) < HELD_PER_HELPER {
            tokio::task::yield_now().await;
        }
        let here = thread_name();
        assert_eq!(helpers.run(thread_name).await, Some(here));
        drop(releases);
        for review in held {
            let ran = review.await.expect("the held review ends");
            assert_eq!(ran.as_deref(), Some("podmend-review-0"));
        }
        assert_eq!(helpers.held.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn without_helpers_every_review_is_answered_where_it_was_read() {
        let helpers = Helpers::start(0).expect("no helpers start");
        assert_eq!(helpers.count(), 0);
        helpers.rules_acted(true);
        assert_eq!(helpers.run(thread_name).await, Some(thread_name()));
    }

    #[tokio::test]
    async fn a_review_that_panics_on_a_helper_is_reported_unanswered_and_frees_its_place() {
        let helpers = Helpers::start(1).expect("helpers start");
        helpers.rules_acted(true);
        let panicked = helpers
            .run(|| -> u8 { panic!("a review that panics") })
            .await;
        assert_eq!(panicked, None);
        assert_eq!(helpers.held.load(Ordering::Relaxed), 0);
        // The helper thread lives on.
        let ran = helpers.run(thread_name).await;
        assert_eq!(ran.as_deref(), Some("podmend-review-0"));
    }
}
