//! The command line: `podmend serve | certs | config`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::audit::FailOn;
use crate::audit::report::Format;
use crate::telemetry::LogFormat;

#[derive(Debug, Parser)]
#[command(
    name = "podmend",
    version,
    about = "Repairs pod specs that make Kubernetes clusters fall over, before they are persisted."
)]
pub struct Cli {
    /// Log line format.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "PODMEND_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTPS admission webhook (POST /mutate, /validate) and the metrics port.
    Serve(ServeArgs),
    /// Show what podmend would repair, in manifests or a live cluster (a dry run).
    Audit(AuditArgs),
    /// Write a development CA and serving certificate (ca.crt, tls.crt, tls.key).
    Certs(CertsArgs),
    /// Print the default configuration with comments, or check a configuration file.
    Config(ConfigArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address of the HTTPS webhook.
    #[arg(long, default_value = "0.0.0.0:8443", env = "PODMEND_LISTEN")]
    pub listen: SocketAddr,
    /// Address of the plain-HTTP port for /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:9090", env = "PODMEND_METRICS_LISTEN")]
    pub metrics_listen: SocketAddr,
    /// Serving certificate (PEM, full chain); reloaded when it changes.
    #[arg(
        long,
        default_value = "/etc/podmend/tls/tls.crt",
        env = "PODMEND_TLS_CERT"
    )]
    pub tls_cert: PathBuf,
    /// Private key of the serving certificate (PEM); reloaded when it changes.
    #[arg(
        long,
        default_value = "/etc/podmend/tls/tls.key",
        env = "PODMEND_TLS_KEY"
    )]
    pub tls_key: PathBuf,
    /// Configuration file (YAML); built-in defaults without it. Reloaded when it changes.
    #[arg(long, env = "PODMEND_CONFIG")]
    pub config: Option<PathBuf>,
    /// Kubeconfig for Node and LimitRange look-ups; default: $KUBECONFIG, ~/.kube/config, or
    /// the in-cluster service account. Without any, look-ups are off.
    #[arg(long, env = "PODMEND_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Seconds between checks of the certificate and config files for changes.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub reload_seconds: u64,
    /// Seconds in-flight requests may take to finish after SIGTERM.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=600))]
    pub shutdown_seconds: u64,
}

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// A DNS name (or IP address) the serving certificate is valid for; repeat for more.
    #[arg(long = "dns", required = true)]
    pub dns: Vec<String>,
    /// Directory to write ca.crt, tls.crt and tls.key into (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// Days the certificates stay valid.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub days: u32,
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// Check this configuration file instead of printing the defaults; exits 1 if invalid.
    #[arg(long, value_name = "FILE")]
    pub check: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Manifest files or directories (recursing into *.yaml, *.yml, *.json); `-` reads stdin.
    #[arg(required_unless_present = "cluster", conflicts_with = "cluster")]
    pub paths: Vec<String>,
    /// Audit the live cluster of the kubeconfig instead of files.
    #[arg(long)]
    pub cluster: bool,
    /// Kubeconfig context (with --cluster).
    #[arg(long, requires = "cluster")]
    pub context: Option<String>,
    /// Kubeconfig file (with --cluster); default: $KUBECONFIG, ~/.kube/config, in-cluster.
    #[arg(long, requires = "cluster")]
    pub kubeconfig: Option<PathBuf>,
    /// Only this namespace (with --cluster); default: all namespaces.
    #[arg(short = 'n', long, requires = "cluster")]
    pub namespace: Option<String>,
    /// Objects per list request (with --cluster).
    #[arg(long, default_value_t = 500, requires = "cluster", value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub page_size: u32,
    /// Output: table, json, sarif, patch (JSON Lines), yaml (the manifests, repaired).
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Format,
    /// Exit 3 when a finding is at or above this mode (warn < deny < enforce), or never.
    /// Default: warn; never with -o yaml, so it works as a Helm post-renderer.
    #[arg(long, value_enum)]
    pub fail_on: Option<FailOn>,
    /// Configuration file, as for `serve` (modes decide what each finding is).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print the findings as wgpolicyk8s.io/v1alpha2 PolicyReports (YAML) instead (with --cluster).
    #[arg(long, requires = "cluster")]
    pub policy_report: bool,
    /// Apply the PolicyReports to the cluster (server-side apply) instead of printing them.
    #[arg(long, requires = "policy_report")]
    pub apply: bool,
}
