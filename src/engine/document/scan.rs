//! A quick read of a body, for the webhook's common case: a JSON scanner that walks the body
//! once, validating what it passes over and building only the [`sketch`](super::sketch); and,
//! for a created object a rule may act on, only the parts those rules read ([`super::read_at`]
//! with a [`Union`]).
//!
//! It is *conservative*: it reads only what it is sure serde_json reads the same way, and
//! declines (`None`) everything else — escapes in keys, numbers with exponents, surrogate
//! escapes, deep nesting, invalid JSON. The caller then reads the body with serde_json, which
//! decides (and words any error) as before. So a body it accepts gives exactly what
//! serde_json gives; debug builds check that on every review (`admission::decode`). The
//! second read of a body the first read accepted passes over what it skips unchecked.
//!
//! Why not serde_json alone: its visitors cost about three times a plain scan of a body, and
//! a body the API server sends is nearly all skipped (`managedFields`, kubectl's
//! `last-applied-configuration`, env, probes, mounts).

use std::borrow::Cow;

use serde_json::{Map, Value};

use super::{Keep, OBJECT, Sketch, Union};

mod reread;

pub use reread::{applies, reread, reread_as};

/// Deeper than this, the scanner declines: serde_json's own limit (128, `admission::MAX_DEPTH`)
/// then decides, where it counts.
const DEPTH_LIMIT: usize = 100;

/// A number longer than this is declined: serde_json refuses one too large for an `f64`
/// (over 300 digits) where it reads numbers, and this scanner does not parse them.
const NUMBER_LIMIT: usize = 32;

/// A cursor over a body that is known to be UTF-8.
pub struct Scanner<'a> {
    text: &'a str,
    pos: usize,
    depth: usize,
}

impl<'a> Scanner<'a> {
    pub fn new(text: &'a str) -> Self {
        Scanner {
            text,
            pos: 0,
            depth: 0,
        }
    }

    /// A scanner at byte `at` of `text`: where a value the first read found starts.
    pub fn starting_at(text: &'a str, at: usize) -> Self {
        Scanner {
            pos: at,
            ..Scanner::new(text)
        }
    }

    /// Where the next value starts, past whitespace.
    pub fn position(&mut self) -> usize {
        self.peek();
        self.pos
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    /// The next byte that is not JSON whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        self.pos = whitespace_end(self.bytes(), self.pos);
        self.bytes().get(self.pos).copied()
    }

