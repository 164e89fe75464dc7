//! A local HTTPS stand-in for the kube-apiserver: GET, list (with `limit`/`continue`, label
//! and field selectors) and watch (newline-delimited events, chunked, kept open) of a few core
//! and apps/batch resources, and server-side apply (PATCH `application/apply-patch+yaml`) of
//! resources registered with [`ApiStub::serve_resource`], in the JSON shapes the real server
//! sends; also create (POST), replace (PUT, with resourceVersion conflicts), JSON Patch and
//! delete (with UID and resourceVersion preconditions) of one object.
//! Every request is recorded as the API server's authorizer sees it ([`Call`]: verb,
//! group, resource, subresource, namespace, name) with the time it arrived, for the RBAC and
//! rate-limit tests.
//! For tests only.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures::stream;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

/// The bearer token the stub's kubeconfig carries and the stub demands.
pub const TOKEN: &str = "podmend-api-stub-token";

/// A running stub API server on `127.0.0.1:<random port>`; stops when dropped.
pub struct ApiStub {
    addr: SocketAddr,
    shared: Arc<Shared>,
    ca_pem: String,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
    server: JoinHandle<()>,
}

struct Shared {
    state: Mutex<StubState>,
    /// The latest resourceVersion; watch streams wake up when it moves.
    changed: watch::Sender<u64>,
    /// Bumped by [`ApiStub::cut_watches`]: every open watch stream breaks off.
    cuts: watch::Sender<u64>,
}

struct StubState {
    resource_version: u64,
    collections: HashMap<String, Collection>,
    events: Vec<Logged>,
    requests: Vec<String>,
    calls: Vec<Call>,
    /// While true every request gets a 500 `InternalError` Status.
    failing: bool,
}

struct Collection {
    /// `v1`, `apps/v1`, ...
    group_version: String,
    kind: String,
    namespaced: bool,
    /// Keyed `namespace/name` (or `name`), so lists come out in a stable order.
    objects: BTreeMap<String, Value>,
}

struct Logged {
    resource: String,
    namespace: Option<String>,
    resource_version: u64,
    event_type: String,
    object: Value,
}

/// Resources the stub knows how to name: (resource, group/version, kind, namespaced).
const KNOWN: &[(&str, &str, &str, bool)] = &[
    ("nodes", "v1", "Node", false),
    ("namespaces", "v1", "Namespace", false),
    ("persistentvolumes", "v1", "PersistentVolume", false),
    ("limitranges", "v1", "LimitRange", true),
    ("pods", "v1", "Pod", true),
    ("configmaps", "v1", "ConfigMap", true),
    ("services", "v1", "Service", true),
    ("serviceaccounts", "v1", "ServiceAccount", true),
    ("resourcequotas", "v1", "ResourceQuota", true),
    (
        "persistentvolumeclaims",
        "v1",
        "PersistentVolumeClaim",
        true,
    ),
    ("podtemplates", "v1", "PodTemplate", true),
    (
        "replicationcontrollers",
        "v1",
        "ReplicationController",
        true,
    ),
    ("deployments", "apps/v1", "Deployment", true),
    ("replicasets", "apps/v1", "ReplicaSet", true),
    ("statefulsets", "apps/v1", "StatefulSet", true),
    ("daemonsets", "apps/v1", "DaemonSet", true),
    ("jobs", "batch/v1", "Job", true),
    ("cronjobs", "batch/v1", "CronJob", true),
    ("events", "v1", "Event", true),
];

/// One request as the API server's authorizer sees it (`RequestInfoFactory.NewRequestInfo` in
/// `k8s.io/apiserver/pkg/endpoints/request/requestinfo.go`), with when it arrived and how it
/// was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// When the request arrived.
    pub at: std::time::Instant,
    /// HTTP method and path with query, for messages.
    pub method: String,
    pub path: String,
    /// Whether the path names an API resource (`/api/...`, `/apis/...` below a group
    /// version); `/version` and discovery are not.
    pub resource_request: bool,
    /// get, list, watch, create, update, patch, delete, deletecollection (for resource
    /// requests); the lower-cased HTTP method otherwise.
    pub verb: String,
    /// `""` for the core group.
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    /// `""` for cluster-scoped requests and for lists across all namespaces.
    pub namespace: String,
    pub name: String,
    /// The answer's HTTP status.
    pub status: u16,
    /// Further authorization checks the request needed: a server-side apply that created
    /// its object was also authorized as `create` (`PatchResource` in
    /// `k8s.io/apiserver/pkg/endpoints/handlers/patch.go`, `createAuthorizerAttributes`).
    pub also: Vec<String>,
}

impl Call {
    /// The verbs this call was authorized for: its verb, then [`Call::also`].
    pub fn verbs(&self) -> Vec<&str> {
        std::iter::once(self.verb.as_str())
            .chain(self.also.iter().map(String::as_str))
            .collect()
    }
}

