//! TLS for the guard's TCP listeners, as the `docker:dind` image serves it: a certificate
//! tree in `--tls-certdir` laid out as its `dockerd-entrypoint.sh` lays out
//! `DOCKER_TLS_CERTDIR` (`ca/`, `server/`, `client/`, each file written atomically), and a
//! server configuration that, like `dockerd --tlsverify`, only completes a handshake with a
//! client presenting a certificate of that CA.
//!
//! The entrypoint's rules, kept: when `server/{ca,cert,key}.pem` exist and `ca/key.pem` does
//! not, the tree is the user's and is only used; otherwise the CA key is kept (or made), and
//! the CA, server and client certificates are made again on every start (names may have
//! changed), keeping the keys that exist. `client/key.pem` is readable by everyone (0644):
//! clients in other containers, running as other users, read it.

use std::fs;
use std::io::{self, Write as _};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// As long as the entrypoint's certificates (its `certValidDays`).
const VALIDITY: Duration = Duration::from_secs(825 * 86_400);
/// How far back validity starts, for clocks a little behind.
const BACKDATE: Duration = Duration::from_secs(3_600);
/// The names every server certificate carries, besides the host's own.
const FIXED_NAMES: [&str; 4] = ["docker", "localhost", "127.0.0.1", "::1"];

/// Why the TLS tree could not be written or used.
#[derive(Debug, thiserror::Error)]
pub enum TlsTreeError {
    #[error("cannot write {path}: {source}", path = .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read {path}: {source}", path = .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot generate the {what}: {source}")]
    Generate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error(
        "{dir} has ca/cert.pem but neither ca/key.pem (to make certificates with) nor \
         server/ca.pem, server/cert.pem and server/key.pem: remove ca/cert.pem, or add the \
         server files",
        dir = .0.display()
    )]
    NoCaKey(PathBuf),
    #[error("{path} holds no usable {what} (PEM expected)", path = .path.display())]
    Pem { path: PathBuf, what: &'static str },
    #[error("cannot build the TLS server configuration from {dir}: {source}", dir = .dir.display())]
    Config {
        dir: PathBuf,
        #[source]
        source: rustls::Error,
    },
}

/// The names of the server certificate: `docker`, `localhost`, `127.0.0.1`, `::1`, the host
/// name, every address of the host's interfaces (as the entrypoint's `ip address`), and
/// `extra` (`--tls-san`), without duplicates, in order.
pub fn server_names(extra: &[String]) -> Vec<String> {
    let mut names: Vec<String> = FIXED_NAMES.iter().map(|n| n.to_string()).collect();
    for file in ["/proc/sys/kernel/hostname", "/etc/hostname"] {
        if let Ok(name) = fs::read_to_string(file) {
            names.push(name.trim().to_string());
        }
    }
    names.extend(interface_addresses().into_iter().map(|ip| ip.to_string()));
    names.extend(extra.iter().map(|n| n.trim().to_string()));
    let mut unique = Vec::new();
    for name in names {
        if !name.is_empty() && !unique.contains(&name) {
            unique.push(name);
        }
    }
    unique
}

/// The host's own addresses: IPv4 from the kernel's local routing table, IPv6 from
/// `/proc/net/if_inet6`. Best effort: none when `/proc` says nothing.
fn interface_addresses() -> Vec<IpAddr> {
    let mut addresses = Vec::new();
    // fib_trie lists each local address as "|-- A.B.C.D" followed by "/32 host LOCAL"
    // (a "/8 host LOCAL" line follows a network, such as 127.0.0.0).
    if let Ok(trie) = fs::read_to_string("/proc/net/fib_trie") {
        let mut last: Option<IpAddr> = None;
        for line in trie.lines() {
            let line = line.trim();
            if let Some(address) = line.strip_prefix("|-- ") {
                last = address.trim().parse().ok();
            } else if line.starts_with("/32 host LOCAL")
                && let Some(ip) = last
                && !addresses.contains(&ip)
            {
                addresses.push(ip);
            }
        }
    }
    if let Ok(table) = fs::read_to_string("/proc/net/if_inet6") {
        for line in table.lines() {
            let Some(hex) = line.split_whitespace().next() else {
                continue;
            };
            if hex.len() != 32 {
                continue;
            }
            let mut bytes = [0u8; 16];
            let parsed = (0..16).all(|i| {
                u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                    .map(|b| bytes[i] = b)
                    .is_ok()
            });
            let ip = IpAddr::from(bytes);
            if parsed && !addresses.contains(&ip) {
                addresses.push(ip);
            }
        }
    }
    addresses
}

