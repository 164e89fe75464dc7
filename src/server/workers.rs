//! The threads that serve the webhook's connections: single-threaded runtimes, each owning
//! the connections handed to it, as nginx's and Envoy's workers do; one per core the process
//! may use but one, with a review helper beside them (see `helpers`).
//!
//! A connection's reading and writing then never cross threads. On tokio's work-stealing
//! runtime, a task woken on one worker and run on another cost the null route a quarter to a
//! third more CPU per request on two cores, and the typical review an eighth (BENCHMARKS.md,
//! issue 17, sixth pass); a review handed to a helper crosses twice, which a repair, three
//! typical reviews' work, pays for. The API server sends its reviews over one HTTP/2
//! connection per instance, and a core answers ~70,000 typical reviews a second; with the
//! chart's CPU limit of 1 there is one worker and no helper. The accept loop hands new
//! connections to the workers in turn; the watches, reloads and the metrics port stay on the
//! main runtime, so a relist of every Node never waits in a review's queue.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::thread::JoinHandle;

use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};

/// Work for a worker: a future it spawns on its own runtime, where it is first polled.
type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The worker threads, and which one gets the next connection.
pub(super) struct Workers {
    queues: Vec<UnboundedSender<Job>>,
    threads: Vec<JoinHandle<()>>,
    next: usize,
}

impl Workers {
    /// `count` worker threads (at least one), each with its runtime started.
    pub(super) fn start(count: usize) -> io::Result<Self> {
        let mut workers = Self {
            queues: Vec::new(),
            threads: Vec::new(),
            next: 0,
        };
        for index in 0..count.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (queue, mut jobs) = unbounded_channel::<Job>();
            let thread = std::thread::Builder::new()
                .name(format!("podmend-webhook-{index}"))
                .spawn(move || {
                    runtime.block_on(async move {
                        while let Some(job) = jobs.recv().await {
                            tokio::spawn(job);
                        }
                    });
                    // Dropping the runtime here cancels what is still running: the accept
                    // loop only stops its workers once the drain is over or has timed out.
                })?;
            workers.queues.push(queue);
            workers.threads.push(thread);
        }
        Ok(workers)
    }

    pub(super) fn count(&self) -> usize {
        self.queues.len()
    }

    /// Runs `job` on the next worker in turn. A worker outlives every job it runs (a task that
    /// panics ends alone); should its thread be gone anyway, `job` runs on the calling runtime.
    pub(super) fn spawn(&mut self, job: impl Future<Output = ()> + Send + 'static) {
        let index = self.next % self.queues.len();
        self.next = self.next.wrapping_add(1);
        if let Err(refused) = self.queues[index].send(Box::pin(job)) {
            tracing::warn!(
                worker = index,
                "webhook worker gone; serving on the main runtime"
            );
            tokio::spawn(refused.0);
        }
    }

    /// Stops the workers, cancelling what they still run, and waits for their threads.
    pub(super) async fn stop(self) {
        let Self {
            queues, threads, ..
        } = self;
        drop(queues);
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Long enough for any loaded machine; a job that never runs fails the test, not hangs it.
    const PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

    /// Where each of `jobs` jobs ran, as thread names, in the order they were handed over.
    async fn run_on(workers: &mut Workers, jobs: usize) -> Vec<String> {
        let ran = Arc::new(Mutex::new(vec![String::new(); jobs]));
        let (done, mut finished) = unbounded_channel();
        for job in 0..jobs {
            let (ran, done) = (ran.clone(), done.clone());
            workers.spawn(async move {
                let name = std::thread::current()
                    .name()
                    .unwrap_or_default()
                    .to_string();
                ran.lock().unwrap()[job] = name;
                let _ = done.send(());
            });
        }
        for _ in 0..jobs {
            let done = tokio::time::timeout(PATIENCE, finished.recv()).await;
            done.expect("every job runs in time")
                .expect("every job finishes");
        }
        ran.lock().unwrap().clone()
    }

    #[tokio::test]
    async fn connections_are_handed_to_the_workers_in_turn() {
        let mut workers = Workers::start(3).expect("workers start");
        let ran = run_on(&mut workers, 6).await;
        let expected: Vec<String> = (0..6)
            .map(|i| format!("podmend-webhook-{}", i % 3))
            .collect();
        assert_eq!(ran, expected);
        workers.stop().await;
    }

    #[tokio::test]
    async fn there_is_always_at_least_one_worker() {
        let mut workers = Workers::start(0).expect("workers start");
        assert_eq!(workers.count(), 1);
        let ran: BTreeSet<String> = run_on(&mut workers, 2).await.into_iter().collect();
        assert_eq!(ran, BTreeSet::from(["podmend-webhook-0".to_string()]));
        workers.stop().await;
    }

    #[tokio::test]
    async fn stopping_cancels_what_the_workers_still_run_and_joins_them() {
        let mut workers = Workers::start(2).expect("workers start");
        let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel::<()>();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
        workers.spawn(async move {
            let _dropped_when_cancelled = dropped_tx;
            let _ = started_tx.send(());
            std::future::pending::<()>().await;
        });
        let started = tokio::time::timeout(PATIENCE, started_rx).await;
        started
            .expect("the job starts in time")
            .expect("the job starts");
        workers.stop().await;
        // The job's future was dropped with its worker's runtime, and with it the sender.
        let dropped = tokio::time::timeout(PATIENCE, dropped_rx).await;
        assert!(dropped.expect("the job is cancelled").is_err());
    }
}
