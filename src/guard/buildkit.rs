//! What a BuildKit build through the daemon produced, read from its answer. Since docker CLI
//! 23, `docker build` is buildx, which talks to the daemon's BuildKit over the hijacked
//! `POST /grpc` (HTTP/2 without TLS) and passes tags and labels as frontend attributes inside
//! gRPC: the guard cannot label those images through the query, as it does classic builds.
//! The answer to a build (`moby.buildkit.v1.Control/Solve`) is a `SolveResponse` whose
//! `ExporterResponse` map names the image the daemon's exporter wrote: its id
//! (`containerimage.config.digest`, `containerimage.digest`) and its names (`image.name`).
//! [`ResponseTap`] reads the daemon's side of that connection as it is relayed (never
//! changing a byte) and returns those references, so that the pod's end removes them as it
//! removes what the pod tagged.
//!
//! The read is exactly as deep as that needs: HTTP/2 frames (RFC 9113 §4.1), the DATA of each
//! stream as gRPC length-prefixed messages, and in each message the protobuf map entries of
//! field 1. A message that is not a SolveResponse has no map entry with those keys (status
//! updates carry digests as values of other fields). Anything the tap cannot follow (a frame
//! larger than HTTP/2 allows, a compressed message) stops the tap, never the relay.

use std::collections::HashMap;

/// The largest frame HTTP/2 allows (`SETTINGS_MAX_FRAME_SIZE` at most 2^24-1).
const MAX_FRAME: usize = (1 << 24) - 1;
/// gRPC messages larger than this are skipped unread: a SolveResponse is a few hundred bytes.
const MAX_MESSAGE: usize = 1 << 20;
const FRAME_HEADER: usize = 9;
const DATA: u8 = 0x0;
const FLAG_PADDED: u8 = 0x8;
/// The exporter response keys that name the image the build wrote.
const IMAGE_ID_KEYS: [&str; 2] = ["containerimage.config.digest", "containerimage.digest"];
const IMAGE_NAME_KEY: &str = "image.name";

/// Follows the daemon's side of one `/grpc` connection.
#[derive(Debug, Default)]
pub struct ResponseTap {
    pending: Vec<u8>,
    streams: HashMap<u32, Messages>,
    stopped: bool,
}

impl ResponseTap {
    /// The next bytes the daemon sent; returns the image references (ids first, then names)
    /// of every build answer completed by them.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        if self.stopped {
            return Vec::new();
        }
        self.pending.extend_from_slice(bytes);
        let mut found = Vec::new();
        let mut at = 0;
        while let Some(header) = self.pending.get(at..at + FRAME_HEADER) {
            let length =
                usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            if length > MAX_FRAME {
                self.stop();
                return found;
            }
            let (kind, flags) = (header[3], header[4]);
            let stream = u32::from_be_bytes([header[5] & 0x7f, header[6], header[7], header[8]]);
            let Some(payload) = self
                .pending
                .get(at + FRAME_HEADER..at + FRAME_HEADER + length)
            else {
                break;
            };
            if kind == DATA {
                match data_of(payload, flags) {
                    Some(data) => {
                        let messages = self.streams.entry(stream).or_default();
                        for message in messages.feed(data) {
                            found.extend(image_references(&message));
                        }
                    }
                    None => {
                        self.stop();
                        return found;
                    }
                }
            }
            at += FRAME_HEADER + length;
        }
        self.pending.drain(..at);
        found
    }

    fn stop(&mut self) {
        self.stopped = true;
        self.pending = Vec::new();
        self.streams = HashMap::new();
    }
}

/// A DATA frame's data: its padding (RFC 9113 §6.1) taken off.
fn data_of(payload: &[u8], flags: u8) -> Option<&[u8]> {
    if flags & FLAG_PADDED == 0 {
        return Some(payload);
    }
    let (&pad, rest) = payload.split_first()?;
    rest.get(..rest.len().checked_sub(usize::from(pad))?)
}

/// One stream's gRPC messages: a 5-byte prefix (compressed flag, big-endian length), then the
/// message.
#[derive(Debug, Default)]
struct Messages {
    prefix: Vec<u8>,
    message: Vec<u8>,
    /// How many bytes of the message being read are still to come, once its prefix is
    /// complete.
    wanted: Option<usize>,
    /// Whether the message being read is kept (uncompressed, not too large) or skipped.
    keep: bool,
}

impl Messages {
    /// The messages `data` completes.
    fn feed(&mut self, mut data: &[u8]) -> Vec<Vec<u8>> {
        let mut complete = Vec::new();
        while !data.is_empty() {
            let Some(remaining) = self.wanted else {
                let take = (5 - self.prefix.len()).min(data.len());
                self.prefix.extend_from_slice(&data[..take]);
                data = &data[take..];
                if self.prefix.len() == 5 {
                    let length = u32::from_be_bytes([
                        self.prefix[1],
                        self.prefix[2],
                        self.prefix[3],
                        self.prefix[4],
                    ]) as usize;
                    self.keep = self.prefix[0] == 0 && length <= MAX_MESSAGE;
                    self.wanted = Some(length);
                    self.prefix.clear();
                    self.message.clear();
                    if length == 0 {
                        self.wanted = None;
                    }
                }
                continue;
            };
            let take = remaining.min(data.len());
            if self.keep {
                self.message.extend_from_slice(&data[..take]);
            }
            data = &data[take..];
            if take == remaining {
                if self.keep {
                    complete.push(std::mem::take(&mut self.message));
                }
                self.wanted = None;
            } else {
                self.wanted = Some(remaining - take);
            }
        }
        complete
    }
}

