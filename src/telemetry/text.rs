//! The text log line as tracing-subscriber's default format writes it, byte for byte, for less:
//! at one line per admission review, its timestamp, level, target and field formatting were
//! most of the line's cost. [`TextLine`] writes the line of an event outside any span, in no
//! colour, itself; [`Timestamp`] formats the date and time up to the second once a second per
//! thread; [`TextFields`] gathers plain fields' `name=value` in a buffer the thread keeps, and
//! writes them at once. Everything else (spans, colours, events from the `log` crate, error
//! sources, a message that needs escaping) is handed to tracing-subscriber's own formatter.
//! The tests compare the lines with its output.

use std::cell::Cell;
use std::fmt::{self, Write as _};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultVisitor, Format, Full, Writer};
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// tracing-subscriber's default event format (`Full`), with [`Timestamp`] unless a test
/// gives another timer; see the module's doc.
#[derive(Debug, Clone)]
pub struct TextLine<T = Timestamp> {
    full: Format<Full, T>,
    timer: T,
}

impl Default for TextLine {
    fn default() -> Self {
        Self::with_timer(Timestamp)
    }
}

impl<T: FormatTime + Clone> TextLine<T> {
    pub fn with_timer(timer: T) -> Self {
        Self {
            full: Format::default().with_timer(timer.clone()),
            timer,
        }
    }
}

impl<S, N, T> FormatEvent<S, N> for TextLine<T>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    T: FormatTime,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let metadata = event.metadata();
        // A `log` record carries its real target and level in `log.` fields, which
        // tracing-subscriber reads back.
        let plain = !writer.has_ansi_escapes()
            && metadata.fields().field("log.target").is_none()
            && ctx.event_scope().is_none();
        if !plain {
            return self.full.format_event(ctx, writer, event);
        }
        if self.timer.format_time(&mut writer).is_err() {
            writer.write_str("<unknown time>")?;
        }
        writer.write_str(level_and_space(metadata.level()))?;
        writer.write_str(metadata.target())?;
        writer.write_str(": ")?;
        ctx.format_fields(writer.by_ref(), event)?;
        writer.write_char('\n')
    }
}

/// The space after the timestamp, the level padded to five characters, and a space.
fn level_and_space(level: &Level) -> &'static str {
    match *level {
        Level::TRACE => " TRACE ",
        Level::DEBUG => " DEBUG ",
        Level::INFO => "  INFO ",
        Level::WARN => "  WARN ",
        Level::ERROR => " ERROR ",
    }
}

/// tracing-subscriber's `SystemTime` timer, `2026-11-24T06:58:16.306482Z` (UTC).
#[derive(Debug, Clone, Copy, Default)]
pub struct Timestamp;

/// `YYYY-MM-DDTHH:MM:SS.`: what every timestamp within one second starts with.
type SecondPrefix = [u8; 20];

thread_local! {
    /// The last second this thread formatted, and its prefix.
    static LAST_SECOND: Cell<(u64, SecondPrefix)> = const { Cell::new((u64::MAX, [0; 20])) };
}

/// The first second of the year 10000, from which tracing-subscriber writes the year with a
/// sign: those times (and times before 1970) are left to it.
const YEAR_10000: u64 = 253_402_300_800;

impl FormatTime for Timestamp {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        match now() {
            // Digits and ASCII punctuation only.
            Some(line) => w.write_str(std::str::from_utf8(&line).map_err(|_| fmt::Error)?),
            None => tracing_subscriber::fmt::time::SystemTime.format_time(w),
        }
    }
}

/// The time now as [`Timestamp`] writes it; `None` before 1970 and from the year 10000, which
/// tracing-subscriber writes differently.
fn now() -> Option<[u8; 27]> {
    let since_epoch = match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(since) if since.as_secs() < YEAR_10000 => since,
        _ => return None,
    };
    let second = since_epoch.as_secs();
    let prefix = LAST_SECOND.with(|last| {
        let (cached, prefix) = last.get();
        if cached == second {
            return prefix;
        }
        let prefix = second_prefix(second);
        last.set((second, prefix));
        prefix
    });
    let mut line = [0u8; 27];
    line[..20].copy_from_slice(&prefix);
    put_digits(&mut line[20..26], u64::from(since_epoch.subsec_micros()));
    line[26] = b'Z';
    Some(line)
}

