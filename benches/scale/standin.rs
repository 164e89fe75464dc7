//! A local HTTPS stand-in for the kube-apiserver, just enough for `serve`'s watchers and
//! `audit --cluster`: list (with `limit` and `continue`, as the real server pages) and
//! watch (kept open, silent, until `timeoutSeconds`) of the collections of
//! `objects.rs`, cluster-wide, and `GET /version`. Items are rendered per page from
//! templates, so 100,000 pods cost the stand-in neither memory nor much CPU.
//!
//! It counts what it served (lists, items, bytes, watches) so a run can check that the
//! process under test really read everything.
//!
//! Unlike `tests/common/api_stub.rs` (the tests' stand-in: stored objects, events, writes),
//! it holds no objects: at these sizes the stub's per-page clone and serialization would
//! take a good part of the CPU the measured process shares.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use futures::StreamExt as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::objects::Collection;

/// The resourceVersion of every list: nothing changes while a run lasts.
const RESOURCE_VERSION: &str = "5000000";
/// How long a watch stays open without `timeoutSeconds`.
const WATCH_DEFAULT: Duration = Duration::from_secs(3600);

/// What was served, per resource.
#[derive(Debug, Default, Clone, Copy)]
pub struct Served {
    pub lists: u64,
    pub items: u64,
    pub bytes: u64,
    pub watches: u64,
    pub open_watches: u64,
}

struct Shared {
    collections: Vec<Collection>,
    by_path: HashMap<String, usize>,
    served: Mutex<HashMap<&'static str, Served>>,
}

impl Shared {
    fn count(&self, resource: &'static str, update: impl FnOnce(&mut Served)) {
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        update(served.entry(resource).or_default());
    }
}

/// The running stand-in; stops (its runtime with it) when dropped.
pub struct StandIn {
    shared: Arc<Shared>,
    kubeconfig: PathBuf,
    runtime: Option<tokio::runtime::Runtime>,
}

impl StandIn {
    /// Serves `collections` on a free loopback port with the serving pair in `pki`
    /// (`podmend certs` output: `tls.crt`, `tls.key`, `ca.crt`), and writes a kubeconfig
    /// for it into `dir`.
    pub fn start(collections: Vec<Collection>, pki: &Path, dir: &Path) -> anyhow::Result<StandIn> {
        let by_path = collections
            .iter()
            .enumerate()
            .map(|(i, c)| (c.path(), i))
            .collect();
        let shared = Arc::new(Shared {
            collections,
            by_path,
            served: Mutex::new(HashMap::new()),
        });
        let acceptor = TlsAcceptor::from(tls_config(pki)?);
        // One worker: the stand-in pages on demand, one request at a time per client; the
        // rest of the machine is for the process under test.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("stand-in")
            .enable_all()
            .build()
            .context("start the stand-in's runtime")?;
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .context("bind the stand-in to 127.0.0.1:0")?;
        let addr = listener.local_addr().context("the stand-in's address")?;
        let app = Router::new().fallback(handle).with_state(shared.clone());
        runtime.spawn(serve(listener, acceptor, app));

        let ca = std::fs::read(pki.join("ca.crt")).context("read the CA of `podmend certs`")?;
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(addr, &ca))
            .with_context(|| format!("write {}", kubeconfig.display()))?;
        Ok(StandIn {
            shared,
            kubeconfig,
            runtime: Some(runtime),
        })
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// What was served so far for `resource`.
    pub fn served(&self, resource: &str) -> Served {
        let served = self.shared.served.lock().unwrap_or_else(|e| e.into_inner());
        served.get(resource).copied().unwrap_or_default()
    }

