//! The command line: `podmend serve | audit | clean-storms | guard | certs | config`, and
//! the conversions from its arguments to the options each entry point of the library takes
//! ([`ServeOptions`], [`AuditOptions`], [`CleanStormsOptions`], …). Only `main.rs` uses this
//! module; the library never reads clap's argument types.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::audit::policy_reports::ReportFormat;
use crate::audit::report::OutputFormat;
use crate::audit::{AuditInput, AuditOptions, FailOn, LiveCluster, PolicyReportOutput};
use crate::dind::{Address, DEFAULT_MAX_EXITED, GuardCommand, Policy, parse_duration};
use crate::guard::reap::parse_size;
use crate::guard::{GuardError, ImageBudget, ReapMode, ReapOptions};
use crate::server::ServeOptions;
use crate::server::selftls::{SelfTlsError, SelfTlsSettings};
use crate::storms::{CleanOptions, CleanStormsOptions};
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
    /// Delete the Failed pods of kubelet rejection storms (OutOfcpu, NodeAffinity, …), all but
    /// the newest few per owner, rate-limited, with an Event on each owner.
    CleanStorms(CleanStormsArgs),
    /// Run the Docker API guard of a Docker-in-Docker pod (guard reap: remove orphans).
    Guard(GuardArgs),
    /// Write a development CA and serving certificate (ca.crt, tls.crt, tls.key).
    Certs(CertsArgs),
    /// Print the default configuration with comments, or check a configuration file.
    Config(ConfigArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address of the HTTPS webhook; [::] takes IPv4 and IPv6 connections.
    #[arg(long, default_value = "[::]:8443", env = "PODMEND_LISTEN")]
    pub listen: SocketAddr,
    /// Address of the plain-HTTP port for /metrics, /healthz and /readyz.
    #[arg(long, default_value = "[::]:9090", env = "PODMEND_METRICS_LISTEN")]
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
    /// While --tls-cert or --tls-key does not exist, wait for it (/readyz says what it waits
    /// for) instead of exiting: for a certificate that cert-manager issues after the pod starts.
    #[arg(long, env = "PODMEND_TLS_WAIT_FOR_FILES")]
    pub tls_wait_for_files: bool,
    /// CA certificate(s), PEM, that a client certificate must chain to: only clients presenting
    /// one complete the TLS handshake. Use it when the API server presents a client
    /// certificate (a kubeconfig in its AdmissionConfiguration names it) so that nothing else
    /// can call the webhook. Read once at start; the metrics port is not affected.
    #[arg(long, value_name = "FILE", env = "PODMEND_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,
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
    /// Seconds after SIGTERM during which /readyz says no but requests are still served, so
    /// the Service's endpoints drop the pod before it stops listening.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=300))]
    pub shutdown_delay_seconds: u64,
    /// Seconds a Node or LimitRange watch may keep failing before /readyz says no (its cache
    /// may be stale).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub cache_stale_seconds: u64,
    /// Also serve POST /null, which answers allowed: true without reading the review: the
    /// baseline of the load generator (cargo bench --bench load). Never in production.
    #[arg(long, hide = true)]
    pub benchmark_null_route: bool,
    #[command(flatten)]
    pub self_tls: SelfTlsArgs,
}

