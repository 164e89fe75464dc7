//! Logging: one `tracing` subscriber for the whole process, text or JSON lines; a text line
//! is formatted by [`text`] as tracing-subscriber formats it, for less. Under `serve`
//! ([`LogWriter::Batched`]) a request never writes to stderr itself: it appends its line to
//! a shared buffer, and a thread of its own writes the buffer out every [`FLUSH_INTERVAL`]
//! or as soon as it grows past [`WAKE_AT`]. One line per admission decision at tens of
//! thousands of reviews a second made the direct write a fifth of the cost, and a queue that
//! woke a writer thread per line still a tenth; appending costs a lock nobody else holds and
//! a copy.

use std::io::{IsTerminal as _, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

mod text;

use text::{TextFields, TextLine, Timestamp};

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// How long a line may wait in the buffer before it is written: short enough that a person
/// tailing the log sees it at once.
const FLUSH_INTERVAL: Duration = Duration::from_millis(20);

/// Buffered bytes past which the writer thread is woken before its interval is up.
const WAKE_AT: usize = 256 * 1024;

/// Buffered bytes past which a request writes the buffer out itself: the writer fell far
/// behind (a stalled stderr), and a line is never dropped, so the request waits instead.
const WRITE_THROUGH_AT: usize = 16 * 1024 * 1024;

/// How log lines reach stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogWriter {
    /// Each line written as it is logged: commands that log a few lines a second.
    Direct,
    /// Lines appended to a buffer a thread writes out (see the module's doc): `serve`, which
    /// logs one line per admission review.
    Batched,
}

/// Installs the global subscriber; `RUST_LOG` overrides the default `info` level. Keep the
/// returned guard until the process ends: dropping it writes out the lines still buffered.
pub fn init(format: LogFormat, writer: LogWriter) -> Option<LogGuard> {
    let ansi = std::io::stderr().is_terminal();
    match writer {
        LogWriter::Direct => {
            install(format, filter(), ansi, std::io::stderr);
            None
        }
        LogWriter::Batched => Some(batched(format, ansi, std::io::stderr())),
    }
}

/// Installs the subscriber `serve` installs, its lines written to `out` in no colour: the log
/// line's benchmark points it at a sink. `RUST_LOG` applies, and a subscriber already installed
/// stays (the lines then never reach `out`). Keep the guard, as [`init`]'s.
#[doc(hidden)]
pub fn init_batched<W: Write + Send + 'static>(format: LogFormat, out: W) -> LogGuard {
    batched(format, false, out)
}

/// Installs the subscriber with batched lines written to `out`.
fn batched<W: Write + Send + 'static>(format: LogFormat, ansi: bool, out: W) -> LogGuard {
    let (writer, guard) = BatchWriter::spawn(out);
    install(format, filter(), ansi, writer);
    guard
}

/// `RUST_LOG`, or `info` when it is unset or does not parse.
fn filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"))
}

fn install<W>(format: LogFormat, filter: EnvFilter, ansi: bool, writer: W)
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_timer(Timestamp)
        .with_writer(writer);
    // A second init (tests) keeps the first subscriber: ignore the error.
    let _ = match format {
        LogFormat::Text => builder
            .event_format(TextLine::default())
            .fmt_fields(TextFields)
            .try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// What the appenders and the writer thread share.
struct Shared {
    state: Mutex<Buffered>,
    wake: Condvar,
}

struct Buffered {
    lines: Vec<u8>,
    closed: bool,
}

impl Shared {
    /// The buffer, even if a thread panicked while holding it (bytes are still bytes).
    fn lock(&self) -> MutexGuard<'_, Buffered> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The [`MakeWriter`] each event's formatted line is written through: appends to the buffer.
pub struct BatchWriter<W: Write + Send + 'static> {
    shared: Arc<Shared>,
    /// The destination, for the write-through a full buffer forces.
    out: Arc<Mutex<W>>,
}

/// Writes out what is still buffered and stops the writer thread when dropped.
pub struct LogGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl<W: Write + Send + 'static> BatchWriter<W> {
    /// The writer, and the guard whose drop writes out the rest, with the thread that writes
    /// the buffer to `out`.
    pub fn spawn(out: W) -> (Self, LogGuard) {
        let shared = Arc::new(Shared {
            state: Mutex::new(Buffered {
                lines: Vec::new(),
                closed: false,
            }),
            wake: Condvar::new(),
        });
        let out = Arc::new(Mutex::new(out));
        let thread = {
            let (shared, out) = (Arc::clone(&shared), Arc::clone(&out));
            std::thread::Builder::new()
                .name("podmend-log".to_string())
                .spawn(move || write_out_until_closed(&shared, &out))
                .ok()
        };
        let writer = Self {
            shared: Arc::clone(&shared),
            out,
        };
        (writer, LogGuard { shared, thread })
    }
}

