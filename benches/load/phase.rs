//! One phase: a set of connections, a warm-up, then a measured run, closed or open loop.
//!
//! Both loops share one dispatcher: a pool of C slots (an HTTP/1.1 connection each, or a
//! handle on a shared HTTP/2 connection), a task per request that hands its slot back with
//! the outcome. Closed loop: a slot back is a new request at once. Open loop: request k is
//! due at t0 + k/R (a timerfd wakes the dispatcher at that time); it waits for a free slot
//! if it must, and its latency counts from its due time, so a stall shows in the figures
//! (no coordinated omission).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::sync::mpsc;

use super::args::{Load, Proto};
use super::client::{self, RequestTemplate, Sender, Target};
use super::timer::Deadline;

/// Error messages kept per phase.
const KEPT_ERRORS: usize = 5;
/// After a failed reconnect, a slot waits this long before it is used again.
const RECONNECT_PAUSE: Duration = Duration::from_millis(10);

/// What every request of a phase shares.
pub struct Shared {
    pub target: Arc<Target>,
    pub template: RequestTemplate,
    pub timeout: Duration,
}

/// One request in flight at a time.
pub struct Slot {
    /// `None` after a transport error: the next request reconnects first.
    sender: Option<Sender>,
}

impl Slot {
    async fn exchange(&mut self, shared: &Shared) -> Result<(), String> {
        let sender = match &mut self.sender {
            Some(sender) => sender,
            empty => match shared.target.connect().await {
                Ok(sender) => empty.insert(sender),
                Err(e) => {
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                    return Err(format!("reconnecting: {e}"));
                }
            },
        };
        match client::exchange(sender, &shared.template).await {
            Ok((status, body)) => client::check_answer(status, &body),
            Err(e) => {
                self.sender = None;
                Err(format!("transport: {e}"))
            }
        }
    }

    /// One request outside any timing, answer returned: the pre-flight check.
    pub async fn probe(
        &mut self,
        shared: &Shared,
    ) -> Result<(hyper::StatusCode, bytes::Bytes), String> {
        let sender = self
            .sender
            .as_mut()
            .ok_or_else(|| "no connection".to_string())?;
        match tokio::time::timeout(shared.timeout, client::exchange(sender, &shared.template)).await
        {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {:?}", shared.timeout)),
        }
    }
}

/// Opens the connections of a phase: `h1_connections` for HTTP/1.1; for HTTP/2
/// `h2_connections` connections shared round-robin by `h2_streams` slots.
pub async fn open_slots(
    target: &Target,
    h1_connections: usize,
    h2_connections: usize,
    h2_streams: usize,
) -> anyhow::Result<Vec<Slot>> {
    let connect = |i: usize| async move {
        target
            .connect()
            .await
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("opening connection {} to {}", i + 1, target.addr))
    };
    let mut slots = Vec::new();
    match target.proto {
        Proto::H1 => {
            for i in 0..h1_connections {
                slots.push(Slot {
                    sender: Some(connect(i).await?),
                });
            }
        }
        Proto::H2 => {
            let mut connections = Vec::new();
            for i in 0..h2_connections {
                connections.push(connect(i).await?);
            }
            for i in 0..h2_streams {
                let sender = connections[i % connections.len()]
                    .share()
                    .context("an HTTP/2 connection came back as HTTP/1.1")?;
                slots.push(Slot {
                    sender: Some(sender),
                });
            }
        }
    }
    Ok(slots)
}

/// What one run recorded.
#[derive(Default)]
pub struct Tally {
    /// Latency of every OK request, ns, sorted.
    pub latencies: Vec<u64>,
    /// For every request started, ns from its due time to its start (open loop: the
    /// dispatcher's wake-up and any wait for a free slot; closed loop: ~0).
    pub lags: Vec<u64>,
    pub ok: u64,
    pub errors: u64,
    pub first_errors: Vec<String>,
    /// From the start to the last answer.
    pub elapsed: Duration,
}

impl Tally {
    fn error(&mut self, message: String) {
        self.errors += 1;
        if self.first_errors.len() < KEPT_ERRORS {
            self.first_errors.push(message);
        }
    }
}