/// `serve --tls-self-manage`: podmend keeps its own CA and serving certificate.
#[derive(Debug, Args)]
pub struct SelfTlsArgs {
    /// Manage the CA and serving certificate in a Secret (--tls-secret), write the serving
    /// pair to --tls-cert/--tls-key and the CA into the webhook configurations' caBundle.
    #[arg(long, requires_all = ["tls_secret", "webhook_configurations"])]
    pub tls_self_manage: bool,
    /// The Secret holding ca.crt, ca.key, tls.crt and tls.key (with --tls-self-manage).
    #[arg(long, requires = "tls_self_manage")]
    pub tls_secret: Option<String>,
    /// Namespace of the Secret; default: the pod's own (in-cluster namespace file). Read only
    /// with --tls-self-manage (POD_NAMESPACE is a common variable, set whatever the TLS mode).
    #[arg(long, env = "POD_NAMESPACE")]
    pub tls_namespace: Option<String>,
    /// Webhook configurations whose caBundle podmend keeps up to date, comma-separated:
    /// mutatingwebhookconfigurations/NAME or validatingwebhookconfigurations/NAME, or NAME
    /// alone (then looked up as either kind, which needs get on both).
    #[arg(long, value_delimiter = ',', requires = "tls_self_manage")]
    pub webhook_configurations: Vec<String>,
    /// The Service in front of the webhook: the certificate is for <service>.<ns>.svc and
    /// <service>.<ns>.svc.cluster.local (unless --tls-service-dns is given).
    #[arg(long, requires = "tls_self_manage")]
    pub tls_service: Option<String>,
    /// A DNS name (or IP) for the serving certificate, instead of the --tls-service names;
    /// repeat for more.
    #[arg(long, requires = "tls_self_manage")]
    pub tls_service_dns: Vec<String>,
    /// Renew the serving certificate (and roll the CA over) this many days before it expires.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub tls_renew_before_days: u32,
    /// Days a serving certificate is valid (the CA: twice as long).
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(2..=3650))]
    pub tls_validity_days: u32,
    /// Seconds between re-checks of the Secret (tests use seconds; default hourly).
    #[arg(long, default_value_t = 3600, hide = true, value_parser = clap::value_parser!(u64).range(1..))]
    pub tls_check_seconds: u64,
    /// Seconds between a caBundle change and serving a certificate of the new CA, for every
    /// API server's watch of the webhook configurations to catch up.
    #[arg(long, default_value_t = 5, hide = true, value_parser = clap::value_parser!(u64).range(0..=600))]
    pub tls_ca_settle_seconds: u64,
}

impl ServeArgs {
    /// The options `podmend serve` runs with, the `--tls-self-manage` settings resolved.
    pub fn options(self) -> Result<ServeOptions, SelfTlsError> {
        let self_tls = self
            .self_tls
            .settings(&self.tls_cert, &self.tls_key)
            .map(SelfTlsSettings::resolve)
            .transpose()?;
        Ok(ServeOptions {
            listen: self.listen,
            metrics_listen: self.metrics_listen,
            tls_cert: self.tls_cert,
            tls_key: self.tls_key,
            config: self.config,
            kubeconfig: self.kubeconfig,
            reload_interval: Duration::from_secs(self.reload_seconds),
            shutdown_timeout: Duration::from_secs(self.shutdown_seconds),
            shutdown_delay: Duration::from_secs(self.shutdown_delay_seconds),
            cache_stale_after: Duration::from_secs(self.cache_stale_seconds),
            self_tls,
            tls_wait_for_files: self.tls_wait_for_files,
            benchmark_null_route: self.benchmark_null_route,
            client_ca: self.client_ca,
            after_cache_list: || {},
        })
    }
}