/// `YYYY-MM-DDTHH:MM:SS.` for a second since 1970 before the year 10000.
fn second_prefix(second: u64) -> SecondPrefix {
    let (year, month, day) = civil_date(second / 86_400);
    let time = second % 86_400;
    let mut prefix = *b"0000-00-00T00:00:00.";
    put_digits(&mut prefix[0..4], year);
    put_digits(&mut prefix[5..7], month);
    put_digits(&mut prefix[8..10], day);
    put_digits(&mut prefix[11..13], time / 3600);
    put_digits(&mut prefix[14..16], time / 60 % 60);
    put_digits(&mut prefix[17..19], time % 60);
    prefix
}

/// The proleptic Gregorian (year, month, day) of a day counted from 1970-01-01: the
/// days-from-civil inverse in Howard Hinnant's "chrono-compatible low-level date algorithms",
/// with eras of 400 years starting on a March 1st.
fn civil_date(days_since_epoch: u64) -> (u64, u64, u64) {
    let days = days_since_epoch + 719_468; // from 0000-03-01
    let era = days / 146_097;
    let day_of_era = days % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// Writes `value`'s last `digits.len()` decimal digits into `digits`, zero-padded.
fn put_digits(digits: &mut [u8], mut value: u64) {
    for digit in digits.iter_mut().rev() {
        *digit = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// tracing-subscriber's `DefaultFields`, writing plain fields itself (see the module's doc).
#[derive(Debug, Clone, Copy, Default)]
pub struct TextFields;

impl<'a> MakeVisitor<Writer<'a>> for TextFields {
    type Visitor = TextVisitor<'a>;

    fn make_visitor(&self, writer: Writer<'a>) -> TextVisitor<'a> {
        TextVisitor {
            writer,
            pending: PENDING.try_with(Cell::take).unwrap_or_default(),
            is_empty: true,
            result: Ok(()),
        }
    }
}

thread_local! {
    /// The room a visitor gathers its fields in, kept between events so that a line costs
    /// no allocation.
    static PENDING: Cell<String> = const { Cell::new(String::new()) };
}

/// Writes fields as `DefaultVisitor` does: separated by a space, `name=value` with the value
/// in its `Debug` form, a `r#` prefix dropped, `log.` fields (already in the line's
/// metadata) skipped.
pub struct TextVisitor<'a> {
    writer: Writer<'a>,
    /// Plain fields gathered and not yet written: `writer` writes through a `dyn fmt::Write`,
    /// and a dozen small writes per field through it were most of a line's cost. Written out
    /// when the fields are done, and before anything else writes to `writer`.
    pending: String,
    /// Whether nothing has been written yet (no space before the first field).
    is_empty: bool,
    result: fmt::Result,
}

impl TextVisitor<'_> {
    /// The field's name, when this visitor writes it itself: not the message (which
    /// tracing-subscriber writes with ANSI escapes sanitized) and not in colour.
    fn plain_name<'f>(&self, field: &'f Field) -> Option<&'f str> {
        let name = field.name();
        if name == "message" || self.writer.has_ansi_escapes() {
            return None;
        }
        Some(name.strip_prefix("r#").unwrap_or(name))
    }

    /// Whether to go on with `field`: not after an error, and not for a `log.` field.
    fn wanted(&self, field: &Field) -> bool {
        self.result.is_ok() && !field.name().starts_with("log.")
    }

    /// Gathers the space that separates a field from the one before it.
    fn separate(&mut self) {
        if !std::mem::replace(&mut self.is_empty, false) {
            self.pending.push(' ');
        }
    }

    /// Gathers `name=` and the value through `write_value` when the field's name is plain,
    /// and lets tracing-subscriber's visitor write it (through `record`) when it is not.
    fn record_with(
        &mut self,
        field: &Field,
        write_value: impl FnOnce(&mut String) -> fmt::Result,
        record: impl FnOnce(&mut DefaultVisitor<'_>),
    ) {
        if !self.wanted(field) {
            return;
        }
        match self.plain_name(field) {
            Some(name) => {
                self.separate();
                self.pending.push_str(name);
                self.pending.push('=');
                self.result = write_value(&mut self.pending);
            }
            None => self.hand_over(record),
        }
    }

    /// Lets tracing-subscriber's own visitor write the field, after what is gathered.
    fn hand_over(&mut self, record: impl FnOnce(&mut DefaultVisitor<'_>)) {
        self.write_pending();
        if self.result.is_err() {
            return;
        }
        let mut visitor = DefaultVisitor::new(self.writer.by_ref(), self.is_empty);
        record(&mut visitor);
        self.result = visitor.finish();
        self.is_empty = false;
    }

    /// Writes what is gathered to the writer.
    fn write_pending(&mut self) {
        if self.result.is_ok() && !self.pending.is_empty() {
            self.result = self.writer.write_str(&self.pending);
        }
        self.pending.clear();
    }
}

impl Visit for TextVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.record_with(
            field,
            |pending| write_debug_str(pending, value),
            |visitor| visitor.record_str(field, value),
        );
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.record_with(
            field,
            |pending| {
                push_decimal(pending, value);
                Ok(())
            },
            |visitor| visitor.record_u64(field, value),
        );
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.record_with(
            field,
            |pending| {
                if value < 0 {
                    pending.push('-');
                }
                push_decimal(pending, value.unsigned_abs());
                Ok(())
            },
            |visitor| visitor.record_i64(field, value),
        );
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        if self.wanted(field) {
            self.hand_over(|visitor| visitor.record_error(field, value));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" && self.wanted(field) && self.wrote_message(value) {
            return;
        }
        self.record_with(
            field,
            |pending| write!(pending, "{value:?}"),
            |visitor| visitor.record_debug(field, value),
        );
    }
}