impl std::fmt::Display for Call {
    /// `delete pods "p" in namespace ns (DELETE /api/v1/...)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.resource_request {
            return write!(f, "{} nonResourceURL {}", self.verb, self.path);
        }
        let mut resource = self.resource.clone();
        if !self.group.is_empty() {
            resource = format!("{resource}.{}", self.group);
        }
        if !self.subresource.is_empty() {
            resource = format!("{resource}/{}", self.subresource);
        }
        write!(f, "{} {resource}", self.verbs().join("+"))?;
        if !self.name.is_empty() {
            write!(f, " {:?}", self.name)?;
        }
        if self.namespace.is_empty() {
            write!(f, " cluster-wide")?;
        } else {
            write!(f, " in namespace {}", self.namespace)?;
        }
        write!(f, " ({} {} → {})", self.method, self.path, self.status)
    }
}

/// What the authorizer is told about a request (see [`Call`]).
fn request_info(method: &Method, path: &str, query: &HashMap<String, String>) -> Call {
    let mut call = Call {
        at: std::time::Instant::now(),
        method: method.as_str().to_string(),
        path: path.to_string(),
        resource_request: false,
        verb: method.as_str().to_lowercase(),
        group: String::new(),
        version: String::new(),
        resource: String::new(),
        subresource: String::new(),
        namespace: String::new(),
        name: String::new(),
        status: 0,
        also: Vec::new(),
    };
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, mut parts) = match segments.as_slice() {
        ["api", version, rest @ ..] if !rest.is_empty() => ("", *version, rest.to_vec()),
        ["apis", group, version, rest @ ..] if !rest.is_empty() => {
            (*group, *version, rest.to_vec())
        }
        _ => return call,
    };
    call.resource_request = true;
    call.group = group.to_string();
    call.version = version.to_string();
    if parts[0] == "namespaces" && parts.len() > 1 {
        call.namespace = parts[1].to_string();
        if parts.len() > 2 {
            parts = parts[2..].to_vec();
        }
    }
    call.resource = parts[0].to_string();
    if let Some(name) = parts.get(1) {
        call.name = name.to_string();
    }
    if let Some(subresource) = parts.get(2) {
        call.subresource = subresource.to_string();
    }
    let watching = matches!(query.get("watch").map(String::as_str), Some("1" | "true"));
    call.verb = match *method {
        Method::GET | Method::HEAD if watching => "watch",
        Method::GET | Method::HEAD if call.name.is_empty() => "list",
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if call.name.is_empty() => "deletecollection",
        Method::DELETE => "delete",
        _ => "",
    }
    .to_string();
    call
}

impl ApiStub {
    /// Starts a stub serving `nodes` and `limit_ranges` (full objects, as `kubectl get -o json`
    /// shows them). Each object gets a fresh `metadata.resourceVersion`.
    pub async fn start(nodes: Vec<Value>, limit_ranges: Vec<Value>) -> ApiStub {
        let (changed, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            state: Mutex::new(StubState {
                resource_version: 1000,
                collections: HashMap::new(),
                events: Vec::new(),
                requests: Vec::new(),
                calls: Vec::new(),
                failing: false,
            }),
            changed,
            cuts: watch::channel(0).0,
        });