    /// Consumes `byte`, after whitespace.
    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.pos += 1)
    }

    /// The end of the body: nothing but whitespace after the value.
    pub fn end(&mut self) -> Option<()> {
        self.peek().is_none().then_some(())
    }

    /// An object, calling `each` with every key (declining a key with escapes); `each` reads
    /// that key's value.
    pub fn object(&mut self, mut each: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.members(|scan| {
            let key = scan.string()?;
            scan.expect(b':')?;
            each(scan, key)
        })
    }

    /// An object, calling `each` at every member; `each` reads its key, colon and value.
    fn members(&mut self, each: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.delimited(b'{', b'}', each)
    }

    /// An array, calling `each` for every item; `each` reads the item.
    fn array(&mut self, each: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.delimited(b'[', b']', each)
    }

    /// `open`, then what `each` reads, separated by commas, up to `close`.
    fn delimited(
        &mut self,
        open: u8,
        close: u8,
        mut each: impl FnMut(&mut Self) -> Option<()>,
    ) -> Option<()> {
        self.expect(open)?;
        self.enter()?;
        if self.peek()? == close {
            self.pos += 1;
        } else {
            loop {
                each(self)?;
                match self.peek()? {
                    b',' => self.pos += 1,
                    byte if byte == close => {
                        self.pos += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        self.depth -= 1;
        Some(())
    }

    fn enter(&mut self) -> Option<()> {
        self.depth += 1;
        (self.depth <= DEPTH_LIMIT).then_some(())
    }

    /// A string without escapes, borrowed from the body; `None` for anything else (a string
    /// with escapes included), having passed only the whitespace before it.
    pub fn string(&mut self) -> Option<&'a str> {
        if self.peek()? != b'"' {
            return None;
        }
        let content = self.pos + 1;
        let end = plain_end(self.bytes(), content);
        if self.bytes().get(end) != Some(&b'"') {
            return None;
        }
        self.pos = end + 1;
        self.text.get(content..end)
    }

    /// `null` as `Some(None)`, or what `read` reads; `None` for anything else.
    pub fn optional<T>(&mut self, read: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.null() {
            return Some(None);
        }
        read(self).map(Some)
    }

    /// `true` or `false`; `None` for anything else.
    pub fn bool(&mut self) -> Option<bool> {
        if self.literal(b"true") {
            Some(true)
        } else if self.literal(b"false") {
            Some(false)
        } else {
            None
        }
    }

    /// Consumes `null` if it comes next.
    pub fn null(&mut self) -> bool {
        self.literal(b"null")
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        self.peek();
        let end = literal_end(self.bytes(), self.pos, word);
        self.pos = end.unwrap_or(self.pos);
        end.is_some()
    }

    /// Passes over one value, checking it is JSON serde_json reads.
    pub fn skip(&mut self) -> Option<()> {
        self.pos = value_end(self.bytes(), self.pos, DEPTH_LIMIT.checked_sub(self.depth)?)?;
        Some(())
    }

    /// Passes over one value of a body read whole before (see [`Union`]), whose JSON is known
    /// good: only where it ends is looked for.
    fn pass_over(&mut self) -> Option<()> {
        self.pos = good_value_end(self.bytes(), whitespace_end(self.bytes(), self.pos))?;
        Some(())
    }

    /// A number without an exponent, no longer than [`NUMBER_LIMIT`].
    fn skip_number(&mut self) -> Option<()> {
        self.pos = number_end(self.bytes(), self.pos)?;
        Some(())
    }

    /// The sketch of the object that comes next (see [`super::sketch`]), `Some(None)` for
    /// `null`; `None` for anything but an object or `null`.
    pub fn sketch(&mut self) -> Option<Option<Sketch<'a>>> {
        self.optional(|scan| {
            if scan.peek()? != b'{' {
                return None;
            }
            scan.shaped(&OBJECT)
        })
    }

    /// The value at `path` (object keys) of the document that comes next, with the parts
    /// `keep` keeps, as [`super::read_at`] reads it; `Some(None)` when the document has no
    /// such value, or `null` there. A union reads a body read whole before, whose JSON is
    /// known good: what it skips is only passed over.
    pub fn read_at(&mut self, path: &[&str], keep: Union) -> Option<Option<Value>> {
        Some(self.at(path, keep)?.filter(|value| !value.is_null()))
    }

    /// [`Self::read_at`]'s walk: anything but an object on the path is no such value, and a
    /// key written twice reads as its last, as serde_json's `Value` keeps it.
    fn at(&mut self, path: &[&str], keep: Union) -> Option<Option<Value>> {
        let Some((first, rest)) = path.split_first() else {
            return self.shaped(keep).map(Some);
        };
        if self.peek()? != b'{' {
            self.pass_over()?;
            return Some(None);
        }
        let mut found = None;
        self.object(|scan, key| {
            if key == *first {
                found = scan.at(rest, keep)?;
            } else {
                scan.pass_over()?;
            }
            Some(())
        })?;
        Some(found)
    }

    /// The value that comes next, with the parts `keep` keeps, as the serde visitor
    /// (`Shaped`) keeps them: a list where fields were expected, or an object where items
    /// were, is kept whole.
    fn shaped<K: Keep, T: Build<'a>>(&mut self, keep: K) -> Option<T> {
        if keep.is_deferred() {
            return self.deferred();
        }
        if keep.is_all() {
            return self.whole();
        }
        match self.peek()? {
            b'{' if !keep.keeps_object_whole() => {
                let mut members = T::members(keep.fields_at_most());
                self.object(|scan, key| match keep.field(key) {
                    Some(kept) if !kept.is_dropped() => {
                        let value = scan.shaped(kept)?;
                        T::push(&mut members, key, value);
                        Some(())
                    }
                    // The sketch checks what it skips; a union's read, of a body read before,
                    // passes over it.
                    _ if keep.counts_skipped() => scan.skip(),
                    _ => scan.pass_over(),
                })?;
                Some(T::object(members))
            }
            b'[' => match keep.items() {
                Some(item) => {
                    let mut items = Vec::new();
                    self.array(|scan| {
                        items.push(scan.shaped(item)?);
                        Some(())
                    })?;
                    Some(T::array(items))
                }
                None => self.whole(),
            },
            _ => self.whole(),
        }
    }

    /// The value that comes next, checked and passed over: its JSON text, where the tree keeps
    /// text (a sketch); otherwise built whole.
    fn deferred<T: Build<'a>>(&mut self) -> Option<T> {
        let start = self.position();
        self.skip()?;
        T::raw(self.text.get(start..self.pos)?)
    }

    /// The value that comes next, whole: built directly when it holds only what the scanner
    /// reads exactly (strings without escapes, literals, numbers without exponents, objects
    /// and lists of them: labels, resources, most of a spec); otherwise through serde_json,
    /// from the bytes passed over.
    fn whole<T: Build<'a>>(&mut self) -> Option<T> {
        let (start, depth) = (self.pos, self.depth);
        if let Some(value) = self.built() {
            return Some(value);
        }
        (self.pos, self.depth) = (start, depth);
        self.skip()?;
        self.parsed_since(start)
    }

    /// [`Self::whole`]'s direct build; `None` at the first thing it leaves to serde_json (an
    /// escape, an exponent), with the cursor anywhere: the caller goes back. A number is
    /// serde_json's own reading of its digits.
    fn built<T: Build<'a>>(&mut self) -> Option<T> {
        match self.peek()? {
            b'"' => self.string().map(T::string),
            b'{' => {
                let mut members = T::members(0);
                self.object(|scan, key| {
                    T::push(&mut members, key, scan.built()?);
                    Some(())
                })?;
                Some(T::object(members))
            }
            b'[' => {
                let mut items = Vec::new();
                self.array(|scan| {
                    items.push(scan.built()?);
                    Some(())
                })?;
                Some(T::array(items))
            }
            b'n' => self.null().then_some(T::null()),
            b't' | b'f' => self.bool().map(T::bool),
            _ => {
                let start = self.pos;
                self.skip_number()?;
                self.parsed_since(start)
            }
        }
    }

    /// What serde_json reads of the bytes passed over since `start`.
    fn parsed_since<T: Build<'a>>(&self, start: usize) -> Option<T> {
        T::parsed(self.text.get(start..self.pos)?)
    }
}