impl TextVisitor<'_> {
    /// Gathers the message as it is, when it has nothing tracing-subscriber would escape
    /// (terminal control characters); `false`, having gathered nothing, when it has.
    fn wrote_message(&mut self, value: &dyn fmt::Debug) -> bool {
        let before = self.pending.len();
        if !self.is_empty {
            self.pending.push(' ');
        }
        let message = self.pending.len();
        if write!(self.pending, "{value:?}").is_err()
            || (self.writer.sanitizes_ansi_escapes()
                && has_control_characters(&self.pending[message..]))
        {
            self.pending.truncate(before);
            return false;
        }
        self.is_empty = false;
        true
    }
}

/// Whether `text` has a character tracing-subscriber escapes in a message: ESC, BEL, BS, FF,
/// DEL, or a C1 control (U+0080 to U+009F, `C2 80` to `C2 9F` in UTF-8).
fn has_control_characters(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.iter().enumerate().any(|(at, &byte)| match byte {
        0x1b | 0x07 | 0x08 | 0x0c | 0x7f => true,
        0xc2 => bytes
            .get(at + 1)
            .is_some_and(|next| (0x80..=0x9f).contains(next)),
        _ => false,
    })
}

/// A string in its `Debug` form: quoted, as it is when it is printable ASCII without quotes
/// or backslashes, and through `Debug` (which escapes) otherwise.
fn write_debug_str(pending: &mut String, value: &str) -> fmt::Result {
    let plain = value
        .bytes()
        .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\');
    if plain {
        pending.push('"');
        pending.push_str(value);
        pending.push('"');
        Ok(())
    } else {
        write!(pending, "{value:?}")
    }
}

/// An integer's `Debug` form, its decimal digits, without the formatting machinery.
fn push_decimal(pending: &mut String, mut value: u64) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    pending.extend(digits[start..].iter().map(|&digit| char::from(digit)));
}

