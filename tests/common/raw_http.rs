//! HTTP/1.1 responses read off a raw Unix-socket connection, framed the way dockerd frames
//! them (length, chunks, or to the end): what the guard tests send by hand and check byte
//! for byte.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::dockerd::text;

/// One HTTP response read off a raw connection.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&self.body)))
    }
}

/// Writes `request` (one or more pipelined requests, the last with `Connection: close`) to
/// `socket` and reads every response until the connection closes.
pub fn raw(socket: &Path, request: &[u8]) -> Vec<Response> {
    let mut stream = UnixStream::connect(socket).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    stream.write_all(request).expect("write request");
    let mut data = Vec::new();
    stream.read_to_end(&mut data).expect("read responses");
    let mut responses = Vec::new();
    let mut rest = data.as_slice();
    while !rest.is_empty() {
        let (response, used) = parse_response(rest)
            .unwrap_or_else(|| panic!("an incomplete response: {:?}", text(rest)));
        responses.push(response);
        rest = &rest[used..];
    }
    responses
}

/// The first response in `data` and how many bytes it took, if it is complete (a response
/// framed by neither length nor chunks takes everything).
pub fn parse_response(data: &[u8]) -> Option<(Response, usize)> {
    let end = data.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = text(&data[..end]);
    let status: u16 = head.get(9..12)?.parse().ok()?;
    let lower = head.to_ascii_lowercase();
    let mut at = end;
    let body = if let Some(length) = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
    {
        let length: usize = length.trim().parse().ok()?;
        at += length;
        data.get(end..at)?.to_vec()
    } else if lower.contains("transfer-encoding: chunked") {
        let mut body = Vec::new();
        loop {
            let line = data[at..].windows(2).position(|w| w == b"\r\n")?;
            let size = usize::from_str_radix(text(&data[at..at + line]).trim(), 16).ok()?;
            at += line + 2;
            if size == 0 {
                at += 2;
                break;
            }
            body.extend_from_slice(data.get(at..at + size)?);
            at += size + 2;
        }
        body
    } else if status == 204 || status == 304 || (100..200).contains(&status) {
        Vec::new()
    } else {
        at = data.len();
        data[end..].to_vec()
    };
    (at <= data.len()).then_some((Response { status, head, body }, at))
}

/// Reads exactly one response from a kept-alive connection.
pub fn read_one(stream: &mut UnixStream, buffer: &mut Vec<u8>) -> Response {
    loop {
        // Only framed answers: one without framing would run to the end of the connection.
        if let Some((response, used)) = parse_response(buffer)
            && (response
                .head
                .to_ascii_lowercase()
                .contains("content-length")
                || response.head.to_ascii_lowercase().contains("chunked"))
        {
            buffer.drain(..used);
            return response;
        }
        let mut chunk = [0u8; 16 * 1024];
        let n = stream.read(&mut chunk).expect("read a response");
        assert!(n > 0, "the connection closed: {:?}", text(buffer));
        buffer.extend_from_slice(&chunk[..n]);
    }
}
