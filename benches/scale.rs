//! podmend at cluster scale: `serve` watching N Nodes and LimitRanges, `audit --cluster`
//! over M pods, against a local API stand-in (`benches/scale/standin.rs`) that serves
//! real-shaped objects (`benches/scale/objects.rs`) with list pagination and watch.
//!
//! # What it measures
//!
//! For each node count and node shape asked for, with a fresh stand-in and a kubeconfig
//! pointing at it (the serving pair from `podmend certs`):
//!
//! - **serve**: `podmend serve --kubeconfig K` (default info logging, to a file): time from
//!   spawn to the first 200 on `/readyz` (polled every millisecond; ready means both the
//!   Node and the LimitRange caches had their first full list), its CPU time by then, and,
//!   after `--settle` seconds, `VmRSS`, `VmHWM` and `RssAnon` from `/proc/PID/status`. The
//!   stand-in's counts must show every Node and LimitRange listed and both watches open.
//! - **audit**: `podmend audit --cluster --kubeconfig K -o json` to a file: wall time from
//!   spawn to exit, pods per second, peak RSS (`ru_maxrss` of `wait4`: the child's own
//!   VmHWM at exit) and CPU time. The stand-in's counts must show every pod and ReplicaSet
//!   listed; the report's summary is printed.
//!
//! At the end, a table of every run and, per node shape with two node counts or more, the
//! RSS slope per 1,000 nodes (least squares over the medians). `--json FILE` writes every
//! figure.
//!
//! The stand-in runs in this process on one thread, so it shares the machine's cores with
//! the process under test; it renders each page from templates (a few copies per object),
//! so its share is small.
//!
//! # Running it
//!
//! ```sh
//! cargo bench --bench scale                     # 5,000 real-shaped nodes, 5,000 LimitRanges,
//!                                               # 100,000 pods, 10,000 ReplicaSets
//! cargo bench --bench scale -- --nodes 0,1000,5000 --shape both --only serve
//! cargo bench --bench scale -- --help
//! ```
//!
//! Without `--bench` (under `cargo test --all-targets`), it runs a smoke test instead: a
//! small cluster, both node shapes for `serve`, one `audit --cluster`, every check above,
//! with the debug binary; it prints a libtest-style `test result:` line.

#[path = "scale/child.rs"]
mod child;
#[path = "scale/objects.rs"]
mod objects;
#[path = "scale/standin.rs"]
mod standin;
#[path = "scale/template.rs"]
mod template;

#[allow(dead_code)]
#[path = "../tests/common/net.rs"]
mod net;
#[path = "common/proc.rs"]
mod proc;
#[path = "common/serve.rs"]
mod serve;
#[path = "../tests/common/spawn.rs"]
mod spawn;

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use child::{Child, Ended, load_average};
use objects::Sizes;
use serve::{free_port, http_status};
use standin::StandIn;

const USAGE: &str = "\
podmend at cluster scale: serve's ready time and RSS, audit --cluster's time and peak RSS,
against a local API stand-in serving real-shaped Nodes, LimitRanges, ReplicaSets and pods.

usage: cargo bench --bench scale -- [OPTIONS]

  --nodes N[,N...]       node counts, one run each (default 5000)
  --shape real|bare|both real-shaped nodes (50 images, status, ...), bare ones (name, labels,
                         taints), or both (default real)
  --limit-ranges N       LimitRanges, one per namespace (default 5000)
  --pods M               pods for audit (default 100000)
  --replicasets R        ReplicaSets owning them (default 10000)
  --namespaces K         namespaces the ReplicaSets and pods are spread over (default 500)
  --only serve|audit     one of the two (default both)
  --rounds R             runs of each (default 1)
  --settle S             seconds after ready before serve's RSS is read (default 3)
  --page-size P          audit --page-size (default: podmend's, 250)
  --server-bin PATH      podmend binary (default: the one cargo built, release under bench)
  --json FILE            write every figure as JSON
  --show RESOURCE/INDEX  print one object as the stand-in serves it (nodes/0, pods/42, ...)
                         and exit
";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Only {
    Both,
    Serve,
    Audit,
}

