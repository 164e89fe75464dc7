//! The load generator's command line. Hand-rolled rather than clap, because cargo hands a
//! `harness = false` target libtest's arguments (`--bench`, `--nocapture`, filters, ...)
//! and those must be tolerated, not refused.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};

/// The scenarios: (name, case in `benches/common/cases.rs`, what it is).
pub const SCENARIOS: &[(&str, &str, &str)] = &[
    (
        "pod-small",
        "pod-create-untouched",
        "the typical pod CREATE (GKE capture), nothing to repair",
    ),
    (
        "pod-large",
        "pod-create-large-40-containers",
        "the same pod with 40 containers, nothing to repair",
    ),
    (
        "deployment",
        "deployment-create-echo",
        "Deployment CREATE (kubewarden echo), template, nothing to repair",
    ),
    (
        "unhandled",
        "configmap-unhandled",
        "ConfigMap CREATE, a kind podmend does not handle",
    ),
    (
        "repair",
        "pod-create-agent-pinned",
        "an agent pod pinned with nodeName, repaired by node-affinity and agent-requests",
    ),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    H1,
    H2,
}

impl Proto {
    pub fn name(self) -> &'static str {
        match self {
            Proto::H1 => "h1",
            Proto::H2 => "h2",
        }
    }

    /// The ALPN protocol id the client offers (and requires back).
    pub fn alpn(self) -> &'static [u8] {
        match self {
            Proto::H1 => b"http/1.1",
            Proto::H2 => b"h2",
        }
    }
}

/// How requests are started.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// Closed loop: a new request as soon as one of the C in flight finishes.
    Max,
    /// Open loop: request k is due at t0 + k/R, whatever happened to the earlier ones.
    Rate(f64),
}

