//! TLS self-management (`serve --tls-self-manage`): podmend keeps its own CA and serving
//! certificate in a Secret, writes the serving pair to `--tls-cert`/`--tls-key` (where
//! [`super::tls::CertStore`] picks it up without a restart) and the CA bundle into the
//! webhook configurations' `caBundle`.
//!
//! The Secret holds `ca.crt` (the CA bundle: the current CA first, then older CAs that have
//! not expired yet, so certificates they signed still verify during a rollover), `ca.key`
//! (the current CA's key), `tls.crt` and `tls.key`. Replicas that start together race on
//! creating or updating it; the loser of the race (HTTP 409) re-reads and uses the winner's.
//!
//! A replica serves a certificate only once the API servers trust its CA: each round writes
//! the Secret's bundle into every caBundle first, and writes the serving pair to the files
//! only after the API server stored the bundle (and, when the bundle changed while a
//! certificate was being served, after [`SelfTlsOptions::ca_settle`] more, for the API
//! servers' watches of the webhook configurations to catch up). A CA rollover is thus
//! published (new and old CA in the bundle) while the old certificate still serves, and a
//! failed patch leaves the old certificate serving; the round is retried within seconds.

mod pki;
mod webhooks;

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

pub use pki::{CA_CERT, CA_KEY, CertInfo, Material, TLS_CERT, TLS_KEY, parse_certs, plan};

/// Create/update attempts per reconcile before giving up for this round.
const ATTEMPTS: usize = 5;
/// The in-cluster namespace file.
pub const NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
const DAY: Duration = Duration::from_secs(86_400);

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
    /// How long after a caBundle change the serving certificate may change: every API server
    /// learns of the change through its watch of the webhook configurations, not at once.
    pub ca_settle: Duration,
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
}

/// The `--tls-self-manage` settings as given, before [`SelfTlsSettings::resolve`] finds the
/// namespace and the certificate's names and checks them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelfTlsSettings {
    /// `--tls-namespace`/`POD_NAMESPACE`; else the in-cluster namespace file.
    pub namespace: Option<String>,
    pub secret: String,
    pub webhook_configurations: Vec<String>,
    /// `--tls-service`: the certificate is for `<service>.<ns>.svc` and
    /// `<service>.<ns>.svc.cluster.local`, unless `service_dns` names are given.
    pub service: Option<String>,
    /// `--tls-service-dns`.
    pub service_dns: Vec<String>,
    pub renew_before_days: u32,
    pub validity_days: u32,
    pub check_interval: Duration,
    pub ca_settle: Duration,
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
}

impl SelfTlsSettings {
    /// The options TLS self-management runs with: the namespace (else the in-cluster
    /// namespace file), the certificate's DNS names, renewal before expiry.
    pub fn resolve(self) -> Result<SelfTlsOptions, SelfTlsError> {
        self.resolve_with(Path::new(NAMESPACE_FILE))
    }