#[derive(Debug, Clone)]
struct Options {
    bench: bool,
    help: bool,
    list: bool,
    nodes: Vec<usize>,
    shapes: Vec<bool>,
    limit_ranges: usize,
    pods: usize,
    replicasets: usize,
    namespaces: usize,
    only: Only,
    rounds: usize,
    settle: Duration,
    page_size: Option<u32>,
    bin: PathBuf,
    json: Option<PathBuf>,
    show: Option<String>,
}

impl Options {
    fn parse(args: impl Iterator<Item = String>) -> anyhow::Result<Options> {
        let args: Vec<String> = args.collect();
        let bench = args.iter().any(|a| a == "--bench");
        let mut o = Options {
            bench,
            help: false,
            list: false,
            nodes: vec![5000],
            shapes: vec![false],
            limit_ranges: 5000,
            pods: 100_000,
            replicasets: 10_000,
            namespaces: 500,
            only: Only::Both,
            rounds: 1,
            settle: Duration::from_secs(3),
            page_size: None,
            bin: PathBuf::from(env!("CARGO_BIN_EXE_podmend")),
            json: None,
            show: None,
        };
        let mut it = args.into_iter();
        while let Some(arg) = it.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            let mut value = || -> anyhow::Result<String> {
                match inline.clone() {
                    Some(v) => Ok(v),
                    None => it.next().with_context(|| format!("{name} needs a value")),
                }
            };
            let number = |v: String| -> anyhow::Result<usize> {
                v.replace('_', "")
                    .parse()
                    .with_context(|| format!("{name} {v}: expected a whole number"))
            };
            match name.as_str() {
                "--bench" => {}
                "-h" | "--help" => o.help = true,
                "--list" => o.list = true,
                "--nodes" => {
                    o.nodes = value()?
                        .split(',')
                        .map(|n| number(n.trim().to_string()))
                        .collect::<anyhow::Result<_>>()?;
                }
                "--shape" => {
                    o.shapes = match value()?.as_str() {
                        "real" => vec![false],
                        "bare" => vec![true],
                        "both" => vec![false, true],
                        other => bail!("--shape {other}: expected real, bare or both"),
                    }
                }
                "--limit-ranges" => o.limit_ranges = number(value()?)?,
                "--pods" => o.pods = number(value()?)?,
                "--replicasets" => o.replicasets = number(value()?)?,
                "--namespaces" => o.namespaces = number(value()?)?,
                "--only" => {
                    o.only = match value()?.as_str() {
                        "serve" => Only::Serve,
                        "audit" => Only::Audit,
                        other => bail!("--only {other}: expected serve or audit"),
                    }
                }
                "--rounds" => o.rounds = number(value()?)?.max(1),
                "--settle" => {
                    let v = value()?;
                    let secs: f64 = v
                        .parse()
                        .with_context(|| format!("--settle {v}: expected seconds"))?;
                    if !(0.0..=600.0).contains(&secs) {
                        bail!("--settle {v}: out of range");
                    }
                    o.settle = Duration::from_secs_f64(secs);
                }
                "--page-size" => {
                    let v = value()?;
                    o.page_size = Some(
                        v.parse()
                            .with_context(|| format!("--page-size {v}: expected a number"))?,
                    );
                }
                "--server-bin" => o.bin = PathBuf::from(value()?),
                "--json" => o.json = Some(PathBuf::from(value()?)),
                "--show" => o.show = Some(value()?),
                // libtest's, under `cargo test`: nothing to do with them.
                _ if !bench => {}
                _ => bail!("unknown argument {arg}"),
            }
        }
        Ok(o)
    }
}

/// One `serve` run.
#[derive(Debug, Clone, serde::Serialize)]
struct ServeFigures {
    ready_ms: f64,
    cpu_to_ready_ms: f64,
    rss_kib: u64,
    hwm_kib: u64,
    rss_anon_kib: u64,
    nodes_listed: u64,
    limit_ranges_listed: u64,
    /// List requests (pages) for both.
    list_requests: u64,
    list_bytes: u64,
    load_average: String,
}

/// One `audit --cluster` run.
#[derive(Debug, Clone, serde::Serialize)]
struct AuditFigures {
    wall_s: f64,
    pods_per_s: f64,
    max_rss_kib: u64,
    cpu_s: f64,
    exit_code: Option<i32>,
    pods_listed: u64,
    replicasets_listed: u64,
    /// List requests (pages) of every resource.
    list_requests: u64,
    list_bytes: u64,
    summary: Value,
    load_average: String,
}

