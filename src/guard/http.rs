//! HTTP/1.1 message framing for the guard's relay: request and response heads, body lengths
//! (Content-Length, chunked, until close) and a buffered reader. Requests are parsed strictly
//! and re-encoded, so the guard never frames a request differently from the Docker daemon.
//! It knows nothing about Docker or policies. Why this is written here rather than taken from
//! hyper: see [`proxy`](super::proxy) (Docker's hijack, half-close, framing as dockerd's).

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// Largest request or response head accepted: Go's `http.DefaultMaxHeaderBytes` and the
/// 4096 bytes of slack its server reads past it (net/http/server.go,
/// `Server.initialReadLimitSize`), so a head dockerd reads the guard reads too, and one it
/// answers `431` the guard answers `431`.
pub const MAX_HEAD: usize = (1 << 20) + 4096;
/// Largest chunk-size line (with extensions) or trailer line accepted.
const MAX_CHUNK_LINE: usize = 4096;
/// Largest trailer section accepted after the last chunk.
const MAX_TRAILERS: usize = 64 * 1024;
/// How much is read from a socket at a time.
const READ_SIZE: usize = 64 * 1024;

/// Why a head or a chunked body could not be framed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("the message head is larger than {MAX_HEAD} bytes")]
    HeadTooLarge,
    #[error("the connection closed in the middle of a message head")]
    TruncatedHead,
    #[error("malformed request line")]
    RequestLine,
    #[error("malformed status line")]
    StatusLine,
    #[error("unsupported HTTP version {0:?} (HTTP/1.0 and HTTP/1.1 only)")]
    Version(String),
    #[error("malformed header line")]
    HeaderLine,
    #[error("invalid Content-Length")]
    ContentLength,
    #[error("unsupported Transfer-Encoding (only \"chunked\" is accepted)")]
    TransferEncoding,
    #[error("both Content-Length and Transfer-Encoding are set")]
    LengthAndEncoding,
    #[error("malformed chunked encoding")]
    Chunked,
}

/// HTTP/1.0 or HTTP/1.1: all the guard speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Http10,
    Http11,
}

impl Version {
    fn parse(text: &str) -> Result<Self, FramingError> {
        match text {
            "HTTP/1.1" => Ok(Version::Http11),
            "HTTP/1.0" => Ok(Version::Http10),
            other => Err(FramingError::Version(other.chars().take(16).collect())),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
        }
    }
}

/// How a message body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    /// No body at all.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the sender closes (responses only: and Docker's hijacked streams).
    UntilClose,
}

/// Header fields in order, names as sent, values as bytes (obs-text is legal).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(Vec<(String, Vec<u8>)>);

impl Headers {
    /// Every value of `name` (case-insensitive), in order.
    pub fn all<'a, 'n>(&'a self, name: &'n str) -> impl Iterator<Item = &'a [u8]> + use<'a, 'n> {
        self.0
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// The first value of `name`, if any.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.all(name).next()
    }

    /// Whether any comma-separated token of any `name` header equals `token`
    /// (case-insensitive): `Connection: keep-alive, Upgrade`.
    pub fn has_token(&self, name: &str, token: &str) -> bool {
        self.all(name).any(|value| {
            value
                .split(|b| *b == b',')
                .any(|t| trim(t).eq_ignore_ascii_case(token.as_bytes()))
        })
    }

    pub fn remove(&mut self, name: &str) {
        self.0.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
    }

    pub fn push(&mut self, name: &str, value: impl Into<Vec<u8>>) {
        self.0.push((name.to_string(), value.into()));
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        for (name, value) in &self.0 {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
    }
}

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    /// The request-target exactly as sent (origin-form, absolute-form, ...).
    pub target: String,
    pub version: Version,
    pub headers: Headers,
}