/// What the scanner builds: a [`Sketch`] borrowed from the body (the first read), or
/// serde_json's `Value` (the second read, which the rules' typed decode takes).
trait Build<'a>: Sized {
    /// An object's members as they are read.
    type Members;
    /// Room for `capacity` members (a hint: 0 when the shapes do not tell).
    fn members(capacity: usize) -> Self::Members;
    /// A member; a key written twice is read as serde_json's `Value` keeps it, its last value.
    fn push(members: &mut Self::Members, key: &'a str, value: Self);
    fn object(members: Self::Members) -> Self;
    fn array(items: Vec<Self>) -> Self;
    fn string(text: &'a str) -> Self;
    fn null() -> Self;
    fn bool(value: bool) -> Self;
    /// What serde_json reads of `text`, a value the scanner leaves to it.
    fn parsed(text: &'a str) -> Option<Self>;
    /// A value kept unbuilt ([`super::Shape::Deferred`]), `text` its JSON.
    fn raw(text: &'a str) -> Option<Self>;
}

impl<'a> Build<'a> for Value {
    type Members = Map<String, Value>;
    fn members(capacity: usize) -> Self::Members {
        Map::with_capacity(capacity)
    }
    fn push(members: &mut Self::Members, key: &'a str, value: Self) {
        members.insert(key.to_owned(), value);
    }
    fn object(members: Self::Members) -> Self {
        Value::Object(members)
    }
    fn array(items: Vec<Self>) -> Self {
        Value::Array(items)
    }
    fn string(text: &'a str) -> Self {
        Value::String(text.to_owned())
    }
    fn null() -> Self {
        Value::Null
    }
    fn bool(value: bool) -> Self {
        Value::Bool(value)
    }
    fn parsed(text: &'a str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }
    /// serde_json's `Value` keeps no text: built whole.
    fn raw(text: &'a str) -> Option<Self> {
        Self::parsed(text)
    }
}

/// Members are kept in the body's order, a key written twice twice: the sketch reads it as its
/// last value, without a search per member here.
impl<'a> Build<'a> for Sketch<'a> {
    type Members = Vec<(Cow<'a, str>, Sketch<'a>)>;
    fn members(capacity: usize) -> Self::Members {
        Vec::with_capacity(capacity)
    }
    fn push(members: &mut Self::Members, key: &'a str, value: Self) {
        members.push((Cow::Borrowed(key), value));
    }
    fn object(members: Self::Members) -> Self {
        Sketch::Object(members)
    }
    fn array(items: Vec<Self>) -> Self {
        Sketch::Array(items)
    }
    fn string(text: &'a str) -> Self {
        Sketch::String(Cow::Borrowed(text))
    }
    fn null() -> Self {
        Sketch::Null
    }
    fn bool(value: bool) -> Self {
        Sketch::Bool(value)
    }
    fn parsed(text: &'a str) -> Option<Self> {
        serde_json::from_str::<Value>(text).ok().map(Sketch::from)
    }
    fn raw(text: &'a str) -> Option<Self> {
        Some(Sketch::Raw(text))
    }
}

/// Where the value at or after `at` (after whitespace) ends, checking it is JSON serde_json
/// reads, with at most `room` levels of nesting; `None` for anything else. One loop over the
/// bytes, not a call per value: `closes` holds the byte that closes each open container
/// (in memory: bits in a `u128` took two registers, and the string loop then spilled to the
/// stack). Keys may have escapes: `managedFields` has them (`k:{\"name\":\"app\"}`).
fn value_end(bytes: &[u8], mut at: usize, room: usize) -> Option<usize> {
    let mut closes = [0u8; DEPTH_LIMIT + 1];
    let mut depth = 0;
    'value: loop {
        at = whitespace_end(bytes, at);
        match *bytes.get(at)? {
            open @ (b'{' | b'[') => {
                depth += 1;
                if depth > room {
                    return None;
                }
                // `}` and `]` are `{` and `[` plus two.
                let close = open + 2;
                *closes.get_mut(depth)? = close;
                at = whitespace_end(bytes, at + 1);
                if *bytes.get(at)? == close {
                    at += 1;
                    depth -= 1;
                } else if close == b'}' {
                    at = member_value(bytes, at)?;
                    continue 'value;
                } else {
                    continue 'value;
                }
            }
            b'"' => at = string_end(bytes, at + 1)?,
            b't' => at = literal_end(bytes, at, b"true")?,
            b'f' => at = literal_end(bytes, at, b"false")?,
            b'n' => at = literal_end(bytes, at, b"null")?,
            _ => at = number_end(bytes, at)?,
        }
        // After a value: the commas and closes that follow it, up to the next value.
        while depth > 0 {
            at = whitespace_end(bytes, at);
            let close = *closes.get(depth)?;
            match *bytes.get(at)? {
                b',' if close == b'}' => {
                    at = member_value(bytes, whitespace_end(bytes, at + 1))?;
                    continue 'value;
                }
                b',' => {
                    at += 1;
                    continue 'value;
                }
                byte if byte == close => {
                    at += 1;
                    depth -= 1;
                }
                _ => return None,
            }
        }
        return Some(at);
    }
}

/// Where the value at `at` ends in JSON known good: only strings and brackets are looked at.
fn good_value_end(bytes: &[u8], at: usize) -> Option<usize> {
    match *bytes.get(at)? {
        b'"' => good_string_end(bytes, at + 1),
        b'{' | b'[' => good_container_end(bytes, at + 1),
        // A number or literal: up to what follows it.
        _ => {
            let rest = bytes.get(at..)?;
            let follows =
                |byte: &u8| matches!(byte, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t');
            Some(at + rest.iter().position(follows).unwrap_or(rest.len()))
        }
    }
}

/// Past the bracket that closes the object or list whose content starts at `at`, in JSON
/// known good.
fn good_container_end(bytes: &[u8], mut at: usize) -> Option<usize> {
    let mut depth = 1usize;
    loop {
        match *bytes.get(at)? {
            b'"' => {
                at = good_string_end(bytes, at + 1)?;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(at + 1);
                }
            }
            _ => {}
        }
        at += 1;
    }
}

/// Where the string whose content starts at `at` ends (past its closing quote), in JSON
/// known good.
fn good_string_end(bytes: &[u8], mut at: usize) -> Option<usize> {
    loop {
        at = quote_or_backslash(bytes, at);
        match *bytes.get(at)? {
            b'"' => return Some(at + 1),
            // An escape: the byte after the backslash is never the string's end.
            _ => at += 2,
        }
    }
}

/// The first `"` or `\` at or after `at` (or the end of `bytes`), eight bytes at a time.
fn quote_or_backslash(bytes: &[u8], at: usize) -> usize {
    first_flagged(bytes, at, quote_or_backslash_bytes, |byte| {
        byte == b'"' || byte == b'\\'
    })
}

/// Past a member's key and colon, the key starting at `at`: where its value starts. Inlined
/// into [`value_end`]'s loop, as [`string_end`] is.
#[inline(always)]
fn member_value(bytes: &[u8], at: usize) -> Option<usize> {
    if *bytes.get(at)? != b'"' {
        return None;
    }
    let at = whitespace_end(bytes, string_end(bytes, at + 1)?);
    (*bytes.get(at)? == b':').then_some(at + 1)
}

/// The first byte at or after `at` that is not JSON whitespace (or the end of `bytes`).
fn whitespace_end(bytes: &[u8], mut at: usize) -> usize {
    while bytes
        .get(at)
        .is_some_and(|byte| matches!(byte, b' ' | b'\n' | b'\r' | b'\t'))
    {
        at += 1;
    }
    at
}

/// Past `word` (`true`, `false`, `null`), when it is at `at`.
fn literal_end(bytes: &[u8], at: usize, word: &[u8]) -> Option<usize> {
    let end = at + word.len();
    (bytes.get(at..end)? == word).then_some(end)
}

/// Where the number at `at` ends: one without an exponent, no longer than [`NUMBER_LIMIT`];
/// `None` for anything else.
fn number_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut at = start + usize::from(bytes.get(start) == Some(&b'-'));
    let digits = |at: &mut usize| {
        let from = *at;
        while bytes.get(*at).is_some_and(u8::is_ascii_digit) {
            *at += 1;
        }
        *at - from
    };
    match bytes.get(at)? {
        b'0' => at += 1,
        b'1'..=b'9' => {
            digits(&mut at);
        }
        _ => return None,
    }
    if bytes.get(at) == Some(&b'.') {
        at += 1;
        if digits(&mut at) == 0 {
            return None;
        }
    }
    if matches!(bytes.get(at), Some(b'e' | b'E')) || at - start > NUMBER_LIMIT {
        return None;
    }
    Some(at)
}

/// Where the string whose content starts at `at` ends (past its closing quote), escapes and
/// all; `None` for a control character, an escape JSON does not have, a surrogate escape, or
/// no closing quote. Free of the scanner, so the position stays in a register: this loop is
/// most of what a body costs to pass over. Inlined into [`value_end`]'s loop: a string there
/// costs no call, and no registers saved and restored.
#[inline(always)]
fn string_end(bytes: &[u8], mut at: usize) -> Option<usize> {
    loop {
        at = plain_end(bytes, at);
        match *bytes.get(at)? {
            b'"' => return Some(at + 1),
            // An escaped quote, the escape of JSON kept in a string (`last-applied-configuration`,
            // `managedFields`' keys), without a call; the others are rarer.
            b'\\' if bytes.get(at + 1) == Some(&b'"') => at += 2,
            b'\\' => at = escape_end(bytes, at)?,
            // A control character: JSON requires it escaped.
            _ => return None,
        }
    }
}

/// Where the escape at `at` ends: one of JSON's, and no surrogate (serde_json refuses a lone
/// one where it reads strings; pairs are rare enough to leave to it).
fn escape_end(bytes: &[u8], at: usize) -> Option<usize> {
    match bytes.get(at + 1)? {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(at + 2),
        b'u' => unicode_escape_end(bytes, at),
        _ => None,
    }
}

/// [`escape_end`] for `\uXXXX`: rare, so kept out of the string loop.
#[cold]
#[inline(never)]
fn unicode_escape_end(bytes: &[u8], at: usize) -> Option<usize> {
    let hex = std::str::from_utf8(bytes.get(at + 2..at + 6)?).ok()?;
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let code = u16::from_str_radix(hex, 16).ok()?;
    if (0xD800..=0xDFFF).contains(&code) {
        return None;
    }
    Some(at + 6)
}

/// Whether `text` is a JSON string's content as it is: no `"`, `\` or control character to
/// escape.
pub fn is_plain(text: &str) -> bool {
    plain_end(text.as_bytes(), 0) == text.len()
}

/// The first `"`, `\` or control character at or after `at` (or the end of `bytes`), eight
/// bytes at a time.
fn plain_end(bytes: &[u8], at: usize) -> usize {
    first_flagged(bytes, at, special_bytes, |byte| {
        byte == b'"' || byte == b'\\' || byte < 0x20
    })
}

/// The first byte at or after `at` that `flags` flags in its word of eight (the rest, one by
/// one, where `stops`), or the end of `bytes`.
#[inline(always)]
fn first_flagged(
    bytes: &[u8],
    mut at: usize,
    flags: impl Fn(u64) -> u64,
    stops: impl Fn(u8) -> bool,
) -> usize {
    while let Some(word) = bytes
        .get(at..at + 8)
        .and_then(|w| <[u8; 8]>::try_from(w).ok())
    {
        let flagged = flags(u64::from_le_bytes(word));
        if flagged != 0 {
            return at + flagged.trailing_zeros() as usize / 8;
        }
        at += 8;
    }
    while bytes.get(at).is_some_and(|&byte| !stops(byte)) {
        at += 1;
    }
    at
}

/// Each byte of a word, eight times.
const ONES: u64 = u64::MAX / 255;
/// Each byte's high bit.
const HIGHS: u64 = ONES << 7;

/// The high bit of each byte of `word` (little-endian) set where the byte is below 0x20, or
/// equal to `"` or `\`. Only the lowest flagged byte is exact (a borrow may flag bytes above
/// it), and it is the one wanted. A byte's high bit is the same in `word`, `word ^ '"'s` and
/// `word ^ '\'s`, so one `!word` stands for the three.
fn special_bytes(word: u64) -> u64 {
    (word.wrapping_sub(ONES * 0x20) | quote_or_backslash_borrows(word)) & !word & HIGHS
}

/// [`special_bytes`] for `"` and `\` alone.
fn quote_or_backslash_bytes(word: u64) -> u64 {
    quote_or_backslash_borrows(word) & !word & HIGHS
}

/// Where subtracting one from each byte of `word ^ '"'s` and of `word ^ '\'s` borrows: the
/// high bit set at a byte equal to `"` or `\` (and at some others, see [`special_bytes`]).
fn quote_or_backslash_borrows(word: u64) -> u64 {
    let quote = word ^ (ONES * u64::from(b'"'));
    let backslash = word ^ (ONES * u64::from(b'\\'));
    quote.wrapping_sub(ONES) | backslash.wrapping_sub(ONES)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::engine::document::{ALL, Part};

    /// The sketch by serde_json's read (`None` for an error).
    fn sketched_by_serde(text: &str) -> Option<Option<Value>> {
        let mut reader = serde_json::Deserializer::from_str(text);
        let sketch = super::super::sketch(&mut reader).ok()?;
        reader.end().ok()?;
        Some(sketch)
    }

    /// The sketch by the scanner, if it reads the body whole.
    fn sketched_by_scan(text: &str) -> Option<Option<Value>> {
        let mut scan = Scanner::new(text);
        let sketch = scan.sketch()?.map(|sketch| sketch.to_value());
        scan.end()?;
        Some(sketch)
    }

    /// The scanner gives serde_json's sketch, or declines.
    fn agrees(text: &str) -> bool {
        match sketched_by_scan(text) {
            Some(sketch) => sketched_by_serde(text) == Some(sketch),
            None => true,
        }
    }

    #[test]
    fn a_pod_sketched_by_the_scanner_is_the_sketch_serde_json_reads() {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "labels": {"a": "b", "n": "1"},
                "annotations": {"x": "{\"k\":\"v\\n\"}", "podmend.io/skip": "all"},
                "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": true}],
                "managedFields": [{"manager": "kubectl",
                    "fieldsV1": {"f:spec": {"k:{\"name\":\"app\"}": {".": {}}}}}], "uid": "u"},
            "spec": {"nodeName": "n1", "priority": -5, "ratio": 0.25, "none": null,
                "containers": [{"name": "app", "image": "busybox", "command": ["sh"],
                    "args": ["-c", "echo \"hi\" \u{e9}"], "env": [{"name": "A", "value": "1"}]}],
                "volumes": [{"name": "sock", "hostPath": {"path": "/var/run/docker.sock"}}, {}]},
            "status": {"phase": "Pending", "conditions": []}
        });
        for text in [
            pod.to_string(),
            serde_json::to_string_pretty(&pod).expect("json"),
        ] {
            let sketch = sketched_by_scan(&text).expect("the scanner reads an ordinary pod");
            assert_eq!(Some(sketch), sketched_by_serde(&text));
        }
    }

    #[test]
    fn a_value_kept_whole_is_the_value_serde_json_reads_whatever_it_holds() {
        for labels in [
            r#"{"app": "web", "tier": ""}"#,
            r#"{"a": {"b": ["c", true, false, null, [], {}]}, "d": []}"#,
            r#"{"a": "1", "a": "2", "b": "3"}"#,
            r#"{"a": "x", "n": 12, "f": -0.5, "z": -0, "big": 18446744073709551615, "s": "y"}"#,
            r#"{"over": 18446744073709551616, "neg": -9223372036854775809, "f": 1.50}"#,
            r#"{"a": "x", "e": "line\nbreak", "k\"ey": "v"}"#,
            r#"[{"a": "b"}, 1, "c\u00e9", {"d": [null]}]"#,
            r#" { "a" : [ "b" , { } ] } "#,
            r#"{}"#,
            r#"[]"#,
        ] {
            let text = format!(r#"{{"metadata": {{"labels": {labels}, "name": "n"}}}}"#);
            let mut scan = Scanner::new(&text);
            let sketch = scan.sketch().expect("read").expect("an object").to_value();
            let expected: Value = serde_json::from_str(labels).expect("json");
            // The second read builds serde_json's `Value`s the same way.
            let whole = Union::of([Part::Here(&ALL)]);
            let read = Scanner::new(labels).read_at(&[], whole.expect("one part"));
            assert_eq!(read, Some(Some(expected.clone())), "{labels}");
            assert_eq!(sketch["metadata"]["labels"], expected, "{labels}");
            assert_eq!(
                sketch["metadata"]["name"], "n",
                "{labels}: read on after it"
            );
            let keys: Vec<_> = sketch["metadata"]["labels"]
                .as_object()
                .map(|map| map.keys().cloned().collect())
                .unwrap_or_default();
            let expected_keys: Vec<_> = expected
                .as_object()
                .map(|map| map.keys().cloned().collect())
                .unwrap_or_default();
            assert_eq!(keys, expected_keys, "{labels}: the keys' order");
            assert!(agrees(&text), "{labels}");
        }
    }

    #[test]
    fn unexpected_types_are_kept_whole_as_the_sketch_keeps_them() {
        for text in [
            r#"{"metadata": [1, {"a": 2}], "spec": {"containers": {"name": "x"}}}"#,
            r#"{"metadata": {"labels": "s", "ownerReferences": 3}, "spec": "text"}"#,
            r#"{"spec": {"containers": [1, "a", null, [2], {"name": "c", "image": 7}]}}"#,
        ] {
            assert!(sketched_by_scan(text).is_some(), "declined {text}");
            assert!(agrees(text), "disagreed on {text}");
        }
    }

    #[test]
    fn what_the_scanner_is_not_sure_of_is_declined() {
        for text in [
            r#"{"metadata": {"n\u0061me": "p"}}"#,
            r#"{"spec": {"x": 1e5}}"#,
            r#"{"spec": {"x": "\ud83d\ude00"}}"#,
            r#"{"spec": {"x": 123456789012345678901234567890123}}"#,
            "[1]",
            "5",
            &format!("{{\"spec\": {}{}}}", "[".repeat(120), "]".repeat(120)),
        ] {
            assert_eq!(sketched_by_scan(text), None, "read {text}");
        }
    }

    #[test]
    fn invalid_json_is_declined_never_read() {
        for text in [
            r#"{"spec": {"x": 01}}"#,
            r#"{"spec": {"x": -}}"#,
            r#"{"spec": {"x": 1.}}"#,
            r#"{"spec": {"x": tru}}"#,
            r#"{"spec": {"x": "a"} "#,
            r#"{"spec": {"x": "a",}}"#,
            r#"{"spec": {"x": "\q"}}"#,
            r#"{"spec": {"x": "\u12"}}"#,
            "{\"spec\": {\"x\": \"tab\tinside\"}}",
            r#"{"spec": {}} x"#,
            r#"{"spec": {}"#,
            r#"{"spec" {}}"#,
        ] {
            assert!(sketched_by_serde(text).is_none(), "serde_json reads {text}");
            assert_eq!(sketched_by_scan(text), None, "read {text}");
        }
    }

    #[test]
    fn strings_are_scanned_to_their_end_however_long_and_wherever_the_quote_falls() {
        for len in 0..40 {
            let value = "x".repeat(len);
            for escaped in ["", "\\\"", "\\\\", "\\u00e9"] {
                let text = format!(
                    r#"{{"spec": {{"nodeName": "{value}", "y": "{value}{escaped}{value}"}}}}"#
                );
                let sketch = sketched_by_scan(&text).expect("reads");
                assert_eq!(Some(sketch), sketched_by_serde(&text), "{text}");
            }
        }
    }

    #[test]
    fn json_kept_in_a_skipped_string_is_read_escape_by_escape_as_serde_json_reads_it() {
        // Quotes escaped one after another, as `last-applied-configuration` and
        // `managedFields`' keys have them, next to every other escape.
        for content in [
            r#"{\"apiVersion\":\"v1\",\"kind\":\"Pod\"}\n"#,
            r#"k:{\"name\":\"app\"}"#,
            r#"\"\"\"\"\\\"\/\u00e9\""#,
        ] {
            let text = format!(r#"{{"spec": {{"y": "{content}", "z": 1}}}}"#);
            let sketch = sketched_by_scan(&text).expect("reads");
            assert_eq!(Some(sketch), sketched_by_serde(&text), "{text}");
        }
        // After escaped quotes: an escape JSON does not have, a lone surrogate, a string the
        // last escaped quote leaves open.
        for text in [
            r#"{"spec": {"y": "\"\"\x"}}"#,
            r#"{"spec": {"y": "\"\ud800\""}}"#,
            r#"{"spec": {"y": "\"\"}}"#,
        ] {
            assert_eq!(sketched_by_scan(text), None, "read {text}");
        }
    }

    #[test]
    fn a_skipped_value_is_read_to_the_depth_limit_and_declined_past_it() {
        // The object itself is one level: its `spec` may nest DEPTH_LIMIT - 1 more.
        let nested = |repeats: usize, open: &str, close: &str| {
            format!(
                r#"{{"spec": {}1{}}}"#,
                open.repeat(repeats),
                close.repeat(repeats)
            )
        };
        // Each repeat of `open` opens `levels` containers.
        for (open, close, levels) in [
            ("[", "]", 1),
            (r#"{"k":"#, "}", 1),
            (r#"[{"k":[],"l":"#, "}]", 2),
        ] {
            let deepest = (DEPTH_LIMIT - 1) / levels;
            let text = nested(deepest, open, close);
            assert!(sketched_by_scan(&text).is_some(), "declined {text}");
            assert!(agrees(&text), "disagreed on {text}");
            let text = nested(deepest + 1, open, close);
            assert_eq!(sketched_by_scan(&text), None, "read {text}");
        }
    }

    #[test]
    fn skipped_containers_of_every_shape_are_passed_over_as_serde_json_reads_them() {
        for value in [
            "{}",
            "[]",
            r#"{"a":{},"b":[],"c":[{}],"d":{"e":[[],{}]}}"#,
            r#"[1, "two", {"three": [3, {"four": null}]}, [true, false], -0.5]"#,
            r#" { "k\"ey" : [ { } , [ ] ] , "x" : { "y" : { "z" : [ 1 ] } } } "#,
        ] {
            let text = format!(r#"{{"spec": {{"skipped": {value}, "nodeName": "n"}}}}"#);
            assert!(sketched_by_scan(&text).is_some(), "declined {text}");
            assert!(agrees(&text), "disagreed on {text}");
        }
        for value in [
            "{]",
            "[}",
            r#"{"a"}"#,
            r#"{"a":}"#,
            "[1,]",
            r#"{"a":1,}"#,
            "[1 2]",
            r#"{"a":1 "b":2}"#,
            r#"{1:2}"#,
            "[[]",
        ] {
            let text = format!(r#"{{"spec": {{"skipped": {value}, "nodeName": "n"}}}}"#);
            assert_eq!(sketched_by_scan(&text), None, "read {text}");
        }
    }

    /// A value with every kind of JSON the scanner passes over, and whitespace between.
    const EVERY_KIND: &str = r#" {"a": [1, -2.5, 0, "x\"y\\z\u00e9\n", true, false, null,
        {"k\"ey": {}, "e": []}], "b" : {"c":"d"} , "f": [[], [{}]]} "#;

    #[test]
    fn a_value_of_every_kind_is_passed_over_to_its_end() {
        let end = value_end(EVERY_KIND.as_bytes(), 0, DEPTH_LIMIT);
        assert_eq!(end, Some(EVERY_KIND.trim_end().len()));
    }

    #[test]
    fn a_value_known_good_is_passed_over_to_its_end_looking_only_at_strings_and_brackets() {
        let start = EVERY_KIND.len() - EVERY_KIND.trim_start().len();
        let end = good_value_end(EVERY_KIND.as_bytes(), start);
        assert_eq!(end, Some(EVERY_KIND.trim_end().len()));
        for (value, after) in [
            ("-1.5e3", ","),
            ("true", "}"),
            ("null", "]"),
            ("7", ""),
            (r#""a\\""#, ","),
            (r#""\"]}""#, "}"),
            (r#""\\\"\u005d""#, " "),
            (r#"["]", {"}": "{["}, "\\"]"#, ","),
        ] {
            let text = format!("{value}{after}");
            assert_eq!(
                good_value_end(text.as_bytes(), 0),
                Some(value.len()),
                "{text}"
            );
        }
    }

    proptest::proptest! {
        /// Whatever the scanner passes over as a value is JSON serde_json reads, and JSON
        /// serde_json reads is passed over to its end on a second read: edits of every kind
        /// anywhere in a value of every kind (ASCII only: a body is UTF-8, checked before it
        /// is scanned).
        #[test]
        fn what_the_scanner_passes_over_is_json_serde_json_reads(
            edits in proptest::collection::vec((0usize..200, 0u8..0x80, 0u8..3), 1..4)
        ) {
            let mut text = EVERY_KIND.as_bytes().to_vec();
            for (at, byte, how) in edits {
                let at = at % text.len();
                match how {
                    0 => text[at] = byte,
                    1 => text.insert(at, byte),
                    _ => {
                        text.remove(at);
                    }
                }
            }
            if let Some(end) = value_end(&text, 0, DEPTH_LIMIT) {
                let read = serde_json::from_slice::<serde::de::IgnoredAny>(&text[..end]);
                proptest::prop_assert!(read.is_ok(), "{}", String::from_utf8_lossy(&text));
            }
            // Where the whole is good JSON, the second read's pass ends the value alike.
            if serde_json::from_slice::<serde::de::IgnoredAny>(&text).is_ok() {
                let start = whitespace_end(&text, 0);
                proptest::prop_assert_eq!(
                    good_value_end(&text, start),
                    Some(text.trim_ascii_end().len()),
                    "{}",
                    String::from_utf8_lossy(&text)
                );
            }
        }
    }

    #[test]
    fn the_word_tests_find_the_first_byte_they_look_for_in_any_word() {
        // Every byte at every place, after plain bytes and followed by bytes of every kind:
        // the lowest flagged byte is the first one looked for, whatever follows it.
        fn check(flags: fn(u64) -> u64, looked_for: fn(u8) -> bool) {
            for byte in 0..=u8::MAX {
                for at in 0..8 {
                    for after in [b'a', b'"', 0x00, 0xff, 0x80, b'\\'] {
                        let mut word = [b'a'; 8];
                        word[at] = byte;
                        word[at + 1..].fill(after);
                        let flagged = flags(u64::from_le_bytes(word));
                        let first = word.iter().position(|&b| looked_for(b));
                        let found = (flagged != 0).then(|| flagged.trailing_zeros() as usize / 8);
                        assert_eq!(found, first, "{word:?}");
                    }
                }
            }
        }
        check(special_bytes, |b| b == b'"' || b == b'\\' || b < 0x20);
        check(quote_or_backslash_bytes, |b| b == b'"' || b == b'\\');
    }

    #[test]
    fn a_null_object_is_no_object() {
        assert_eq!(sketched_by_scan(" null "), Some(None));
    }
}
