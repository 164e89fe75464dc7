//! The load generator: a running `podmend serve` under real AdmissionReviews over real TLS,
//! HTTP/1.1 and HTTP/2, against the same server's null webhook in the same run.
//!
//! # What it measures
//!
//! It writes a dev PKI with `podmend certs`, starts `podmend serve --benchmark-null-route`
//! on free loopback ports (default info logging, as in production: one log line per
//! admission, to a file), and times **spawn → first 200 on `/readyz`** (polled every 1 ms)
//! and the **idle RSS** right after. Then, for each scenario × protocol, each round runs
//! two phases on fresh connections:
//!
//! 1. `POST /null`: the same server stack (TLS, HTTP, routing, body read) answering a fixed
//!    `allowed: true` without decoding: the baseline;
//! 2. `POST /mutate`: the real webhook.
//!
//! The bodies are the engine bench's (`benches/common/cases.rs`): `pod-small` (the typical
//! pod CREATE, a GKE capture, nothing to repair), `pod-large` (the same pod with 40
//! containers), `deployment` (a Deployment CREATE), `unhandled` (a ConfigMap), `repair` (an
//! agent pod pinned with `nodeName`, which two rules repair). Before each
//! phase, one request checks the answer (`/mutate`: uid echoed, a patch only where the case
//! expects one), so no phase measures an error path. A response is OK when it is a 200
//! whose body contains `"allowed":true`; anything else, a transport error or a timeout is
//! an error, counted, and the first few are printed.
//!
//! # Load shapes
//!
//! - HTTP/1.1: `--connections C` keep-alive connections (default 8), one request in flight
//!   on each; HTTP/2: `--concurrency C` streams in flight (default 8) on `--h2-connections`
//!   connections (default 1).
//! - No `--rate` (or `--rate max`): closed loop, C requests always in flight, latency from
//!   the moment each request starts: maximum throughput.
//! - `--rate R`: open loop. Request k is due at t0 + k/R (a timerfd); it starts on a
//!   free connection or stream as soon as there is one, and its latency counts from its due
//!   time, so a server stall delays, and shows in, every request due during it (no
//!   coordinated omission). `lag p50`/`lag p99` (µs) say how late requests started against
//!   their due time: the timer's wake-up (on the 2-core VM of BENCHMARKS.md a bare C
//!   timerfd + epoll wake-up alone overshoots 40–70 µs at p50) plus any wait for a free
//!   connection. It is in every open-loop latency, null's as much as podmend's, so compare
//!   the two rather than read absolutes.
//!
//! # Figures
//!
//! Per phase: requests, errors, throughput (OK answers per second), latency percentiles of
//! the OK answers (p50/p90/p99/p99.9/max, every latency kept and sorted), the server's CPU
//! time (utime + stime of `/proc/PID/stat`, all threads) per request (`srv µs/r`), and this
//! process's (`cli µs/r`: both share the machine's cores). CPU time comes in clock ticks
//! (10 ms), so it is coarse on short phases: a few seconds at 1,000 req/s is ±3 %; it
//! covers the whole server, logging included. Then each figure's median over the rounds,
//! and podmend against null on those medians: the p50 and p99 ratios, the p99 difference in
//! µs, the extra server CPU per request. At the end: ready time, idle RSS and peak RSS
//! (VmHWM). `--json FILE` writes every figure as JSON.
//!
//! # Running it
//!
//! ```sh
//! cargo bench --bench load -- --proto both --rate 1000 --duration 10 --rounds 3
//! cargo bench --bench load -- --proto h2 --concurrency 64     # maximum throughput
//! cargo bench --bench load -- --help
//! ```
//!
//! Without `--bench` (that is, under `cargo test --all-targets`), it runs a smoke test
//! instead: every scenario, HTTP/1.1 and HTTP/2, null and mutate, for 0.3 s each at
//! maximum rate plus one phase at 200 req/s, and fails on any error; it prints a
//! libtest-style `test result:` line. Name filters select checks (`pod-small/h2`), as
//! libtest's do; other libtest arguments are ignored.

