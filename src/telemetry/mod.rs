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

use tracing::{Dispatch, Level};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt as _;

mod text;

pub use text::PlainField;
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
    let (subscriber, guard) = batch_subscriber(format, filter(), ansi, out);
    // A second init (tests) keeps the first subscriber: ignore the error.
    let _ = subscriber.try_init();
    guard
}

/// The subscriber with batched lines written to `out`, and its guard.
fn batch_subscriber<W: Write + Send + 'static>(
    format: LogFormat,
    filter: EnvFilter,
    ansi: bool,
    out: W,
) -> (Dispatch, LogGuard) {
    let (mut writer, guard) = BatchWriter::spawn(out);
    writer.plain_text = format == LogFormat::Text && !ansi;
    (subscriber(format, filter, ansi, writer), guard)
}

/// Writes one line straight into the batch, as the current subscriber would write an event of
/// `level` and `target` with `message` and `fields`, when that subscriber is `serve`'s in the
/// plain text format. At one line per admission review, the event's way through the
/// subscriber (its fields recorded one by one through `dyn` visitors) was most of the line's
/// cost. `false`, with nothing written, under any other subscriber (JSON, colour, a test's):
/// the caller then logs the event. The caller checks that the event's level is enabled.
pub fn write_plain_line(
    level: Level,
    target: &str,
    message: &str,
    fields: &[(&str, PlainField<'_>)],
) -> bool {
    tracing::dispatcher::get_default(|current| {
        current
            .downcast_ref::<BatchWriter>()
            .filter(|writer| writer.plain_text)
            .is_some_and(|writer| {
                text::write_plain(&level, target, message, fields, |line| writer.append(line))
            })
    })
}

/// `RUST_LOG`, or `info` when it is unset or does not parse.
fn filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"))
}

fn install<W>(format: LogFormat, filter: EnvFilter, ansi: bool, writer: W)
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    // A second init (tests) keeps the first subscriber: ignore the error.
    let _ = subscriber(format, filter, ansi, writer).try_init();
}

/// The subscriber of `format`, its lines written through `writer`.
fn subscriber<W>(format: LogFormat, filter: EnvFilter, ansi: bool, writer: W) -> Dispatch
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_timer(Timestamp)
        .with_writer(writer);
    match format {
        LogFormat::Text => builder
            .event_format(TextLine::default())
            .fmt_fields(TextFields)
            .finish()
            .into(),
        LogFormat::Json => builder.json().flatten_event(true).finish().into(),
    }
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
pub struct BatchWriter {
    shared: Arc<Shared>,
    /// The destination, for the write-through a full buffer forces.
    out: Arc<Mutex<Box<dyn Write + Send>>>,
    /// Whether the subscriber writes the plain text format (no JSON, no colour): then a line
    /// can be written into the buffer as that format writes it ([`write_plain_line`]).
    plain_text: bool,
}

