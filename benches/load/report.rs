//! Figures of a phase, medians over rounds, podmend/null comparisons, and the text table.

use std::time::Duration;

use serde::Serialize;

use super::phase::Tally;

/// A phase's figures. Latencies in µs, of the OK requests; CPU in µs per request (OK or
/// not) of the measured run. `NaN` (JSON `null`) where there is nothing to measure.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Figures {
    pub requests: f64,
    pub errors: f64,
    pub seconds: f64,
    pub throughput_rps: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    /// How late requests started against their due time (open loop; ~0 in closed loop).
    pub lag_p50_us: f64,
    pub lag_p99_us: f64,
    pub server_cpu_us_per_req: f64,
    pub client_cpu_us_per_req: f64,
}

/// Nearest-rank percentile of sorted values, in µs.
fn percentile_us(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    let ns = sorted[rank.clamp(1, sorted.len()) - 1];
    round1(ns as f64 / 1000.0)
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

impl Figures {
    pub fn new(tally: &Tally, server_cpu: Duration, client_cpu: Duration) -> Figures {
        let requests = tally.ok + tally.errors;
        let seconds = tally.elapsed.as_secs_f64();
        let per_request = |cpu: Duration| {
            if requests == 0 {
                f64::NAN
            } else {
                round1(cpu.as_secs_f64() * 1e6 / requests as f64)
            }
        };
        Figures {
            requests: requests as f64,
            errors: tally.errors as f64,
            seconds: (seconds * 1000.0).round() / 1000.0,
            throughput_rps: if seconds > 0.0 {
                round1(tally.ok as f64 / seconds)
            } else {
                f64::NAN
            },
            p50_us: percentile_us(&tally.latencies, 0.50),
            p90_us: percentile_us(&tally.latencies, 0.90),
            p99_us: percentile_us(&tally.latencies, 0.99),
            p999_us: percentile_us(&tally.latencies, 0.999),
            max_us: percentile_us(&tally.latencies, 1.0),
            lag_p50_us: percentile_us(&tally.lags, 0.50),
            lag_p99_us: percentile_us(&tally.lags, 0.99),
            server_cpu_us_per_req: per_request(server_cpu),
            client_cpu_us_per_req: per_request(client_cpu),
        }
    }

    /// Each figure's median over the rounds, on its own.
    pub fn median(rounds: &[Figures]) -> Figures {
        let m = |get: fn(&Figures) -> f64| median(rounds.iter().map(get).collect());
        Figures {
            requests: m(|f| f.requests),
            errors: m(|f| f.errors),
            seconds: m(|f| f.seconds),
            throughput_rps: m(|f| f.throughput_rps),
            p50_us: m(|f| f.p50_us),
            p90_us: m(|f| f.p90_us),
            p99_us: m(|f| f.p99_us),
            p999_us: m(|f| f.p999_us),
            max_us: m(|f| f.max_us),
            lag_p50_us: m(|f| f.lag_p50_us),
            lag_p99_us: m(|f| f.lag_p99_us),
            server_cpu_us_per_req: m(|f| f.server_cpu_us_per_req),
            client_cpu_us_per_req: m(|f| f.client_cpu_us_per_req),
        }
    }
}

/// Median of the values that are numbers; `NaN` when none is.
fn median(mut values: Vec<f64>) -> f64 {
    values.retain(|v| !v.is_nan());
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let m = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    round1(m)
}

/// podmend (/mutate) against the null webhook, on the medians.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Comparison {
    pub p50_ratio: f64,
    pub p99_ratio: f64,
    pub p99_diff_us: f64,
    pub server_cpu_diff_us_per_req: f64,
    pub throughput_ratio: f64,
}

impl Comparison {
    pub fn new(null: &Figures, podmend: &Figures) -> Comparison {
        let ratio = |a: f64, b: f64| (a / b * 100.0).round() / 100.0;
        Comparison {
            p50_ratio: ratio(podmend.p50_us, null.p50_us),
            p99_ratio: ratio(podmend.p99_us, null.p99_us),
            p99_diff_us: round1(podmend.p99_us - null.p99_us),
            server_cpu_diff_us_per_req: round1(
                podmend.server_cpu_us_per_req - null.server_cpu_us_per_req,
            ),
            throughput_ratio: ratio(podmend.throughput_rps, null.throughput_rps),
        }
    }

    pub fn line(&self) -> String {
        format!(
            "podmend/null: p50 ×{}, p99 ×{}, p99 {} µs, server CPU {} µs/req, throughput ×{}",
            num(self.p50_ratio, 2),
            num(self.p99_ratio, 2),
            signed(self.p99_diff_us),
            signed(self.server_cpu_diff_us_per_req),
            num(self.throughput_ratio, 2),
        )
    }
}

/// A number with `decimals` decimals, `-` when it is not one.
pub fn num(x: f64, decimals: usize) -> String {
    if x.is_finite() {
        format!("{x:.decimals$}")
    } else {
        "-".to_string()
    }
}

fn signed(x: f64) -> String {
    if x.is_finite() {
        format!("{x:+.0}")
    } else {
        "-".to_string()
    }
}

/// The columns of a phase row; `lag` adds the open loop's start lag (µs after the due time).
pub fn header(label: &str, label_width: usize, lag: bool) -> String {
    let mut line = format!(
        "{label:<label_width$} {:>9} {:>6} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8} {:>9} {:>9}",
        "requests",
        "errors",
        "req/s",
        "p50 µs",
        "p90 µs",
        "p99 µs",
        "p99.9 µs",
        "max µs",
        "srv µs/r",
        "cli µs/r",
    );
    if lag {
        line.push_str(&format!(" {:>8} {:>8}", "lag p50", "lag p99"));
    }
    line
}

pub fn row(label: &str, label_width: usize, f: &Figures, lag: bool) -> String {
    let mut line = format!(
        "{label:<label_width$} {:>9} {:>6} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8} {:>9} {:>9}",
        num(f.requests, 0),
        num(f.errors, 0),
        num(f.throughput_rps, 0),
        num(f.p50_us, 0),
        num(f.p90_us, 0),
        num(f.p99_us, 0),
        num(f.p999_us, 0),
        num(f.max_us, 0),
        num(f.server_cpu_us_per_req, 1),
        num(f.client_cpu_us_per_req, 1),
    );
    if lag {
        line.push_str(&format!(
            " {:>8} {:>8}",
            num(f.lag_p50_us, 0),
            num(f.lag_p99_us, 0)
        ));
    }
    line
}