#[path = "load/args.rs"]
mod args;
#[path = "load/client.rs"]
mod client;
#[path = "load/phase.rs"]
mod phase;
#[path = "load/report.rs"]
mod report;
#[path = "load/server.rs"]
mod server;
#[path = "load/soak.rs"]
mod soak;
#[path = "load/timer.rs"]
mod timer;

#[path = "common/cases.rs"]
mod cases;
#[allow(dead_code)]
#[path = "../tests/common/net.rs"]
mod net;
#[path = "common/proc.rs"]
mod proc;
#[path = "common/serve.rs"]
mod serve;
#[path = "../tests/common/spawn.rs"]
mod spawn;

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use podmend::server::paths;
use serde_json::{Value, json};

use args::{Load, Options, Proto, SCENARIOS, USAGE};
use cases::Expect;
use client::{RequestTemplate, Target};
use phase::Shared;
use report::{Comparison, Figures};
use server::Server;

/// The smoke test's load: short, but every path once.
const SMOKE_DURATION: Duration = Duration::from_millis(300);
const SMOKE_WARMUP: Duration = Duration::from_millis(100);
const SMOKE_RATE: f64 = 200.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Null,
    Mutate,
}

impl Route {
    fn name(self) -> &'static str {
        match self {
            Route::Null => "null",
            Route::Mutate => "mutate",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Route::Null => paths::NULL,
            Route::Mutate => paths::MUTATE,
        }
    }
}

/// A request body under test.
struct Scenario {
    name: &'static str,
    description: &'static str,
    body: Bytes,
    uid: String,
    expect: Expect,
}

/// The scenarios' bodies, from the engine bench's cases.
fn scenarios() -> anyhow::Result<Vec<Scenario>> {
    let mut cases = cases::cases();
    SCENARIOS
        .iter()
        .map(|&(name, case_name, description)| {
            let index = cases
                .iter()
                .position(|c| c.name == case_name)
                .with_context(|| format!("scenario {name}: no case {case_name} in cases.rs"))?;
            let case = cases.swap_remove(index);
            let review: Value = serde_json::from_slice(&case.body)
                .with_context(|| format!("scenario {name}: the body is not JSON"))?;
            let uid = review
                .pointer("/request/uid")
                .and_then(Value::as_str)
                .with_context(|| format!("scenario {name}: the review has no request.uid"))?
                .to_string();
            Ok(Scenario {
                name,
                description,
                body: Bytes::from(case.body),
                uid,
                expect: case.expect,
            })
        })
        .collect()
}

/// One phase's result.
struct PhaseOutcome {
    figures: Figures,
    warmup_errors: u64,
    /// The first errors of the warm-up and of the measured run.
    first_errors: Vec<String>,
}

impl PhaseOutcome {
    fn errors(&self) -> u64 {
        self.figures.errors as u64 + self.warmup_errors
    }
}

/// The connection-level settings of every phase.
struct Shape {
    connections: usize,
    concurrency: usize,
    h2_connections: usize,
    timeout: Duration,
}

impl Shape {
    fn of(o: &Options) -> Shape {
        Shape {
            connections: o.connections,
            concurrency: o.concurrency,
            h2_connections: o.h2_connections,
            timeout: o.timeout,
        }
    }

    fn describe(&self, proto: Proto) -> String {
        match proto {
            Proto::H1 => format!("{} connections", self.connections),
            Proto::H2 => format!(
                "{} stream(s) on {} connection(s)",
                self.concurrency, self.h2_connections
            ),
        }
    }
}

