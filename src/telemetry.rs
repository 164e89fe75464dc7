//! Logging: one `tracing` subscriber for the whole process, text or JSON lines, written by a
//! thread of its own so that a request never waits for stderr (one line per admission
//! decision: at tens of thousands of reviews a second the write was a fifth of the cost).

use std::io::IsTerminal as _;

use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Lines queued for the writer thread; a request waits (never drops its line) only when the
/// writer falls this far behind.
const QUEUED_LINES: usize = 64 * 1024;

/// Installs the global subscriber; `RUST_LOG` overrides the default `info` level. Keep the
/// returned guard until the process ends: dropping it flushes the lines still queued.
pub fn init(format: LogFormat) -> WorkerGuard {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(false)
        .buffered_lines_limit(QUEUED_LINES)
        .thread_name("podmend-log")
        .finish(std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(writer);
    // A second init (tests) keeps the first subscriber: ignore the error.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    guard
}