fn record(tally: &mut Tally, done: Done) {
    tally.lags.push(done.lag.as_nanos() as u64);
    match done.result {
        Ok(()) => {
            tally.ok += 1;
            tally.latencies.push(done.latency.as_nanos() as u64);
        }
        Err(e) => tally.error(e),
    }
}

struct Done {
    latency: Duration,
    lag: Duration,
    result: Result<(), String>,
}

type DoneTx = mpsc::UnboundedSender<(Slot, Done)>;

fn dispatch(shared: &Arc<Shared>, mut slot: Slot, due: Instant, done: &DoneTx) {
    let shared = shared.clone();
    let done = done.clone();
    tokio::spawn(async move {
        let started = Instant::now();
        let result = match tokio::time::timeout(shared.timeout, slot.exchange(&shared)).await {
            Ok(result) => result,
            Err(_) => {
                // The connection is in an unknown state: replace it.
                slot.sender = None;
                Err(format!("no answer within {:?}", shared.timeout))
            }
        };
        let finished = Instant::now();
        let outcome = Done {
            latency: finished - due,
            lag: started.saturating_duration_since(due),
            result,
        };
        let _ = done.send((slot, outcome));
    });
}

/// Runs the load for `duration` on `slots`, and hands the slots back.
pub async fn run(
    shared: &Arc<Shared>,
    slots: Vec<Slot>,
    load: Load,
    duration: Duration,
) -> anyhow::Result<(Vec<Slot>, Tally)> {
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(Slot, Done)>();
    let mut tally = Tally::default();
    let mut idle = slots;
    let total = idle.len();
    let start = Instant::now();
    let end = start + duration;
    match load {
        Load::Max => loop {
            while let Some(slot) = idle.pop() {
                let now = Instant::now();
                if now >= end {
                    idle.push(slot);
                    break;
                }
                dispatch(shared, slot, now, &done_tx);
            }
            if idle.len() == total {
                break;
            }
            let Some((slot, done)) = done_rx.recv().await else {
                break;
            };
            record(&mut tally, done);
            idle.push(slot);
        },
        Load::Rate(rate) => {
            // Requests still due this long after the end are not sent but counted as errors:
            // the rate was not sustained, and the phase must end.
            let give_up = end + duration.max(Duration::from_secs(2));
            let deadline = Deadline::new().context("create the open loop's timerfd")?;
            let due_at = |k: u64| start + Duration::from_secs_f64(k as f64 / rate);
            let mut next = 0u64;
            let mut next_due = due_at(0);
            let mut backlog = std::collections::VecDeque::new();
            loop {
                // Everything due by now joins the backlog, with its due time kept.
                let now = Instant::now();
                while next_due < end && next_due <= now {
                    backlog.push_back(next_due);
                    next += 1;
                    next_due = due_at(next);
                }
                while !idle.is_empty() {
                    let Some(due) = backlog.pop_front() else {
                        break;
                    };
                    if now > give_up {
                        tally.error(format!(
                            "not sent: due at +{:.3} s, and the run is {:?} past its end",
                            (due - start).as_secs_f64(),
                            give_up - end
                        ));
                        continue;
                    }
                    if let Some(slot) = idle.pop() {
                        dispatch(shared, slot, due, &done_tx);
                    }
                }
                let more_due = next_due < end;
                if !more_due && backlog.is_empty() && idle.len() == total {
                    break;
                }
                // With no free slot, the next due time can wait: it is caught up on above.
                tokio::select! {
                    biased;
                    Some((slot, done)) = done_rx.recv(), if idle.len() < total => {
                        record(&mut tally, done);
                        idle.push(slot);
                    }
                    woke = deadline.until(next_due), if more_due && !idle.is_empty() => {
                        woke.context("wait on the open loop's timerfd")?;
                    }
                    else => break,
                }
            }
        }
    }
    tally.elapsed = start.elapsed();
    tally.latencies.sort_unstable();
    tally.lags.sort_unstable();
    Ok((idle, tally))
}