/// Writes (or keeps) the tree in `dir` as the docker:dind entrypoint does, for a server
/// certificate valid for `names`, and returns the configuration serving it with client
/// certificates required.
pub fn ensure_tree(
    dir: &Path,
    names: &[String],
) -> Result<Arc<rustls::ServerConfig>, TlsTreeError> {
    let ca_key_path = dir.join("ca/key.pem");
    let server = dir.join("server");
    let user_managed = ["ca.pem", "cert.pem", "key.pem"]
        .iter()
        .all(|f| non_empty(&server.join(f)))
        && !non_empty(&ca_key_path);
    if user_managed {
        tracing::info!(dir = %dir.display(), "using the TLS files in server/ as they are (no ca/key.pem)");
        return server_config(dir);
    }
    let ca_cert_path = dir.join("ca/cert.pem");
    if !non_empty(&ca_key_path) && non_empty(&ca_cert_path) {
        return Err(TlsTreeError::NoCaKey(dir.to_path_buf()));
    }
    let ca_key = ensure_key(&ca_key_path, 0o600)?;
    let ca_params = ca_params();
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .map_err(generate("CA certificate"))?;
    write_atomically(&ca_cert_path, ca_cert.pem().as_bytes(), 0o644)?;
    let issuer = Issuer::new(ca_params, ca_key);

    for (role, mode, usage, names) in [
        ("server", 0o600, ExtendedKeyUsagePurpose::ServerAuth, names),
        (
            "client",
            0o644,
            ExtendedKeyUsagePurpose::ClientAuth,
            &[][..],
        ),
    ] {
        let sub = dir.join(role);
        let key = ensure_key(&sub.join("key.pem"), mode)?;
        let mut params = CertificateParams::new(names.to_vec()).map_err(generate("names"))?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("docker:dind {role}"));
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params);
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(generate("certificate"))?;
        // The CA first, then the certificate: a client that finds cert.pem finds its CA.
        write_atomically(&sub.join("ca.pem"), ca_cert.pem().as_bytes(), 0o644)?;
        write_atomically(&sub.join("cert.pem"), cert.pem().as_bytes(), 0o644)?;
    }
    tracing::info!(dir = %dir.display(), names = %names.join(","), "wrote the TLS tree (ca, server, client)");
    server_config(dir)
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, "docker:dind CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyCertSign,
    ];
    set_validity(&mut params);
    params
}

fn set_validity(params: &mut CertificateParams) {
    let now = x509_parser::time::ASN1Time::now().to_datetime();
    params.not_before = now - BACKDATE;
    params.not_after = now + VALIDITY;
}

fn generate(what: &'static str) -> impl FnOnce(rcgen::Error) -> TlsTreeError {
    move |source| TlsTreeError::Generate { what, source }
}

fn non_empty(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.len() > 0)
}