impl RequestHead {
    /// Parses a head as returned by [`Reader::read_head`]: request line, header lines, and
    /// the empty line. Rejects everything Go's HTTP server rejects, and a bit more.
    pub fn parse(head: &[u8]) -> Result<Self, FramingError> {
        let mut lines = head_lines(head);
        let line = lines.next().ok_or(FramingError::RequestLine)?;
        let line = std::str::from_utf8(line).map_err(|_| FramingError::RequestLine)?;
        let mut parts = line.split(' ');
        let (Some(method), Some(target), Some(version), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(FramingError::RequestLine);
        };
        if method.is_empty() || !method.bytes().all(is_tchar) {
            return Err(FramingError::RequestLine);
        }
        if target.is_empty() || target.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(FramingError::RequestLine);
        }
        let version = Version::parse(version)?;
        let headers = parse_headers(lines)?;
        Ok(Self {
            method: method.to_string(),
            target: target.to_string(),
            version,
            headers,
        })
    }

    /// How the request body is framed (RFC 9112 §6.3 for requests: no body without
    /// Content-Length or Transfer-Encoding). Ambiguous framings are errors.
    pub fn body_length(&self) -> Result<BodyLength, FramingError> {
        let mut encodings = self.headers.all("transfer-encoding");
        if let Some(encoding) = encodings.next() {
            // HTTP/1.0 servers (Go's included) ignore Transfer-Encoding: a smuggling vector.
            if self.version == Version::Http10
                || encodings.next().is_some()
                || !trim(encoding).eq_ignore_ascii_case(b"chunked")
            {
                return Err(FramingError::TransferEncoding);
            }
            if self.headers.get("content-length").is_some() {
                return Err(FramingError::LengthAndEncoding);
            }
            return Ok(BodyLength::Chunked);
        }
        match content_length(&self.headers)? {
            Some(0) | None => Ok(BodyLength::Empty),
            Some(n) => Ok(BodyLength::Length(n)),
        }
    }

    /// Whether the connection ends after this exchange, as far as the client is concerned.
    pub fn wants_close(&self) -> bool {
        match self.version {
            Version::Http11 => self.headers.has_token("connection", "close"),
            Version::Http10 => !self.headers.has_token("connection", "keep-alive"),
        }
    }

    /// Serializes the head (CRLF line ends, `name: value`).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(self.method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.target.as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.version.as_str().as_bytes());
        out.extend_from_slice(b"\r\n");
        self.headers.encode_into(&mut out);
        out
    }

    /// Replaces whatever framed the body with `Content-Length: length`.
    pub fn set_content_length(&mut self, length: usize) {
        self.headers.remove("content-length");
        self.headers.remove("transfer-encoding");
        self.headers.push("Content-Length", length.to_string());
    }
}

/// A parsed response head; forwarded as the bytes received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    pub version: Version,
    pub status: u16,
    pub headers: Headers,
}

impl ResponseHead {
    pub fn parse(head: &[u8]) -> Result<Self, FramingError> {
        let mut lines = head_lines(head);
        let line = lines.next().ok_or(FramingError::StatusLine)?;
        let line = String::from_utf8_lossy(line);
        let mut parts = line.splitn(3, ' ');
        let version = Version::parse(parts.next().unwrap_or_default())?;
        let status = parts
            .next()
            .filter(|s| s.len() == 3 && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<u16>().ok())
            .ok_or(FramingError::StatusLine)?;
        let headers = parse_headers(lines)?;
        Ok(Self {
            version,
            status,
            headers,
        })
    }

    /// How the response body is framed, given the request method (RFC 9112 §6.3). Methods
    /// are case-sensitive: Go's server answers `head` (not `HEAD`) with a body, so only
    /// `HEAD` has none, or the guard would take that body for the next response.
    pub fn body_length(&self, request_method: &str) -> Result<BodyLength, FramingError> {
        if request_method == "HEAD"
            || (100..200).contains(&self.status)
            || self.status == 204
            || self.status == 304
        {
            return Ok(BodyLength::Empty);
        }
        let encodings: Vec<&[u8]> = self.headers.all("transfer-encoding").collect();
        if !encodings.is_empty() {
            let last = encodings
                .iter()
                .flat_map(|v| v.split(|b| *b == b','))
                .map(trim)
                .rfind(|t| !t.is_empty());
            return Ok(match last {
                Some(t) if t.eq_ignore_ascii_case(b"chunked") => BodyLength::Chunked,
                _ => BodyLength::UntilClose,
            });
        }
        match content_length(&self.headers)? {
            Some(0) => Ok(BodyLength::Empty),
            Some(n) => Ok(BodyLength::Length(n)),
            None => Ok(BodyLength::UntilClose),
        }
    }

    /// Whether the server ends the connection after this response.
    pub fn wants_close(&self) -> bool {
        match self.version {
            Version::Http11 => self.headers.has_token("connection", "close"),
            Version::Http10 => !self.headers.has_token("connection", "keep-alive"),
        }
    }
}

