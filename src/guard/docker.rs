//! A minimal Docker Engine API client over the guard's upstream, for clean-up only: list
//! containers by label, read when one stopped, remove one. One short connection per request.

use std::collections::BTreeMap;
use std::io;

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

use super::http::{BodyLength, Reader, ResponseHead};
use super::upstream::Upstream;

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
}

/// Talks to the daemon behind an [`Upstream`].
#[derive(Debug, Clone)]
pub struct DockerClient {
    upstream: Upstream,
}

impl DockerClient {
    pub fn new(upstream: Upstream) -> Self {
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
        let (status, body) = self.request("DELETE", &path).await?;
        match status {
            200..=299 => Ok(Removal::Removed),
            404 => Ok(Removal::AlreadyGone),
            409 if message(&body).contains("already in progress") => Ok(Removal::AlreadyGone),
            _ => Err(self.status_error("DELETE", &path, status, &body)),
        }
    }

    async fn expect_ok(&self, method: &'static str, path: &str) -> Result<Vec<u8>, DockerError> {
        let (status, body) = self.request(method, path).await?;
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
    ) -> Result<(u16, Vec<u8>), DockerError> {
        let stream = self
            .upstream
            .connect()
            .await
            .map_err(|source| DockerError::Connect {
                address: self.upstream.address().to_string(),
                source,
            })?;
        let (read, mut write) = tokio::io::split(stream);
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: docker\r\nUser-Agent: podmend-guard\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        );
        let fail = |reason: String| self.exchange_error(method, path, reason);
        write
            .write_all(request.as_bytes())
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
        let body = match length {
            BodyLength::Empty => Vec::new(),
            length => reader
                .read_body(length, MAX_ANSWER)
                .await
                .map_err(|e| fail(e.to_string()))?,
        };
        Ok((response.status, body))
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

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn query_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
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