        let (ca_pem, server_config) = tls_material();
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let acceptor = TlsAcceptor::from(Arc::new(server_config));
        let server = tokio::spawn(serve(listener, acceptor, app));

        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(addr, &ca_pem)).expect("write kubeconfig");

        let stub = ApiStub {
            addr,
            shared,
            ca_pem,
            kubeconfig,
            _dir: dir,
            server,
        };
        stub.set_objects("nodes", nodes);
        stub.set_objects("limitranges", limit_ranges);
        // podmend serve watches Namespaces too (their toleration whitelists).
        stub.set_objects("namespaces", Vec::new());
        stub
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The PEM of the CA that signed the stub's serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A kubeconfig (CA data, server URL, token user) pointing at the stub.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// A client built from [`Self::kubeconfig_path`], as `kube` would build it.
    pub async fn client(&self) -> kube::Client {
        let kubeconfig =
            kube::config::Kubeconfig::read_from(&self.kubeconfig).expect("read stub kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .expect("stub kubeconfig");
        kube::Client::try_from(config).expect("client for stub")
    }

    /// Replaces every object served for `resource` (e.g. `"pods"`), without watch events.
    /// Unknown resource names are served as namespaced `v1` objects of the objects' `kind`.
    pub fn set_objects(&self, resource: &str, objects: Vec<Value>) {
        let mut state = self.shared.lock();
        let mut rv = state.resource_version;
        let collection = state.collection(resource, objects.first());
        collection.objects.clear();
        for mut object in objects {
            rv += 1;
            set_resource_version(&mut object, rv);
            collection.objects.insert(object_key(&object), object);
        }
        state.resource_version = rv;
        drop(state);
        self.shared.changed.send_replace(rv);
    }

    /// Serves `resource` (plural) under `group_version` (`wgpolicyk8s.io/v1alpha2`) as `kind`,
    /// empty: like installing a CRD. Such resources also take server-side apply.
    pub fn serve_resource(
        &self,
        resource: &str,
        group_version: &str,
        kind: &str,
        namespaced: bool,
    ) {
        self.shared.lock().collections.insert(
            resource.to_string(),
            Collection {
                group_version: group_version.to_string(),
                kind: kind.to_string(),
                namespaced,
                objects: BTreeMap::new(),
            },
        );
    }

    /// The stored objects of `resource` (as the stub keeps them, without type meta for
    /// listed ones), in key order; empty when the resource is not served.
    pub fn objects(&self, resource: &str) -> Vec<Value> {
        self.shared
            .lock()
            .collections
            .get(resource)
            .map(|c| c.objects.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Pushes a watch event for a Node (`ADDED`, `MODIFIED`, `DELETED` or `BOOKMARK`).
    pub fn push_node_event(&self, event_type: &str, node: Value) {
        self.push_event("nodes", event_type, node);
    }

    /// Pushes a watch event for a LimitRange.
    pub fn push_limit_range_event(&self, event_type: &str, limit_range: Value) {
        self.push_event("limitranges", event_type, limit_range);
    }

    /// Applies a change to the stored objects of `resource` and delivers it to open watches
    /// (and to watches resumed from an older resourceVersion), as the API server would.
    pub fn push_event(&self, resource: &str, event_type: &str, object: Value) {
        let mut state = self.shared.lock();
        state.resource_version += 1;
        let rv = state.resource_version;
        let collection = state.collection(resource, Some(&object));
        let mut object = with_type_meta(object, collection);
        set_resource_version(&mut object, rv);
        let key = object_key(&object);
        match event_type {
            "ADDED" | "MODIFIED" => {
                collection.objects.insert(key, object.clone());
            }
            "DELETED" => {
                collection.objects.remove(&key);
            }
            "BOOKMARK" => {
                // A bookmark carries only the type and the resourceVersion (and annotations).
                let annotations = object
                    .pointer("/metadata/annotations")
                    .cloned()
                    .unwrap_or(Value::Null);
                let mut metadata = json!({ "resourceVersion": rv.to_string() });
                if !annotations.is_null() {
                    metadata["annotations"] = annotations;
                }
                object = json!({
                    "kind": collection.kind,
                    "apiVersion": collection.group_version,
                    "metadata": metadata,
                });
            }
            other => panic!("unknown watch event type {other}"),
        }
        let namespace = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(str::to_string);
        state.events.push(Logged {
            resource: resource.to_string(),
            namespace,
            resource_version: rv,
            event_type: event_type.to_string(),
            object,
        });
        drop(state);
        self.shared.changed.send_replace(rv);
    }

    /// Every request seen so far, as path plus query (`/api/v1/nodes?limit=500`).
    pub fn requests(&self) -> Vec<String> {
        self.shared.lock().requests.clone()
    }

    /// Every request answered so far as the authorizer sees it, in the order they arrived.
    pub fn calls(&self) -> Vec<Call> {
        let mut calls = self.shared.lock().calls.clone();
        calls.sort_by_key(|c| c.at);
        calls
    }

    /// Forgets the requests seen so far (the set-up's, say).
    pub fn clear_calls(&self) {
        let mut state = self.shared.lock();
        state.calls.clear();
        state.requests.clear();
    }

    /// While `failing`, every request (list, watch, get) answers 500 with an `InternalError`
    /// Status; open watch streams are not cut.
    pub fn set_failing(&self, failing: bool) {
        self.shared.lock().failing = failing;
    }

    /// Breaks off every open watch stream mid-body, as a dropped connection or an API server
    /// restart would: the client sees the response body fail, not a clean end.
    pub fn cut_watches(&self) {
        self.shared.cuts.send_modify(|n| *n += 1);
    }

    /// The current resourceVersion of the stub's "etcd".
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().resource_version
    }
}

impl Drop for ApiStub {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every connection task.
        self.server.abort();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, StubState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl StubState {
    fn collection(&mut self, resource: &str, sample: Option<&Value>) -> &mut Collection {
        self.collections
            .entry(resource.to_string())
            .or_insert_with(|| {
                let (group_version, kind, namespaced) = match KNOWN.iter().find(|k| k.0 == resource)
                {
                    Some(&(_, gv, kind, namespaced)) => {
                        (gv.to_string(), kind.to_string(), namespaced)
                    }
                    None => {
                        let kind = sample
                            .and_then(|o| o.get("kind"))
                            .and_then(Value::as_str)
                            .map(str::to_string)
                            .unwrap_or_else(|| resource.trim_end_matches('s').to_string());
                        ("v1".to_string(), kind, true)
                    }
                };
                Collection {
                    group_version,
                    kind,
                    namespaced,
                    objects: BTreeMap::new(),
                }
            })
    }
}

fn object_key(object: &Value) -> String {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
    {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

fn set_resource_version(object: &mut Value, rv: u64) {
    if let Some(obj) = object.as_object_mut() {
        let metadata = obj.entry("metadata").or_insert_with(|| json!({}));
        if let Some(metadata) = metadata.as_object_mut() {
            metadata.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
    }
}

/// Objects in watch events and single GETs carry `apiVersion` and `kind`.
fn with_type_meta(mut object: Value, collection: &Collection) -> Value {
    if let Some(obj) = object.as_object_mut() {
        obj.insert(
            "apiVersion".into(),
            Value::String(collection.group_version.clone()),
        );
        obj.insert("kind".into(), Value::String(collection.kind.clone()));
    }
    object
}

/// Items of a list do not: the list itself names them.
fn without_type_meta(mut object: Value) -> Value {
    if let Some(obj) = object.as_object_mut() {
        obj.remove("apiVersion");
        obj.remove("kind");
    }
    object
}

/// A fresh CA and a serving configuration for `127.0.0.1` and `localhost` it signed (h2 and
/// HTTP/1.1): (CA PEM, config). For any HTTPS server a test runs on loopback.
pub fn tls_material() -> (String, rustls::ServerConfig) {
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "podmend api-stub CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).expect("CA cert");
    let issuer = Issuer::new(ca_params, ca_key);

    let key = KeyPair::generate().expect("serving key");
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .expect("serving params");
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer).expect("serving cert");

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .expect("server TLS config");
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    (ca_cert.pem(), config)
}

fn kubeconfig_yaml(addr: SocketAddr, ca_pem: &str) -> String {
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: api-stub\n  \
           cluster:\n    \
             server: https://{addr}\n    \
             certificate-authority-data: {ca}\n\
         users:\n\
         - name: api-stub-user\n  \
           user:\n    \
             token: {TOKEN}\n\
         contexts:\n\
         - name: api-stub\n  \
           context:\n    \
             cluster: api-stub\n    \
             user: api-stub-user\n    \
             namespace: default\n\
         current-context: api-stub\n",
        ca = BASE64.encode(ca_pem)
    )
}

/// Serves `app` over TLS (`acceptor`) to every connection `listener` accepts, HTTP/1.1 or h2,
/// until the task is dropped.
pub async fn serve(listener: TcpListener, acceptor: TlsAcceptor, app: Router) {
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        connections.spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(TokioIo::new(tls), TowerToHyperService::new(app))
                .await;
        });
    }
}

