//! A minimal Docker Engine API client over the guard's upstream, for clean-up only: list
//! containers, networks and images by label, read when a container stopped, follow the
//! daemon's events, read its disk usage, remove things. One short connection per request
//! (and one long one per event stream).

use std::collections::BTreeMap;
use std::io;

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

use super::http::{BodyLength, ChunkedDecoder, Reader, ResponseHead};
use super::policy::query_escape;
use super::upstream::{BoxStream, DaemonUpstream};

/// Largest daemon answer read (a container list of thousands is a few MiB).
const MAX_ANSWER: usize = 64 << 20;

/// Why a clean-up request failed.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    #[error("cannot reach the Docker daemon at {address}: {source}")]
    Connect {
        address: String,
        #[source]
        source: io::Error,
    },
    #[error("{method} {path} to the Docker daemon at {address} failed: {reason}")]
    Exchange {
        address: String,
        method: &'static str,
        path: String,
        reason: String,
    },
    #[error("the Docker daemon at {address} answered {method} {path} with {status}: {message}")]
    Status {
        address: String,
        method: &'static str,
        path: String,
        status: u16,
        message: String,
    },
}

/// One entry of `GET /containers/json`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ContainerSummary {
    pub id: String,
    #[serde(default)]
    pub names: Option<Vec<String>>,
    #[serde(default)]
    pub image: String,
    /// The image's id (`sha256:...`).
    #[serde(rename = "ImageID", default)]
    pub image_id: String,
    #[serde(default)]
    pub state: String,
    /// Creation time, unix seconds.
    #[serde(default)]
    pub created: i64,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
}

impl ContainerSummary {
    /// The first 12 characters of the id, as `docker ps` shows it.
    pub fn short_id(&self) -> &str {
        self.id.get(..12).unwrap_or(&self.id)
    }

    /// The container's name without its leading `/`.
    pub fn name(&self) -> &str {
        self.names
            .as_ref()
            .and_then(|n| n.first())
            .map_or("", |n| n.trim_start_matches('/'))
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.as_ref()?.get(key).map(String::as_str)
    }

    /// Whether the container is not running (created, exited or dead).
    pub fn is_stopped(&self) -> bool {
        matches!(self.state.as_str(), "created" | "exited" | "dead")
    }
}

/// What a removal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    Removed,
    /// Already gone (or already being removed, as `--rm` containers are when they exit).
    AlreadyGone,
    /// Refused because it is in use: a container running again, an image a container uses,
    /// a network with containers attached. Kept.
    InUse,
}

/// One entry of `GET /networks`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct NetworkSummary {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    /// `2024-05-01T12:34:56.123456789Z`.
    #[serde(default)]
    pub created: String,
}

impl NetworkSummary {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.as_ref()?.get(key).map(String::as_str)
    }
}

/// `GET /volumes`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct VolumeList {
    #[serde(default)]
    volumes: Option<Vec<VolumeSummary>>,
}

/// One entry of `GET /volumes`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct VolumeSummary {
    pub name: String,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    /// `2024-05-01T12:34:56Z`.
    #[serde(default)]
    pub created_at: String,
}

impl VolumeSummary {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.as_ref()?.get(key).map(String::as_str)
    }
}

/// One image, as `GET /images/json` and `GET /system/df` list them.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ImageSummary {
    pub id: String,
    #[serde(default)]
    pub parent_id: String,
    #[serde(default)]
    pub repo_tags: Option<Vec<String>>,
    /// Creation time, unix seconds.
    #[serde(default)]
    pub created: i64,
    #[serde(default)]
    pub size: i64,
    /// Bytes shared with other images (`-1`: not computed).
    #[serde(default)]
    pub shared_size: i64,
    /// Containers (running or not) using the image (`-1`: not computed).
    #[serde(default)]
    pub containers: i64,
}