impl SelfTlsArgs {
    /// The settings as given, with the serving pair's paths; `None` without
    /// `--tls-self-manage`.
    fn settings(
        &self,
        cert_path: &std::path::Path,
        key_path: &std::path::Path,
    ) -> Option<SelfTlsSettings> {
        self.tls_self_manage.then(|| SelfTlsSettings {
            namespace: self.tls_namespace.clone(),
            secret: self.tls_secret.clone().unwrap_or_default(),
            webhook_configurations: self.webhook_configurations.clone(),
            service: self.tls_service.clone(),
            service_dns: self.tls_service_dns.clone(),
            renew_before_days: self.tls_renew_before_days,
            validity_days: self.tls_validity_days,
            check_interval: Duration::from_secs(self.tls_check_seconds),
            ca_settle: Duration::from_secs(self.tls_ca_settle_seconds),
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
        })
    }
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
    /// Manifest files or directories (recursing into *.yaml, *.yml, *.json); - reads stdin.
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
    #[arg(long, default_value_t = crate::audit::cluster::DEFAULT_PAGE_SIZE, requires = "cluster", value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub page_size: u32,
    /// Output: table, json, sarif, patch (JSON Lines), yaml (the manifests, repaired).
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: OutputFormat,
    /// Exit 3 when a finding is at or above this mode (warn < deny < enforce), or never.
    /// Default: warn; never with -o yaml, so it works as a Helm post-renderer.
    #[arg(long, value_enum)]
    pub fail_on: Option<FailOn>,
    /// Configuration file, as for podmend serve (its modes decide what each finding is).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The cluster objects rules look up, from a file: the output of kubectl get
    /// nodes,namespaces,limitranges -A -o yaml. Without it (or --cluster) node taints are
    /// unknown, so pods pinned with nodeName are reported but not rewritten.
    #[arg(long, value_name = "FILE", conflicts_with = "cluster")]
    pub cluster_snapshot: Option<PathBuf>,
    /// Print the findings as report objects (YAML) instead, one set per namespace, each object
    /// under 1 MiB (with --cluster); --report-format picks the API.
    #[arg(long, requires = "cluster")]
    pub policy_report: bool,
    /// The report API: policyreport (wgpolicyk8s.io/v1alpha2 PolicyReport) or openreports
    /// (openreports.io/v1alpha1 Report).
    #[arg(
        long,
        value_enum,
        default_value = "policyreport",
        requires = "policy_report"
    )]
    pub report_format: ReportFormat,
    /// Apply the reports to the cluster (server-side apply, field manager podmend) instead of
    /// printing them, and delete podmend's reports the run no longer produces.
    #[arg(long, requires = "policy_report")]
    pub apply: bool,
}