fn status(code: StatusCode, reason: &str, message: &str, details: Value) -> Response {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code.as_u16(),
    });
    json_response(code, &body)
}

fn not_found() -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource",
        json!({}),
    )
}

/// What a path asks for, once `/api/v1` or `/apis/GROUP/VERSION` is taken off.
enum Target {
    Collection {
        resource: String,
        namespace: Option<String>,
    },
    Object {
        resource: String,
        namespace: Option<String>,
        name: String,
    },
}

fn parse_path(path: &str) -> Option<(String, Target)> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group_version, rest) = match segments.as_slice() {
        ["api", "v1", rest @ ..] => ("v1".to_string(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return None,
    };
    let owned = |s: &&str| s.to_string();
    let target = match rest {
        [resource] => Target::Collection {
            resource: owned(resource),
            namespace: None,
        },
        ["namespaces", ns, resource] => Target::Collection {
            resource: owned(resource),
            namespace: Some(owned(ns)),
        },
        ["namespaces", ns, resource, name] => Target::Object {
            resource: owned(resource),
            namespace: Some(owned(ns)),
            name: owned(name),
        },
        [resource, name] => Target::Object {
            resource: owned(resource),
            namespace: None,
            name: owned(name),
        },
        _ => return None,
    };
    Some((group_version, target))
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let path_and_query = uri
        .path_and_query()
        .map(|pq| pq.as_str().to_string())
        .unwrap_or_else(|| uri.path().to_string());
    let mut call = request_info(&method, uri.path(), &query);
    call.path = path_and_query.clone();
    let response = answer(
        &shared,
        &method,
        &uri,
        &headers,
        &query,
        &body,
        path_and_query,
    )
    .await;
    call.status = response.status().as_u16();
    if call.verb == "patch" && call.status == StatusCode::CREATED.as_u16() {
        call.also.push("create".to_string());
    }
    shared.lock().calls.push(call);
    response
}

async fn answer(
    shared: &Arc<Shared>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    query: &HashMap<String, String>,
    body: &[u8],
    path_and_query: String,
) -> Response {
    let shared = shared.clone();
    let (method, headers) = (method.clone(), headers.clone());
    let failing = {
        let mut state = shared.lock();
        state.requests.push(path_and_query);
        state.failing
    };
    if failing {
        return status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "Internal error occurred: the api-stub was told to fail",
            json!({}),
        );
    }

    let authorized = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bearer {TOKEN}"));
    if !authorized {
        return status(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "Unauthorized",
            json!({}),
        );
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if method == Method::POST
        || method == Method::PUT
        || (method == Method::PATCH && content_type == "application/json-patch+json")
    {
        return write_response(&shared, &method, uri.path(), body);
    }
    if method == Method::PATCH {
        return apply_response(&shared, uri.path(), &headers, query, body);
    }
    if method == Method::DELETE {
        return delete_response(&shared, uri.path(), body);
    }
    if method != Method::GET {
        return status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
            json!({}),
        );
    }
    get_response(shared, uri.path(), query)
}