impl ImageSummary {
    /// Its tags, without Docker's `<none>:<none>` placeholder.
    pub fn tags(&self) -> Vec<&str> {
        self.repo_tags
            .iter()
            .flatten()
            .map(String::as_str)
            .filter(|t| *t != "<none>:<none>")
            .collect()
    }

    /// The id without `sha256:`, 12 characters, as `docker images` shows it.
    pub fn short_id(&self) -> &str {
        let id = self.id.strip_prefix("sha256:").unwrap_or(&self.id);
        id.get(..12).unwrap_or(id)
    }
}

/// `GET /system/df`: what the images take.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DiskUsage {
    /// Bytes of every image layer, shared ones counted once.
    #[serde(default)]
    pub layers_size: i64,
    #[serde(default)]
    pub images: Option<Vec<ImageSummary>>,
}

/// One event of `GET /events`.
#[derive(Debug, Clone, Deserialize)]
pub struct Event {
    #[serde(rename = "Type", default)]
    pub kind: String,
    #[serde(rename = "Action", default)]
    pub action: String,
    #[serde(rename = "Actor", default)]
    pub actor: Actor,
    /// Unix nanoseconds.
    #[serde(rename = "timeNano", default)]
    pub time_nano: i64,
}

/// What an event is about: its id and attributes (a container's labels, name, image).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Actor {
    #[serde(rename = "ID", default)]
    pub id: String,
    #[serde(rename = "Attributes", default)]
    pub attributes: BTreeMap<String, String>,
}

/// A stream of daemon events, one JSON object per line in a chunked body.
pub struct EventStream {
    reader: Reader<tokio::io::ReadHalf<BoxStream>>,
    _write: tokio::io::WriteHalf<BoxStream>,
    length: BodyLength,
    decoder: ChunkedDecoder,
    pending: Vec<u8>,
}

impl EventStream {
    /// The next event; `None` when the daemon ended the stream.
    pub async fn next(&mut self) -> io::Result<Option<Event>> {
        loop {
            if let Some(newline) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=newline).collect();
                let line = line.trim_ascii();
                if line.is_empty() {
                    continue;
                }
                match serde_json::from_slice::<Event>(line) {
                    Ok(event) => return Ok(Some(event)),
                    Err(error) => {
                        tracing::debug!(%error, "an event the guard cannot read");
                        continue;
                    }
                }
            }
            if self.decoder.is_done() {
                return Ok(None);
            }
            if self.reader.buffered().is_empty() && self.reader.fill().await? == 0 {
                return Ok(None);
            }
            match self.length {
                BodyLength::Chunked => {
                    let taken = self
                        .decoder
                        .feed(self.reader.buffered(), Some(&mut self.pending))
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    self.reader.consume(taken);
                }
                _ => {
                    let n = self.reader.buffered().len();
                    self.pending.extend_from_slice(self.reader.buffered());
                    self.reader.consume(n);
                }
            }
        }
    }
}

/// Talks to the daemon behind an [`DaemonUpstream`].
#[derive(Debug, Clone)]
pub struct DockerClient {
    upstream: DaemonUpstream,
}

impl DockerClient {
    pub fn new(upstream: DaemonUpstream) -> Self {
        Self { upstream }
    }

    /// Every container (running or not) carrying `label` (`KEY` or `KEY=VALUE`).
    pub async fn containers_with_label(
        &self,
        label: &str,
    ) -> Result<Vec<ContainerSummary>, DockerError> {
        let filters = json!({ "label": [label] }).to_string();
        let path = format!("/containers/json?all=1&filters={}", query_escape(&filters));
        let body = self.expect_ok("GET", &path).await?;
        serde_json::from_slice(&body).map_err(|e| self.exchange_error("GET", &path, e.to_string()))
    }