impl AuditArgs {
    /// The options `podmend audit` runs with.
    pub fn options(&self) -> AuditOptions {
        let input = if self.cluster {
            AuditInput::Cluster(LiveCluster {
                kubeconfig: self.kubeconfig.clone(),
                context: self.context.clone(),
                namespace: self.namespace.clone(),
                page_size: self.page_size,
                policy_reports: self.policy_report.then_some(PolicyReportOutput {
                    format: self.report_format,
                    apply: self.apply,
                }),
            })
        } else {
            AuditInput::Files(self.paths.clone())
        };
        AuditOptions {
            input,
            output: self.output,
            fail_on: self.fail_on,
            config: self.config.clone(),
            cluster_snapshot: self.cluster_snapshot.clone(),
        }
    }
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct GuardArgs {
    #[command(subcommand)]
    pub command: Option<GuardSubcommand>,
    #[command(flatten)]
    pub run: GuardRunArgs,
}

#[derive(Debug, Subcommand)]
pub enum GuardSubcommand {
    /// Remove podmend-labelled containers whose owner pod no longer exists (or, with
    /// --older-than, stopped ones that stopped that long ago), and with --images-high unused
    /// images least recently used first; one line per removal. Once, or every --interval.
    Reap(GuardReapArgs),
}

/// `podmend guard`: the proxy itself. Its command line is the DinD contract's
/// [`GuardCommand`], which the dind-rm rule writes: [`GuardRunArgs::command`] reads it back.
#[derive(Debug, Args)]
pub struct GuardRunArgs {
    /// Where the guard listens for Docker clients, written as DOCKER_HOST is
    /// (unix:///PATH, tcp://HOST:PORT, HOST[:PORT]); repeat for more.
    #[arg(
        long,
        default_value = "unix:///podmend/guard/docker.sock",
        env = "PODMEND_GUARD_LISTEN",
        value_delimiter = ','
    )]
    pub listen: Vec<Address>,
    /// Serve TLS on the TCP listeners, with a certificate tree the guard writes in this
    /// directory as the docker:dind image writes its DOCKER_TLS_CERTDIR (ca, server and
    /// client); clients present the certificate of its client directory.
    #[arg(long, value_name = "DIR")]
    pub tls_certdir: Option<PathBuf>,
    /// Another name or IP address for that server certificate; repeat for more.
    #[arg(long, value_name = "NAME", requires = "tls_certdir")]
    pub tls_san: Vec<String>,
    #[command(flatten)]
    pub upstream: UpstreamArgs,
    /// What the guard does about the containers, networks and images the pod leaves behind.
    #[arg(long, value_enum, default_value_t = Policy::default(), env = "PODMEND_GUARD_POLICY")]
    pub policy: Policy,
    /// UID of the pod the guard runs in (downward API metadata.uid); every container created
    /// through the guard is labelled podmend.io/owner-pod=<uid>.
    #[arg(long, required = true, env = "PODMEND_OWNER_POD_UID")]
    pub owner_pod_uid: Option<String>,
    /// Policy collect: an exited container is removed once it has been exited this long
    /// (90s, 5m, 1h; 0s: as soon as it exits).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub min_age: Duration,
    /// Policy collect: how many exited containers a pod keeps; beyond, the oldest are removed.
    #[arg(long, default_value_t = DEFAULT_MAX_EXITED)]
    pub max_exited: u32,
    /// Address of a plain-HTTP port serving GET /metrics, /healthz (200 once every listener
    /// is bound and the TLS tree written: a startupProbe) and /readyz (200 while the daemon
    /// answers /_ping: a readinessProbe); none by default.
    #[arg(long, env = "PODMEND_GUARD_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Serve the probes also at /healthz/TOKEN and /readyz/TOKEN, and answer 404 there to
    /// any other token: a probe proves it reached this guard, not another pod's on a shared
    /// network namespace (hostNetwork). Letters, digits, '-' and '_'.
    #[arg(long, value_name = "TOKEN", requires = "metrics_listen", value_parser = parse_health_token)]
    pub health_token: Option<String>,
    /// How long a client request waits for a daemon the guard has not reached yet (its
    /// socket missing, its port closed, --cert-path files not written yet) before its
    /// connection is closed unanswered; 0s gives up at once. Once the daemon has answered
    /// (or the wait is over), while the daemon is down the guard refuses connections as
    /// the daemon's own socket does, so the docker CLI says "Cannot connect to the Docker
    /// daemon" and fails; it listens again as soon as the daemon answers.
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub upstream_wait: Duration,
    /// The daemon runs in this pod and only this guard reaches it: when the guard starts, it
    /// removes the containers, networks and volumes other owners left on it (pods that ran on
    /// the same persistent /var/lib/docker before and are gone). Images stay.
    #[arg(long)]
    pub daemon_in_pod: bool,
    /// A path at which the daemon finds its own socket when it resolves a container's bind
    /// mount (docker run -v PATH:...); repeat for more. Such binds would reach the daemon
    /// without the guard: they are rewritten to --guard-socket-for-daemon, or refused (403).
    #[arg(long, value_name = "PATH")]
    pub daemon_socket_path: Vec<String>,
    /// The path at which the daemon finds this guard's socket, for the binds above.
    #[arg(long, value_name = "PATH")]
    pub guard_socket_for_daemon: Option<String>,
    /// Seconds the removal of the pod's containers may take after SIGTERM.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=600))]
    pub shutdown_seconds: u64,
}

impl GuardRunArgs {
    /// The command line as the DinD contract describes it.
    pub fn command(&self) -> Result<GuardCommand, String> {
        let upstream = self
            .upstream
            .upstream
            .clone()
            .ok_or_else(|| "--upstream is required".to_string())?;
        let mut command = GuardCommand::new(self.listen.clone(), upstream, self.policy);
        command.tls_certdir = self.tls_certdir.clone();
        command.tls_san = self.tls_san.clone();
        command.upstream_cert_path = self.upstream.cert_dir()?;
        command.min_age = self.min_age;
        command.max_exited = self.max_exited;
        command.health_listen = self.metrics_listen;
        command.health_token = self.health_token.clone();
        command.upstream_wait = self.upstream_wait;
        command.daemon_in_pod = self.daemon_in_pod;
        command.daemon_socket_paths = self.daemon_socket_path.clone();
        command.guard_socket_for_daemon = self.guard_socket_for_daemon.clone();
        Ok(command)
    }
}