/// A GET: a list or a watch of a collection, or one object.
fn get_response(shared: Arc<Shared>, path: &str, query: &HashMap<String, String>) -> Response {
    let Some((group_version, target)) = parse_path(path) else {
        return not_found();
    };
    match target {
        Target::Collection {
            resource,
            namespace,
        } => collection_response(shared, &group_version, resource, namespace, query),
        Target::Object {
            resource,
            namespace,
            name,
        } => object_response(
            &shared,
            &group_version,
            &resource,
            namespace.as_deref(),
            &name,
        ),
    }
}

/// A list or, with `watch=1`, a watch of a collection that exists at that group/version.
fn collection_response(
    shared: Arc<Shared>,
    group_version: &str,
    resource: String,
    namespace: Option<String>,
    query: &HashMap<String, String>,
) -> Response {
    {
        let state = shared.lock();
        match state.collections.get(&resource) {
            Some(c) if c.group_version == group_version => {
                if namespace.is_some() && !c.namespaced {
                    return not_found();
                }
            }
            _ => return not_found(),
        }
    }
    let watching = matches!(query.get("watch").map(String::as_str), Some("1" | "true"));
    if watching {
        watch_response(shared, resource, namespace, query)
    } else {
        list_response(&shared, &resource, namespace.as_deref(), query)
    }
}

/// One object of a collection that exists at that group/version.
fn object_response(
    shared: &Shared,
    group_version: &str,
    resource: &str,
    namespace: Option<&str>,
    name: &str,
) -> Response {
    let state = shared.lock();
    let Some(c) = state.collections.get(resource) else {
        return not_found();
    };
    if c.group_version != group_version || c.namespaced != namespace.is_some() {
        return not_found();
    }
    let key = match namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    };
    match c.objects.get(&key) {
        Some(object) => json_response(StatusCode::OK, &with_type_meta(object.clone(), c)),
        None => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("{resource} \"{name}\" not found"),
            json!({ "name": name, "kind": resource }),
        ),
    }
}

/// Server-side apply of one object: the whole applied object replaces the stored one (one
/// field manager, as in these tests); answers 201 on create, 200 on update.
fn apply_response(
    shared: &Shared,
    path: &str,
    headers: &HeaderMap,
    query: &HashMap<String, String>,
    body: &[u8],
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type != "application/apply-patch+yaml" {
        return status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            &format!(
                "the body of the request was in an unknown format - accepted media types include: application/apply-patch+yaml (the stub only does apply), got {content_type:?}"
            ),
            json!({}),
        );
    }
    if query.get("fieldManager").is_none_or(String::is_empty) {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
            json!({}),
        );
    }
    let Some((
        group_version,
        Target::Object {
            resource,
            namespace,
            name,
        },
    )) = parse_path(path)
    else {
        return not_found();
    };
    // JSON is YAML; kube sends JSON.
    let Ok(mut object) = serde_json::from_slice::<Value>(body) else {
        return bad_request("error decoding YAML: the stub only decodes JSON");
    };
    let mut state = shared.lock();
    state.resource_version += 1;
    let rv = state.resource_version;
    let Some(c) = state.collections.get_mut(&resource) else {
        return not_found();
    };
    if c.group_version != group_version || c.namespaced != namespace.is_some() {
        return not_found();
    }
    if object.pointer("/metadata/name").and_then(Value::as_str) != Some(name.as_str()) {
        return bad_request("the name of the object does not match the name on the URL");
    }
    if let Some(ns) = &namespace {
        object["metadata"]["namespace"] = Value::String(ns.clone());
    }
    set_resource_version(&mut object, rv);
    let key = object_key(&object);
    let code = if c.objects.contains_key(&key) {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let object = store(c, key, object);
    drop(state);
    shared.changed.send_replace(rv);
    json_response(code, &object)
}

/// POST (create: 409 AlreadyExists if present), PUT (replace: 409 Conflict unless
/// `metadata.resourceVersion` is the stored one) and JSON Patch (RFC 6902) of one object of a
/// served resource, as the API server does them.
fn write_response(shared: &Shared, method: &Method, path: &str, body: &[u8]) -> Response {
    let Some((group_version, target)) = parse_path(path) else {
        return not_found();
    };
    let Ok(sent) = serde_json::from_slice::<Value>(body) else {
        return bad_request("the stub only decodes JSON");
    };
    let (resource, namespace, name) = match (method, target) {
        (
            &Method::POST,
            Target::Collection {
                resource,
                namespace,
            },
        ) => {
            let name = sent
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            (resource, namespace, name)
        }
        (
            &Method::PUT | &Method::PATCH,
            Target::Object {
                resource,
                namespace,
                name,
            },
        ) => (resource, namespace, name),
        _ => return not_found(),
    };
    let mut state = shared.lock();
    let rv = state.resource_version + 1;
    // Built-in kinds (Events, say) are always served, as on a real API server.
    if KNOWN
        .iter()
        .any(|k| k.0 == resource && k.1 == group_version)
    {
        state.collection(&resource, None);
    }
    let Some(c) = state.collections.get_mut(&resource) else {
        return not_found();
    };
    if c.group_version != group_version || c.namespaced != namespace.is_some() {
        return not_found();
    }
    let key = match &namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.clone(),
    };
    let existing = c.objects.get(&key).cloned();
    let (mut object, code) = match written(method, sent, existing, &resource, &name) {
        Ok(written) => written,
        Err(refused) => return *refused,
    };
    if let Some(ns) = &namespace {
        object["metadata"]["namespace"] = Value::String(ns.clone());
    }
    set_resource_version(&mut object, rv);
    let object = store(c, key, object);
    state.resource_version = rv;
    drop(state);
    shared.changed.send_replace(rv);
    json_response(code, &object)
}