/// The image ids and names a SolveResponse's `ExporterResponse` (field 1, a map of strings)
/// holds; nothing for any other message.
fn image_references(message: &[u8]) -> Vec<String> {
    let entries: Vec<(String, String)> = fields(message)
        .unwrap_or_default()
        .into_iter()
        .filter(|(number, _)| *number == 1)
        .filter_map(|(_, value)| map_entry(value))
        .collect();
    let ids: Vec<String> = IMAGE_ID_KEYS
        .iter()
        .filter_map(|key| entries.iter().find(|(k, _)| k == key))
        .map(|(_, id)| id.clone())
        .filter(|id| id.starts_with("sha256:"))
        .take(1)
        .collect();
    if ids.is_empty() {
        return Vec::new();
    }
    let names = entries
        .iter()
        .filter(|(key, _)| key == IMAGE_NAME_KEY)
        .flat_map(|(_, names)| names.split(','))
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_string);
    ids.into_iter().chain(names).collect()
}

/// A protobuf map entry: field 1 the key, field 2 the value, both strings.
fn map_entry(entry: &[u8]) -> Option<(String, String)> {
    let mut key = None;
    let mut value = String::new();
    for (number, bytes) in fields(entry)? {
        let text = String::from_utf8(bytes.to_vec()).ok()?;
        match number {
            1 => key = Some(text),
            2 => value = text,
            _ => return None,
        }
    }
    Some((key?, value))
}

/// The length-delimited fields of a protobuf message, in order; `None` when it is not one.
/// Fields of the other wire types are skipped.
fn fields(mut bytes: &[u8]) -> Option<Vec<(u64, &[u8])>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let key = varint(&mut bytes)?;
        let (number, wire) = (key >> 3, key & 7);
        if number == 0 {
            return None;
        }
        match wire {
            0 => {
                varint(&mut bytes)?;
            }
            1 => bytes = bytes.get(8..)?,
            2 => {
                let length = usize::try_from(varint(&mut bytes)?).ok()?;
                out.push((number, bytes.get(..length)?));
                bytes = &bytes[length..];
            }
            5 => bytes = bytes.get(4..)?,
            _ => return None,
        }
    }
    Some(out)
}

fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn length_delimited(number: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![(number << 3 | 2) as u8, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    fn entry(key: &str, value: &str) -> Vec<u8> {
        let mut entry = length_delimited(1, key.as_bytes());
        entry.extend(length_delimited(2, value.as_bytes()));
        length_delimited(1, &entry)
    }

    fn grpc(message: &[u8]) -> Vec<u8> {
        let mut out = vec![0];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let length = payload.len() as u32;
        let mut out = length.to_be_bytes()[1..].to_vec();
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    const ID: &str = "sha256:62da6e7e816f5de1b8c2b7276ed988d9026ff7b9596746073c9a1bb6b7e886a7";

    fn solve_response() -> Vec<u8> {
        let mut message = entry("containerimage.config.digest", ID);
        message.extend(entry("containerimage.digest", ID));
        message.extend(entry(
            "image.name",
            "docker.io/library/built:1,built:latest",
        ));
        message
    }

    #[test]
    fn a_build_answer_names_the_image_id_then_its_names_however_the_bytes_arrive() {
        let settings = frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]);
        let headers = frame(0x1, 0x4, 1, b"\x88");
        let status = grpc(&length_delimited(1, &length_delimited(1, ID.as_bytes())));
        let answer = grpc(&solve_response());
        // The answer split over two DATA frames, the second padded.
        let (first, second) = answer.split_at(7);
        let mut padded = vec![3];
        padded.extend_from_slice(second);
        padded.extend_from_slice(&[0, 0, 0]);
        let mut stream = settings;
        stream.extend(headers);
        stream.extend(frame(DATA, 0, 3, &status));
        stream.extend(frame(DATA, 0, 1, first));
        stream.extend(frame(DATA, FLAG_PADDED | 0x1, 1, &padded));
        let expected = vec![
            ID.to_string(),
            "docker.io/library/built:1".to_string(),
            "built:latest".to_string(),
        ];
        for chunk in [1, 2, 5, 9, 64, stream.len()] {
            let mut tap = ResponseTap::default();
            let found: Vec<String> = stream.chunks(chunk).flat_map(|c| tap.feed(c)).collect();
            assert_eq!(found, expected, "in chunks of {chunk}");
        }
    }

    #[test]
    fn other_messages_compressed_ones_and_garbage_name_nothing() {
        let mut tap = ResponseTap::default();
        let unnamed = grpc(&entry("containerimage.digest", "not-a-digest"));
        let mut compressed = grpc(&solve_response());
        compressed[0] = 1;
        for payload in [unnamed, compressed, grpc(b"\xff\xff\xff"), grpc(&[])] {
            assert_eq!(tap.feed(&frame(DATA, 0, 1, &payload)), Vec::<String>::new());
        }
        // After something it cannot follow, the tap stays quiet.
        let mut tap = ResponseTap::default();
        assert!(tap.feed(&frame(DATA, FLAG_PADDED, 1, &[9])).is_empty());
        assert!(
            tap.feed(&frame(DATA, 0, 1, &grpc(&solve_response())))
                .is_empty()
        );
    }

    #[test]
    fn a_large_message_is_skipped_and_the_next_one_read() {
        let mut big = vec![0u8];
        big.extend_from_slice(&((MAX_MESSAGE + 10) as u32).to_be_bytes());
        big.extend(vec![7u8; MAX_MESSAGE + 10]);
        big.extend(grpc(&solve_response()));
        let mut tap = ResponseTap::default();
        let found: Vec<String> = big
            .chunks(16 << 10)
            .flat_map(|c| tap.feed(&frame(DATA, 0, 1, c)))
            .collect();
        assert_eq!(found.first().map(String::as_str), Some(ID));
    }
}