    /// When the container last stopped, in unix seconds (`None` if it never ran).
    pub async fn finished_at(&self, id: &str) -> Result<Option<i64>, DockerError> {
        let path = format!("/containers/{}/json", query_escape(id));
        let body = self.expect_ok("GET", &path).await?;
        let inspect: Value = serde_json::from_slice(&body)
            .map_err(|e| self.exchange_error("GET", &path, e.to_string()))?;
        Ok(inspect
            .pointer("/State/FinishedAt")
            .and_then(Value::as_str)
            .and_then(parse_rfc3339)
            .filter(|t| *t > 0))
    }

    /// Removes a container, running or not, with its anonymous volumes.
    pub async fn remove(&self, id: &str) -> Result<Removal, DockerError> {
        let path = format!("/containers/{}?force=1&v=1", query_escape(id));
        self.delete(&path).await
    }

    /// Removes a stopped container with its anonymous volumes, without force: one that runs
    /// again (restarted in the meantime) is refused by the daemon and kept.
    pub async fn remove_stopped(&self, id: &str) -> Result<Removal, DockerError> {
        let path = format!("/containers/{}?v=1", query_escape(id));
        self.delete(&path).await
    }

    /// Whether the daemon answers `GET /_ping`.
    pub async fn ping(&self) -> Result<(), DockerError> {
        self.expect_ok("GET", "/_ping").await.map(drop)
    }

    /// Every network carrying `label` (`KEY=VALUE`).
    pub async fn networks_with_label(
        &self,
        label: &str,
    ) -> Result<Vec<NetworkSummary>, DockerError> {
        let filters = json!({ "label": [label] }).to_string();
        self.get_json(&format!("/networks?filters={}", query_escape(&filters)))
            .await
    }

    /// Removes a network; one with containers attached is refused and kept.
    pub async fn remove_network(&self, id: &str) -> Result<Removal, DockerError> {
        self.delete(&format!("/networks/{}", query_escape(id)))
            .await
    }

    /// Every volume carrying `label` (`KEY` or `KEY=VALUE`).
    pub async fn volumes_with_label(&self, label: &str) -> Result<Vec<VolumeSummary>, DockerError> {
        let filters = json!({ "label": [label] }).to_string();
        let list: VolumeList = self
            .get_json(&format!("/volumes?filters={}", query_escape(&filters)))
            .await?;
        Ok(list.volumes.unwrap_or_default())
    }

    /// Whether a volume named `name` exists.
    pub async fn volume_exists(&self, name: &str) -> Result<bool, DockerError> {
        let path = format!("/volumes/{}", query_escape(name));
        let (status, body) = self.request("GET", &path, None).await?;
        match status {
            200..=299 => Ok(true),
            404 => Ok(false),
            _ => Err(self.status_error("GET", &path, status, &body)),
        }
    }