/// Stores `object` under `key` with the collection's type meta, and returns what was stored.
fn store(c: &mut Collection, key: String, object: Value) -> Value {
    let object = with_type_meta(object, c);
    c.objects.insert(key, object.clone());
    object
}

/// A JSON answer.
fn json_response(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// What a write stores and the status it answers with, from what was `sent` and what is
/// stored under the name: a POST creates, a PUT replaces (if its resourceVersion is current),
/// a PATCH applies a JSON Patch; or the API server's refusal.
fn written(
    method: &Method,
    sent: Value,
    existing: Option<Value>,
    resource: &str,
    name: &str,
) -> Result<(Value, StatusCode), Box<Response>> {
    let details = json!({ "name": name, "kind": resource });
    match (method, existing) {
        (&Method::POST, Some(_)) => Err(Box::new(status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            &format!("{resource} \"{name}\" already exists"),
            details,
        ))),
        (&Method::POST, None) => Ok((sent, StatusCode::CREATED)),
        (_, None) => Err(Box::new(status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("{resource} \"{name}\" not found"),
            details,
        ))),
        (&Method::PUT, Some(stored)) => {
            let sent_rv = sent.pointer("/metadata/resourceVersion");
            if sent_rv.is_some() && sent_rv != stored.pointer("/metadata/resourceVersion") {
                return Err(Box::new(status(
                    StatusCode::CONFLICT,
                    "Conflict",
                    &format!(
                        "Operation cannot be fulfilled on {resource} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
                    ),
                    details,
                )));
            }
            Ok((sent, StatusCode::OK))
        }
        (_, Some(mut stored)) => {
            let Ok(patch) = serde_json::from_value::<json_patch::Patch>(sent) else {
                return Err(Box::new(bad_request("the body is not a JSON Patch")));
            };
            if let Err(error) = json_patch::patch(&mut stored, &patch) {
                return Err(Box::new(status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    &format!("the JSON Patch cannot be applied: {error}"),
                    details,
                )));
            }
            Ok((stored, StatusCode::OK))
        }
    }
}

/// DELETE of one object, with the preconditions of its `DeleteOptions` body: a UID or
/// resourceVersion that differs from the stored object's is a 409 Conflict, as the API
/// server answers (`Precondition failed: UID in precondition: …`). Answers 200 with the
/// deleted object; watches see it DELETED.
fn delete_response(shared: &Shared, path: &str, body: &[u8]) -> Response {
    let Some((
        group_version,
        Target::Object {
            resource,
            namespace,
            name,
        },
    )) = parse_path(path)
    else {
        return status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the stub deletes one object at a time",
            json!({}),
        );
    };
    let options: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(body) {
            Ok(options) => options,
            Err(_) => return bad_request("the body is not a JSON DeleteOptions"),
        }
    };
    let mut state = shared.lock();
    let Some(c) = state.collections.get_mut(&resource) else {
        return not_found();
    };
    if c.group_version != group_version || c.namespaced != namespace.is_some() {
        return not_found();
    }
    let key = match &namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.clone(),
    };
    let details = json!({ "name": name, "kind": resource });
    let Some(stored) = c.objects.get(&key) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("{resource} \"{name}\" not found"),
            details,
        );
    };
    for (field, pointer) in [
        ("UID", "/metadata/uid"),
        ("ResourceVersion", "/metadata/resourceVersion"),
    ] {
        let precondition = options
            .pointer(&format!(
                "/preconditions/{}",
                if field == "UID" {
                    "uid"
                } else {
                    "resourceVersion"
                }
            ))
            .and_then(Value::as_str);
        let actual = stored
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or("");
        if let Some(wanted) = precondition
            && wanted != actual
        {
            return status(
                StatusCode::CONFLICT,
                "Conflict",
                &format!(
                    "Operation cannot be fulfilled on {resource} \"{name}\": Precondition failed: {field} in precondition: {wanted}, {field} in object meta: {actual}"
                ),
                details,
            );
        }
    }
    let object = with_type_meta(c.objects.remove(&key).unwrap_or_default(), c);
    state.resource_version += 1;
    let rv = state.resource_version;
    state.events.push(Logged {
        resource: resource.clone(),
        namespace: namespace.clone(),
        resource_version: rv,
        event_type: "DELETED".to_string(),
        object: object.clone(),
    });
    drop(state);
    shared.changed.send_replace(rv);
    json_response(StatusCode::OK, &object)
}