/// The Docker daemon the guard talks to.
#[derive(Debug, Args)]
pub struct UpstreamArgs {
    /// The Docker daemon, written as DOCKER_HOST is: unix:///PATH, tcp://HOST:PORT or
    /// HOST[:PORT] (2375 when the port is left out).
    #[arg(long, required = true, env = "PODMEND_GUARD_UPSTREAM")]
    pub upstream: Option<Address>,
    /// Speak TLS to the daemon: verify it against ca.pem and present cert.pem and key.pem
    /// from --cert-path.
    #[arg(long)]
    pub tls_verify: bool,
    /// Directory holding ca.pem, cert.pem and key.pem, as DOCKER_CERT_PATH (default with
    /// --tls-verify: ~/.docker, as the docker CLI).
    #[arg(long, env = "DOCKER_CERT_PATH")]
    pub cert_path: Option<PathBuf>,
}

impl UpstreamArgs {
    /// The certificate directory when TLS is on: --cert-path, else ~/.docker as the docker
    /// CLI has it.
    pub fn cert_dir(&self) -> Result<Option<PathBuf>, String> {
        match (self.tls_verify, &self.cert_path) {
            (false, _) => Ok(None),
            (true, Some(dir)) => Ok(Some(dir.clone())),
            (true, None) => std::env::var_os("HOME")
                .map(|home| Some(PathBuf::from(home).join(".docker")))
                .ok_or_else(|| "--tls-verify needs --cert-path (or DOCKER_CERT_PATH)".to_string()),
        }
    }
}

/// `podmend guard reap`.
#[derive(Debug, Args)]
pub struct GuardReapArgs {
    #[command(flatten)]
    pub upstream: UpstreamArgs,
    /// Kubeconfig for listing pods; default: $KUBECONFIG, ~/.kube/config, or in-cluster.
    #[arg(long, conflicts_with = "older_than")]
    pub kubeconfig: Option<PathBuf>,
    /// List only the pods of this node (a DaemonSet passes spec.nodeName from the downward
    /// API): the node's daemon only runs containers of the node's pods.
    #[arg(long, env = "NODE_NAME", conflicts_with = "older_than")]
    pub node_name: Option<String>,
    /// Without a cluster: remove stopped podmend containers that stopped (or were created,
    /// if never started) at least this long ago: 30m, 2h, 1h30m, 7d.
    #[arg(long, value_parser = parse_duration)]
    pub older_than: Option<Duration>,
    /// Keep running: a pass every DURATION (30s, 5m) until SIGTERM; a failed pass is logged
    /// and the next one tried. Without it: one pass, then exit (1 if a removal failed).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub interval: Option<Duration>,
    /// Image budget: when the daemon's image layers (GET /system/df LayersSize) take more
    /// than this (50Gi, 500Mi, bytes), remove unused images, least recently used first,
    /// until under --images-low. No image pass without it.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, requires = "images_low")]
    pub images_high: Option<u64>,
    /// Image budget: the size to get back under once above --images-high.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, requires = "images_high")]
    pub images_low: Option<u64>,
    /// Image budget: never remove an image created, tagged or first seen less than this long
    /// ago (as the kubelet's imageMinimumGCAge).
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_duration)]
    pub image_min_age: Duration,
    /// Address of a plain-HTTP port serving GET /metrics, /healthz and /readyz (with
    /// --interval).
    #[arg(long, requires = "interval")]
    pub metrics_listen: Option<SocketAddr>,
    /// Print what would be removed and remove nothing.
    #[arg(long)]
    pub dry_run: bool,
}

