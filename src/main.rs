//! The `podmend` binary: parse the command line, set up logging, dispatch.

use std::io::IsTerminal as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use podmend::cli::{
    AuditArgs, CertsArgs, CleanStormsArgs, Cli, Command, GuardArgs, GuardSubcommand, ServeArgs,
};
use podmend::config::{Config, DEFAULT_CONFIG_YAML};
use podmend::guard::{self, GuardOptions};
use podmend::server::ServeOptions;
use podmend::telemetry::LogWriter;
use podmend::{audit, certs, server, storms, telemetry};

mod allocator;

/// A review allocates and frees many small objects (JSON trees, typed pod specs): with glibc's
/// allocator that was a third of a repair's CPU (BENCHMARKS.md, issue 17). mimalloc, built
/// without transparent huge pages (`no_thp`), which would round a small heap up to 2 MiB
/// pieces, and entered without its alignment checks where they cannot matter ([`allocator`]).
#[global_allocator]
static ALLOCATOR: allocator::Mimalloc = allocator::Mimalloc;

/// How long mimalloc keeps freed memory before giving it back to the system, per command.
/// `serve` keeps it a few milliseconds: given back at once, a page that a review frees at the
/// end of each request is faulted back in by the next (on one CPU, two `madvise` calls and two
/// page faults per repair, a quarter more CPU; over HTTP/2, a third less throughput on one
/// connection; BENCHMARKS.md), and what listing the cluster took it gives back right after
/// each list ([`give_back_freed_memory`]). `audit` keeps it a little longer, for the same
/// reason at the scale of a list page: see [`AUDIT_PURGE_DELAY_MS`]. Every other command
/// gives freed memory back at once, as glibc does; the guard's footprint was measured so.
fn purge_delay_ms(command: &Command) -> std::ffi::c_long {
    match command {
        Command::Serve(_) => SERVE_PURGE_DELAY_MS,
        Command::Audit(_) => AUDIT_PURGE_DELAY_MS,
        _ => 0,
    }
}

/// `audit`'s purge delay: long enough that the pages one list page of pods was parsed into
/// are still there when the next page is parsed. Given back at once, they were faulted back
/// in page after page, and `audit --cluster` took 1.35–1.6× the CPU over 100,000 pods (10 ms
/// was too short to help; from 300 ms the peak went over the 64 MiB target). BENCHMARKS.md,
/// issue 17, twenty-second pass.
const AUDIT_PURGE_DELAY_MS: std::ffi::c_long = 50;

/// `serve`'s purge delay: long enough that a page freed at the end of one review is still
/// there for the next (on one CPU, 1 ms left 4 % of the faults, 10 ms under 0.5 %).
const SERVE_PURGE_DELAY_MS: std::ffi::c_long = 10;

/// Gives back what is free, whatever the purge delay: `serve` calls it after each list of the
/// cluster, whose pages and old table have just been freed (20 MiB for 5,000 real-shaped
/// Nodes). It frees the calling thread's empty pages and purges what every thread has handed
/// back to mimalloc's shared arenas, where a freed list's pages go; empty pages another thread
/// keeps stay until it reuses or hands them back.
fn give_back_freed_memory() {
    // SAFETY: mimalloc's collection is safe from any thread: it collects the caller's own
    // heap, and purges the shared arenas one thread at a time.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

/// `mi_option_purge_delay` in mimalloc.h's `mi_option_e` (the same in v2 and v3), which
/// libmimalloc-sys does not name; the test below pins it by its default.
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // SAFETY: stores an integer in mimalloc's option table, which mimalloc reads each time it
    // considers giving pages back; no other thread is running yet. `set_default` leaves a
    // valid `MIMALLOC_PURGE_DELAY` (any case, or its old name) in the environment in force.
    unsafe { libmimalloc_sys::mi_option_set_default(PURGE_DELAY, purge_delay_ms(&cli.command)) };
    // Only `serve` logs a line per request; the others write each line as it comes.
    let writer = match cli.command {
        Command::Serve(_) => LogWriter::Batched,
        _ => LogWriter::Direct,
    };
    let log = telemetry::init(cli.log_format, writer);
    let result = run(cli.command);
    // Writes out the log lines still buffered, so they come before a final error.
    drop(log);
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("podmend: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(args) => serve(args),
        Command::Audit(args) => audit(&args),
        Command::CleanStorms(args) => clean_storms(&args),
        Command::Guard(args) => guard(args),
        Command::Certs(args) => certs(&args),
        Command::Config(args) => config(args.check.as_deref()),
    }
}

/// The async runtime of the commands that talk to a network, with the one process-wide
/// crypto provider installed first, so that every rustls user (kube's client too) agrees.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Runtime::new().context("cannot start the async runtime")
}

