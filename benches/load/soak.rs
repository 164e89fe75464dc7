//! `--soak SECS`: a long run at a steady rate against one server, in slices of
//! `--sample SECS`, rotating over the selected scenario/protocol pairs. After each slice it
//! prints the slice's figures and the server's RSS, so the memory curve can be read (and
//! plotted from `--json`). Any error fails the run.

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::args::{Options, Proto};
use super::client::Target;
use super::{
    Route, Server, Shape, print_errors, print_server_start, run_phase, runtime, scenarios,
};

/// One slice of the soak: when it ended, what ran, its figures and the RSS after it.
struct Slice {
    at_s: f64,
    pair: String,
    requests: f64,
    errors: u64,
    p50_us: f64,
    p99_us: f64,
    rss_kib: u64,
}

pub fn soak(o: &Options, total: Duration, every: Duration) -> anyhow::Result<()> {
    let scenarios = scenarios()?;
    let pairs: Vec<(usize, Proto)> = o
        .scenarios
        .iter()
        .flat_map(|&s| o.protos.iter().map(move |&p| (s, p)))
        .collect();
    let mut server = Server::start(&o.server_bin)?;
    print_server_start(&server);
    println!(
        "soak: {} for {:.0} s, a slice of {:.0} s at a time over {} scenario/protocol pair(s)",
        o.load.describe(),
        total.as_secs_f64(),
        every.as_secs_f64(),
        pairs.len()
    );
    println!(
        "{:>7} {:<17} {:>9} {:>6} {:>9} {:>9} {:>9}",
        "t (s)", "pair", "requests", "errors", "p50 µs", "p99 µs", "RSS MiB"
    );
    let shape = Shape::of(o);
    let started = Instant::now();
    let mut slices: Vec<Slice> = Vec::new();
    runtime(o)?.block_on(async {
        let targets = [
            Arc::new(Target::new(server.webhook, &server.ca_pem, Proto::H1)?),
            Arc::new(Target::new(server.webhook, &server.ca_pem, Proto::H2)?),
        ];
        let mut next = 0;
        while started.elapsed() < total {
            let (s, proto) = pairs[next % pairs.len()];
            next += 1;
            let scenario = &scenarios[s];
            let target = &targets[if proto == Proto::H1 { 0 } else { 1 }];
            let outcome = run_phase(
                &server,
                target,
                &shape,
                scenario,
                Route::Mutate,
                o.load,
                Duration::ZERO,
                every,
            )
            .await?;
            let slice = Slice {
                at_s: started.elapsed().as_secs_f64(),
                pair: format!("{}/{}", scenario.name, proto.name()),
                requests: outcome.figures.requests,
                errors: outcome.errors(),
                p50_us: outcome.figures.p50_us,
                p99_us: outcome.figures.p99_us,
                rss_kib: server.status_kib("VmRSS")?,
            };
            println!(
                "{:>7.0} {:<17} {:>9.0} {:>6} {:>9.1} {:>9.1} {:>9.1}",
                slice.at_s,
                slice.pair,
                slice.requests,
                slice.errors,
                slice.p50_us,
                slice.p99_us,
                slice.rss_kib as f64 / 1024.0
            );
            let _ = std::io::stdout().flush();
            print_errors(&outcome);
            server.check_alive()?;
            slices.push(slice);
        }
        anyhow::Ok(())
    })?;

    let requests: f64 = slices.iter().map(|s| s.requests).sum();
    let errors: u64 = slices.iter().map(|s| s.errors).sum();
    let rss: Vec<u64> = slices.iter().map(|s| s.rss_kib).collect();
    let (first, last) = (
        rss.first().copied().unwrap_or(0),
        rss.last().copied().unwrap_or(0),
    );
    let (low, high) = (
        rss.iter().copied().min().unwrap_or(0),
        rss.iter().copied().max().unwrap_or(0),
    );
    // Growth over the second half: a leak keeps growing after the allocator has warmed up.
    let half = &rss[rss.len() / 2..];
    let second_half_growth =
        half.last().copied().unwrap_or(0) as i64 - half.first().copied().unwrap_or(0) as i64;
    println!();
    println!(
        "soak: {requests:.0} requests in {:.0} s, {errors} errors; RSS first {:.1} MiB, last {:.1} MiB, \
         min {:.1}, max {:.1}, second-half growth {:+.1} MiB; peak (VmHWM) {:.1} MiB",
        started.elapsed().as_secs_f64(),
        first as f64 / 1024.0,
        last as f64 / 1024.0,
        low as f64 / 1024.0,
        high as f64 / 1024.0,
        second_half_growth as f64 / 1024.0,
        server.status_kib("VmHWM")? as f64 / 1024.0
    );
    if let Some(path) = &o.json {
        let curve: Vec<_> = slices
            .iter()
            .map(|s| {
                json!({"t_s": s.at_s, "pair": s.pair, "requests": s.requests, "errors": s.errors,
                       "p50_us": s.p50_us, "p99_us": s.p99_us, "rss_kib": s.rss_kib})
            })
            .collect();
        let report = json!({"load": o.load.describe(), "seconds": started.elapsed().as_secs_f64(),
                            "requests": requests, "errors": errors, "slices": curve});
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
        println!("soak: figures written to {}", path.display());
    }
    anyhow::ensure!(errors == 0, "soak: {errors} request(s) failed");
    Ok(())
}
