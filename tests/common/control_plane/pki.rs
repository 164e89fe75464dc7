//! The control plane's PKI, minted with rcgen for each suite: one CA that signs the API
//! server's serving certificate (`localhost`, `127.0.0.1`) and the admin's client certificate
//! (organisation `system:masters`, so RBAC allows everything), and the service-account key pair
//! the API server signs tokens with.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

/// The files of the PKI, in one directory.
#[derive(Debug, Clone)]
pub struct Pki {
    pub ca_cert: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    pub service_account_key: PathBuf,
    pub service_account_public: PathBuf,
}

/// The admin's user name (`system:masters` is its group).
pub const ADMIN_USER: &str = "podmend-e2e-admin";

impl Pki {
    /// Writes a fresh PKI into `dir`.
    pub fn write(dir: &Path) -> Result<Pki, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let pki = Pki {
            ca_cert: dir.join("ca.crt"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            admin_cert: dir.join("admin.crt"),
            admin_key: dir.join("admin.key"),
            service_account_key: dir.join("sa.key"),
            service_account_public: dir.join("sa.pub"),
        };

        let mut ca_params = CertificateParams::default();
        ca_params.distinguished_name = name("podmend-e2e-ca", None);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca =
            CertifiedIssuer::self_signed(ca_params, KeyPair::generate().map_err(fail("CA key"))?)
                .map_err(fail("CA"))?;

        let mut serving = CertificateParams::default();
        serving.distinguished_name = name("kube-apiserver", None);
        serving.subject_alt_names = vec![
            SanType::DnsName("localhost".try_into().map_err(fail("serving name"))?),
            SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()),
            SanType::IpAddress(std::net::Ipv6Addr::LOCALHOST.into()),
        ];
        serving.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_key = KeyPair::generate().map_err(fail("serving key"))?;
        let serving_cert = serving
            .signed_by(&serving_key, &ca)
            .map_err(fail("serving certificate"))?;

        let mut admin = CertificateParams::default();
        admin.distinguished_name = name(ADMIN_USER, Some("system:masters"));
        admin.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_key = KeyPair::generate().map_err(fail("admin key"))?;
        let admin_cert = admin
            .signed_by(&admin_key, &ca)
            .map_err(fail("admin certificate"))?;

        let service_accounts = KeyPair::generate().map_err(fail("service-account key"))?;

        for (path, text) in [
            (&pki.ca_cert, ca.pem()),
            (&pki.serving_cert, serving_cert.pem()),
            (&pki.serving_key, serving_key.serialize_pem()),
            (&pki.admin_cert, admin_cert.pem()),
            (&pki.admin_key, admin_key.serialize_pem()),
            (&pki.service_account_key, service_accounts.serialize_pem()),
            (
                &pki.service_account_public,
                service_accounts.public_key_pem(),
            ),
        ] {
            std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(pki)
    }

    /// A kubeconfig for the admin at `server`, every credential inline.
    pub fn admin_kubeconfig(&self, server: &str) -> Result<String, String> {
        let inline = |path: &Path| -> Result<String, String> {
            use base64::Engine as _;
            let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
        };
        Ok(format!(
            "apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {ADMIN_USER}
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: e2e
  context:
    cluster: e2e
    user: {ADMIN_USER}
current-context: e2e
",
            ca = inline(&self.ca_cert)?,
            cert = inline(&self.admin_cert)?,
            key = inline(&self.admin_key)?,
        ))
    }
}

/// The error of making `what`.
fn fail(what: &'static str) -> impl Fn(rcgen::Error) -> String {
    move |e| format!("cannot make the {what}: {e}")
}

/// A subject with common name `cn` and, when given, organisation `o` (a Kubernetes group).
fn name(cn: &str, o: Option<&str>) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, cn);
    if let Some(o) = o {
        name.push(DnType::OrganizationName, o);
    }
    name
}