/// A `labelSelector` as the API server reads it: `k=v`, `k==v`, `k!=v`, `k`, `!k`, joined
/// by commas (set-based `in`/`notin` are not needed by podmend and refused).
fn label_selector(selector: &str) -> Result<Vec<(String, &'static str, String)>, String> {
    let mut out = Vec::new();
    for term in selector.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        if term.contains(" in ") || term.contains(" notin ") || term.contains('(') {
            return Err(format!(
                "the stub does not read set-based selectors: {term}"
            ));
        }
        let parsed = if let Some((k, v)) = term.split_once("!=") {
            (k.to_string(), "!=", v.to_string())
        } else if let Some((k, v)) = term.split_once("==") {
            (k.to_string(), "=", v.to_string())
        } else if let Some((k, v)) = term.split_once('=') {
            (k.to_string(), "=", v.to_string())
        } else if let Some(k) = term.strip_prefix('!') {
            (k.to_string(), "!", String::new())
        } else {
            (term.to_string(), "exists", String::new())
        };
        out.push(parsed);
    }
    Ok(out)
}

fn labels_match(object: &Value, terms: &[(String, &'static str, String)]) -> bool {
    let label = |key: &str| {
        object
            .pointer("/metadata/labels")
            .and_then(|l| l.get(key))
            .and_then(Value::as_str)
    };
    terms.iter().all(|(key, op, value)| match *op {
        "=" => label(key) == Some(value.as_str()),
        "!=" => label(key) != Some(value.as_str()),
        "!" => label(key).is_none(),
        _ => label(key).is_some(),
    })
}

/// A `fieldSelector` on the fields the API server lets a resource be selected by
/// (`metadata.name`, `metadata.namespace`, and for pods `status.phase` and `spec.nodeName`):
/// `field=value`, `field==value`, `field!=value`, joined by commas. Another field is the API
/// server's 400 `field label not supported`.
fn field_selector(
    resource: &str,
    selector: &str,
) -> Result<Vec<(&'static str, bool, String)>, String> {
    let mut out = Vec::new();
    for term in selector.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
            (f, false, v)
        } else if let Some((f, v)) = term.split_once("==") {
            (f, true, v)
        } else if let Some((f, v)) = term.split_once('=') {
            (f, true, v)
        } else {
            return Err(format!(
                "invalid selector: '{term}'; can't understand '{term}'"
            ));
        };
        let pointer = match (resource, field) {
            (_, "metadata.name") => "/metadata/name",
            (_, "metadata.namespace") => "/metadata/namespace",
            ("pods", "status.phase") => "/status/phase",
            ("pods", "spec.nodeName") => "/spec/nodeName",
            _ => return Err(format!("field label not supported: {field}")),
        };
        out.push((pointer, equal, value.to_string()));
    }
    Ok(out)
}