/// Everything measured for one cluster.
#[derive(Debug, Clone, serde::Serialize)]
struct Run {
    nodes: usize,
    bare_nodes: bool,
    limit_ranges: usize,
    pods: usize,
    replicasets: usize,
    serve: Vec<ServeFigures>,
    audit: Vec<AuditFigures>,
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn shape_name(bare: bool) -> &'static str {
    if bare { "bare" } else { "real" }
}

/// Starts `serve`, waits for ready, lets it settle, reads its figures; kills it.
fn run_serve(
    o: &Options,
    stand_in: &StandIn,
    sizes: Sizes,
    dir: &std::path::Path,
) -> anyhow::Result<ServeFigures> {
    stand_in.reset_counts();
    let pki = dir.join("pki");
    let listen = free_port()?;
    let metrics = free_port()?;
    let mut command = spawn::serve_command(&o.bin, listen, metrics, &pki, stand_in.kubeconfig());
    command.env_remove("RUST_LOG").env_remove("KUBECONFIG");
    let mut serve = Child::spawn(command, None, &dir.join("serve.log"))?;
    let deadline = Duration::from_secs(120);
    loop {
        if let Ok(200) = http_status(metrics, "/readyz") {
            break;
        }
        serve.check_alive("podmend serve")?;
        if serve.spawned.elapsed() > deadline {
            bail!(
                "podmend serve was not ready within {deadline:?}; its log ends with:\n{}",
                serve.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let ready = serve.spawned.elapsed();
    let cpu = serve.cpu_time()?;
    std::thread::sleep(o.settle);
    serve.check_alive("podmend serve")?;
    let rss = serve.status_kib("VmRSS")?;
    let hwm = serve.status_kib("VmHWM")?;
    let anon = serve.status_kib("RssAnon")?;
    if http_status(metrics, "/readyz").ok() != Some(200) {
        bail!(
            "podmend serve is no longer ready after settling; its log ends with:\n{}",
            serve.log_tail()
        );
    }
    let log = std::fs::read_to_string(&serve.log).unwrap_or_default();
    if log.contains("watch of the cluster failed") {
        bail!(
            "a watch failed while serve started; its log ends with:\n{}",
            serve.log_tail()
        );
    }
    let nodes = stand_in.served("nodes");
    let lrs = stand_in.served("limitranges");
    if nodes.items != sizes.nodes as u64 || lrs.items != sizes.limit_ranges as u64 {
        bail!(
            "serve listed {} of {} nodes and {} of {} LimitRanges",
            nodes.items,
            sizes.nodes,
            lrs.items,
            sizes.limit_ranges
        );
    }
    if nodes.open_watches != 1 || lrs.open_watches != 1 {
        bail!(
            "serve should watch nodes and LimitRanges once each; open watches: {} and {}",
            nodes.open_watches,
            lrs.open_watches
        );
    }
    drop(serve);
    Ok(ServeFigures {
        ready_ms: ready.as_secs_f64() * 1000.0,
        cpu_to_ready_ms: cpu.as_secs_f64() * 1000.0,
        rss_kib: rss,
        hwm_kib: hwm,
        rss_anon_kib: anon,
        nodes_listed: nodes.items,
        limit_ranges_listed: lrs.items,
        list_requests: nodes.lists + lrs.lists,
        list_bytes: nodes.bytes + lrs.bytes,
        load_average: load_average(),
    })
}

/// Runs `audit --cluster` to the end.
fn run_audit(
    o: &Options,
    stand_in: &StandIn,
    sizes: Sizes,
    dir: &std::path::Path,
) -> anyhow::Result<AuditFigures> {
    stand_in.reset_counts();
    let mut command = Command::new(&o.bin);
    command
        .args(["audit", "--cluster", "-o", "json", "--kubeconfig"])
        .arg(stand_in.kubeconfig())
        .env_remove("RUST_LOG")
        .env_remove("KUBECONFIG");
    if let Some(page) = o.page_size {
        command.arg("--page-size").arg(page.to_string());
    }
    let out = dir.join("audit.json");
    let mut audit = Child::spawn(command, Some(&out), &dir.join("audit.log"))?;
    let ended: Ended = audit
        .wait_end(Duration::from_secs(1800))
        .context("podmend audit --cluster")?;
    if !matches!(ended.code, Some(0 | 3)) {
        bail!(
            "podmend audit --cluster ended with {:?}; its stderr ends with:\n{}",
            ended.code,
            audit.log_tail()
        );
    }
    let report: Value = serde_json::from_slice(
        &std::fs::read(&out).with_context(|| format!("read {}", out.display()))?,
    )
    .context("the audit's -o json output is not JSON")?;
    let pods = stand_in.served("pods");
    let rs = stand_in.served("replicasets");
    if pods.items != sizes.pods as u64 || rs.items != sizes.replicasets as u64 {
        bail!(
            "the audit listed {} of {} pods and {} of {} ReplicaSets",
            pods.items,
            sizes.pods,
            rs.items,
            sizes.replicasets
        );
    }
    let every: Vec<standin::Served> = ["nodes", "limitranges", "pods", "replicasets"]
        .iter()
        .map(|r| stand_in.served(r))
        .collect();
    let wall = ended.wall.as_secs_f64();
    Ok(AuditFigures {
        wall_s: wall,
        pods_per_s: sizes.pods as f64 / wall,
        max_rss_kib: ended.max_rss_kib,
        cpu_s: (ended.user + ended.system).as_secs_f64(),
        exit_code: ended.code,
        pods_listed: pods.items,
        replicasets_listed: rs.items,
        list_requests: every.iter().map(|s| s.lists).sum(),
        list_bytes: every.iter().map(|s| s.bytes).sum(),
        summary: report.get("summary").cloned().unwrap_or(Value::Null),
        load_average: load_average(),
    })
}

/// `podmend certs` into `dir/pki`: the stand-in's and the webhook's serving pair.
fn certs(o: &Options, dir: &std::path::Path) -> anyhow::Result<()> {
    serve::write_certs(&o.bin, &dir.join("pki"))
}

/// Every run of one cluster: a stand-in, then serve and audit rounds.
fn measure(o: &Options, nodes: usize, bare: bool, quiet: bool) -> anyhow::Result<Run> {
    let sizes = Sizes {
        nodes,
        bare_nodes: bare,
        limit_ranges: o.limit_ranges,
        pods: o.pods,
        replicasets: o.replicasets,
        namespaces: o.namespaces,
    };
    let dir = tempfile::Builder::new()
        .prefix("podmend-scale-")
        .tempdir()
        .context("create a temporary directory")?;
    certs(o, dir.path())?;
    let collections = objects::collections(sizes)?;
    if !quiet {
        let node_bytes = collections[0]
            .item(0)
            .map(|n| n.to_string().len())
            .unwrap_or(0);
        let pod_bytes = collections[3]
            .item(0)
            .map(|n| n.to_string().len())
            .unwrap_or(0);
        println!(
            "\n== {nodes} {} nodes (~{:.1} KB each), {} LimitRanges, {} pods (~{:.1} KB each), {} ReplicaSets, {} namespaces",
            shape_name(bare),
            node_bytes as f64 / 1000.0,
            o.limit_ranges,
            o.pods,
            pod_bytes as f64 / 1000.0,
            o.replicasets,
            o.namespaces,
        );
    }
    let stand_in = StandIn::start(collections, &dir.path().join("pki"), dir.path())?;
    let mut run = Run {
        nodes,
        bare_nodes: bare,
        limit_ranges: o.limit_ranges,
        pods: o.pods,
        replicasets: o.replicasets,
        serve: Vec::new(),
        audit: Vec::new(),
    };
    for round in 1..=o.rounds {
        if o.only != Only::Audit {
            let s = run_serve(o, &stand_in, sizes, dir.path())?;
            if !quiet {
                println!(
                    "round {round} serve: ready {:.0} ms (CPU {:.0} ms), RSS {:.1} MiB, VmHWM {:.1} MiB, RssAnon {:.1} MiB; listed {} nodes + {} LimitRanges ({} pages, {:.1} MB); load {}",
                    s.ready_ms,
                    s.cpu_to_ready_ms,
                    mib(s.rss_kib),
                    mib(s.hwm_kib),
                    mib(s.rss_anon_kib),
                    s.nodes_listed,
                    s.limit_ranges_listed,
                    s.list_requests,
                    s.list_bytes as f64 / 1e6,
                    s.load_average
                );
            }
            run.serve.push(s);
        }
        if o.only != Only::Serve {
            let a = run_audit(o, &stand_in, sizes, dir.path())?;
            if !quiet {
                println!(
                    "round {round} audit: {:.2} s, {:.0} pods/s, peak RSS {:.1} MiB, CPU {:.2} s, exit {:?}; listed {} pods + {} ReplicaSets ({} pages in all, {:.0} MB); load {}",
                    a.wall_s,
                    a.pods_per_s,
                    mib(a.max_rss_kib),
                    a.cpu_s,
                    a.exit_code,
                    a.pods_listed,
                    a.replicasets_listed,
                    a.list_requests,
                    a.list_bytes as f64 / 1e6,
                    a.load_average
                );
                println!("  summary: {}", a.summary);
            }
            run.audit.push(a);
        }
    }
    Ok(run)
}

/// Least-squares slope of y over x.
fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

fn report(o: &Options, runs: &[Run]) {
    println!();
    if runs.iter().any(|r| !r.serve.is_empty()) {
        println!(
            "serve (medians of {} round(s); RSS after {:.0} s settled)",
            o.rounds,
            o.settle.as_secs_f64()
        );
        println!("| nodes | shape | LimitRanges | ready ms | RSS MiB | VmHWM MiB | RssAnon MiB |");
        println!("| ---: | --- | ---: | ---: | ---: | ---: | ---: |");
        for r in runs.iter().filter(|r| !r.serve.is_empty()) {
            let m = |f: fn(&ServeFigures) -> f64| median(r.serve.iter().map(f).collect());
            println!(
                "| {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.1} |",
                r.nodes,
                shape_name(r.bare_nodes),
                r.limit_ranges,
                m(|s| s.ready_ms),
                m(|s| mib(s.rss_kib)),
                m(|s| mib(s.hwm_kib)),
                m(|s| mib(s.rss_anon_kib)),
            );
        }
        for bare in [false, true] {
            let points: Vec<(f64, f64)> = runs
                .iter()
                .filter(|r| r.bare_nodes == bare && !r.serve.is_empty())
                .map(|r| {
                    (
                        r.nodes as f64 / 1000.0,
                        median(r.serve.iter().map(|s| mib(s.rss_kib)).collect()),
                    )
                })
                .collect();
            if let Some(s) = slope(&points) {
                println!(
                    "RSS per 1,000 {} nodes: {s:.2} MiB (least squares over {} node counts)",
                    shape_name(bare),
                    points.len()
                );
            }
        }
    }
    if runs.iter().any(|r| !r.audit.is_empty()) {
        println!();
        println!("audit --cluster (medians of {} round(s))", o.rounds);
        println!("| pods | ReplicaSets | nodes | shape | wall s | pods/s | peak RSS MiB | CPU s |");
        println!("| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |");
        for r in runs.iter().filter(|r| !r.audit.is_empty()) {
            let m = |f: fn(&AuditFigures) -> f64| median(r.audit.iter().map(f).collect());
            println!(
                "| {} | {} | {} | {} | {:.2} | {:.0} | {:.1} | {:.2} |",
                r.pods,
                r.replicasets,
                r.nodes,
                shape_name(r.bare_nodes),
                m(|a| a.wall_s),
                m(|a| a.pods_per_s),
                m(|a| mib(a.max_rss_kib)),
                m(|a| a.cpu_s),
            );
        }
    }
}

fn git_commit() -> String {
    Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".to_string())
}

/// `--show RESOURCE/INDEX`: one object of the first cluster asked for.
fn show(o: &Options, what: &str) -> anyhow::Result<()> {
    let (resource, index) = what
        .split_once('/')
        .and_then(|(r, i)| Some((r, i.parse::<usize>().ok()?)))
        .with_context(|| format!("--show {what}: expected RESOURCE/INDEX, e.g. nodes/0"))?;
    let sizes = Sizes {
        nodes: o.nodes.first().copied().unwrap_or(0),
        bare_nodes: o.shapes.first().copied().unwrap_or(false),
        limit_ranges: o.limit_ranges,
        pods: o.pods,
        replicasets: o.replicasets,
        namespaces: o.namespaces,
    };
    let collections = objects::collections(sizes)?;
    let names: Vec<&str> = collections.iter().map(|c| c.resource).collect();
    let c = collections
        .iter()
        .find(|c| c.resource == resource)
        .with_context(|| format!("--show {what}: the stand-in serves {}", names.join(", ")))?;
    if index >= c.len {
        bail!("--show {what}: there are {} {resource}", c.len);
    }
    let object = c.item(index)?;
    println!("{}", serde_json::to_string_pretty(&object)?);
    eprintln!("{} bytes as served", object.to_string().len());
    Ok(())
}

fn bench(o: &Options) -> anyhow::Result<()> {
    if let Some(what) = &o.show {
        return show(o, what);
    }
    if !o.bin.is_file() {
        bail!("podmend binary {} does not exist", o.bin.display());
    }
    let load_before = load_average();
    println!(
        "podmend scale: {} cores, load average {load_before}; {} at {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        o.bin.display(),
        git_commit()
    );
    let mut runs = Vec::new();
    for &bare in &o.shapes {
        for &nodes in &o.nodes {
            runs.push(measure(o, nodes, bare, false)?);
        }
    }
    report(o, &runs);
    let load_after = load_average();
    println!("load average before / after: {load_before} / {load_after}");
    if let Some(path) = &o.json {
        let document = json!({
            "tool": "podmend scale (benches/scale.rs)",
            "commit": git_commit(),
            "bin": o.bin.display().to_string(),
            "settle_s": o.settle.as_secs_f64(),
            "namespaces": o.namespaces,
            "load_average_before": load_before,
            "load_average_after": load_after,
            "runs": runs,
        });
        let text = serde_json::to_string_pretty(&document).context("encode the JSON report")?;
        std::fs::write(path, text + "\n").with_context(|| format!("write {}", path.display()))?;
        println!("figures written to {}", path.display());
    }
    Ok(())
}

/// What `cargo test` runs: a small cluster through every path and check, quickly.
fn smoke(o: &Options) -> ExitCode {
    let started = Instant::now();
    if o.list {
        println!("smoke: test");
        return ExitCode::SUCCESS;
    }
    let small = Options {
        nodes: vec![30],
        limit_ranges: 12,
        pods: 1_500,
        replicasets: 150,
        namespaces: 6,
        settle: Duration::from_millis(100),
        page_size: Some(200),
        ..o.clone()
    };
    let result = (|| -> anyhow::Result<()> {
        let real = measure(&small, 30, false, true)?;
        let audit = real.audit.first().context("no audit run")?;
        // One ReplicaSet in a hundred is the Pinniped agent's, its pods rejected: a symptom.
        let summary = audit.summary.to_string();
        if audit.exit_code != Some(3) {
            bail!("the audit found no symptom in a cluster with failed agent pods: {summary}");
        }
        let bare = measure(
            &Options {
                only: Only::Serve,
                ..small.clone()
            },
            30,
            true,
            true,
        )?;
        let (r, b) = (&real.serve[0], &bare.serve[0]);
        if r.rss_kib == 0 || b.rss_kib == 0 || r.ready_ms <= 0.0 {
            bail!("no figures: {r:?} {b:?}");
        }
        println!(
            "scale smoke: serve ready {:.0} ms, RSS {:.1} MiB (bare nodes: {:.1} MiB); audit {:.2} s, peak {:.1} MiB, {summary}",
            r.ready_ms,
            mib(r.rss_kib),
            mib(b.rss_kib),
            audit.wall_s,
            mib(audit.max_rss_kib)
        );
        Ok(())
    })();
    let (passed, failed) = match &result {
        Ok(()) => (1, 0),
        Err(e) => {
            eprintln!("scale smoke failed: {e:#}");
            (0, 1)
        }
    };
    println!(
        "test result: {}. {passed} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out; finished in {:.2}s",
        if failed == 0 { "ok" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("scale: {e:#}\n\n{USAGE}");
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
    match bench(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("scale: {e:#}");
            ExitCode::FAILURE
        }
    }
}