impl GuardReapArgs {
    /// The options [`guard::reap_command`](crate::guard::reap_command) runs with.
    pub fn options(&self) -> Result<ReapOptions, GuardError> {
        let upstream = self
            .upstream
            .upstream
            .clone()
            .ok_or_else(|| GuardError::Usage("--upstream is required".to_string()))?;
        let upstream_cert_dir = self.upstream.cert_dir().map_err(GuardError::Usage)?;
        let mode = match self.older_than {
            Some(age) => ReapMode::StoppedFor(age),
            None => ReapMode::OwnerGone {
                kubeconfig: self.kubeconfig.clone(),
                node: self.node_name.clone(),
            },
        };
        let image_budget = match (self.images_high, self.images_low) {
            (Some(high), Some(low)) => Some(ImageBudget::new(high, low, self.image_min_age)?),
            _ => None,
        };
        Ok(ReapOptions {
            upstream,
            upstream_cert_dir,
            mode,
            image_budget,
            interval: self.interval,
            metrics_listen: self.metrics_listen,
            dry_run: self.dry_run,
        })
    }
}

/// `podmend clean-storms`: the Failed pods `audit --cluster` reports as a storm, deleted.
#[derive(Debug, Args)]
pub struct CleanStormsArgs {
    /// Kubeconfig context.
    #[arg(long)]
    pub context: Option<String>,
    /// Kubeconfig file; default: $KUBECONFIG, ~/.kube/config, in-cluster.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Only this namespace; default: all namespaces.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Pods per list request.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub page_size: u32,
    /// An owner's Failed pods of one rejection reason are a storm from this many on; smaller
    /// groups are left alone.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..))]
    pub threshold: u64,
    /// Keep the newest this many pods of each storm (by creationTimestamp), for inspection.
    #[arg(long, default_value_t = 5)]
    pub keep: u64,
    /// At most this many deletes per second (a client-side token bucket), so the API server is
    /// never flooded.
    #[arg(long, default_value_t = 10.0, value_parser = parse_rate)]
    pub deletes_per_second: f64,
    /// List the pods that would be deleted, one line each in the order a real run deletes
    /// them, and delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Only this kubelet rejection reason (OutOfcpu, NodeAffinity, …); repeat or separate
    /// with commas for more. Default: every admission rejection.
    #[arg(long = "reason", value_delimiter = ',')]
    pub reasons: Vec<String>,
    /// Push the run's metrics to this Prometheus Pushgateway (http://HOST:PORT), job
    /// podmend-clean-storms.
    #[arg(long, value_name = "URL", env = "PODMEND_PUSHGATEWAY")]
    pub pushgateway: Option<String>,
    /// Write the run's metrics to this file in the Prometheus text format (e.g. for
    /// node_exporter's textfile collector).
    #[arg(long, value_name = "FILE")]
    pub metrics_file: Option<PathBuf>,
}

impl CleanStormsArgs {
    /// The options `podmend clean-storms` runs with; `progress` on stderr (a terminal).
    pub fn options(&self, progress: bool) -> CleanStormsOptions {
        CleanStormsOptions {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            clean: CleanOptions {
                namespace: self.namespace.clone(),
                page_size: self.page_size,
                threshold: usize::try_from(self.threshold).unwrap_or(usize::MAX),
                keep: usize::try_from(self.keep).unwrap_or(usize::MAX),
                deletes_per_second: self.deletes_per_second,
                dry_run: self.dry_run,
                reasons: self.reasons.clone(),
                progress,
            },
            metrics_file: self.metrics_file.clone(),
            pushgateway: self.pushgateway.clone(),
        }
    }
}

/// A rate per second: a positive number up to 10,000.
fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate > 0.0 && rate <= 10_000.0 && rate.is_finite() => Ok(rate),
        _ => Err(format!(
            "{text:?} is not a rate: give a number of deletes per second above 0 and at most 10000"
        )),
    }
}

/// A `--health-token`: one path segment, letters, digits, `-` and `_`.
fn parse_health_token(text: &str) -> Result<String, String> {
    if !text.is_empty()
        && text.len() <= 64
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        Ok(text.to_string())
    } else {
        Err(format!(
            "{text:?} is not a token: use 1 to 64 letters, digits, '-' or '_'"
        ))
    }
}