/// Checks one answer outside timing, so no phase measures an error path.
async fn preflight(
    slot: &mut phase::Slot,
    shared: &Shared,
    scenario: &Scenario,
    route: Route,
) -> anyhow::Result<()> {
    let path = route.path();
    let (status, body) = slot
        .probe(shared)
        .await
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("pre-flight POST {path}"))?;
    if route == Route::Null && status == hyper::StatusCode::NOT_FOUND {
        bail!(
            "POST {path} answered 404: this server does not mount the null webhook \
             (serve --benchmark-null-route); is --server-bin an older podmend?"
        );
    }
    client::check_answer(status, &body)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("pre-flight POST {path}"))?;
    if route == Route::Mutate {
        let answer: Value = serde_json::from_slice(&body)
            .with_context(|| format!("pre-flight POST {path}: the answer is not JSON"))?;
        let uid = answer.pointer("/response/uid").and_then(Value::as_str);
        if uid != Some(scenario.uid.as_str()) {
            bail!(
                "pre-flight POST {path}: uid {uid:?} in the answer, {:?} in the request",
                scenario.uid
            );
        }
        let patched = answer.pointer("/response/patchType").is_some();
        if patched != (scenario.expect == Expect::Patched) {
            bail!(
                "pre-flight POST {path}: {} expected {:?}, the answer {} a patch: {}",
                scenario.name,
                scenario.expect,
                if patched { "has" } else { "has no" },
                client::snippet(&body)
            );
        }
    }
    Ok(())
}

/// Connects, checks, warms up, then measures one route.
#[allow(clippy::too_many_arguments)]
async fn run_phase(
    server: &Server,
    target: &Arc<Target>,
    shape: &Shape,
    scenario: &Scenario,
    route: Route,
    load: Load,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<PhaseOutcome> {
    let shared = Arc::new(Shared {
        target: target.clone(),
        template: RequestTemplate::new(
            target.proto,
            server.webhook,
            route.path(),
            scenario.body.clone(),
        )?,
        timeout: shape.timeout,
    });
    let mut slots = phase::open_slots(
        target,
        shape.connections,
        shape.h2_connections,
        shape.concurrency,
    )
    .await?;
    let first = slots.first_mut().context("no connection to send on")?;
    preflight(first, &shared, scenario, route).await?;

    let mut warmup_errors = 0;
    let mut first_errors = Vec::new();
    if !warmup.is_zero() {
        let (back, tally) = phase::run(&shared, slots, load, warmup).await?;
        slots = back;
        warmup_errors = tally.errors;
        first_errors.extend(
            tally
                .first_errors
                .into_iter()
                .map(|e| format!("warm-up: {e}")),
        );
    }
    let server_before = server.cpu_time()?;
    let client_before = proc::cpu_time("self")?;
    let (slots, tally) = phase::run(&shared, slots, load, duration).await?;
    let server_cpu = server.cpu_time()?.saturating_sub(server_before);
    let client_cpu = proc::cpu_time("self")?.saturating_sub(client_before);
    drop(slots);
    first_errors.extend(tally.first_errors.iter().cloned());
    Ok(PhaseOutcome {
        figures: Figures::new(&tally, server_cpu, client_cpu),
        warmup_errors,
        first_errors,
    })
}

fn runtime(o: &Options) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = if o.client_threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(o.client_threads);
        b
    };
    builder
        .enable_all()
        .build()
        .context("start the client runtime")
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| {
            let parts: Vec<&str> = s.split_whitespace().take(3).collect();
            (parts.len() == 3).then(|| parts.join(" "))
        })
        .unwrap_or_else(|| "?".to_string())
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

fn print_server_start(server: &Server) {
    println!(
        "server: {} (pid {}), webhook https://{}, metrics http://{}",
        server.bin.display(),
        server.pid,
        server.webhook,
        server.metrics
    );
    println!(
        "server ready {:.1} ms after spawn (first 200 on /readyz); idle RSS {:.1} MiB",
        server.ready_after.as_secs_f64() * 1000.0,
        server.idle_rss_kib as f64 / 1024.0
    );
}

