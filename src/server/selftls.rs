//! TLS self-management (`serve --tls-self-manage`): podmend keeps its own CA and serving
//! certificate in a Secret, writes the serving pair to `--tls-cert`/`--tls-key` (where
//! [`super::tls::CertStore`] picks it up without a restart) and the CA bundle into the
//! webhook configurations' `caBundle`.
//!
//! The Secret holds `ca.crt` (the CA bundle: the current CA first, then older CAs that have
//! not expired yet, so certificates they signed still verify during a rollover), `ca.key`
//! (the current CA's key), `tls.crt` and `tls.key`. Replicas that start together race on
//! creating or updating it; the loser of the race (HTTP 409) re-reads and uses the winner's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::http::Request;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde_json::{Value, json};
use x509_parser::extensions::ParsedExtension;

/// Secret keys.
pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const TLS_CERT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";

const CA_COMMON_NAME: &str = "podmend webhook CA";
/// Validity starts this far back, for clock skew between nodes.
const BACKDATE: Duration = Duration::from_secs(3_600);
/// The CA lives this many times as long as a serving certificate.
const CA_VALIDITY_FACTOR: u32 = 2;
/// Create/update attempts per reconcile before giving up for this round.
const ATTEMPTS: usize = 5;
/// The in-cluster namespace file.
pub const NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// What `serve --tls-self-manage` was told.
#[derive(Debug, Clone)]
pub struct SelfTlsOptions {
    pub namespace: String,
    pub secret: String,
    /// Webhook configurations whose caBundle is kept: `mutatingwebhookconfigurations/NAME`,
    /// `validatingwebhookconfigurations/NAME`, or a bare `NAME`, looked up as either (which
    /// needs `get` on both kinds for that name; the chart names the kind, so that its RBAC
    /// grants each name on its own kind only).
    pub webhook_configurations: Vec<String>,
    pub dns_names: Vec<String>,
    pub renew_before: Duration,
    pub validity: Duration,
    /// How often the Secret is re-checked and renewed if needed.
    pub check_interval: Duration,
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum SelfTlsError {
    #[error(
        "no namespace for the TLS Secret: set POD_NAMESPACE or --tls-namespace (the in-cluster \
         namespace file {NAMESPACE_FILE} is not there)"
    )]
    NoNamespace,
    #[error(
        "--tls-self-manage needs the DNS names of the Service: pass --tls-service or --tls-service-dns"
    )]
    NoDnsNames,
    #[error("--tls-self-manage needs the Kubernetes API, but {reason}")]
    NoCluster { reason: String },
    #[error("cannot {action} Secret {namespace}/{name}: {source}")]
    Secret {
        action: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("Secret {namespace}/{name} kept changing under us (conflicts); will retry")]
    Contended { namespace: String, name: String },
    #[error("cannot generate the {what}: {source}")]
    Generate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error("cannot write {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "webhook configuration {name:?} is neither a mutating nor a validating one; check --webhook-configurations (KIND/NAME with KIND mutatingwebhookconfigurations or validatingwebhookconfigurations, or NAME)"
    )]
    WebhookNotFound { name: String },
    #[error("cannot {action} {kind} {name}: {source}")]
    Webhook {
        action: &'static str,
        kind: &'static str,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
}

/// The PKI as kept in the Secret, all PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct Material {
    /// Current CA first, then older unexpired CAs.
    pub ca_bundle: String,
    pub ca_key: String,
    pub cert: String,
    pub key: String,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Material")
            .field("ca_bundle", &self.ca_bundle)
            .field("cert", &self.cert)
            .finish_non_exhaustive()
    }
}

impl Material {
    /// Reads the four keys of a Secret; `None` if any is missing or not UTF-8.
    pub fn from_secret(secret: &Secret) -> Option<Material> {
        let data = secret.data.as_ref()?;
        let get = |k: &str| {
            data.get(k)
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
        };
        Some(Material {
            ca_bundle: get(CA_CERT)?,
            ca_key: get(CA_KEY)?,
            cert: get(TLS_CERT)?,
            key: get(TLS_KEY)?,
        })
    }