/// Writes out what is still buffered and stops the writer thread when dropped.
pub struct LogGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl BatchWriter {
    /// The writer, and the guard whose drop writes out the rest, with the thread that writes
    /// the buffer to `out`.
    pub fn spawn(out: impl Write + Send + 'static) -> (Self, LogGuard) {
        let shared = Arc::new(Shared {
            state: Mutex::new(Buffered {
                lines: Vec::new(),
                closed: false,
            }),
            wake: Condvar::new(),
        });
        let out: Arc<Mutex<Box<dyn Write + Send>>> = Arc::new(Mutex::new(Box::new(out)));
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
            plain_text: false,
        };
        (writer, LogGuard { shared, thread })
    }

    /// Appends `line` to the buffer: the writer thread writes it out (see the module's doc).
    fn append(&self, line: &[u8]) {
        let mut state = self.shared.lock();
        if state.closed {
            drop(state);
            write_all(&mut *lock(&self.out), line);
            return;
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

impl Write for &BatchWriter {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        self.append(line);
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for BatchWriter {
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

    /// A timer that writes [`FixedTime::TEXT`] whenever it is asked.
    #[derive(Clone)]
    pub(crate) struct FixedTime;

    impl FixedTime {
        pub(crate) const TEXT: &str = "2026-11-24T06:58:16.306482Z";
    }

    impl tracing_subscriber::fmt::time::FormatTime for FixedTime {
        fn format_time(
            &self,
            w: &mut tracing_subscriber::fmt::format::Writer<'_>,
        ) -> std::fmt::Result {
            w.write_str(Self::TEXT)
        }
    }

    /// A tracing-subscriber format subscriber at every level, in colour or not, writing into a
    /// [`Sink`]: what a test finishes with the format it checks.
    pub(crate) type SinkBuilder = tracing_subscriber::fmt::SubscriberBuilder<
        tracing_subscriber::fmt::format::DefaultFields,
        tracing_subscriber::fmt::format::Format,
        tracing_subscriber::filter::LevelFilter,
        tracing_subscriber::fmt::writer::BoxMakeWriter,
    >;

    /// What the subscriber `finish` makes of a [`SinkBuilder`] writes of what `log` logs.
    pub(crate) fn written_by<S>(
        ansi: bool,
        finish: impl FnOnce(SinkBuilder) -> S,
        log: impl FnOnce(),
    ) -> String
    where
        S: tracing::Subscriber + Send + Sync + 'static,
    {
        let sink = Sink::default();
        let writer = sink.clone();
        let builder = tracing_subscriber::fmt()
            .with_writer(tracing_subscriber::fmt::writer::BoxMakeWriter::new(
                move || writer.clone(),
            ))
            .with_ansi(ansi)
            .with_max_level(Level::TRACE);
        tracing::subscriber::with_default(finish(builder), log);
        sink.text()
    }

    /// What the text format writes, in colour or not, at [`FixedTime`], of what `log` logs.
    pub(crate) fn text_of(ansi: bool, log: impl FnOnce()) -> String {
        let ours = |builder: SinkBuilder| {
            builder
                .event_format(TextLine::with_timer(FixedTime))
                .fmt_fields(TextFields)
                .finish()
        };
        written_by(ansi, ours, log)
    }

    /// The line [`write_plain_line`] writes, at [`FixedTime`]; `None` when it writes none.
    pub(crate) fn plain_line_of(
        level: Level,
        target: &str,
        message: &str,
        fields: &[(&str, PlainField<'_>)],
    ) -> Option<String> {
        let mut line = String::new();
        text::plain_line(&mut line, FixedTime::TEXT, &level, target, message, fields).ok()?;
        Some(line)
    }

    /// Calls `write_plain_line` under the batched subscriber of `format`, and gives what it
    /// returned and what reached the destination.
    fn written_plainly(format: LogFormat, ansi: bool) -> (bool, String) {
        let sink = Sink::default();
        let (subscriber, guard) =
            batch_subscriber(format, EnvFilter::new("info"), ansi, sink.clone());
        let fields = [
            ("uid", PlainField::Display("a-1")),
            ("n", PlainField::U64(7)),
        ];
        let written = tracing::dispatcher::with_default(&subscriber, || {
            write_plain_line(Level::INFO, "podmend::x", "done", &fields)
        });
        drop(guard);
        (written, sink.text())
    }

    #[test]
    fn under_the_batched_plain_text_subscriber_a_line_goes_straight_into_the_batch() {
        let (written, text) = written_plainly(LogFormat::Text, false);
        assert!(written);
        let (time, rest) = text.split_at(FixedTime::TEXT.len());
        assert!(time.ends_with('Z'), "{text}");
        assert_eq!(rest, "  INFO podmend::x: done uid=a-1 n=7\n");
    }

    #[test]
    fn a_message_the_format_escapes_is_left_to_the_subscriber() {
        assert_eq!(plain_line_of(Level::INFO, "t", "bell\u{7}", &[]), None);
        assert_eq!(
            plain_line_of(Level::WARN, "t", "plain", &[]).as_deref(),
            Some("2026-11-24T06:58:16.306482Z  WARN t: plain\n")
        );
    }

    #[test]
    fn under_json_colour_or_another_subscriber_nothing_is_written_straight() {
        for (format, ansi) in [(LogFormat::Json, false), (LogFormat::Text, true)] {
            assert_eq!(written_plainly(format, ansi), (false, String::new()));
        }
        let fields = [("n", PlainField::U64(7))];
        let mut written = true;
        text_of(false, || {
            written = write_plain_line(Level::INFO, "t", "m", &fields)
        });
        assert!(!written);
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