fn print_errors(outcome: &PhaseOutcome) {
    for e in &outcome.first_errors {
        eprintln!("    error: {e}");
    }
    let shown = outcome.first_errors.len() as u64;
    if outcome.errors() > shown {
        eprintln!("    ... {} errors in all", outcome.errors());
    }
}

/// One scenario over one protocol: its rounds and medians.
struct PairResult {
    scenario: &'static str,
    proto: Proto,
    body_bytes: usize,
    rounds: Vec<(Figures, Figures)>,
    null: Figures,
    podmend: Figures,
    comparison: Comparison,
    warmup_errors: u64,
    errors: Vec<String>,
}

fn bench(o: &Options) -> anyhow::Result<()> {
    let scenarios = scenarios()?;
    let pairs: Vec<(usize, Proto)> = o
        .scenarios
        .iter()
        .flat_map(|&s| o.protos.iter().map(move |&p| (s, p)))
        .filter(|&(s, p)| o.selects(&format!("{}/{}", SCENARIOS[s].0, p.name())))
        .collect();
    if pairs.is_empty() {
        println!(
            "load: no scenario/protocol pair matches the filter(s) {:?}; nothing to run",
            o.filters
        );
        return Ok(());
    }
    let load_before = load_average();
    println!(
        "podmend load: {} cores, load average {load_before}; client: {} runtime thread(s)",
        cores(),
        o.client_threads
    );
    println!(
        "load: {}, {:.1} s measured per phase after {:.1} s warm-up, {} round(s) of (null, mutate)",
        o.load.describe(),
        o.duration.as_secs_f64(),
        o.warmup.as_secs_f64(),
        o.rounds
    );
    let mut server = Server::start(&o.server_bin)?;
    print_server_start(&server);
    let shape = Shape::of(o);
    let lag = matches!(o.load, Load::Rate(_));
    let runtime = runtime(o)?;
    let mut results: Vec<PairResult> = Vec::new();
    runtime.block_on(async {
        let mut targets = Vec::new();
        for proto in [Proto::H1, Proto::H2] {
            targets.push(Arc::new(Target::new(
                server.webhook,
                &server.ca_pem,
                proto,
            )?));
        }
        for &(s, proto) in &pairs {
            let scenario = &scenarios[s];
            let target = &targets[if proto == Proto::H1 { 0 } else { 1 }];
            println!();
            println!(
                "== {}/{}: {} ({} bytes), {}",
                scenario.name,
                proto.name(),
                scenario.description,
                scenario.body.len(),
                shape.describe(proto)
            );
            println!("{}", report::header("round route", 14, lag));
            let mut rounds = Vec::new();
            let mut warmup_errors = 0;
            let mut errors = Vec::new();
            for round in 1..=o.rounds {
                let mut figures = Vec::new();
                for route in [Route::Null, Route::Mutate] {
                    let outcome = match run_phase(
                        &server, target, &shape, scenario, route, o.load, o.warmup, o.duration,
                    )
                    .await
                    {
                        Ok(outcome) => outcome,
                        Err(e) => {
                            // A server that died explains itself best with its log.
                            server.check_alive()?;
                            return Err(e.context(format!(
                                "{}/{}/{}",
                                scenario.name,
                                proto.name(),
                                route.name()
                            )));
                        }
                    };
                    println!(
                        "{}",
                        report::row(
                            &format!("{round:<5} {}", route.name()),
                            14,
                            &outcome.figures,
                            lag
                        )
                    );
                    let _ = std::io::stdout().flush();
                    print_errors(&outcome);
                    warmup_errors += outcome.warmup_errors;
                    errors.extend(
                        outcome
                            .first_errors
                            .iter()
                            .map(|e| format!("round {round} {}: {e}", route.name())),
                    );
                    figures.push(outcome.figures);
                    server.check_alive()?;
                }
                rounds.push((figures[0], figures[1]));
            }
            let null = Figures::median(&rounds.iter().map(|r| r.0).collect::<Vec<_>>());
            let podmend = Figures::median(&rounds.iter().map(|r| r.1).collect::<Vec<_>>());
            let comparison = Comparison::new(&null, &podmend);
            println!("{}", report::row("median null", 14, &null, lag));
            println!("{}", report::row("median mutate", 14, &podmend, lag));
            println!("{}", comparison.line());
            results.push(PairResult {
                scenario: scenario.name,
                proto,
                body_bytes: scenario.body.len(),
                rounds,
                null,
                podmend,
                comparison,
                warmup_errors,
                errors,
            });
        }
        anyhow::Ok(())
    })?;
    let peak_rss_kib = server.status_kib("VmHWM")?;
    let final_rss_kib = server.status_kib("VmRSS")?;
    let total_cpu = server.cpu_time()?;
    let load_after = load_average();

    println!();
    println!(
        "== medians over {} round(s): {}, {:.1} s per phase",
        o.rounds,
        o.load.describe(),
        o.duration.as_secs_f64()
    );
    println!("{}", report::header("scenario/proto route", 24, lag));
    for r in &results {
        let pair = format!("{}/{}", r.scenario, r.proto.name());
        println!(
            "{}",
            report::row(&format!("{pair:<17} null"), 24, &r.null, lag)
        );
        println!(
            "{}",
            report::row(&format!("{pair:<17} mutate"), 24, &r.podmend, lag)
        );
    }
    println!();
    println!("== podmend (/mutate) vs null, on the medians");
    println!(
        "{:<17} {:>8} {:>8} {:>6} {:>8} {:>8} {:>6} {:>9} {:>12} {:>8}",
        "scenario/proto",
        "p50 null",
        "p50 pm",
        "×",
        "p99 null",
        "p99 pm",
        "×",
        "p99 Δ µs",
        "srv Δ µs/r",
        "req/s ×"
    );
    for r in &results {
        let c = &r.comparison;
        println!(
            "{:<17} {:>8} {:>8} {:>6} {:>8} {:>8} {:>6} {:>9} {:>12} {:>8}",
            format!("{}/{}", r.scenario, r.proto.name()),
            report::num(r.null.p50_us, 0),
            report::num(r.podmend.p50_us, 0),
            report::num(c.p50_ratio, 2),
            report::num(r.null.p99_us, 0),
            report::num(r.podmend.p99_us, 0),
            report::num(c.p99_ratio, 2),
            report::num(c.p99_diff_us, 0),
            report::num(c.server_cpu_diff_us_per_req, 1),
            report::num(c.throughput_ratio, 2),
        );
    }
    println!();
    println!("== server");
    println!(
        "ready (spawn to first 200 on /readyz)  {:>9.1} ms",
        server.ready_after.as_secs_f64() * 1000.0
    );
    println!(
        "idle RSS (right after ready)           {:>9.1} MiB",
        server.idle_rss_kib as f64 / 1024.0
    );
    println!(
        "peak RSS (VmHWM, end of run)           {:>9.1} MiB",
        peak_rss_kib as f64 / 1024.0
    );
    println!(
        "RSS at the end of the run              {:>9.1} MiB",
        final_rss_kib as f64 / 1024.0
    );
    println!(
        "CPU time, whole run                    {:>9.2} s",
        total_cpu.as_secs_f64()
    );
    println!("load average before / after: {load_before} / {load_after}");
    let errors: u64 = results
        .iter()
        .map(|r| {
            r.rounds
                .iter()
                .map(|(n, m)| (n.errors + m.errors) as u64)
                .sum::<u64>()
                + r.warmup_errors
        })
        .sum();
    if errors > 0 {
        println!("errors: {errors} in all (see above)");
    }

    if let Some(path) = &o.json {
        let document = json!({
            "tool": "podmend load (benches/load.rs)",
            "settings": {
                "load": match o.load { Load::Max => json!("max"), Load::Rate(r) => json!(r) },
                "duration_s": o.duration.as_secs_f64(),
                "warmup_s": o.warmup.as_secs_f64(),
                "rounds": o.rounds,
                "h1_connections": o.connections,
                "h2_streams": o.concurrency,
                "h2_connections": o.h2_connections,
                "client_threads": o.client_threads,
                "timeout_s": o.timeout.as_secs_f64(),
            },
            "machine": {
                "cores": cores(),
                "load_average_before": load_before,
                "load_average_after": load_after,
            },
            "server": {
                "bin": server.bin.display().to_string(),
                "ready_ms": (server.ready_after.as_secs_f64() * 1e4).round() / 10.0,
                "idle_rss_kib": server.idle_rss_kib,
                "peak_rss_kib": peak_rss_kib,
                "final_rss_kib": final_rss_kib,
                "cpu_s": total_cpu.as_secs_f64(),
            },
            "errors": errors,
            "results": results.iter().map(|r| json!({
                "scenario": r.scenario,
                "proto": r.proto.name(),
                "body_bytes": r.body_bytes,
                "rounds": r.rounds.iter().enumerate().map(|(i, (n, m))| json!({
                    "round": i + 1,
                    "null": n,
                    "mutate": m,
                })).collect::<Vec<_>>(),
                "median": {"null": r.null, "mutate": r.podmend},
                "podmend_vs_null": r.comparison,
                "warmup_errors": r.warmup_errors,
                "first_errors": r.errors,
            })).collect::<Vec<_>>(),
        });
        let text = serde_json::to_string_pretty(&document).context("encode the JSON report")?;
        std::fs::write(path, text + "\n").with_context(|| format!("write {}", path.display()))?;
        println!("figures written to {}", path.display());
    }
    Ok(())
}