/// The lines of a head without their line ends (CRLF or a bare LF), up to the empty line.
fn head_lines(head: &[u8]) -> impl Iterator<Item = &[u8]> {
    head.split(|b| *b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
        .take_while(|line| !line.is_empty())
}

fn parse_headers<'a>(lines: impl Iterator<Item = &'a [u8]>) -> Result<Headers, FramingError> {
    let mut headers = Vec::new();
    for line in lines {
        let colon = line
            .iter()
            .position(|b| *b == b':')
            .ok_or(FramingError::HeaderLine)?;
        let (name, value) = (&line[..colon], trim(&line[colon + 1..]));
        // No obs-fold, no whitespace before the colon, no control characters in values.
        if name.is_empty() || !name.iter().copied().all(is_tchar) {
            return Err(FramingError::HeaderLine);
        }
        if value
            .iter()
            .any(|b| (*b < b' ' && *b != b'\t') || *b == 0x7f)
        {
            return Err(FramingError::HeaderLine);
        }
        let name = String::from_utf8(name.to_vec()).map_err(|_| FramingError::HeaderLine)?;
        headers.push((name, value.to_vec()));
    }
    Ok(Headers(headers))
}

/// The Content-Length, if any: digits only, every copy identical.
fn content_length(headers: &Headers) -> Result<Option<u64>, FramingError> {
    let mut length = None;
    for value in headers.all("content-length") {
        let value = trim(value);
        if value.is_empty() || value.len() > 18 || !value.iter().all(u8::is_ascii_digit) {
            return Err(FramingError::ContentLength);
        }
        let parsed: u64 = std::str::from_utf8(value)
            .ok()
            .and_then(|v| v.parse().ok())
            .ok_or(FramingError::ContentLength)?;
        if length.is_some_and(|l| l != parsed) {
            return Err(FramingError::ContentLength);
        }
        length = Some(parsed);
    }
    Ok(length)
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|b| *b != b' ' && *b != b'\t')
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| *b != b' ' && *b != b'\t')
        .map_or(start, |p| p + 1);
    &bytes[start..end.max(start)]
}

/// Where a chunked body is: a state machine fed with raw bytes, so a relay can pass them on
/// verbatim and still know where the body ends.
#[derive(Debug, Default)]
pub struct ChunkedDecoder {
    state: ChunkState,
    line: Vec<u8>,
    trailer_bytes: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    #[default]
    SizeLine,
    Data(u64),
    DataCr,
    DataLf,
    Trailer,
    Done,
}

impl ChunkedDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the last chunk and the trailer section have been seen.
    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// Consumes the prefix of `input` that belongs to the body and returns its length; the
    /// chunk data in it is appended to `data` when given. Stops at the body's end.
    pub fn feed(
        &mut self,
        input: &[u8],
        mut data: Option<&mut Vec<u8>>,
    ) -> Result<usize, FramingError> {
        let mut at = 0;
        while at < input.len() {
            match self.state {
                ChunkState::Done => break,
                ChunkState::SizeLine | ChunkState::Trailer => {
                    let rest = &input[at..];
                    let (taken, complete) = match rest.iter().position(|b| *b == b'\n') {
                        Some(nl) => (nl + 1, true),
                        None => (rest.len(), false),
                    };
                    self.line.extend_from_slice(&rest[..taken]);
                    at += taken;
                    if self.line.len() > MAX_CHUNK_LINE {
                        return Err(FramingError::Chunked);
                    }
                    if complete {
                        self.end_of_line()?;
                    }
                }
                ChunkState::Data(remaining) => {
                    let available = (input.len() - at) as u64;
                    let take = remaining.min(available) as usize;
                    if let Some(out) = data.as_deref_mut() {
                        out.extend_from_slice(&input[at..at + take]);
                    }
                    at += take;
                    let left = remaining - take as u64;
                    self.state = if left == 0 {
                        ChunkState::DataCr
                    } else {
                        ChunkState::Data(left)
                    };
                }
                ChunkState::DataCr => {
                    if input[at] != b'\r' {
                        return Err(FramingError::Chunked);
                    }
                    at += 1;
                    self.state = ChunkState::DataLf;
                }
                ChunkState::DataLf => {
                    if input[at] != b'\n' {
                        return Err(FramingError::Chunked);
                    }
                    at += 1;
                    self.state = ChunkState::SizeLine;
                }
            }
        }
        Ok(at)
    }

    fn end_of_line(&mut self) -> Result<(), FramingError> {
        let line = std::mem::take(&mut self.line);
        let trimmed = trim_line_end(&line);
        if self.state == ChunkState::Trailer {
            self.trailer_bytes += line.len();
            if self.trailer_bytes > MAX_TRAILERS {
                return Err(FramingError::Chunked);
            }
            if trimmed.is_empty() {
                self.state = ChunkState::Done;
            }
            return Ok(());
        }
        let size = match trimmed.iter().position(|b| *b == b';') {
            Some(semi) => &trimmed[..semi],
            None => trimmed,
        };
        if size.is_empty() || size.len() > 16 || !size.iter().all(u8::is_ascii_hexdigit) {
            return Err(FramingError::Chunked);
        }
        let size = std::str::from_utf8(size)
            .ok()
            .and_then(|s| u64::from_str_radix(s, 16).ok())
            .ok_or(FramingError::Chunked)?;
        self.state = if size == 0 {
            ChunkState::Trailer
        } else {
            ChunkState::Data(size)
        };
        Ok(())
    }
}