    /// Creates the volume `name` with `driver` (empty: the daemon's default) and `labels`. A
    /// volume of that name made in the meantime is left as it is (the daemon answers with it).
    pub async fn create_volume(
        &self,
        name: &str,
        driver: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), DockerError> {
        let mut body = json!({ "Name": name, "Labels": labels });
        if !driver.is_empty() {
            body["Driver"] = Value::String(driver.to_string());
        }
        let path = "/volumes/create";
        let (status, answer) = self
            .request("POST", path, Some(body.to_string().as_bytes()))
            .await?;
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(self.status_error("POST", path, status, &answer))
        }
    }

    /// Removes a volume without force; one a container uses is refused and kept.
    pub async fn remove_volume(&self, name: &str) -> Result<Removal, DockerError> {
        self.delete(&format!("/volumes/{}", query_escape(name)))
            .await
    }

    /// Every image carrying `label` (`KEY=VALUE`).
    pub async fn images_with_label(&self, label: &str) -> Result<Vec<ImageSummary>, DockerError> {
        let filters = json!({ "label": [label] }).to_string();
        self.get_json(&format!("/images/json?filters={}", query_escape(&filters)))
            .await
    }

    /// Every image, intermediate ones too (to know which images are parents).
    pub async fn all_images(&self) -> Result<Vec<ImageSummary>, DockerError> {
        self.get_json("/images/json?all=1").await
    }

    /// `GET /images/{name}/json`: (created, last tagged) in unix seconds.
    pub async fn image_times(&self, name: &str) -> Result<(i64, Option<i64>), DockerError> {
        let inspect: Value = self
            .get_json(&format!("/images/{}/json", path_escape(name)))
            .await?;
        let time = |pointer: &str| {
            inspect
                .pointer(pointer)
                .and_then(Value::as_str)
                .and_then(parse_rfc3339)
        };
        Ok((
            time("/Created").unwrap_or(0),
            time("/Metadata/LastTagTime").filter(|t| *t > 0),
        ))
    }

    /// The names (`RepoTags`) of the image `name` (an id or a reference); none when it is
    /// gone.
    pub async fn image_tags(&self, name: &str) -> Result<Vec<String>, DockerError> {
        let path = format!("/images/{}/json", path_escape(name));
        let (status, body) = self.request("GET", &path, None).await?;
        match status {
            200..=299 => {
                let inspect: Value = serde_json::from_slice(&body)
                    .map_err(|e| self.exchange_error("GET", &path, e.to_string()))?;
                Ok(inspect
                    .get("RepoTags")
                    .and_then(Value::as_array)
                    .map(|tags| {
                        tags.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default())
            }
            404 => Ok(Vec::new()),
            _ => Err(self.status_error("GET", &path, status, &body)),
        }
    }

    /// Removes an image by reference (a tag: untags it, and removes the image with its last
    /// tag) or id, without force: an image a container uses is refused and kept.
    pub async fn remove_image(&self, name: &str) -> Result<Removal, DockerError> {
        self.delete(&format!("/images/{}", path_escape(name))).await
    }

    /// Every container, running or not.
    pub async fn all_containers(&self) -> Result<Vec<ContainerSummary>, DockerError> {
        self.get_json("/containers/json?all=1").await
    }

    /// `GET /system/df`.
    pub async fn disk_usage(&self) -> Result<DiskUsage, DockerError> {
        self.get_json("/system/df").await
    }

    /// Follows `GET /events` with `filters` (the Engine API's JSON map of lists).
    pub async fn events(&self, filters: &Value) -> Result<EventStream, DockerError> {
        let path = format!("/events?filters={}", query_escape(&filters.to_string()));
        let (status, reader, write, length) = self.open("GET", &path, None).await?;
        if !(200..300).contains(&status) {
            let mut reader = reader;
            let body = match length {
                BodyLength::Empty => Vec::new(),
                length => reader.read_body(length, 1 << 20).await.unwrap_or_default(),
            };
            return Err(self.status_error("GET", &path, status, &body));
        }
        Ok(EventStream {
            reader,
            _write: write,
            length,
            decoder: ChunkedDecoder::new(),
            pending: Vec::new(),
        })
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, DockerError> {
        let body = self.expect_ok("GET", path).await?;
        serde_json::from_slice(&body).map_err(|e| self.exchange_error("GET", path, e.to_string()))
    }

    async fn delete(&self, path: &str) -> Result<Removal, DockerError> {
        let (status, body) = self.request("DELETE", path, None).await?;
        match status {
            200..=299 => Ok(Removal::Removed),
            404 => Ok(Removal::AlreadyGone),
            409 if message(&body).contains("already in progress") => Ok(Removal::AlreadyGone),
            // Containers running, images in use, networks with endpoints.
            403 | 409 => Ok(Removal::InUse),
            _ => Err(self.status_error("DELETE", path, status, &body)),
        }
    }

    async fn expect_ok(&self, method: &'static str, path: &str) -> Result<Vec<u8>, DockerError> {
        let (status, body) = self.request(method, path, None).await?;
        if (200..300).contains(&status) {
            Ok(body)
        } else {
            Err(self.status_error(method, path, status, &body))
        }
    }

    async fn request(
        &self,
        method: &'static str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<(u16, Vec<u8>), DockerError> {
        let (status, mut reader, _write, length) = self.open(method, path, body).await?;
        let body = match length {
            BodyLength::Empty => Vec::new(),
            length => reader
                .read_body(length, MAX_ANSWER)
                .await
                .map_err(|e| self.exchange_error(method, path, e.to_string()))?,
        };
        Ok((status, body))
    }

    /// Sends a request (with a JSON `body`, if any); returns the status, the reader positioned
    /// at the response body, the write half (kept open for streams) and the body's framing.
    async fn open(
        &self,
        method: &'static str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<
        (
            u16,
            Reader<tokio::io::ReadHalf<BoxStream>>,
            tokio::io::WriteHalf<BoxStream>,
            BodyLength,
        ),
        DockerError,
    > {
        let stream = self
            .upstream
            .connect()
            .await
            .map_err(|source| DockerError::Connect {
                address: self.upstream.address().to_string(),
                source,
            })?;
        let (read, mut write) = tokio::io::split(stream);
        let body = body.unwrap_or_default();
        let content_type = if body.is_empty() {
            ""
        } else {
            "Content-Type: application/json\r\n"
        };
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: docker\r\nUser-Agent: podmend-guard\r\nConnection: close\r\n{content_type}Content-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        let fail = |reason: String| self.exchange_error(method, path, reason);
        write
            .write_all(&request)
            .await
            .map_err(|e| fail(e.to_string()))?;
        write.flush().await.map_err(|e| fail(e.to_string()))?;
        let mut reader = Reader::new(read);
        let head = reader
            .read_head()
            .await
            .map_err(|e| fail(e.to_string()))?
            .ok_or_else(|| fail("no answer".to_string()))?;
        let response = ResponseHead::parse(&head).map_err(|e| fail(e.to_string()))?;
        let length = response
            .body_length(method)
            .map_err(|e| fail(e.to_string()))?;
        Ok((response.status, reader, write, length))
    }

    fn exchange_error(&self, method: &'static str, path: &str, reason: String) -> DockerError {
        DockerError::Exchange {
            address: self.upstream.address().to_string(),
            method,
            path: path.to_string(),
            reason,
        }
    }

    fn status_error(
        &self,
        method: &'static str,
        path: &str,
        status: u16,
        body: &[u8],
    ) -> DockerError {
        DockerError::Status {
            address: self.upstream.address().to_string(),
            method,
            path: path.to_string(),
            status,
            message: message(body),
        }
    }
}

/// The `message` of a daemon error body, or the body itself.
fn message(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_string())
}

/// Percent-encodes a name for a path segment the way the docker CLI sends image names:
/// `/`, `:` and `@` (registry, tag, digest) stay as they are.
fn path_escape(name: &str) -> String {
    name.split(['/', ':', '@'])
        .map(query_escape)
        .zip(
            name.chars()
                .filter(|c| matches!(c, '/' | ':' | '@'))
                .map(|c| c.to_string())
                .chain(std::iter::once(String::new())),
        )
        .map(|(part, separator)| part + &separator)
        .collect()
}

/// `2024-05-01T12:34:56.123456789Z` (or with a `+hh:mm` offset) as unix seconds.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    if bytes.len() < 20
        || bytes[4] != b'-'
        || bytes[7] != b'-'
        || !matches!(bytes[10], b'T' | b't' | b' ')
    {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if bytes[13] != b':'
        || bytes[16] != b':'
        || !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
    {
        return None;
    }
    let mut rest = &text[19..];
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        rest = &fraction[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (h, m) = rest[1..].split_once(':')?;
            sign * (h.parse::<i64>().ok()? * 3600 + m.parse::<i64>().ok()? * 60)
        }
    };
    let days = days_from_civil(year, month, day);
    Some(days * 86_400 + hour * 3600 + minute * 60 + second - offset)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = if year >= 0 { year } else { year - 399 } / 400;
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_timestamps_parse_to_unix_seconds() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339("2024-05-01T12:34:56.123456789Z"),
            Some(1_714_566_896)
        );
        assert_eq!(
            parse_rfc3339("2024-05-01T14:34:56+02:00"),
            Some(1_714_566_896)
        );
        assert_eq!(parse_rfc3339("2000-02-29T00:00:00Z"), Some(951_782_400));
        assert!(parse_rfc3339("0001-01-01T00:00:00Z").unwrap() < 0);
        assert_eq!(parse_rfc3339("yesterday"), None);
        assert_eq!(parse_rfc3339("2024-13-01T00:00:00Z"), None);
    }

    #[test]
    fn filters_are_escaped_for_the_query() {
        assert_eq!(
            query_escape(r#"{"label":["podmend.io/owner-pod=a b"]}"#),
            "%7B%22label%22%3A%5B%22podmend.io%2Fowner-pod%3Da%20b%22%5D%7D"
        );
    }

    #[test]
    fn image_names_keep_their_registry_tag_and_digest_separators() {
        assert_eq!(
            path_escape("mirror.example:5000/ci/app:b 1"),
            "mirror.example:5000/ci/app:b%201"
        );
        assert_eq!(path_escape("sha256:ab"), "sha256:ab");
        assert_eq!(path_escape("a@sha256:cd"), "a@sha256:cd");
    }

    #[tokio::test]
    async fn events_are_read_line_by_line_across_chunk_boundaries() {
        let (mut daemon, guard_side) = tokio::io::duplex(1 << 16);
        let (read, write) = tokio::io::split(Box::pin(guard_side) as BoxStream);
        let mut stream = EventStream {
            reader: Reader::new(read),
            _write: write,
            length: BodyLength::Chunked,
            decoder: ChunkedDecoder::new(),
            pending: Vec::new(),
        };
        let first = r#"{"Type":"container","Action":"die","Actor":{"ID":"abc","Attributes":{"name":"b"}},"timeNano":5}"#;
        let second = r#"{"Type":"container","Action":"start","Actor":{"ID":"def"},"timeNano":6}"#;
        let body = format!("{first}\n{second}\n");
        let (a, b) = body.split_at(40);
        let wire = format!("{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n", a.len(), b.len());
        daemon.write_all(wire.as_bytes()).await.unwrap();
        let event = stream.next().await.unwrap().unwrap();
        assert_eq!(
            (
                event.action.as_str(),
                event.actor.id.as_str(),
                event.time_nano
            ),
            ("die", "abc", 5)
        );
        assert_eq!(event.actor.attributes["name"], "b");
        let event = stream.next().await.unwrap().unwrap();
        assert_eq!(
            (event.action.as_str(), event.actor.id.as_str()),
            ("start", "def")
        );
        assert!(stream.next().await.unwrap().is_none());
    }

    #[test]
    fn summaries_tolerate_null_names_and_labels() {
        let list: Vec<ContainerSummary> = serde_json::from_str(
            r#"[{"Id":"0123456789abcdef","Names":null,"Labels":null,"State":"exited","Created":5},
                {"Id":"ab","Names":["/x"],"Labels":{"k":"v"},"State":"running"}]"#,
        )
        .unwrap();
        assert_eq!(list[0].short_id(), "0123456789ab");
        assert_eq!(list[0].name(), "");
        assert!(list[0].is_stopped());
        assert_eq!(list[1].name(), "x");
        assert_eq!(list[1].label("k"), Some("v"));
        assert!(!list[1].is_stopped());
    }

    #[test]
    fn error_messages_come_from_the_json_body() {
        assert_eq!(
            message(br#"{"message":"No such container: x"}"#),
            "No such container: x"
        );
        assert_eq!(message(b"plain\n"), "plain");
    }
}