    fn to_data(&self) -> BTreeMap<String, ByteString> {
        [
            (CA_CERT, &self.ca_bundle),
            (CA_KEY, &self.ca_key),
            (TLS_CERT, &self.cert),
            (TLS_KEY, &self.key),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect()
    }
}

/// One certificate of a PEM text: its PEM block, notAfter (unix seconds) and DNS SANs.
pub struct CertInfo {
    pub pem: String,
    pub not_after: i64,
    pub dns_names: Vec<String>,
    /// DER of the subject and issuer names.
    pub subject: Vec<u8>,
    pub issuer: Vec<u8>,
    /// Subject and authority key identifiers, when present.
    pub key_id: Option<Vec<u8>>,
    pub authority_key_id: Option<Vec<u8>>,
}

impl CertInfo {
    /// Whether this certificate names `ca` as its issuer (by key identifier when both carry
    /// one, else by name).
    pub fn issued_by(&self, ca: &CertInfo) -> bool {
        match (&self.authority_key_id, &ca.key_id) {
            (Some(aki), Some(ski)) => aki == ski,
            _ => self.issuer == ca.subject,
        }
    }
}

/// Every certificate in a PEM text, in order; unparsable blocks are skipped.
pub fn parse_certs(pem: &str) -> Vec<CertInfo> {
    let mut out = Vec::new();
    for block in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()).flatten() {
        let Ok(cert) = block.parse_x509() else {
            continue;
        };
        let dns_names = cert
            .subject_alternative_name()
            .ok()
            .flatten()
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .filter_map(|n| match n {
                        x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(CertInfo {
            pem: pem_block(&block.contents),
            not_after: cert.validity().not_after.timestamp(),
            dns_names,
            subject: cert.subject().as_raw().to_vec(),
            key_id: cert
                .iter_extensions()
                .find_map(|e| match e.parsed_extension() {
                    ParsedExtension::SubjectKeyIdentifier(id) => Some(id.0.to_vec()),
                    _ => None,
                }),
            authority_key_id: cert
                .iter_extensions()
                .find_map(|e| match e.parsed_extension() {
                    ParsedExtension::AuthorityKeyIdentifier(aki) => {
                        aki.key_identifier.as_ref().map(|id| id.0.to_vec())
                    }
                    _ => None,
                }),
            issuer: cert.issuer().as_raw().to_vec(),
        });
    }
    out
}

fn pem_block(der: &[u8]) -> String {
    let b64 = BASE64.encode(der);
    let mut s = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        s.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        s.push('\n');
    }
    s.push_str("-----END CERTIFICATE-----\n");
    s
}

fn now_unix() -> i64 {
    x509_parser::time::ASN1Time::now().timestamp()
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, CA_COMMON_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

fn generate_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> SelfTlsError {
    move |source| SelfTlsError::Generate { what, source }
}

/// A new CA valid for `validity`: (certificate PEM, key PEM).
fn new_ca(validity: Duration) -> Result<(String, String), SelfTlsError> {
    let now = x509_parser::time::ASN1Time::now().to_datetime();
    let mut params = ca_params();
    params.not_before = now - BACKDATE;
    params.not_after = now + validity;
    let key = KeyPair::generate().map_err(generate_err("CA key"))?;
    let cert = params
        .self_signed(&key)
        .map_err(generate_err("CA certificate"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A serving certificate signed by the CA of `ca_key_pem`, never outliving the CA.
fn new_leaf(
    ca_key_pem: &str,
    ca_not_after: i64,
    dns_names: &[String],
    validity: Duration,
) -> Result<(String, String), SelfTlsError> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(generate_err("CA key (from the Secret)"))?;
    let issuer = Issuer::new(ca_params(), ca_key);
    let now = x509_parser::time::ASN1Time::now().to_datetime();
    let mut params = CertificateParams::new(dns_names.to_vec())
        .map_err(generate_err("serving certificate names"))?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    if let Some(first) = dns_names.first() {
        params
            .distinguished_name
            .push(DnType::CommonName, first.as_str());
    }
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = now - BACKDATE;
    let ca_left = u64::try_from(ca_not_after - now_unix()).unwrap_or(0);
    params.not_after = now + validity.min(Duration::from_secs(ca_left));
    let key = KeyPair::generate().map_err(generate_err("serving key"))?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(generate_err("serving certificate"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// What the Secret should hold next, or `None` if `current` is fine as it is.
pub fn plan(
    current: Option<&Material>,
    options: &SelfTlsOptions,
) -> Result<Option<Material>, SelfTlsError> {
    let now = now_unix();
    let renew_at = |not_after: i64| not_after - options.renew_before.as_secs() as i64 <= now;
    let ca_validity = options.validity * CA_VALIDITY_FACTOR;

    let Some(current) = current else {
        let (ca, ca_key) = new_ca(ca_validity)?;
        let ca_end = parse_certs(&ca).first().map_or(0, |c| c.not_after);
        let (cert, key) = new_leaf(&ca_key, ca_end, &options.dns_names, options.validity)?;
        return Ok(Some(Material {
            ca_bundle: ca,
            ca_key,
            cert,
            key,
        }));
    };
    let cas = parse_certs(&current.ca_bundle);
    let unexpired: Vec<&CertInfo> = cas.iter().filter(|c| c.not_after > now).collect();
    let current_ca = cas.first().filter(|c| !renew_at(c.not_after));
    let Some(current_ca) = current_ca else {
        // CA rollover: a new CA signs from now on; the old ones stay trusted until they expire.
        let (ca, ca_key) = new_ca(ca_validity)?;
        let ca_end = parse_certs(&ca).first().map_or(0, |c| c.not_after);
        let (cert, key) = new_leaf(&ca_key, ca_end, &options.dns_names, options.validity)?;
        let mut bundle = ca;
        for old in &unexpired {
            bundle.push_str(&old.pem);
        }
        return Ok(Some(Material {
            ca_bundle: bundle,
            ca_key,
            cert,
            key,
        }));
    };
    // Drop CAs that have expired.
    let pruned: String = unexpired.iter().map(|c| c.pem.as_str()).collect();
    let leaf = parse_certs(&current.cert);
    let leaf_ok = leaf.first().is_some_and(|l| {
        let mut have = l.dns_names.clone();
        let mut want = options.dns_names.clone();
        have.sort();
        want.sort();
        !renew_at(l.not_after) && have == want && l.issued_by(current_ca)
    });
    if leaf_ok {
        if pruned.len() == cas.iter().map(|c| c.pem.len()).sum::<usize>() {
            return Ok(None);
        }
        return Ok(Some(Material {
            ca_bundle: pruned,
            ..current.clone()
        }));
    }
    let (cert, key) = new_leaf(
        &current.ca_key,
        current_ca.not_after,
        &options.dns_names,
        options.validity,
    )?;
    Ok(Some(Material {
        ca_bundle: pruned,
        ca_key: current.ca_key.clone(),
        cert,
        key,
    }))
}

fn is_code(error: &kube::Error, code: u16) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == code)
}

/// Keeps the Secret, the files and the caBundles in line.
pub struct SelfTls {
    client: Client,
    options: SelfTlsOptions,
}

impl SelfTls {
    pub fn new(client: Client, options: SelfTlsOptions) -> Self {
        Self { client, options }
    }

    pub fn options(&self) -> &SelfTlsOptions {
        &self.options
    }

    /// Makes sure the Secret holds a valid PKI (creating or renewing it) and returns it.
    pub async fn reconcile_secret(&self) -> Result<Material, SelfTlsError> {
        let o = &self.options;
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &o.namespace);
        let secret_err = |action: &'static str| {
            move |source| SelfTlsError::Secret {
                action,
                namespace: o.namespace.clone(),
                name: o.secret.clone(),
                source: Box::new(source),
            }
        };
        for _ in 0..ATTEMPTS {
            let existing = api.get_opt(&o.secret).await.map_err(secret_err("read"))?;
            let material = existing.as_ref().and_then(Material::from_secret);
            let Some(next) = plan(material.as_ref(), o)? else {
                if let Some(material) = material {
                    return Ok(material);
                }
                continue;
            };
            let written = match existing {
                None => {
                    let secret = Secret {
                        metadata: ObjectMeta {
                            name: Some(o.secret.clone()),
                            namespace: Some(o.namespace.clone()),
                            ..ObjectMeta::default()
                        },
                        type_: Some("kubernetes.io/tls".to_string()),
                        data: Some(next.to_data()),
                        ..Secret::default()
                    };
                    match api.create(&PostParams::default(), &secret).await {
                        Err(e) if is_code(&e, 409) => {
                            tracing::info!(secret = %o.secret, "TLS Secret created by another replica; using it");
                            continue;
                        }
                        other => other.map_err(secret_err("create"))?,
                    };
                    tracing::info!(secret = %o.secret, "TLS Secret created with a new CA and serving certificate");
                    next
                }
                Some(mut secret) => {
                    let mut data = secret.data.take().unwrap_or_default();
                    data.extend(next.to_data());
                    secret.data = Some(data);
                    match api
                        .replace(&o.secret, &PostParams::default(), &secret)
                        .await
                    {
                        Err(e) if is_code(&e, 409) => {
                            tracing::info!(secret = %o.secret, "TLS Secret updated by another replica; re-reading it");
                            continue;
                        }
                        other => other.map_err(secret_err("update"))?,
                    };
                    tracing::info!(secret = %o.secret, "TLS Secret renewed");
                    next
                }
            };
            return Ok(written);
        }
        Err(SelfTlsError::Contended {
            namespace: o.namespace.clone(),
            name: o.secret.clone(),
        })
    }

    /// One full round: Secret, files, caBundles. True when the files changed.
    pub async fn reconcile(&self) -> Result<bool, SelfTlsError> {
        let material = self.reconcile_secret().await?;
        let changed = write_pair(
            &self.options.cert_path,
            &material.cert,
            &self.options.key_path,
            &material.key,
        )?;
        self.patch_ca_bundles(&material.ca_bundle).await?;
        Ok(changed)
    }

    /// Sets `webhooks[*].clientConfig.caBundle` of every configured webhook configuration
    /// (JSON Patch, each webhook guarded by a `test` of its name).
    pub async fn patch_ca_bundles(&self, bundle: &str) -> Result<(), SelfTlsError> {
        let encoded = BASE64.encode(bundle.as_bytes());
        const KINDS: [(&str, &str); 2] = [
            (
                "MutatingWebhookConfiguration",
                "mutatingwebhookconfigurations",
            ),
            (
                "ValidatingWebhookConfiguration",
                "validatingwebhookconfigurations",
            ),
        ];
        for entry in &self.options.webhook_configurations {
            let qualified = entry.split_once('/').and_then(|(plural, name)| {
                KINDS
                    .iter()
                    .find(|(_, p)| *p == plural)
                    .map(|kind| (vec![*kind], name.to_string()))
            });
            let (kinds, name) = qualified.unwrap_or_else(|| (KINDS.to_vec(), entry.clone()));
            let name = &name;
            let mut found = false;
            for (kind, plural) in kinds {
                let url = format!("/apis/admissionregistration.k8s.io/v1/{plural}/{name}");
                let err = |action: &'static str| {
                    move |source| SelfTlsError::Webhook {
                        action,
                        kind,
                        name: name.clone(),
                        source: Box::new(source),
                    }
                };
                let get = Request::get(&url).body(Vec::new()).expect("valid request");
                let object: Value = match self.client.request(get).await {
                    Ok(object) => object,
                    Err(e) if is_code(&e, 404) => continue,
                    Err(e) => return Err(err("read")(e)),
                };
                found = true;
                let webhooks = object
                    .get("webhooks")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let mut ops = Vec::new();
                for (i, webhook) in webhooks.iter().enumerate() {
                    if webhook
                        .pointer("/clientConfig/caBundle")
                        .and_then(Value::as_str)
                        == Some(encoded.as_str())
                    {
                        continue;
                    }
                    ops.push(json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": webhook.get("name")}));
                    ops.push(json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": encoded}));
                }
                if ops.is_empty() {
                    continue;
                }
                let body = serde_json::to_vec(&ops).unwrap_or_default();
                let patch = Request::patch(&url)
                    .header("Content-Type", "application/json-patch+json")
                    .body(body)
                    .expect("valid request");
                let _: Value = self.client.request(patch).await.map_err(err("patch"))?;
                tracing::info!(kind, name = %name, webhooks = ops.len() / 2, "caBundle updated");
            }
            if !found {
                return Err(SelfTlsError::WebhookNotFound { name: name.clone() });
            }
        }
        Ok(())
    }

    /// Re-checks every `check_interval`; calls `on_change` after new files were written.
    pub async fn run(self, on_change: impl Fn() + Send) {
        let mut ticks = tokio::time::interval(self.options.check_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            match self.reconcile().await {
                Ok(true) => {
                    tracing::info!("TLS self-management: new serving certificate written");
                    on_change();
                }
                Ok(false) => {}
                Err(error) => tracing::error!("TLS self-management failed, will retry: {error}"),
            }
        }
    }
}

/// Writes key and certificate (each atomically, by rename); false if both were already so.
pub fn write_pair(
    cert_path: &Path,
    cert: &str,
    key_path: &Path,
    key: &str,
) -> Result<bool, SelfTlsError> {
    let same = |p: &Path, c: &str| std::fs::read_to_string(p).is_ok_and(|t| t == c);
    if same(cert_path, cert) && same(key_path, key) {
        return Ok(false);
    }
    write_atomic(key_path, key, true)?;
    write_atomic(cert_path, cert, false)?;
    Ok(true)
}

fn write_atomic(path: &Path, text: &str, secret: bool) -> Result<(), SelfTlsError> {
    let err = |source| SelfTlsError::Write {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text).map_err(err)?;
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    }
    #[cfg(not(unix))]
    let _ = secret;
    std::fs::rename(&tmp, path).map_err(err)
}

/// `--tls-namespace`/`POD_NAMESPACE`, else the in-cluster namespace file.
pub fn namespace(explicit: Option<String>) -> Result<String, SelfTlsError> {
    if let Some(ns) = explicit.filter(|n| !n.trim().is_empty()) {
        return Ok(ns);
    }
    std::fs::read_to_string(NAMESPACE_FILE)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .ok_or(SelfTlsError::NoNamespace)
}

/// `--tls-service-dns` values, else `<service>.<ns>.svc` and `<service>.<ns>.svc.cluster.local`.
pub fn dns_names(
    explicit: &[String],
    service: Option<&str>,
    namespace: &str,
) -> Result<Vec<String>, SelfTlsError> {
    if !explicit.is_empty() {
        return Ok(explicit.to_vec());
    }
    let service = service.ok_or(SelfTlsError::NoDnsNames)?;
    Ok(vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ])
}
