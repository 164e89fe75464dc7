//! What changes while `podmend serve` runs: the serving certificate and the config file,
//! polled and swapped in only when the new version is valid, and the certificate TLS
//! self-management writes (first one, then renewals).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::selftls::SelfTls;
use super::tls::CertStore;
use super::{AppState, ServeOptions};
use crate::config::Config;

/// Waits until TLS self-management has put a certificate in place, retrying with backoff
/// (0.5 s doubling to 30 s); false when `shutdown` came first.
pub(super) async fn first_certificate<F: Future<Output = ()>>(
    self_tls: &SelfTls,
    shutdown: &mut Pin<&mut F>,
) -> bool {
    let mut delay = Duration::from_millis(500);
    loop {
        match self_tls.reconcile().await {
            Ok(_) => return true,
            Err(error) => {
                tracing::error!(
                    "TLS self-management: no certificate yet, retrying in {delay:?}: {error}"
                )
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.as_mut() => return false,
        }
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

/// Waits until both `--tls-cert` and `--tls-key` exist, checking every reload interval, with
/// `/readyz` saying what it waits for; false when `shutdown` came first. A Secret volume
/// marked optional (the chart's, in certManager mode) is mounted empty while the Secret does
/// not exist, and the kubelet fills it once cert-manager has issued the certificate.
pub(super) async fn certificate_files<F: Future<Output = ()>>(
    options: &ServeOptions,
    state: &AppState,
    shutdown: &mut Pin<&mut F>,
) -> bool {
    let mut logged = None;
    loop {
        let missing: Vec<String> = [&options.tls_cert, &options.tls_key]
            .into_iter()
            .filter(|path| !path.exists())
            .map(|path| path.display().to_string())
            .collect();
        if missing.is_empty() {
            return true;
        }
        let reason = format!(
            "waiting for the serving certificate: {} not there yet (with cert-manager: the \
             Certificate is not issued yet; see kubectl describe certificate)",
            missing.join(" and ")
        );
        if logged.as_ref() != Some(&reason) {
            tracing::warn!("{reason}");
            state
                .readiness
                .set_certificate_pending(Some(reason.clone()));
            logged = Some(reason);
        }
        tokio::select! {
            _ = tokio::time::sleep(options.reload_interval) => {}
            _ = shutdown.as_mut() => return false,
        }
    }
}

/// Runs TLS self-management's periodic renewal; each renewed certificate is loaded into
/// `certs` at once, without waiting for the reload poll.
pub(super) fn spawn_renewals(
    self_tls: SelfTls,
    certs: Arc<CertStore>,
    state: Arc<AppState>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(self_tls.run(move || match certs.reload_if_changed() {
        Ok(true) => {
            state.metrics.tls_reload(true);
            state.metrics.set_certificate_expiry(certs.not_after_unix());
        }
        Ok(false) => {}
        Err(error) => tracing::error!("renewed certificate not loaded yet: {error}"),
    }))
}

/// Polls the certificate and the config file; swaps in valid new versions only.
pub(super) async fn reload_loop(
    state: Arc<AppState>,
    certs: Arc<CertStore>,
    options: ServeOptions,
) {
    let mut config_text = options
        .config
        .as_ref()
        .and_then(|path| std::fs::read_to_string(path).ok());
    let mut ticks = tokio::time::interval(options.reload_interval);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        reload_certificate(&state, &certs, &options.tls_cert);
        if let Some(path) = &options.config {
            reload_config(&state, path, &mut config_text);
        }
    }
}

/// Loads the certificate files if they changed and are valid; else the old pair serves on.
fn reload_certificate(state: &AppState, certs: &CertStore, cert_path: &Path) {
    match certs.reload_if_changed() {
        Ok(false) => {}
        Ok(true) => {
            state.metrics.tls_reload(true);
            state.metrics.set_certificate_expiry(certs.not_after_unix());
            tracing::info!(cert = %cert_path.display(), "serving certificate reloaded");
        }
        Err(error) => {
            state.metrics.tls_reload(false);
            tracing::error!("serving certificate not reloaded, keeping the old one: {error}");
        }
    }
}

/// Swaps in the config file at `path` if its text changed since `last_text` and it is
/// valid; else the old configuration serves on. An unreadable file is reported once.
fn reload_config(state: &AppState, path: &Path, last_text: &mut Option<String>) {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) => {
            if last_text.take().is_some() {
                state.metrics.config_reload(false);
                tracing::error!(
                    "config {} unreadable, keeping the old one: {error}",
                    path.display()
                );
            }
            return;
        }
    };
    if last_text.as_deref() == Some(text.as_str()) {
        return;
    }
    match Config::from_yaml(&text, &path.display().to_string()) {
        Ok(config) => {
            state.set_config(&config);
            state.metrics.config_reload(true);
            tracing::info!(config = %path.display(), "configuration reloaded");
        }
        Err(error) => {
            state.metrics.config_reload(false);
            tracing::error!("configuration not reloaded, keeping the old one: {error}");
        }
    }
    *last_text = Some(text);
}