fn success_if(succeeded: bool) -> ExitCode {
    if succeeded {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let options = ServeOptions {
        after_cache_list: give_back_freed_memory,
        ..args.options()?
    };
    runtime()?.block_on(server::serve(options, shutdown_signal()))?;
    Ok(ExitCode::SUCCESS)
}

fn audit(args: &AuditArgs) -> anyhow::Result<ExitCode> {
    let terminal = audit::Terminal {
        color: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        progress: std::io::stderr().is_terminal(),
    };
    let runtime = runtime()?;
    let mut stdout = std::io::stdout().lock();
    let status = runtime.block_on(audit::run(&args.options(), &mut stdout, terminal))?;
    Ok(ExitCode::from(status))
}

fn clean_storms(args: &CleanStormsArgs) -> anyhow::Result<ExitCode> {
    let runtime = runtime()?;
    let mut stdout = std::io::stdout().lock();
    let options = args.options(std::io::stderr().is_terminal());
    let succeeded = runtime.block_on(storms::clean_command(&options, &mut stdout))?;
    Ok(success_if(succeeded))
}

fn guard(args: GuardArgs) -> anyhow::Result<ExitCode> {
    let runtime = runtime()?;
    match args.command {
        Some(GuardSubcommand::Reap(reap)) => {
            let mut stdout = std::io::stdout().lock();
            let report = runtime.block_on(guard::reap_command(
                &reap.options()?,
                &mut stdout,
                shutdown_signal(),
            ))?;
            Ok(success_if(report.failed == 0))
        }
        None => {
            let command = args.run.command().map_err(anyhow::Error::msg)?;
            let options = GuardOptions::new(
                command,
                args.run.owner_pod_uid.as_deref().unwrap_or(""),
                Duration::from_secs(args.run.shutdown_seconds),
            )?;
            runtime.block_on(guard::run(options, shutdown_signal()))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn certs(args: &CertsArgs) -> anyhow::Result<ExitCode> {
    let pki = certs::generate(&args.dns, args.days)?;
    pki.write_to(&args.out)?;
    println!(
        "wrote {dir}/ca.crt, {dir}/tls.crt, {dir}/tls.key (valid {days} days for {names})",
        dir = args.out.display(),
        days = args.days,
        names = args.dns.join(", ")
    );
    Ok(ExitCode::SUCCESS)
}

/// `podmend config`: the defaults, or `--check FILE`.
fn config(check: Option<&Path>) -> anyhow::Result<ExitCode> {
    let Some(path) = check else {
        print!("{DEFAULT_CONFIG_YAML}");
        return Ok(ExitCode::SUCCESS);
    };
    match Config::from_file(path) {
        Ok(_) => {
            println!("{}: valid", path.display());
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            eprintln!("podmend: {error}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Resolves on SIGTERM (the kubelet stopping the pod) or Ctrl-C.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_and_audit_keep_freed_pages_some_milliseconds_and_every_other_command_none() {
        let delay = |args: &[&str]| purge_delay_ms(&Cli::parse_from(args).command);
        assert_eq!(delay(&["podmend", "serve"]), SERVE_PURGE_DELAY_MS);
        assert_eq!(
            delay(&["podmend", "audit", "pod.yaml"]),
            AUDIT_PURGE_DELAY_MS
        );
        assert_eq!(
            delay(&["podmend", "audit", "--cluster"]),
            AUDIT_PURGE_DELAY_MS
        );
        assert_eq!(
            delay(&["podmend", "certs", "--dns", "podmend.svc", "--out", "pki"]),
            0
        );
        assert_eq!(
            delay(&[
                "podmend",
                "guard",
                "--upstream",
                "unix:///run/docker.sock",
                "--owner-pod-uid",
                "u1",
                "--listen",
                "unix:///tmp/d.sock"
            ]),
            0
        );
    }

    #[test]
    fn the_option_set_at_start_is_mimallocs_purge_delay() {
        // SAFETY: reads an integer of mimalloc's option table, which only `main` writes.
        let value = unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) };
        // 1,000 ms is mimalloc 3's default purge delay, and no other option's default.
        // (Unless the environment sets a mimalloc option for the test run.)
        if std::env::vars().all(|(name, _)| !name.to_ascii_uppercase().starts_with("MIMALLOC_")) {
            assert_eq!(
                value, 1000,
                "option {PURGE_DELAY} is not mimalloc's purge delay"
            );
        }
    }

    #[test]
    fn giving_back_freed_memory_can_run_on_any_thread() {
        let threads: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| (0..100).for_each(|_| give_back_freed_memory())))
            .collect();
        for thread in threads {
            assert!(thread.join().is_ok());
        }
    }
}