impl Load {
    pub fn describe(self) -> String {
        match self {
            Load::Max => "max rate (closed loop)".to_string(),
            Load::Rate(r) => format!("{r} req/s (open loop)"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    /// `--bench` (what `cargo bench` passes): the full benchmark; otherwise the smoke test.
    pub bench: bool,
    pub help: bool,
    /// libtest's `--list`: name the smoke checks, run nothing.
    pub list: bool,
    pub protos: Vec<Proto>,
    /// Indexes into [`SCENARIOS`].
    pub scenarios: Vec<usize>,
    /// HTTP/1.1: keep-alive connections, one request in flight on each.
    pub connections: usize,
    /// HTTP/2: streams in flight, over `h2_connections` connections.
    pub concurrency: usize,
    pub h2_connections: usize,
    pub load: Load,
    pub duration: Duration,
    pub warmup: Duration,
    pub rounds: usize,
    pub timeout: Duration,
    pub client_threads: usize,
    pub json: Option<PathBuf>,
    pub server_bin: PathBuf,
    /// `--soak SECS`: one long mutate-only run instead of the benchmark.
    pub soak: Option<Duration>,
    /// `--sample SECS`: the soak's slice, after which RSS is read.
    pub sample: Duration,
    /// libtest-style name filters (substring, or whole name with `--exact`).
    pub filters: Vec<String>,
    pub exact: bool,
    /// Arguments neither ours nor libtest's (ignored, with a note, outside `--bench`).
    pub ignored: Vec<String>,
}

pub const USAGE: &str = "\
usage: cargo bench --bench load -- [OPTIONS] [FILTER...]

  --proto h1|h2|both       protocols (default both)
  --scenario NAME[,NAME]   pod-small, pod-large, deployment, unhandled, repair (default all)
  --connections C          HTTP/1.1 keep-alive connections, one request in flight each (default 8)
  --concurrency C          HTTP/2 streams in flight (default 8)
  --h2-connections N       HTTP/2 connections the streams are spread over (default 1)
  --rate R|max             R: open loop, request k due at t0 + k/R, latency from that time;
                           max (default): closed loop, C requests always in flight
  --duration SECS          measured time per phase (default 5)
  --warmup SECS            unrecorded time before each phase (default 1)
  --rounds N               rounds of (null phase, mutate phase) per scenario and protocol (default 3)
  --timeout SECS           a request without an answer by then is an error (default 10)
  --client-threads N       the load generator's runtime threads (default 1)
  --json FILE              also write every figure as JSON
  --server-bin PATH        the podmend binary to run (default: the one cargo built)
  --soak SECS              instead of the benchmark: mutate only, at --rate, for SECS, in slices
                           of --sample SECS (default 10) rotating over the scenario/protocol
                           pairs; prints each slice with the server's RSS; any error fails
  --sample SECS            the soak's slice length
  FILTER                   only scenario/protocol pairs whose name (e.g. pod-small/h2) contains it

Without --bench (cargo test), a short smoke run checks every scenario, h1 and h2, null and
mutate, with zero errors allowed.";

/// libtest flags cargo or a user may pass that take no value.
const LIBTEST_FLAGS: &[&str] = &[
    "--nocapture",
    "--no-capture",
    "--show-output",
    "--ignored",
    "--include-ignored",
    "--test",
    "--quiet",
    "-q",
    "--force-run-in-process",
    "--report-time",
    "--ensure-time",
    "--shuffle",
];
/// libtest options that take a value.
const LIBTEST_OPTIONS: &[&str] = &[
    "--test-threads",
    "--color",
    "--format",
    "--skip",
    "--logfile",
    "--shuffle-seed",
    "-Z",
];

impl Options {
    pub fn parse(args: impl IntoIterator<Item = String>) -> anyhow::Result<Options> {
        let args: Vec<String> = args.into_iter().collect();
        let bench = args.iter().any(|a| a == "--bench");
        let mut o = Options {
            bench,
            help: false,
            list: false,
            protos: vec![Proto::H1, Proto::H2],
            scenarios: (0..SCENARIOS.len()).collect(),
            connections: 8,
            concurrency: 8,
            h2_connections: 1,
            load: Load::Max,
            duration: Duration::from_secs(5),
            warmup: Duration::from_secs(1),
            rounds: 3,
            timeout: Duration::from_secs(10),
            client_threads: 1,
            json: None,
            server_bin: PathBuf::from(env!("CARGO_BIN_EXE_podmend")),
            soak: None,
            sample: Duration::from_secs(10),
            filters: Vec::new(),
            exact: false,
            ignored: Vec::new(),
        };
        let mut it = args.into_iter();
        while let Some(arg) = it.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            let value = |it: &mut std::vec::IntoIter<String>| -> anyhow::Result<String> {
                match inline.clone() {
                    Some(v) => Ok(v),
                    None => it.next().with_context(|| format!("{name} needs a value")),
                }
            };
            match name.as_str() {
                "--bench" => {}
                "-h" | "--help" => o.help = true,
                "--list" => o.list = true,
                "--exact" => o.exact = true,
                "--proto" => {
                    o.protos = match value(&mut it)?.as_str() {
                        "h1" => vec![Proto::H1],
                        "h2" => vec![Proto::H2],
                        "both" => vec![Proto::H1, Proto::H2],
                        other => bail!("--proto {other}: expected h1, h2 or both"),
                    }
                }
                "--scenario" | "--scenarios" => {
                    let list = value(&mut it)?;
                    o.scenarios = list
                        .split(',')
                        .map(|s| {
                            SCENARIOS
                                .iter()
                                .position(|(n, _, _)| *n == s.trim())
                                .with_context(|| {
                                    let names: Vec<&str> =
                                        SCENARIOS.iter().map(|(n, _, _)| *n).collect();
                                    format!("--scenario {s}: known are {}", names.join(", "))
                                })
                        })
                        .collect::<anyhow::Result<_>>()?;
                }
                "--connections" => o.connections = count(&name, &value(&mut it)?)?,
                "--concurrency" => o.concurrency = count(&name, &value(&mut it)?)?,
                "--h2-connections" => o.h2_connections = count(&name, &value(&mut it)?)?,
                "--rounds" => o.rounds = count(&name, &value(&mut it)?)?,
                "--client-threads" => o.client_threads = count(&name, &value(&mut it)?)?,
                "--rate" => {
                    let v = value(&mut it)?;
                    o.load = if v == "max" {
                        Load::Max
                    } else {
                        let rate: f64 = v
                            .parse()
                            .with_context(|| format!("--rate {v}: not a number or `max`"))?;
                        if !(rate.is_finite() && rate > 0.0) {
                            bail!("--rate {v}: must be above 0");
                        }
                        Load::Rate(rate)
                    };
                }
                "--duration" => o.duration = seconds(&name, &value(&mut it)?, false)?,
                "--warmup" => o.warmup = seconds(&name, &value(&mut it)?, true)?,
                "--timeout" => o.timeout = seconds(&name, &value(&mut it)?, false)?,
                "--json" => o.json = Some(PathBuf::from(value(&mut it)?)),
                "--server-bin" => o.server_bin = PathBuf::from(value(&mut it)?),
                "--soak" => o.soak = Some(seconds(&name, &value(&mut it)?, false)?),
                "--sample" => o.sample = seconds(&name, &value(&mut it)?, false)?,
                n if LIBTEST_FLAGS.contains(&n) => {}
                n if LIBTEST_OPTIONS.contains(&n) => {
                    value(&mut it)?;
                }
                n if n.starts_with('-') => {
                    if bench {
                        bail!("unknown option {arg}");
                    }
                    o.ignored.push(arg.clone());
                }
                _ => o.filters.push(arg.clone()),
            }
        }
        Ok(o)
    }

    /// Whether a name passes the libtest-style filters.
    pub fn selects(&self, name: &str) -> bool {
        self.filters.is_empty()
            || self.filters.iter().any(|f| {
                if self.exact {
                    name == f
                } else {
                    name.contains(f.as_str())
                }
            })
    }
}

fn count(name: &str, value: &str) -> anyhow::Result<usize> {
    match value.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => bail!("{name} {value}: expected a whole number of at least 1"),
    }
}

fn seconds(name: &str, value: &str, zero_ok: bool) -> anyhow::Result<Duration> {
    let secs: f64 = value
        .parse()
        .with_context(|| format!("{name} {value}: expected seconds, e.g. 5 or 0.3"))?;
    if !secs.is_finite() || secs < 0.0 || (secs == 0.0 && !zero_ok) || secs > 86_400.0 {
        bail!("{name} {value}: out of range");
    }
    Ok(Duration::from_secs_f64(secs))
}