    fn resolve_with(self, namespace_file: &Path) -> Result<SelfTlsOptions, SelfTlsError> {
        let namespace = namespace_from(self.namespace, namespace_file)?;
        let dns_names = dns_names(&self.service_dns, self.service.as_deref(), &namespace)?;
        if self.renew_before_days >= self.validity_days {
            return Err(SelfTlsError::RenewalAfterExpiry {
                renew_before_days: self.renew_before_days,
                validity_days: self.validity_days,
            });
        }
        Ok(SelfTlsOptions {
            namespace,
            secret: self.secret,
            webhook_configurations: self.webhook_configurations,
            dns_names,
            renew_before: DAY * self.renew_before_days,
            validity: DAY * self.validity_days,
            check_interval: self.check_interval,
            ca_settle: self.ca_settle,
            cert_path: self.cert_path,
            key_path: self.key_path,
        })
    }
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
    #[error(
        "--tls-renew-before-days ({renew_before_days}) must be less than --tls-validity-days ({validity_days})"
    )]
    RenewalAfterExpiry {
        renew_before_days: u32,
        validity_days: u32,
    },
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
    #[error(
        "webhook configuration name {name:?} cannot be part of an API path; check --webhook-configurations (KIND/NAME or NAME, as in metadata.name)"
    )]
    WebhookName { name: String },
    #[error(
        "{kind} {name} was patched but the stored object does not carry the new caBundle in \
         every webhook (edited meanwhile?); will retry"
    )]
    CaBundleNotStored { kind: &'static str, name: String },
    #[error("cannot {action} {kind} {name}: {source}")]
    Webhook {
        action: &'static str,
        kind: &'static str,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
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
        for _ in 0..ATTEMPTS {
            let existing = api
                .get_opt(&o.secret)
                .await
                .map_err(self.secret_error("read"))?;
            let material = existing.as_ref().and_then(Material::from_secret);
            let Some(next) = plan(material.as_ref(), o)? else {
                if let Some(material) = material {
                    return Ok(material);
                }
                continue;
            };
            let stored = match existing {
                None => self.create_secret(&api, &next).await?,
                Some(secret) => self.update_secret(&api, secret, &next).await?,
            };
            if stored {
                return Ok(next);
            }
        }
        Err(SelfTlsError::Contended {
            namespace: o.namespace.clone(),
            name: o.secret.clone(),
        })
    }

    fn secret_error(&self, action: &'static str) -> impl FnOnce(kube::Error) -> SelfTlsError + '_ {
        move |source| SelfTlsError::Secret {
            action,
            namespace: self.options.namespace.clone(),
            name: self.options.secret.clone(),
            source: Box::new(source),
        }
    }

    /// Creates the Secret with `material`; false when another replica created it first.
    async fn create_secret(
        &self,
        api: &Api<Secret>,
        material: &Material,
    ) -> Result<bool, SelfTlsError> {
        let o = &self.options;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(o.secret.clone()),
                namespace: Some(o.namespace.clone()),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".to_string()),
            data: Some(material.to_data()),
            ..Secret::default()
        };
        match api.create(&PostParams::default(), &secret).await {
            Err(e) if is_code(&e, 409) => {
                tracing::info!(secret = %o.secret, "TLS Secret created by another replica; using it");
                return Ok(false);
            }
            other => other.map_err(self.secret_error("create"))?,
        };
        tracing::info!(secret = %o.secret, "TLS Secret created with a new CA and serving certificate");
        Ok(true)
    }

    /// Writes `material` into the Secret as read (its other keys kept); false when another
    /// replica changed it since.
    async fn update_secret(
        &self,
        api: &Api<Secret>,
        mut secret: Secret,
        material: &Material,
    ) -> Result<bool, SelfTlsError> {
        let o = &self.options;
        let mut data = secret.data.take().unwrap_or_default();
        data.extend(material.to_data());
        secret.data = Some(data);
        match api
            .replace(&o.secret, &PostParams::default(), &secret)
            .await
        {
            Err(e) if is_code(&e, 409) => {
                tracing::info!(secret = %o.secret, "TLS Secret updated by another replica; re-reading it");
                return Ok(false);
            }
            other => other.map_err(self.secret_error("update"))?,
        };
        tracing::info!(secret = %o.secret, "TLS Secret renewed");
        Ok(true)
    }

    /// One full round: Secret, caBundles, then files; the files change only once every
    /// caBundle holds the bundle (see the module's documentation). True when the files
    /// changed.
    pub async fn reconcile(&self) -> Result<bool, SelfTlsError> {
        let o = &self.options;
        let material = self.reconcile_secret().await?;
        let bundle_changed = self.patch_ca_bundles(&material.ca_bundle).await?;
        let serving = o.cert_path.exists() && o.key_path.exists();
        if bundle_changed && serving && !same_pair(o, &material) {
            tracing::info!(
                settle_s = o.ca_settle.as_secs_f64(),
                "TLS self-management: caBundle updated; serving the new certificate once the \
                 API servers have it"
            );
            tokio::time::sleep(o.ca_settle).await;
        }
        write_pair(&o.cert_path, &material.cert, &o.key_path, &material.key)
    }

    /// Sets `webhooks[*].clientConfig.caBundle` of every configured webhook configuration
    /// (JSON Patch, each webhook guarded by a `test` of its name); true when one changed.
    pub async fn patch_ca_bundles(&self, bundle: &str) -> Result<bool, SelfTlsError> {
        let encoded = BASE64.encode(bundle.as_bytes());
        webhooks::patch_ca_bundles(&self.client, &self.options.webhook_configurations, &encoded)
            .await
    }

    /// Re-checks every `check_interval`; calls `on_change` after new files were written. A
    /// failed round (a caBundle patch the API server refused, say) is retried after
    /// [`RETRY_FIRST`], doubling up to [`RETRY_MAX`] (never past `check_interval`), not an
    /// interval later: until it succeeds, a rolled-over Secret is not served.
    pub async fn run(self, on_change: impl Fn() + Send) {
        let mut ticks = tokio::time::interval(self.options.check_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            if self.reconcile_until_done().await {
                tracing::info!("TLS self-management: new serving certificate written");
                on_change();
            }
        }
    }

    /// [`SelfTls::reconcile`] until it succeeds, with backoff; true when the files changed.
    async fn reconcile_until_done(&self) -> bool {
        let mut delay = RETRY_FIRST;
        loop {
            match self.reconcile().await {
                Ok(changed) => return changed,
                Err(error) => {
                    tracing::error!("TLS self-management failed, retrying in {delay:?}: {error}")
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(RETRY_MAX).min(self.options.check_interval);
        }
    }
}

/// The first retry of a failed round, doubling up to [`RETRY_MAX`].
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between retries of a failed round.
pub const RETRY_MAX: Duration = Duration::from_secs(30);

/// Whether the files hold `material`'s pair already.
fn same_pair(options: &SelfTlsOptions, material: &Material) -> bool {
    let same = |p: &Path, c: &str| std::fs::read_to_string(p).is_ok_and(|t| t == c);
    same(&options.cert_path, &material.cert) && same(&options.key_path, &material.key)
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
    namespace_from(explicit, Path::new(NAMESPACE_FILE))
}

fn namespace_from(explicit: Option<String>, file: &Path) -> Result<String, SelfTlsError> {
    if let Some(ns) = explicit.filter(|n| !n.trim().is_empty()) {
        return Ok(ns);
    }
    std::fs::read_to_string(file)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> SelfTlsSettings {
        SelfTlsSettings {
            namespace: Some("podmend-system".to_string()),
            secret: "podmend-tls".to_string(),
            webhook_configurations: vec!["podmend".to_string()],
            service: Some("podmend".to_string()),
            service_dns: Vec::new(),
            renew_before_days: 30,
            validity_days: 365,
            check_interval: Duration::from_secs(3600),
            ca_settle: Duration::from_secs(5),
            cert_path: PathBuf::from("/tls/tls.crt"),
            key_path: PathBuf::from("/tls/tls.key"),
        }
    }

    #[test]
    fn the_service_names_the_certificate_in_its_namespace_and_days_become_durations() {
        let options = settings().resolve().expect("valid");
        assert_eq!(options.namespace, "podmend-system");
        assert_eq!(
            options.dns_names,
            [
                "podmend.podmend-system.svc",
                "podmend.podmend-system.svc.cluster.local"
            ]
        );
        assert_eq!(options.renew_before, Duration::from_secs(30 * 86_400));
        assert_eq!(options.validity, Duration::from_secs(365 * 86_400));
        assert_eq!(options.secret, "podmend-tls");
        assert_eq!(options.cert_path, PathBuf::from("/tls/tls.crt"));
    }

    #[test]
    fn explicit_dns_names_replace_the_service_names() {
        let options = SelfTlsSettings {
            service: None,
            service_dns: vec!["webhook.example.test".to_string()],
            ..settings()
        }
        .resolve()
        .expect("valid");
        assert_eq!(options.dns_names, ["webhook.example.test"]);
    }

    #[test]
    fn without_a_service_or_dns_names_it_says_which_flags_to_pass() {
        let error = SelfTlsSettings {
            service: None,
            ..settings()
        }
        .resolve()
        .expect_err("no names");
        assert!(matches!(error, SelfTlsError::NoDnsNames));
        assert!(error.to_string().contains("--tls-service"), "{error}");
    }

    #[test]
    fn renewing_at_or_before_issue_is_refused_naming_both_flags() {
        let error = SelfTlsSettings {
            renew_before_days: 365,
            ..settings()
        }
        .resolve()
        .expect_err("renewal would start at issue");
        assert_eq!(
            error.to_string(),
            "--tls-renew-before-days (365) must be less than --tls-validity-days (365)"
        );
        assert!(
            SelfTlsSettings {
                renew_before_days: 364,
                ..settings()
            }
            .resolve()
            .is_ok()
        );
    }

    #[test]
    fn the_namespace_comes_from_the_flag_else_the_in_cluster_file_else_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("namespace");
        let from_file = SelfTlsSettings {
            namespace: Some("  ".to_string()),
            ..settings()
        };
        let error = from_file
            .clone()
            .resolve_with(&file)
            .expect_err("no namespace anywhere");
        assert!(matches!(error, SelfTlsError::NoNamespace));
        assert!(error.to_string().contains("POD_NAMESPACE"), "{error}");
        std::fs::write(&file, "team-a\n").expect("write");
        let options = from_file.resolve_with(&file).expect("from the file");
        assert_eq!(options.namespace, "team-a");
        assert_eq!(options.dns_names[0], "podmend.team-a.svc");
    }

    #[test]
    fn the_namespace_is_checked_before_the_names_and_the_names_before_the_days() {
        let dir = tempfile::tempdir().expect("tempdir");
        let nothing_right = SelfTlsSettings {
            namespace: None,
            service: None,
            renew_before_days: 400,
            ..settings()
        };
        let missing = dir.path().join("namespace");
        assert!(matches!(
            nothing_right.clone().resolve_with(&missing),
            Err(SelfTlsError::NoNamespace)
        ));
        let with_namespace = SelfTlsSettings {
            namespace: Some("ns".to_string()),
            ..nothing_right
        };
        assert!(matches!(
            with_namespace.resolve_with(&missing),
            Err(SelfTlsError::NoDnsNames)
        ));
    }
}