/// Trailing whitespace and line end off a chunk line, as Go's chunked reader does.
fn trim_line_end(line: &[u8]) -> &[u8] {
    let end = line
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
        .map_or(0, |p| p + 1);
    &line[..end]
}

/// A read half with a buffer: heads are read through it, the rest is relayed from it.
pub struct Reader<R> {
    inner: R,
    buf: Vec<u8>,
    pos: usize,
    eof: bool,
    /// Where the search for the end of a head resumes.
    scanned: usize,
}

impl<R: AsyncRead + Unpin> Reader<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            pos: 0,
            eof: false,
            scanned: 0,
        }
    }

    /// The bytes read but not consumed yet.
    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    pub fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.buf.len());
        self.scanned = self.scanned.saturating_sub(n);
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
    }

    /// Whether the peer has closed its sending side.
    pub fn at_eof(&self) -> bool {
        self.eof
    }

    /// Reads more from the socket; `Ok(0)` at end of stream. Cancel-safe.
    pub async fn fill(&mut self) -> io::Result<usize> {
        if self.eof {
            return Ok(0);
        }
        if self.pos > 0 && self.pos >= self.buf.len() / 2 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.reserve(READ_SIZE);
        let n = self.inner.read_buf(&mut self.buf).await?;
        if n == 0 {
            self.eof = true;
        }
        Ok(n)
    }

    /// Reads the next head (through the empty line). `Ok(None)` when the stream ended cleanly
    /// before a new head began. Cancel-safe.
    pub async fn read_head(&mut self) -> Result<Option<Vec<u8>>, HeadReadError> {
        loop {
            if let Some(end) = self.find_head_end() {
                // However it arrived (a head read whole in one go is over the limit too).
                if end > MAX_HEAD {
                    return Err(HeadReadError::Framing(FramingError::HeadTooLarge));
                }
                let head = self.buffered()[..end].to_vec();
                self.consume(end);
                self.scanned = 0;
                return Ok(Some(head));
            }
            if self.buffered().len() > MAX_HEAD {
                return Err(HeadReadError::Framing(FramingError::HeadTooLarge));
            }
            if self.fill().await? == 0 {
                return if self.buffered().is_empty() {
                    Ok(None)
                } else {
                    Err(HeadReadError::Framing(FramingError::TruncatedHead))
                };
            }
        }
    }

    /// The length of the head at the front of the buffer, through its empty line.
    fn find_head_end(&mut self) -> Option<usize> {
        let data = self.buffered();
        let from = self.scanned.min(data.len());
        for (i, byte) in data.iter().enumerate().skip(from) {
            if *byte != b'\n' {
                continue;
            }
            // A line that is empty (LF or CRLF) ends the head, except at the very start.
            let prev = &data[..i];
            if prev.ends_with(b"\n") && i > 0 {
                return Some(i + 1);
            }
            if prev.ends_with(b"\n\r") {
                return Some(i + 1);
            }
        }
        self.scanned = data.len();
        None
    }

    /// Copies a body of `length` from this reader to `to`, passing the bytes on verbatim.
    pub async fn copy_body<W: AsyncWrite + Unpin>(
        &mut self,
        length: BodyLength,
        to: &mut W,
    ) -> Result<(), CopyError> {
        match length {
            BodyLength::Empty => Ok(()),
            BodyLength::Length(mut remaining) => {
                while remaining > 0 {
                    if self.buffered().is_empty()
                        && self.fill().await.map_err(CopyError::Read)? == 0
                    {
                        return Err(CopyError::Truncated);
                    }
                    let take = (self.buffered().len() as u64).min(remaining) as usize;
                    to.write_all(&self.buffered()[..take])
                        .await
                        .map_err(CopyError::Write)?;
                    self.consume(take);
                    remaining -= take as u64;
                }
                to.flush().await.map_err(CopyError::Write)
            }
            BodyLength::Chunked => {
                let mut decoder = ChunkedDecoder::new();
                while !decoder.is_done() {
                    if self.buffered().is_empty()
                        && self.fill().await.map_err(CopyError::Read)? == 0
                    {
                        return Err(CopyError::Truncated);
                    }
                    let take = decoder
                        .feed(self.buffered(), None)
                        .map_err(CopyError::Framing)?;
                    to.write_all(&self.buffered()[..take])
                        .await
                        .map_err(CopyError::Write)?;
                    self.consume(take);
                }
                to.flush().await.map_err(CopyError::Write)
            }
            BodyLength::UntilClose => self.copy_to_end(to).await,
        }
    }

    /// Copies everything until the peer closes, then returns (without shutting `to` down).
    pub async fn copy_to_end<W: AsyncWrite + Unpin>(
        &mut self,
        to: &mut W,
    ) -> Result<(), CopyError> {
        loop {
            if !self.buffered().is_empty() {
                to.write_all(self.buffered())
                    .await
                    .map_err(CopyError::Write)?;
                let n = self.buffered().len();
                self.consume(n);
                to.flush().await.map_err(CopyError::Write)?;
            }
            if self.fill().await.map_err(CopyError::Read)? == 0 {
                return Ok(());
            }
        }
    }

    /// Reads a whole body of `length` into memory, refusing more than `limit` bytes of it.
    pub async fn read_body(
        &mut self,
        length: BodyLength,
        limit: usize,
    ) -> Result<Vec<u8>, ReadBodyError> {
        let mut body = Vec::new();
        match length {
            BodyLength::Empty => {}
            BodyLength::Length(n) => {
                if n > limit as u64 {
                    return Err(ReadBodyError::TooLarge);
                }
                let mut remaining = n as usize;
                while remaining > 0 {
                    if self.buffered().is_empty() && self.fill().await? == 0 {
                        return Err(ReadBodyError::Truncated);
                    }
                    let take = self.buffered().len().min(remaining);
                    body.extend_from_slice(&self.buffered()[..take]);
                    self.consume(take);
                    remaining -= take;
                }
            }
            BodyLength::Chunked => {
                let mut decoder = ChunkedDecoder::new();
                while !decoder.is_done() {
                    if self.buffered().is_empty() && self.fill().await? == 0 {
                        return Err(ReadBodyError::Truncated);
                    }
                    let take = decoder.feed(self.buffered(), Some(&mut body))?;
                    self.consume(take);
                    if body.len() > limit {
                        return Err(ReadBodyError::TooLarge);
                    }
                }
            }
            BodyLength::UntilClose => loop {
                body.extend_from_slice(self.buffered());
                let n = self.buffered().len();
                self.consume(n);
                if body.len() > limit {
                    return Err(ReadBodyError::TooLarge);
                }
                if self.fill().await? == 0 {
                    break;
                }
            },
        }
        Ok(body)
    }

    /// Gives the inner reader back with whatever was buffered.
    pub fn into_parts(self) -> (R, Vec<u8>) {
        let buffered = self.buf[self.pos..].to_vec();
        (self.inner, buffered)
    }
}

