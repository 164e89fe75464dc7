//! A token bucket: the client-side rate limit of `clean-storms`, so that the API server sees
//! at most `rate` deletes per second (plus the bucket's capacity once, after an idle spell).
//!
//! Tokens are taken at the moment a request really goes out ([`TokenBucket::take`]), not when
//! its turn was computed: a sender that wakes late (a busy runtime, a stalled machine) makes
//! the next ones wait their full interval after it, so late requests never bunch up into a
//! burst. The arithmetic works on the instants it is given, so its accuracy is tested without
//! a clock; [`TokenBucket::acquire`] sleeps (a tokio sleep never ends early).

use std::time::{Duration, Instant};

/// A token short of 1 by less than this counts as whole: floating point refills a wait
/// computed to the nanosecond to 0.999999….
const EPSILON: f64 = 1e-6;

/// Tokens refill continuously at `rate` per second up to `capacity`; each request takes one.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    capacity: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket. `rate` is per second and must be positive; `capacity` is at least 1.
    pub fn new(rate: f64, capacity: f64, now: Instant) -> Self {
        let capacity = capacity.max(1.0);
        Self {
            rate: rate.max(f64::MIN_POSITIVE),
            capacity,
            tokens: capacity,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed * self.rate).min(self.capacity);
    }

    /// How long from `now` until a token is there (zero when one is).
    pub fn wait(&mut self, now: Instant) -> Duration {
        self.refill(now);
        if self.tokens >= 1.0 - EPSILON {
            Duration::ZERO
        } else {
            // Rounded up to the next nanosecond: never a token early.
            Duration::from_secs_f64((1.0 - self.tokens) / self.rate) + Duration::from_nanos(1)
        }
    }

    /// Takes a token at `now`, the moment the request goes out; false (nothing taken) when
    /// none is there yet.
    pub fn take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 - EPSILON {
            self.tokens = (self.tokens - 1.0).max(0.0);
            true
        } else {
            false
        }
    }

    /// Waits for a token and takes it. Callers that share a bucket hold it (a fair lock)
    /// across this call, so that they go out in the order they asked, one interval apart.
    pub async fn acquire(&mut self) {
        loop {
            let wait = self.wait(Instant::now());
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            if self.take(Instant::now()) {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The send times of `n` requests made back to back, each sender waking `late(i)` after
    /// its token was due.
    fn send_times(
        bucket: &mut TokenBucket,
        start: Instant,
        n: usize,
        late: impl Fn(usize) -> Duration,
    ) -> Vec<Instant> {
        let mut now = start;
        (0..n)
            .map(|i| {
                let wait = bucket.wait(now);
                if !wait.is_zero() {
                    now += wait + late(i);
                }
                assert!(bucket.take(now), "a token at {:?}", now - start);
                now
            })
            .collect()
    }

    fn busiest_second(times: &[Instant]) -> usize {
        let mut most = 0;
        let mut first = 0;
        for last in 0..times.len() {
            while times[last] - times[first] >= Duration::from_secs(1) {
                first += 1;
            }
            most = most.max(last - first + 1);
        }
        most
    }

    #[test]
    fn back_to_back_requests_are_spaced_one_over_the_rate_apart() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(20.0, 1.0, start);
        let times = send_times(&mut bucket, start, 101, |_| Duration::ZERO);
        assert_eq!(times[0], start, "the first token is there");
        let span = times[100] - times[0];
        assert!((span.as_secs_f64() - 5.0).abs() < 1e-6, "{span:?}");
        for pair in times.windows(2) {
            let gap = (pair[1] - pair[0]).as_secs_f64();
            assert!((gap - 0.05).abs() < 1e-6, "{gap}");
        }
    }

    #[test]
    fn no_window_of_a_second_holds_more_than_rate_plus_capacity() {
        for (rate, capacity) in [(10.0, 1.0), (7.5, 1.0), (100.0, 5.0), (1000.0, 1.0)] {
            let start = Instant::now();
            let mut bucket = TokenBucket::new(rate, capacity, start);
            let times = send_times(&mut bucket, start, 3000, |_| Duration::ZERO);
            let most = busiest_second(&times) as f64;
            assert!(
                most <= rate + capacity,
                "{most} in one second at rate {rate}, capacity {capacity}"
            );
        }
    }

    #[test]
    fn senders_that_wake_late_never_bunch_up_behind_them() {
        // Every seventh sender wakes 30 ms late (a stalled runtime): the ones after it still
        // go out a full interval apart, so no second ever holds more than the rate plus one.
        let start = Instant::now();
        let mut bucket = TokenBucket::new(100.0, 1.0, start);
        let times = send_times(&mut bucket, start, 2000, |i| {
            Duration::from_millis(if i % 7 == 0 { 30 } else { 0 })
        });
        assert!(busiest_second(&times) <= 101, "{}", busiest_second(&times));
        for pair in times.windows(2) {
            assert!(pair[1] - pair[0] >= Duration::from_millis(10) - Duration::from_nanos(1));
        }
    }

    #[test]
    fn an_idle_bucket_refills_to_its_capacity_and_no_further() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(10.0, 3.0, start);
        let later = start + Duration::from_secs(60);
        assert!((0..3).all(|_| bucket.take(later)));
        assert!(!bucket.take(later));
        assert!((bucket.wait(later).as_secs_f64() - 0.1).abs() < 1e-9);
    }

    #[test]
    fn a_capacity_below_one_still_lets_requests_through() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(2.0, 0.0, start);
        assert!(bucket.take(start));
        assert!((bucket.wait(start).as_secs_f64() - 0.5).abs() < 1e-9);
    }
}