/// One check of the smoke test.
struct Check {
    name: String,
    scenario: usize,
    proto: Proto,
    route: Route,
    load: Load,
}

fn smoke_checks() -> Vec<Check> {
    let mut checks = Vec::new();
    for (s, (name, _, _)) in SCENARIOS.iter().enumerate() {
        for proto in [Proto::H1, Proto::H2] {
            for route in [Route::Null, Route::Mutate] {
                checks.push(Check {
                    name: format!("{name}/{}/{}", proto.name(), route.name()),
                    scenario: s,
                    proto,
                    route,
                    load: Load::Max,
                });
            }
        }
    }
    checks.push(Check {
        name: format!("{}/h1/mutate@{SMOKE_RATE}rps", SCENARIOS[0].0),
        scenario: 0,
        proto: Proto::H1,
        route: Route::Mutate,
        load: Load::Rate(SMOKE_RATE),
    });
    checks
}

fn result_line(passed: usize, failed: usize, filtered: usize, started: Instant) -> String {
    format!(
        "test result: {}. {passed} passed; {failed} failed; 0 ignored; 0 measured; {filtered} filtered out; finished in {:.2}s",
        if failed == 0 { "ok" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    )
}

/// The smoke test `cargo test` runs: every path once, briefly, with zero errors allowed.
fn smoke(o: &Options) -> ExitCode {
    let started = Instant::now();
    if !o.ignored.is_empty() {
        eprintln!("load: ignoring argument(s) {:?}", o.ignored);
    }
    let all = smoke_checks();
    let total = all.len();
    let checks: Vec<Check> = all
        .into_iter()
        .filter(|c| o.selects(&format!("load::{}", c.name)) || o.selects(&c.name))
        .collect();
    let filtered = total - checks.len();
    if o.list {
        for c in &checks {
            println!("load::{}: test", c.name);
        }
        println!();
        println!("{} tests, 0 benchmarks", checks.len());
        return ExitCode::SUCCESS;
    }
    println!();
    println!("running {} tests", checks.len());
    if checks.is_empty() {
        println!();
        println!("{}", result_line(0, 0, filtered, started));
        return ExitCode::SUCCESS;
    }
    let fail_all = |why: String| {
        println!("load: {why}");
        println!();
        println!("{}", result_line(0, checks.len(), filtered, started));
        ExitCode::from(101)
    };
    let scenarios = match scenarios() {
        Ok(s) => s,
        Err(e) => return fail_all(format!("{e:#}")),
    };
    let mut server = match Server::start(&o.server_bin) {
        Ok(s) => s,
        Err(e) => return fail_all(format!("{e:#}")),
    };
    let runtime = match runtime(o) {
        Ok(r) => r,
        Err(e) => return fail_all(format!("{e:#}")),
    };
    let shape = Shape::of(o);
    let mut failures: Vec<(String, String)> = Vec::new();
    let mut passed = 0;
    runtime.block_on(async {
        let mut targets = Vec::new();
        for proto in [Proto::H1, Proto::H2] {
            match Target::new(server.webhook, &server.ca_pem, proto) {
                Ok(t) => targets.push(Arc::new(t)),
                Err(e) => {
                    for c in &checks {
                        failures.push((c.name.clone(), format!("{e:#}")));
                    }
                    return;
                }
            }
        }
        for c in &checks {
            let target = &targets[if c.proto == Proto::H1 { 0 } else { 1 }];
            let outcome = run_phase(
                &server,
                target,
                &shape,
                &scenarios[c.scenario],
                c.route,
                c.load,
                SMOKE_WARMUP,
                SMOKE_DURATION,
            )
            .await;
            let verdict = match outcome {
                Err(e) => Err(format!("{e:#}")),
                Ok(outcome) if outcome.errors() > 0 => Err(format!(
                    "{} errors ({} in the warm-up): {}",
                    outcome.errors(),
                    outcome.warmup_errors,
                    outcome.first_errors.join("; ")
                )),
                Ok(outcome) if outcome.figures.requests < 1.0 => {
                    Err("no request completed".to_string())
                }
                Ok(outcome) => Ok(outcome.figures),
            };
            let verdict = match (verdict, server.check_alive()) {
                (Ok(_), Err(e)) => Err(format!("{e:#}")),
                (v, _) => v,
            };
            match verdict {
                Ok(f) => {
                    passed += 1;
                    println!(
                        "test load::{} ... ok ({} requests, {} req/s, p50 {} µs, p99 {} µs)",
                        c.name,
                        report::num(f.requests, 0),
                        report::num(f.throughput_rps, 0),
                        report::num(f.p50_us, 0),
                        report::num(f.p99_us, 0),
                    );
                }
                Err(why) => {
                    println!("test load::{} ... FAILED", c.name);
                    failures.push((c.name.clone(), why));
                }
            }
        }
    });
    println!(
        "server: ready {:.1} ms after spawn, idle RSS {:.1} MiB, peak RSS {}",
        server.ready_after.as_secs_f64() * 1000.0,
        server.idle_rss_kib as f64 / 1024.0,
        server.status_kib("VmHWM").map_or_else(
            |e| format!("? ({e})"),
            |k| format!("{:.1} MiB", k as f64 / 1024.0)
        )
    );
    if !failures.is_empty() {
        println!();
        println!("failures:");
        for (name, why) in &failures {
            println!("    load::{name}: {why}");
        }
        println!();
        println!("server log (end):\n{}", server.log_tail());
    }
    println!();
    println!("{}", result_line(passed, failures.len(), filtered, started));
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(101)
    }
}

fn main() -> ExitCode {
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("load: {e:#}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if options.help {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if !options.bench {
        return smoke(&options);
    }
    let run = match options.soak {
        Some(total) => soak::soak(&options, total, options.sample),
        None => bench(&options),
    };
    match run {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("load: {e:#}");
            ExitCode::FAILURE
        }
    }
}
