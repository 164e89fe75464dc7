//! The cluster connection of `audit --cluster` and `clean-storms`: finding the cluster as
//! kubectl would ([`client_for`]), and what can go wrong talking to it
//! ([`ClusterAuditError`]), each error saying what to do.

use std::path::{Path, PathBuf};

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};

/// What can stop `audit --cluster`, each with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ClusterAuditError {
    #[error(
        "cannot use kubeconfig {}{}: {detail}; check --kubeconfig / KUBECONFIG and --context (`kubectl config get-contexts`)",
        shown_path(.path.as_deref()),
        shown_context(.context.as_deref())
    )]
    Kubeconfig {
        path: Option<PathBuf>,
        context: Option<String>,
        detail: String,
    },
    #[error(
        "no cluster found: no usable kubeconfig ({kubeconfig}) and not running in a cluster ({in_cluster}); set KUBECONFIG or pass --kubeconfig / --context"
    )]
    NoCluster {
        kubeconfig: String,
        in_cluster: String,
    },
    #[error(
        "cannot build a Kubernetes client for {url}: {detail}; check the kubeconfig's cluster and user entries"
    )]
    Client { url: String, detail: String },
    #[error(
        "cannot reach the cluster{}: {detail}; check --context / KUBECONFIG and that the API server is up",
        at_url(.url.as_deref())
    )]
    Unreachable { url: Option<String>, detail: String },
    #[error(
        "the cluster{} rejected the credentials (401 Unauthorized: {message}); log in again or check the kubeconfig user",
        at_url(.url.as_deref())
    )]
    Unauthorized {
        url: Option<String>,
        message: String,
    },
    #[error("not allowed to list {resource} {scope} (403 Forbidden: {message}); {needs}")]
    Forbidden {
        resource: String,
        scope: String,
        message: String,
        /// What the command needs, e.g. "the audit needs list on nodes, …, or use -n NAMESPACE".
        needs: &'static str,
    },
    #[error(
        "listing {resource} {scope} expired while paging (410 Gone: {message}), and the API server gave no token to go on with, or it kept expiring; run again, or with a larger --page-size so that the list needs fewer pages"
    )]
    ListExpired {
        resource: String,
        scope: String,
        message: String,
    },
    #[error("listing {resource} {scope} failed ({code} {reason}: {message})")]
    List {
        resource: String,
        scope: String,
        code: u16,
        reason: String,
        message: String,
    },
    #[error("cannot read the {resource} list {scope}: {detail}")]
    Decode {
        resource: String,
        scope: String,
        detail: String,
    },
}

/// An error and its sources in one line (the variants carry no `source`, so that a caller
/// printing the chain does not print it twice).
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

fn shown_path(path: Option<&Path>) -> String {
    path.map_or_else(
        || "(KUBECONFIG or ~/.kube/config)".to_string(),
        |p| p.display().to_string(),
    )
}

fn shown_context(context: Option<&str>) -> String {
    context.map_or_else(String::new, |c| format!(" with context {c:?}"))
}

fn at_url(url: Option<&str>) -> String {
    url.map_or_else(String::new, |u| format!(" at {u}"))
}

/// Finds a cluster as kubectl would: the kubeconfig at `kubeconfig`, else `KUBECONFIG` or
/// `~/.kube/config`, with `context` or the current one; without a context asked for, the
/// in-cluster service account when no kubeconfig works. Then checks the API server answers
/// (`GET /version`; any HTTP answer but 401 counts).
pub async fn client_for(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<Client, ClusterAuditError> {
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..KubeConfigOptions::default()
    };
    let kubeconfig_error = |path: Option<&Path>| {
        let path = path.map(Path::to_path_buf);
        let context = context.map(str::to_string);
        move |error: KubeconfigError| ClusterAuditError::Kubeconfig {
            path,
            context,
            detail: chain(&error),
        }
    };
    let mut config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path).map_err(kubeconfig_error(Some(path)))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(kubeconfig_error(Some(path)))?
        }
        None => match kube::Config::from_kubeconfig(&options).await {
            Ok(config) => config,
            Err(source) if context.is_some() => return Err(kubeconfig_error(None)(source)),
            Err(kubeconfig) => {
                kube::Config::incluster().map_err(|in_cluster| ClusterAuditError::NoCluster {
                    kubeconfig: chain(&kubeconfig),
                    in_cluster: chain(&in_cluster),
                })?
            }
        },
    };
    config.apply_debug_overrides();
    let url = config.cluster_url.to_string();
    let client = Client::try_from(config).map_err(|error| ClusterAuditError::Client {
        url: url.clone(),
        detail: chain(&error),
    })?;
    match client.apiserver_version().await {
        Ok(_) => Ok(client),
        Err(kube::Error::Api(status)) if status.code == 401 => {
            Err(ClusterAuditError::Unauthorized {
                url: Some(url),
                message: status.message,
            })
        }
        // Any other answer means the server is there (a stub or a proxy may not serve /version).
        Err(kube::Error::Api(_) | kube::Error::SerdeError(_)) => Ok(client),
        Err(error) => Err(ClusterAuditError::Unreachable {
            url: Some(url),
            detail: chain(&error),
        }),
    }
}

pub(crate) fn list_error(
    what: &str,
    scope: &str,
    needs: &'static str,
    error: kube::Error,
) -> ClusterAuditError {
    let (resource, scope) = (what.to_string(), scope.to_string());
    match error {
        kube::Error::Api(status) => match status.code {
            401 => ClusterAuditError::Unauthorized {
                url: None,
                message: status.message,
            },
            403 => ClusterAuditError::Forbidden {
                resource,
                scope,
                message: status.message,
                needs,
            },
            410 => ClusterAuditError::ListExpired {
                resource,
                scope,
                message: status.message,
            },
            code => ClusterAuditError::List {
                resource,
                scope,
                code,
                reason: status.reason,
                message: status.message,
            },
        },
        error @ kube::Error::SerdeError(_) => ClusterAuditError::Decode {
            resource,
            scope,
            detail: chain(&error),
        },
        error => ClusterAuditError::Unreachable {
            url: None,
            detail: chain(&error),
        },
    }
}
