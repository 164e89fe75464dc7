//! The DinD contract end to end: a guard command line written by [`GuardCommand::to_args`]
//! (what the dind-rm rule injects) is read back by the real command-line parser into the same
//! value, for every setting.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use podmend::cli::{Cli, Command};
use podmend::dind::{Address, GuardCommand, Policy};

/// Parses `args` as the guard container's arguments (its entrypoint is `podmend`).
fn parse(args: &[String]) -> GuardCommand {
    let argv = std::iter::once("podmend".to_string())
        .chain(args.iter().cloned())
        .chain(["--owner-pod-uid".to_string(), "uid".to_string()]);
    let cli = Cli::try_parse_from(argv)
        .unwrap_or_else(|error| panic!("podmend {} does not parse: {error}", args.join(" ")));
    let Command::Guard(guard) = cli.command else {
        panic!("not podmend guard: {args:?}");
    };
    assert!(guard.command.is_none(), "{args:?} is not the proxy");
    guard
        .run
        .command()
        .unwrap_or_else(|error| panic!("{args:?}: {error}"))
}

fn tcp(host: &str, port: u16) -> Address {
    Address::Tcp {
        host: host.to_string(),
        port,
    }
}

fn unix(path: &str) -> Address {
    Address::Unix(PathBuf::from(path))
}

fn every_setting() -> Vec<GuardCommand> {
    let base = GuardCommand::new(
        vec![unix("/podmend/guard/docker.sock")],
        tcp("docker", 2375),
        Policy::default(),
    );
    let mut commands = Vec::new();
    for policy in Policy::ALL {
        commands.push(GuardCommand {
            policy,
            ..base.clone()
        });
    }
    commands.push(GuardCommand {
        listen: vec![
            unix("/var/run/docker.sock"),
            tcp("0.0.0.0", 2376),
            tcp("::", 2375),
        ],
        tls_certdir: Some(PathBuf::from("/certs")),
        tls_san: vec!["docker".into(), "$(POD_IP)".into(), "10.0.0.7".into()],
        upstream: unix("/podmend/daemon/docker.sock"),
        ..base.clone()
    });
    commands.push(GuardCommand {
        upstream: tcp("127.0.0.1", 2376),
        upstream_cert_path: Some(PathBuf::from("/certs/client")),
        ..base.clone()
    });
    commands.push(GuardCommand {
        min_age: Duration::from_secs(90),
        max_exited: 3,
        health_listen: Some("0.0.0.0:9797".parse().expect("address")),
        ..base.clone()
    });
    commands.push(GuardCommand {
        min_age: Duration::from_secs(0),
        max_exited: 0,
        upstream_wait: Duration::from_secs(0),
        ..base.clone()
    });
    commands.push(GuardCommand {
        upstream_wait: Duration::from_secs(300),
        ..base
    });
    commands
}

#[test]
fn every_guard_command_line_parses_back_to_what_was_written() {
    for command in every_setting() {
        let args = command.to_args();
        assert_eq!(args[0], "guard");
        assert_eq!(parse(&args), command, "{}", args.join(" "));
    }
}

#[test]
fn every_value_is_joined_to_its_flag_so_none_can_read_as_a_flag() {
    for command in every_setting() {
        for arg in command.to_args().iter().skip(1) {
            assert!(
                arg.starts_with("--") && (arg.contains('=') || arg == "--tls-verify"),
                "{arg}"
            );
        }
    }
}