/// Why a head could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HeadReadError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error(transparent)]
    Framing(FramingError),
}

/// Why a body could not be relayed; says which side failed.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("reading the body: {0}")]
    Read(#[source] io::Error),
    #[error("writing the body: {0}")]
    Write(#[source] io::Error),
    #[error("the connection closed in the middle of a body")]
    Truncated,
    #[error(transparent)]
    Framing(FramingError),
}

/// Why a body could not be read into memory.
#[derive(Debug, thiserror::Error)]
pub enum ReadBodyError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("the body is larger than allowed")]
    TooLarge,
    #[error("the connection closed in the middle of a body")]
    Truncated,
    #[error(transparent)]
    Framing(#[from] FramingError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(text: &str) -> Result<RequestHead, FramingError> {
        RequestHead::parse(text.as_bytes())
    }

    #[test]
    fn a_docker_cli_request_head_parses_and_re_encodes_with_crlf() {
        let head = request(
            "POST /v1.41/containers/create HTTP/1.1\r\nHost: api.moby.localhost\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n",
        )
        .unwrap();
        assert_eq!(head.method, "POST");
        assert_eq!(head.target, "/v1.41/containers/create");
        assert_eq!(head.body_length().unwrap(), BodyLength::Length(2));
        assert!(!head.wants_close());
        assert_eq!(
            String::from_utf8(head.encode()).unwrap(),
            "POST /v1.41/containers/create HTTP/1.1\r\nHost: api.moby.localhost\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n"
        );
    }

    #[test]
    fn ambiguous_or_malformed_framing_is_rejected() {
        let cases = [
            (
                "GET / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
                FramingError::LengthAndEncoding,
            ),
            (
                "GET / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                FramingError::TransferEncoding,
            ),
            (
                "GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                FramingError::TransferEncoding,
            ),
            (
                "GET / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
                FramingError::TransferEncoding,
            ),
            (
                "GET / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
                FramingError::ContentLength,
            ),
            (
                "GET / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
                FramingError::ContentLength,
            ),
            (
                "GET / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n",
                FramingError::ContentLength,
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(
                request(text).unwrap().body_length(),
                Err(expected),
                "{text:?}"
            );
        }
        let heads = [
            "GET  / HTTP/1.1\r\n\r\n",
            "GET / HTTP/2.0\r\n\r\n",
            "GET / HTTP/1.1 extra\r\n\r\n",
            "GET / HTTP/1.1\r\nTransfer-Encoding : chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
            "GET / HTTP/1.1\r\nNoColon\r\n\r\n",
            "GET / HTTP/1.1\r\nX: a\rb\r\n\r\n",
        ];
        for text in heads {
            assert!(request(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn the_same_content_length_twice_and_a_chunked_encoding_in_any_case_are_accepted() {
        let head =
            request("POST / HTTP/1.1\r\nContent-Length: 3\r\ncontent-length: 3\r\n\r\n").unwrap();
        assert_eq!(head.body_length().unwrap(), BodyLength::Length(3));
        let head = request("POST / HTTP/1.1\r\ntransfer-encoding:  Chunked \r\n\r\n").unwrap();
        assert_eq!(head.body_length().unwrap(), BodyLength::Chunked);
        let head = request("GET / HTTP/1.1\n\n").unwrap();
        assert_eq!(head.body_length().unwrap(), BodyLength::Empty);
    }

    #[test]
    fn connection_close_and_http10_end_the_connection() {
        assert!(
            request("GET / HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n")
                .unwrap()
                .wants_close()
        );
        assert!(request("GET / HTTP/1.0\r\n\r\n").unwrap().wants_close());
        assert!(
            !request("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
                .unwrap()
                .wants_close()
        );
    }

    #[test]
    fn set_content_length_replaces_chunked_framing() {
        let mut head =
            request("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n").unwrap();
        head.set_content_length(42);
        assert_eq!(head.body_length().unwrap(), BodyLength::Length(42));
        assert_eq!(
            String::from_utf8(head.encode()).unwrap(),
            "POST / HTTP/1.1\r\nX-A: 1\r\nContent-Length: 42\r\n\r\n"
        );
    }

    #[test]
    fn response_bodies_are_framed_by_status_method_and_headers() {
        let response = |text: &str| ResponseHead::parse(text.as_bytes()).unwrap();
        let upgraded = response(
            "HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n",
        );
        assert_eq!(upgraded.status, 101);
        assert_eq!(upgraded.body_length("POST").unwrap(), BodyLength::Empty);
        let hijacked =
            response("HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\n");
        assert_eq!(
            hijacked.body_length("POST").unwrap(),
            BodyLength::UntilClose
        );
        let ping = response("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n");
        assert_eq!(ping.body_length("HEAD").unwrap(), BodyLength::Empty);
        // dockerd answers `head /_ping` with a 404 and its JSON body: relay the body.
        let not_found = response("HTTP/1.1 404 Not Found\r\nContent-Length: 29\r\n\r\n");
        assert_eq!(
            not_found.body_length("head").unwrap(),
            BodyLength::Length(29)
        );
        assert_eq!(ping.body_length("GET").unwrap(), BodyLength::Length(2));
        let logs = response("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(logs.body_length("GET").unwrap(), BodyLength::Chunked);
        let no_content = response("HTTP/1.1 204 No Content\r\n\r\n");
        assert_eq!(no_content.body_length("POST").unwrap(), BodyLength::Empty);
        assert!(response("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n").wants_close());
    }

    #[test]
    fn the_chunked_decoder_finds_the_end_across_any_split_and_decodes_data() {
        let body = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        let end = body.len() - b"NEXT".len();
        for split in 0..=body.len() {
            let mut decoder = ChunkedDecoder::new();
            let mut data = Vec::new();
            let first = decoder.feed(&body[..split], Some(&mut data)).unwrap();
            assert_eq!(first, split.min(end), "everything before the end is body");
            let second = decoder.feed(&body[first..], Some(&mut data)).unwrap();
            assert!(decoder.is_done());
            assert_eq!(first + second, end);
            assert_eq!(data, b"hello world");
        }
    }

    #[test]
    fn malformed_chunks_are_errors() {
        for body in [
            &b"x\r\n"[..],
            b"5\r\nhelloXX",
            b"11111111111111111\r\n",
            b" 5\r\n",
            b"\r\n",
        ] {
            let mut decoder = ChunkedDecoder::new();
            assert_eq!(
                decoder.feed(body, None),
                Err(FramingError::Chunked),
                "{body:?}"
            );
        }
    }

    #[tokio::test]
    async fn heads_are_read_one_at_a_time_and_leave_pipelined_bytes_buffered() {
        let input: &[u8] =
            b"GET /a HTTP/1.1\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET";
        let mut reader = Reader::new(input);
        let first = reader.read_head().await.unwrap().unwrap();
        assert_eq!(first, b"GET /a HTTP/1.1\r\n\r\n");
        let second = reader.read_head().await.unwrap().unwrap();
        let head = RequestHead::parse(&second).unwrap();
        let body = reader
            .read_body(head.body_length().unwrap(), 10)
            .await
            .unwrap();
        assert_eq!(body, b"abc");
        assert!(matches!(
            reader.read_head().await,
            Err(HeadReadError::Framing(FramingError::TruncatedHead))
        ));
    }

    #[tokio::test]
    async fn a_head_over_the_limit_is_refused_even_when_it_arrives_whole() {
        let head = |size: usize| {
            let mut head = b"GET / HTTP/1.1\r\nX: ".to_vec();
            head.resize(size - 4, b'a');
            head.extend_from_slice(b"\r\n\r\n");
            head
        };
        let at_limit = head(MAX_HEAD);
        let mut reader = Reader::new(at_limit.as_slice());
        assert_eq!(reader.read_head().await.unwrap().unwrap().len(), MAX_HEAD);
        let over = head(MAX_HEAD + 1);
        let mut reader = Reader::new(over.as_slice());
        assert!(matches!(
            reader.read_head().await,
            Err(HeadReadError::Framing(FramingError::HeadTooLarge))
        ));
    }

    #[tokio::test]
    async fn bodies_over_the_limit_are_refused() {
        let input: &[u8] = b"3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n";
        let mut reader = Reader::new(input);
        assert!(matches!(
            reader.read_body(BodyLength::Chunked, 4).await,
            Err(ReadBodyError::TooLarge)
        ));
        let mut reader = Reader::new(&b""[..]);
        assert!(matches!(
            reader.read_body(BodyLength::Length(5), 4).await,
            Err(ReadBodyError::TooLarge)
        ));
    }

    #[tokio::test]
    async fn chunked_bodies_are_copied_verbatim() {
        let input: &[u8] = b"3\r\nabc\r\n0\r\n\r\nrest";
        let mut reader = Reader::new(input);
        let mut out = Vec::new();
        reader
            .copy_body(BodyLength::Chunked, &mut out)
            .await
            .unwrap();
        assert_eq!(out, b"3\r\nabc\r\n0\r\n\r\n");
        assert_eq!(reader.buffered(), b"rest");
    }
}
