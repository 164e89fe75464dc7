//! The `podmend` binary: parse the command line, set up logging, dispatch.

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use podmend::cli::{Cli, Command, GuardSubcommand};
use podmend::config::{Config, DEFAULT_CONFIG_YAML};
use podmend::guard::{self, GuardOptions};
use podmend::server::{self, ServeOptions};
use podmend::{audit, certs, storms, telemetry};

fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    match run(cli.command) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("podmend: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The `--tls-self-manage` settings, resolved (namespace, DNS names).
fn self_tls_options(
    args: &podmend::cli::ServeArgs,
) -> anyhow::Result<Option<server::selftls::SelfTlsOptions>> {
    let t = &args.self_tls;
    if !t.tls_self_manage {
        return Ok(None);
    }
    let namespace = server::selftls::namespace(t.tls_namespace.clone())?;
    let dns_names =
        server::selftls::dns_names(&t.tls_service_dns, t.tls_service.as_deref(), &namespace)?;
    if t.tls_renew_before_days >= t.tls_validity_days {
        anyhow::bail!(
            "--tls-renew-before-days ({}) must be less than --tls-validity-days ({})",
            t.tls_renew_before_days,
            t.tls_validity_days
        );
    }
    const DAY: u64 = 86_400;
    Ok(Some(server::selftls::SelfTlsOptions {
        namespace,
        secret: t.tls_secret.clone().unwrap_or_default(),
        webhook_configurations: t.webhook_configurations.clone(),
        dns_names,
        renew_before: Duration::from_secs(u64::from(t.tls_renew_before_days) * DAY),
        validity: Duration::from_secs(u64::from(t.tls_validity_days) * DAY),
        check_interval: Duration::from_secs(t.tls_check_seconds),
        cert_path: args.tls_cert.clone(),
        key_path: args.tls_key.clone(),
    }))
}

fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(args) => {
            // One process-wide crypto provider, so every rustls user (kube's client too) agrees.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let self_tls = self_tls_options(&args)?;
            let options = ServeOptions {
                listen: args.listen,
                metrics_listen: args.metrics_listen,
                tls_cert: args.tls_cert,
                tls_key: args.tls_key,
                config: args.config,
                kubeconfig: args.kubeconfig,
                reload_interval: Duration::from_secs(args.reload_seconds),
                shutdown_timeout: Duration::from_secs(args.shutdown_seconds),
                shutdown_delay: Duration::from_secs(args.shutdown_delay_seconds),
                cache_stale_after: Duration::from_secs(args.cache_stale_seconds),
                self_tls,
                benchmark_null_route: args.benchmark_null_route,
                client_ca: args.client_ca,
            };
            let runtime =
                tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
            runtime.block_on(server::serve(options, shutdown_signal()))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Audit(args) => {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let terminal = audit::Terminal {
                color: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
                progress: std::io::stderr().is_terminal(),
            };
            let runtime =
                tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
            let mut stdout = std::io::stdout().lock();
            let status = runtime.block_on(audit::run(&args, &mut stdout, terminal))?;
            Ok(ExitCode::from(status))
        }
        Command::CleanStorms(args) => {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let runtime =
                tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
            let mut stdout = std::io::stdout().lock();
            let progress = std::io::stderr().is_terminal();
            let succeeded =
                runtime.block_on(storms::clean_command(&args, progress, &mut stdout))?;
            Ok(if succeeded {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Guard(args) => {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let runtime =
                tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
            match args.command {
                Some(GuardSubcommand::Reap(reap)) => {
                    let mut stdout = std::io::stdout().lock();
                    let report = runtime.block_on(guard::reap_command(
                        &reap.options()?,
                        &mut stdout,
                        shutdown_signal(),
                    ))?;
                    Ok(if report.failed > 0 {
                        ExitCode::FAILURE
                    } else {
                        ExitCode::SUCCESS
                    })
                }
                None => {
                    let command = args.run.command().map_err(anyhow::Error::msg)?;
                    let options = GuardOptions::new(
                        command,
                        args.run.owner_pod_uid.as_deref().unwrap_or(""),
                        Duration::from_secs(args.run.shutdown_seconds),
                    )?;
                    runtime.block_on(guard::run(options, shutdown_signal()))?;
                    Ok(ExitCode::SUCCESS)
                }
            }
        }
        Command::Certs(args) => {
            let pki = certs::generate(&args.dns, args.days)?;
            pki.write_to(&args.out)?;
            println!(
                "wrote {dir}/ca.crt, {dir}/tls.crt, {dir}/tls.key (valid {days} days for {names})",
                dir = args.out.display(),
                days = args.days,
                names = args.dns.join(", ")
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Config(args) => match args.check {
            None => {
                print!("{DEFAULT_CONFIG_YAML}");
                Ok(ExitCode::SUCCESS)
            }
            Some(path) => match Config::from_file(&path) {
                Ok(_) => {
                    println!("{}: valid", path.display());
                    Ok(ExitCode::SUCCESS)
                }
                Err(error) => {
                    eprintln!("podmend: {error}");
                    Ok(ExitCode::FAILURE)
                }
            },
        },
    }
}

/// Resolves on SIGTERM (the kubelet stopping the pod) or Ctrl-C.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