/// The key in `path`, or a new one written there with `mode` (the mode is set either way,
/// as the entrypoint's `chmod` of the client key).
fn ensure_key(path: &Path, mode: u32) -> Result<KeyPair, TlsTreeError> {
    if non_empty(path) {
        let pem = fs::read_to_string(path).map_err(|source| TlsTreeError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        match KeyPair::from_pem(&pem) {
            Ok(key) => {
                set_mode(path, mode)?;
                return Ok(key);
            }
            Err(error) => tracing::warn!(
                path = %path.display(),
                %error,
                "cannot use this private key; writing a new one"
            ),
        }
    }
    let key = KeyPair::generate().map_err(generate("private key"))?;
    write_atomically(path, key.serialize_pem().as_bytes(), mode)?;
    Ok(key)
}

fn set_mode(path: &Path, mode: u32) -> Result<(), TlsTreeError> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(|source| {
        TlsTreeError::Write {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// Writes `content` to a temporary file beside `path`, syncs it, sets `mode` and renames it
/// over `path`: a reader sees the old file or the new one, never half of one.
fn write_atomically(path: &Path, content: &[u8], mode: u32) -> Result<(), TlsTreeError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let fail = |source| TlsTreeError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(fail)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let temporary = dir.join(format!(".{name}.podmend-{}", std::process::id()));
    let written = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&temporary)?;
        file.write_all(content)?;
        file.sync_all()?;
        drop(file);
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(&temporary, fs::Permissions::from_mode(mode))?;
        fs::rename(&temporary, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    written.map_err(fail)
}

fn read(path: PathBuf) -> Result<(PathBuf, Vec<u8>), TlsTreeError> {
    match fs::read(&path) {
        Ok(bytes) => Ok((path, bytes)),
        Err(source) => Err(TlsTreeError::Read { path, source }),
    }
}

/// Serves `server/cert.pem` with `server/key.pem`, and requires a client certificate issued
/// by `server/ca.pem` (dockerd's `--tlsverify --tlscacert`).
pub fn server_config(dir: &Path) -> Result<Arc<rustls::ServerConfig>, TlsTreeError> {
    let server = dir.join("server");
    let (ca_path, ca) = read(server.join("ca.pem"))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&ca) {
        let bad = || TlsTreeError::Pem {
            path: ca_path.clone(),
            what: "CA certificate",
        };
        roots.add(cert.map_err(|_| bad())?).map_err(|_| bad())?;
    }
    if roots.is_empty() {
        return Err(TlsTreeError::Pem {
            path: ca_path,
            what: "CA certificate",
        });
    }
    let (cert_path, cert) = read(server.join("cert.pem"))?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert)
        .collect::<Result<_, _>>()
        .ok()
        .filter(|chain: &Vec<_>| !chain.is_empty())
        .ok_or(TlsTreeError::Pem {
            path: cert_path,
            what: "server certificate",
        })?;
    let (key_path, key) = read(server.join("key.pem"))?;
    let key = PrivateKeyDer::from_pem_slice(&key).map_err(|_| TlsTreeError::Pem {
        path: key_path,
        what: "private key",
    })?;
    let config_error = |source| TlsTreeError::Config {
        dir: dir.to_path_buf(),
        source,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
            .build()
            .map_err(|e| config_error(rustls::Error::General(e.to_string())))?;
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(config_error)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(config_error)?;
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_tree_has_the_entrypoints_files_and_modes() {
        let dir = tempfile::tempdir().unwrap();
        let names = server_names(&["ci.example".to_string(), "10.1.2.3".to_string()]);
        for name in [
            "docker",
            "localhost",
            "127.0.0.1",
            "::1",
            "ci.example",
            "10.1.2.3",
        ] {
            assert!(names.iter().any(|n| n == name), "{name}: {names:?}");
        }
        ensure_tree(dir.path(), &names).unwrap();
        for file in [
            "ca/key.pem",
            "ca/cert.pem",
            "server/ca.pem",
            "server/cert.pem",
            "server/key.pem",
            "client/ca.pem",
            "client/cert.pem",
            "client/key.pem",
        ] {
            assert!(non_empty(&dir.path().join(file)), "{file}");
        }
        assert_eq!(mode(&dir.path().join("client/key.pem")), 0o644);
        assert_eq!(mode(&dir.path().join("server/key.pem")), 0o600);
        assert_eq!(mode(&dir.path().join("ca/key.pem")), 0o600);
        let leftovers: Vec<_> = fs::read_dir(dir.path().join("client"))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    }

    #[test]
    fn a_second_start_keeps_every_key_and_makes_the_certificates_again() {
        let dir = tempfile::tempdir().unwrap();
        let names = server_names(&[]);
        ensure_tree(dir.path(), &names).unwrap();
        let read = |f: &str| fs::read_to_string(dir.path().join(f)).unwrap();
        let keys = ["ca/key.pem", "server/key.pem", "client/key.pem"].map(read);
        ensure_tree(dir.path(), &names).unwrap();
        assert_eq!(
            ["ca/key.pem", "server/key.pem", "client/key.pem"].map(read),
            keys
        );
    }

    #[test]
    fn server_files_without_a_ca_key_are_the_users_and_only_used() {
        let dir = tempfile::tempdir().unwrap();
        ensure_tree(dir.path(), &server_names(&[])).unwrap();
        fs::remove_file(dir.path().join("ca/key.pem")).unwrap();
        let cert = fs::read_to_string(dir.path().join("server/cert.pem")).unwrap();
        ensure_tree(dir.path(), &server_names(&[])).unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join("server/cert.pem")).unwrap(),
            cert
        );
        fs::remove_dir_all(dir.path().join("server")).unwrap();
        let error = ensure_tree(dir.path(), &server_names(&[])).unwrap_err();
        assert!(matches!(error, TlsTreeError::NoCaKey(_)), "{error}");
    }
}
