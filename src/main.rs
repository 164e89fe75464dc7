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

/// A review allocates and frees many small objects (JSON trees, typed pod specs): with glibc's
/// allocator that was a third of a repair's CPU (BENCHMARKS.md, issue 17). Built without
/// transparent huge pages (`no_thp`), which would round a small heap up to 2 MiB pieces.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// When mimalloc gives freed memory back to the system, per command. The batch commands give
/// it back at once, as glibc does: mimalloc's default keeps it a second, and `audit --cluster`
/// would hold a page of pods more. `serve` keeps it a few milliseconds: given back at once, a
/// page that a repair frees at the end of each request is faulted back in by the next (two
/// `madvise` calls and two page faults per repair, a quarter more CPU on one core;
/// BENCHMARKS.md). What listing the cluster took, `serve` gives back right after each list
/// ([`give_back_freed_memory`]). `MIMALLOC_PURGE_DELAY` in the environment overrides both.
fn set_purge_delay(command: &Command) {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return; // the operator's choice, which mimalloc has read
    }
    let milliseconds = match command {
        Command::Serve(_) => SERVE_PURGE_DELAY_MS,
        _ => 0,
    };
    // SAFETY: stores an integer in mimalloc's option table, which mimalloc reads each time it
    // considers giving pages back; no thread is running yet.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, milliseconds) };
}

/// `serve`'s purge delay: long enough that a page freed at the end of one review is still
/// there for the next (1 ms left a tenth of the faults, 10 ms none; BENCHMARKS.md).
const SERVE_PURGE_DELAY_MS: std::ffi::c_long = 10;

/// Gives back at once what is free, whatever the purge delay: `serve` calls it after each list
/// of the cluster, whose pages and old table it has just freed (20 MiB for 5,000 real-shaped
/// Nodes).
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
    set_purge_delay(&cli.command);
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

    /// mimalloc's option table is plain memory: the tests that write or read it take turns.
    static OPTIONS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn serve_keeps_freed_pages_a_few_milliseconds_and_the_batch_commands_none() {
        let _turn = OPTIONS.lock().unwrap_or_else(|e| e.into_inner());
        let serve = Cli::parse_from(["podmend", "serve"]).command;
        let audit = Cli::parse_from(["podmend", "audit", "pod.yaml"]).command;
        // SAFETY: reads and sets integers in mimalloc's option table (this test alone).
        let (default, for_serve, for_audit) = unsafe {
            let default = libmimalloc_sys::mi_option_get(PURGE_DELAY);
            set_purge_delay(&serve);
            let for_serve = libmimalloc_sys::mi_option_get(PURGE_DELAY);
            set_purge_delay(&audit);
            (
                default,
                for_serve,
                libmimalloc_sys::mi_option_get(PURGE_DELAY),
            )
        };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            // 1,000 ms is mimalloc 3's default purge delay, and no other option's default.
            assert_eq!(
                default, 1000,
                "option {PURGE_DELAY} is not mimalloc's purge delay"
            );
            assert_eq!((for_serve, for_audit), (SERVE_PURGE_DELAY_MS, 0));
        } else {
            assert_eq!(
                (for_serve, for_audit),
                (default, default),
                "the environment's delay is kept"
            );
        }
    }

    #[test]
    fn giving_back_freed_memory_can_run_on_any_thread() {
        let _turn = OPTIONS.lock().unwrap_or_else(|e| e.into_inner());
        let threads: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| (0..100).for_each(|_| give_back_freed_memory())))
            .collect();
        for thread in threads {
            assert!(thread.join().is_ok());
        }
    }
}