/// The writer thread: every interval, or when woken, takes what is buffered and writes it.
/// It takes the destination before it lets go of the buffer, so a request that writes
/// through (see [`WRITE_THROUGH_AT`]) cannot put its lines before older ones.
fn write_out_until_closed<W: Write>(shared: &Shared, out: &Mutex<W>) {
    let mut spare = Vec::new();
    loop {
        let mut state = shared.lock();
        if state.lines.is_empty() && !state.closed {
            state = shared
                .wake
                .wait_timeout(state, FLUSH_INTERVAL)
                .map_or_else(|poisoned| poisoned.into_inner().0, |(state, _)| state);
        }
        std::mem::swap(&mut state.lines, &mut spare);
        let closed = state.closed;
        let mut out = lock(out);
        drop(state);
        write_all(&mut *out, &spare);
        drop(out);
        spare.clear();
        if closed {
            return;
        }
    }
}

/// The destination, even if a thread panicked while writing to it.
fn lock<W>(out: &Mutex<W>) -> MutexGuard<'_, W> {
    out.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes `bytes` to `out`; a log line that cannot be written has nowhere else to go.
fn write_all<W: Write>(out: &mut W, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let _ = out.write_all(bytes);
    let _ = out.flush();
}

impl<W: Write + Send + 'static> Write for &BatchWriter<W> {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let mut state = self.shared.lock();
        if state.closed {
            drop(state);
            write_all(&mut *lock(&self.out), line);
            return Ok(line.len());
        }
        state.lines.extend_from_slice(line);
        let buffered = state.lines.len();
        if buffered >= WRITE_THROUGH_AT {
            // Keeps the buffer locked while writing, so lines stay in order.
            let lines = std::mem::take(&mut state.lines);
            write_all(&mut *lock(&self.out), &lines);
        } else if buffered >= WAKE_AT {
            self.shared.wake.notify_one();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a, W: Write + Send + 'static> MakeWriter<'a> for BatchWriter<W> {
    type Writer = &'a Self;

    fn make_writer(&'a self) -> Self::Writer {
        self
    }
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A destination the test can read back.
    #[derive(Clone, Default)]
    pub(crate) struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("sink").extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        pub(crate) fn text(&self) -> String {
            String::from_utf8(self.0.lock().expect("sink").clone()).expect("utf-8")
        }
    }

    #[test]
    fn lines_reach_the_destination_in_order_within_the_interval() {
        let sink = Sink::default();
        let (writer, _guard) = BatchWriter::spawn(sink.clone());
        for n in 0..100 {
            writer
                .make_writer()
                .write_all(format!("line {n}\n").as_bytes())
                .expect("write");
        }
        let expected: String = (0..100).map(|n| format!("line {n}\n")).collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while sink.text() != expected && std::time::Instant::now() < deadline {
            std::thread::sleep(FLUSH_INTERVAL);
        }
        assert_eq!(sink.text(), expected);
    }

    #[test]
    fn dropping_the_guard_writes_out_what_is_still_buffered() {
        let sink = Sink::default();
        let (writer, guard) = BatchWriter::spawn(sink.clone());
        writer
            .make_writer()
            .write_all(b"last words\n")
            .expect("write");
        drop(guard);
        assert_eq!(sink.text(), "last words\n");
        // After the guard, lines are written straight through, not lost.
        writer.make_writer().write_all(b"after\n").expect("write");
        assert_eq!(sink.text(), "last words\nafter\n");
    }

    #[test]
    fn a_buffer_past_the_write_through_mark_is_written_by_the_request_itself() {
        let sink = Sink::default();
        let (writer, _guard) = BatchWriter::spawn(sink.clone());
        let big = vec![b'x'; WRITE_THROUGH_AT];
        writer.make_writer().write_all(&big).expect("write");
        assert_eq!(sink.0.lock().expect("sink").len(), WRITE_THROUGH_AT);
    }
}