fn fields_match(object: &Value, terms: &[(&'static str, bool, String)]) -> bool {
    terms.iter().all(|(pointer, equal, value)| {
        let actual = object
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or("");
        (actual == value) == *equal
    })
}

fn bad_request(message: &str) -> Response {
    status(StatusCode::BAD_REQUEST, "BadRequest", message, json!({}))
}

/// A continue token shaped like the API server's: base64 of `{"v","rv","start"}`.
fn continue_token(rv: u64, start: &str) -> String {
    BASE64.encode(json!({ "v": "meta.k8s.io/v1", "rv": rv, "start": start }).to_string())
}

fn parse_continue_token(token: &str) -> Option<(u64, String)> {
    let bytes = BASE64.decode(token).ok()?;
    let value: Value = serde_json::from_slice(&bytes).ok()?;
    if value.get("v")?.as_str()? != "meta.k8s.io/v1" {
        return None;
    }
    Some((
        value.get("rv")?.as_u64()?,
        value.get("start")?.as_str()?.to_string(),
    ))
}

fn list_response(
    shared: &Shared,
    resource: &str,
    namespace: Option<&str>,
    query: &HashMap<String, String>,
) -> Response {
    let limit = match query.get("limit").map(|l| l.parse::<usize>()) {
        None => None,
        Some(Ok(0)) => None,
        Some(Ok(n)) => Some(n),
        Some(Err(_)) => return bad_request("limit must be a non-negative integer"),
    };
    let labels = match label_selector(query.get("labelSelector").map_or("", String::as_str)) {
        Ok(terms) => terms,
        Err(message) => return bad_request(&message),
    };
    let fields = match field_selector(
        resource,
        query.get("fieldSelector").map_or("", String::as_str),
    ) {
        Ok(terms) => terms,
        Err(message) => return bad_request(&message),
    };
    let state = shared.lock();
    let Some(c) = state.collections.get(resource) else {
        return not_found();
    };
    let (list_rv, start) = match query.get("continue").filter(|t| !t.is_empty()) {
        None => (state.resource_version, String::new()),
        Some(token) => match parse_continue_token(token) {
            Some(parsed) => parsed,
            None => {
                return bad_request(
                    "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
                );
            }
        },
    };
    let matching: Vec<(&String, &Value)> = c
        .objects
        .range(start..)
        .filter(|(_, o)| {
            namespace.is_none()
                || o.pointer("/metadata/namespace").and_then(Value::as_str) == namespace
        })
        .filter(|(_, o)| labels_match(o, &labels) && fields_match(o, &fields))
        .collect();
    let take = limit.unwrap_or(matching.len()).min(matching.len());
    let items: Vec<Value> = matching[..take]
        .iter()
        .map(|(_, o)| without_type_meta((*o).clone()))
        .collect();
    let mut metadata = json!({ "resourceVersion": list_rv.to_string() });
    if take < matching.len() {
        let last_key = matching[take - 1].0;
        metadata["continue"] = Value::String(continue_token(list_rv, &format!("{last_key}\u{0}")));
        metadata["remainingItemCount"] = json!(matching.len() - take);
    }
    let body = json!({
        "kind": format!("{}List", c.kind),
        "apiVersion": c.group_version,
        "metadata": metadata,
        "items": items,
    });
    json_response(StatusCode::OK, &body)
}

/// One open watch: what it filters on and what it still has to send.
struct Watch {
    shared: Arc<Shared>,
    resource: String,
    namespace: Option<String>,
    bookmarks: bool,
    last_rv: u64,
    pending: VecDeque<Bytes>,
    changed: watch::Receiver<u64>,
    cuts: watch::Receiver<u64>,
    deadline: Option<Instant>,
}

impl Watch {
    /// The watch's next line: a pending event, or the next ones the stub records, waiting
    /// until there are some; `None` at the deadline or when the stub stops, an error when
    /// the test cuts the watch.
    async fn next_line(mut self) -> Option<(Result<Bytes, std::io::Error>, Self)> {
        loop {
            if let Some(line) = self.pending.pop_front() {
                return Some((Ok(line), self));
            }
            self.changed.borrow_and_update();
            {
                let state = self.shared.lock();
                for e in state.events.iter().filter(|e| {
                    e.resource_version > self.last_rv
                        && e.resource == self.resource
                        && (self.namespace.is_none() || e.namespace == self.namespace)
                        && (self.bookmarks || e.event_type != "BOOKMARK")
                }) {
                    self.pending.push_back(event_line(&e.event_type, &e.object));
                }
                self.last_rv = self.last_rv.max(state.resource_version);
            }
            if !self.pending.is_empty() {
                continue;
            }
            let sleep = async {
                match self.deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                res = self.changed.changed() => if res.is_err() { return None },
                _ = self.cuts.changed() => {
                    let cut = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "watch cut by the test");
                    return Some((Err(cut), self));
                }
                () = sleep => return None,
            }
        }
    }
}

/// The events a watch from scratch starts with: a synthetic ADDED for every current object
/// (in `namespace`, if given), and with `sendInitialEvents` the bookmark that ends them.
fn initial_events(
    c: &Collection,
    namespace: Option<&str>,
    send_initial: bool,
    current: u64,
) -> VecDeque<Bytes> {
    let mut pending = VecDeque::new();
    for object in c.objects.values().filter(|o| {
        namespace.is_none() || o.pointer("/metadata/namespace").and_then(Value::as_str) == namespace
    }) {
        pending.push_back(event_line("ADDED", &with_type_meta(object.clone(), c)));
    }
    if send_initial {
        pending.push_back(event_line(
            "BOOKMARK",
            &json!({
                "kind": c.kind,
                "apiVersion": c.group_version,
                "metadata": {
                    "resourceVersion": current.to_string(),
                    "annotations": { "k8s.io/initial-events-end": "true" },
                },
            }),
        ));
    }
    pending
}

fn event_line(event_type: &str, object: &Value) -> Bytes {
    let mut line = json!({ "type": event_type, "object": object }).to_string();
    line.push('\n');
    Bytes::from(line)
}

fn watch_response(
    shared: Arc<Shared>,
    resource: String,
    namespace: Option<String>,
    query: &HashMap<String, String>,
) -> Response {
    let flag = |name: &str| matches!(query.get(name).map(String::as_str), Some("1" | "true"));
    let bookmarks = flag("allowWatchBookmarks");
    let send_initial = flag("sendInitialEvents");
    let requested_rv = query.get("resourceVersion").cloned().unwrap_or_default();
    let deadline = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(|secs| Instant::now() + Duration::from_secs(secs));

    let mut changed = shared.changed.subscribe();
    changed.borrow_and_update();
    let mut cuts = shared.cuts.subscribe();
    cuts.borrow_and_update();
    let mut pending = VecDeque::new();
    let last_rv = {
        let state = shared.lock();
        let Some(c) = state.collections.get(&resource) else {
            return not_found();
        };
        let current = state.resource_version;
        let from_scratch = send_initial || requested_rv.is_empty() || requested_rv == "0";
        if from_scratch {
            pending = initial_events(c, namespace.as_deref(), send_initial, current);
            current
        } else {
            match requested_rv.parse::<u64>() {
                Ok(rv) => rv,
                Err(_) => {
                    return bad_request(&format!(
                        "resourceVersion: Invalid value: \"{requested_rv}\": must be a valid integer"
                    ));
                }
            }
        }
    };

    let watch = Watch {
        shared,
        resource,
        namespace,
        bookmarks,
        last_rv,
        pending,
        changed,
        cuts,
        deadline,
    };
    let body = stream::unfold(watch, Watch::next_line);
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(body),
    )
        .into_response()
}