/// A field of a line written straight into the batch ([`super::write_plain_line`]), as a
/// `tracing` macro records it.
#[derive(Debug, Clone, Copy)]
pub enum PlainField<'a> {
    /// `name = value` with a `&str`: quoted, escaped as `Debug` escapes.
    Str(&'a str),
    /// `name = %value` with a `&str`: as it is.
    Display(&'a str),
    /// `name = %items.join(separator)`, without joining them first.
    Joined(&'a [&'a str], &'a str),
    /// `name = value` with a `u64`.
    U64(u64),
}

thread_local! {
    /// The room a line written straight into the batch is made in, kept between lines.
    static PLAIN_LINE: Cell<String> = const { Cell::new(String::new()) };
}

/// Makes the line of an event happening now (see [`plain_line`]) in a buffer the thread
/// keeps, and gives it to `write`; `false`, with nothing given, when the line cannot be made
/// so (a time [`Timestamp`] leaves to tracing-subscriber, a message it would escape).
pub(super) fn write_plain(
    level: &Level,
    target: &str,
    message: &str,
    fields: &[(&str, PlainField<'_>)],
    write: impl FnOnce(&[u8]),
) -> bool {
    let Some(time) = now() else {
        return false;
    };
    let Ok(time) = std::str::from_utf8(&time) else {
        return false;
    };
    let mut line = PLAIN_LINE.try_with(Cell::take).unwrap_or_default();
    line.clear();
    let made = plain_line(&mut line, time, level, target, message, fields).is_ok();
    if made {
        write(line.as_bytes());
    }
    let _ = PLAIN_LINE.try_with(|room| room.set(line));
    made
}

/// The line [`TextLine`] and [`TextFields`] write for an event of `level` and `target` outside
/// any span, in no colour, with `message` (first, as the macros put it) and then `fields`,
/// after `timestamp`. An error for a message with a character tracing-subscriber escapes.
pub(super) fn plain_line(
    line: &mut String,
    timestamp: &str,
    level: &Level,
    target: &str,
    message: &str,
    fields: &[(&str, PlainField<'_>)],
) -> fmt::Result {
    if has_control_characters(message) {
        return Err(fmt::Error);
    }
    line.push_str(timestamp);
    line.push_str(level_and_space(level));
    line.push_str(target);
    line.push_str(": ");
    line.push_str(message);
    for (name, value) in fields {
        line.push(' ');
        line.push_str(name);
        line.push('=');
        match *value {
            PlainField::Str(text) => write_debug_str(line, text)?,
            PlainField::Display(text) => line.push_str(text),
            PlainField::Joined(items, separator) => {
                for (at, item) in items.iter().enumerate() {
                    if at > 0 {
                        line.push_str(separator);
                    }
                    line.push_str(item);
                }
            }
            PlainField::U64(value) => push_decimal(line, value),
        }
    }
    line.push('\n');
    Ok(())
}

impl VisitOutput<fmt::Result> for TextVisitor<'_> {
    fn finish(mut self) -> fmt::Result {
        self.write_pending();
        self.result
    }
}

impl VisitFmt for TextVisitor<'_> {
    /// The writer, with what is gathered written to it first, so that it stays in order.
    fn writer(&mut self) -> &mut dyn fmt::Write {
        self.write_pending();
        &mut self.writer
    }
}

impl Drop for TextVisitor<'_> {
    /// Gives the gathering room back for the thread's next line (unless the thread is ending).
    fn drop(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        let _ = PENDING.try_with(|room| room.set(pending));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::tests::{FixedTime, SinkBuilder, text_of, written_by};

    #[test]
    fn second_prefixes_follow_the_calendar_across_leap_days_and_centuries() {
        let cases = [
            (0, "1970-01-01T00:00:00."),
            (94_694_399, "1972-12-31T23:59:59."),
            (951_825_599, "2000-02-29T11:59:59."),
            (1_795_503_496, "2026-11-24T06:58:16."),
            (4_107_542_400, "2100-03-01T00:00:00."),
            (YEAR_10000 - 1, "9999-12-31T23:59:59."),
        ];
        for (second, expected) in cases {
            assert_eq!(
                std::str::from_utf8(&second_prefix(second)),
                Ok(expected),
                "{second}"
            );
        }
    }

    fn formatted(timer: &impl FormatTime) -> String {
        let mut text = String::new();
        timer
            .format_time(&mut Writer::new(&mut text))
            .expect("format");
        text
    }

    #[test]
    fn the_timestamp_reads_as_tracing_subscribers_own() {
        // Taken twice in a row, the two agree to the second unless a second began between
        // them: then the next try agrees.
        let agreed = (0..5).any(|_| {
            let ours = formatted(&Timestamp);
            let theirs = formatted(&tracing_subscriber::fmt::time::SystemTime);
            assert_eq!(ours.len(), theirs.len(), "{ours} {theirs}");
            assert!(ours.ends_with('Z'), "{ours}");
            ours[..20] == theirs[..20]
        });
        assert!(agreed);
    }

    #[derive(Debug)]
    struct Failure(Option<Box<Failure>>);

    impl fmt::Display for Failure {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(if self.0.is_some() { "outer" } else { "inner" })
        }
    }

    impl std::error::Error for Failure {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.0.as_deref().map(|e| e as _)
        }
    }

    /// Events with every kind of field the visitor treats apart.
    fn log_some_events() {
        tracing::info!(
            webhook = "mutate",
            uid = %"0c9a8d74-9cb7-44dd-b98e-09fd62def2f4",
            kind = %"Pod",
            namespace = "colin-coder",
            name = %"echo-pod",
            rules = %"",
            skipped = "",
            duration_us = 69_u64,
            "admission"
        );
        tracing::warn!(
            quoted = "say \"hi\" \\ bye",
            backslash = "C:\\temp",
            tab = "a\tb\nc",
            accents = "žluťoučký",
            escape = "\u{1b}[31mred",
            r#type = "raw name",
            flag = true,
            signed = -3_i64,
            smallest = i64::MIN,
            largest = u64::MAX,
            zero = 0_u64,
            float = 1.5_f64,
            listed = ?vec!["a", "b"],
            log.target = "skipped",
            "a message with \u{1b}[2J in it: {}",
            42
        );
        let failure = Failure(Some(Box::new(Failure(None))));
        tracing::error!(error = &failure as &dyn std::error::Error, "failed");
        tracing::error!(error = %failure, "failed, displayed");
        tracing::error!(
            before = "gathered",
            error = &failure as &dyn std::error::Error,
            after = 2,
            "an error between plain fields"
        );
        let span = tracing::info_span!("outer", id = "a b", n = 3);
        let _entered = span.enter();
        tracing::info!(inner = "yes", "in a span");
        tracing::info!("only a message");
        tracing::info!(field_only = 1);
        tracing::info!(log.module_path = "skipped", after = "a skipped first field");
        drop(_entered);
        tracing::trace!(level = "trace", "levels");
        tracing::debug!(level = "debug", "levels");
        tracing::info!(
            log.target = "from::the::log::crate",
            "a log record's fields"
        );
        tracing::info!("a C1 control \u{9b} in the message");
    }

    /// The lines of [`log_some_events`], through tracing-subscriber's default format or ours.
    fn lines(ours: bool, ansi: bool) -> String {
        if ours {
            return text_of(ansi, log_some_events);
        }
        let theirs = |builder: SinkBuilder| builder.with_timer(FixedTime).finish();
        written_by(ansi, theirs, log_some_events)
    }

    #[test]
    fn lines_are_written_as_tracing_subscriber_writes_them_with_and_without_colour() {
        for ansi in [false, true] {
            let expected = lines(false, ansi);
            assert_eq!(lines(true, ansi), expected);
            assert_eq!(expected.lines().count(), 13, "{expected}");
        }
        let plain = lines(true, false);
        assert!(
            plain.starts_with(
                "2026-11-24T06:58:16.306482Z  INFO podmend::telemetry::text::tests: \
                 admission webhook=\"mutate\" uid=0c9a8d74"
            ),
            "{plain}"
        );
        assert!(plain.contains(r#" type="raw name" "#), "{plain}");
        assert!(!plain.contains("skipped\""), "{plain}");
    }

    #[test]
    fn only_terminal_control_characters_make_a_message_need_escaping() {
        for plain in ["admission", "žluťoučký \" \\ \t\n", "\u{a0} after C1"] {
            assert!(!has_control_characters(plain), "{plain:?}");
        }
        for escaped in [
            "\u{1b}[2J",
            "bell\u{7}",
            "\u{8}",
            "\u{c}",
            "\u{7f}",
            "\u{80}",
            "c1 \u{9f}",
        ] {
            assert!(has_control_characters(escaped), "{escaped:?}");
        }
    }
}