    /// Forgets the counts (between two processes under test).
    pub fn reset_counts(&self) {
        let mut served = self.shared.served.lock().unwrap_or_else(|e| e.into_inner());
        for s in served.values_mut() {
            let open = s.open_watches;
            *s = Served {
                open_watches: open,
                ..Served::default()
            };
        }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn tls_config(pki: &Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let cert_path = pki.join("tls.crt");
    let key_path = pki.join("tls.key");
    let certs = CertificateDer::pem_file_iter(&cert_path)
        .with_context(|| format!("read {}", cert_path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parse {}", cert_path.display()))?;
    if certs.is_empty() {
        bail!("no certificate in {}", cert_path.display());
    }
    let key = PrivateKeyDer::from_pem_file(&key_path)
        .with_context(|| format!("read {}", key_path.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("the stand-in's TLS configuration")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn kubeconfig_yaml(addr: SocketAddr, ca_pem: &[u8]) -> String {
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: scale-stand-in\n  \
           cluster:\n    \
             server: https://{addr}\n    \
             certificate-authority-data: {ca}\n\
         users:\n\
         - name: bench\n  \
           user:\n    \
             token: podmend-scale-bench\n\
         contexts:\n\
         - name: scale-stand-in\n  \
           context:\n    \
             cluster: scale-stand-in\n    \
             user: bench\n\
         current-context: scale-stand-in\n",
        ca = STANDARD.encode(ca_pem)
    )
}

async fn serve(listener: TcpListener, acceptor: TlsAcceptor, app: Router) {
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        connections.spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                .await;
        });
    }
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let path = uri.path();
    if path == "/version" {
        let version = json!({
            "major": "1", "minor": "33", "gitVersion": "v1.33.1-podmend-scale-stand-in",
            "platform": "linux/amd64",
        });
        return (
            [(header::CONTENT_TYPE, "application/json")],
            version.to_string(),
        )
            .into_response();
    }
    let Some(&index) = shared.by_path.get(path) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("the scale stand-in serves no {path} (only cluster-wide lists and watches)"),
        );
    };
    if matches!(query.get("watch").map(String::as_str), Some("1" | "true")) {
        return watch(shared, index, &query);
    }
    list(&shared, index, &query)
}

/// One page: `limit` items from the `continue` token's index (all items without a limit).
fn list(shared: &Shared, index: usize, query: &HashMap<String, String>) -> Response {
    let c = &shared.collections[index];
    let limit = match query.get("limit").map(|l| l.parse::<usize>()) {
        None | Some(Ok(0)) => c.len,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "limit must be a non-negative integer",
            );
        }
    };
    let start = match query.get("continue").filter(|t| !t.is_empty()) {
        None => 0,
        Some(token) => match parse_token(token) {
            Some(start) if start <= c.len => start,
            _ => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
                );
            }
        },
    };
    let end = start.saturating_add(limit).min(c.len);
    let mut out = Vec::with_capacity(256 + (end - start) * 4096);
    let _ = write!(
        out,
        "{{\"kind\":\"{}List\",\"apiVersion\":\"{}\",\"metadata\":{{\"resourceVersion\":\"{RESOURCE_VERSION}\"",
        c.kind, c.api_version
    );
    if end < c.len {
        let _ = write!(
            out,
            ",\"continue\":\"{}\",\"remainingItemCount\":{}",
            token(end),
            c.len - end
        );
    }
    out.extend_from_slice(b"},\"items\":[");
    for i in start..end {
        if i > start {
            out.push(b',');
        }
        (c.render)(i, &mut out);
    }
    out.extend_from_slice(b"]}");
    let bytes = out.len() as u64;
    shared.count(c.resource, |s| {
        s.lists += 1;
        s.items += (end - start) as u64;
        s.bytes += bytes;
    });
    ([(header::CONTENT_TYPE, "application/json")], out).into_response()
}

/// Shaped like the API server's token (base64 of `{"v","rv","start"}`); `start` is an index.
fn token(start: usize) -> String {
    URL_SAFE_NO_PAD.encode(
        json!({"v": "meta.k8s.io/v1", "rv": RESOURCE_VERSION.parse::<u64>().unwrap_or(0), "start": start.to_string()})
            .to_string(),
    )
}

fn parse_token(token: &str) -> Option<usize> {
    let bytes = URL_SAFE_NO_PAD.decode(token).ok()?;
    let value: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    value.get("start")?.as_str()?.parse().ok()
}

/// Decrements the open-watch count when the watch's body is dropped (ended or cut).
struct OpenWatch {
    shared: Arc<Shared>,
    resource: &'static str,
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.shared.count(self.resource, |s| {
            s.open_watches = s.open_watches.saturating_sub(1)
        });
    }
}

/// A watch that sends nothing (nothing changes) and ends after `timeoutSeconds`.
fn watch(shared: Arc<Shared>, index: usize, query: &HashMap<String, String>) -> Response {
    let resource = shared.collections[index].resource;
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map_or(WATCH_DEFAULT, Duration::from_secs);
    shared.count(resource, |s| {
        s.watches += 1;
        s.open_watches += 1;
    });
    let open = OpenWatch { shared, resource };
    let body = futures::stream::once(async move {
        tokio::time::sleep(timeout).await;
        drop(open);
    })
    .filter_map(|()| async { None::<Result<Bytes, Infallible>> });
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(body),
    )
        .into_response()
}
