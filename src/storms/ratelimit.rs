//! A token bucket: the client-side rate limit of `clean-storms`, so that the API server sees
//! at most `rate` deletes per second (plus the bucket's capacity once, after an idle spell).
//!
//! The bucket is pure arithmetic on the instants it is given ([`TokenBucket::reserve`]), so
//! its accuracy is tested without a clock; [`TokenBucket::acquire`] sleeps for the
//! reservation. A sleep never ends early (tokio rounds up to its millisecond timer), so a
//! reservation is a lower bound on the send time: the limit holds.

use std::time::{Duration, Instant};

/// Tokens refill continuously at `rate` per second up to `capacity`; each request takes one.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    capacity: f64,
    /// May go negative: tokens already promised to reservations still waiting.
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

    /// Takes one token at `now`; returns how long to wait before using it (zero when one was
    /// there). Reservations are served in the order they are made.
    pub fn reserve(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed * self.rate).min(self.capacity);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }

    /// Waits for a token.
    pub async fn acquire(&mut self) {
        let wait = self.reserve(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The send times of `n` requests made back to back: each goes out when its
    /// reservation says.
    fn send_times(bucket: &mut TokenBucket, start: Instant, n: usize) -> Vec<Instant> {
        let mut now = start;
        (0..n)
            .map(|_| {
                now += bucket.reserve(now);
                now
            })
            .collect()
    }

    #[test]
    fn back_to_back_requests_are_spaced_one_over_the_rate_apart() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(20.0, 1.0, start);
        let times = send_times(&mut bucket, start, 101);
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
            let times = send_times(&mut bucket, start, 3000);
            let mut first = 0;
            for last in 0..times.len() {
                while times[last] - times[first] >= Duration::from_secs(1) {
                    first += 1;
                }
                let in_window = (last - first + 1) as f64;
                assert!(
                    in_window <= rate + capacity,
                    "{in_window} in one second at rate {rate}, capacity {capacity}"
                );
            }
        }
    }

    #[test]
    fn an_idle_bucket_refills_to_its_capacity_and_no_further() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(10.0, 3.0, start);
        let later = start + Duration::from_secs(60);
        let waits: Vec<Duration> = (0..4).map(|_| bucket.reserve(later)).collect();
        assert_eq!(&waits[..3], &[Duration::ZERO; 3]);
        assert!(
            (waits[3].as_secs_f64() - 0.1).abs() < 1e-9,
            "{:?}",
            waits[3]
        );
    }

    #[test]
    fn a_capacity_below_one_still_lets_requests_through() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(2.0, 0.0, start);
        assert_eq!(bucket.reserve(start), Duration::ZERO);
        assert!((bucket.reserve(start).as_secs_f64() - 0.5).abs() < 1e-9);
    }
}
