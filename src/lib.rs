//! podmend: a Kubernetes admission webhook that repairs pod specs which make clusters fall
//! over, and a dry-run audit that shows the same repairs.
//!
//! Module map:
//! - [`cli`]: the command line (clap) and its conversion into the options each entry point
//!   takes; only `main.rs`, which only dispatches, uses it.
//! - [`config`]: the YAML configuration, its defaults and validation.
//! - [`admission`]: the `admission.k8s.io/v1` AdmissionReview envelope, in and out.
//! - [`audit`]: `podmend audit`, the dry run over manifests and live clusters, and the
//!   PolicyReports / OpenReports it keeps current.
//! - [`storms`]: `podmend clean-storms`, the rate-limited clean-up of rejection storms.
//! - [`engine`]: runs the rules on one object and computes the JSON Patch.
//! - [`target`]: the one table from workload kind to pod-template path.
//! - [`rules`]: the ordered rule registry, one file per rule.
//! - [`quantity`]: Kubernetes resource quantities, parsed exactly.
//! - [`cluster`]: what rules may ask of the cluster (node taints, LimitRanges), and the
//!   watched caches that answer it.
//! - [`dind`]: the Docker-in-Docker contract between the `dind-rm` rule and the guard:
//!   policies, paths, Docker addresses, the guard's command line.
//! - [`guard`]: `podmend guard`, the Docker API proxy of DinD pods, and `guard reap`.
//! - [`server`]: `podmend serve`: the HTTPS webhook, the metrics port, TLS reloading.
//! - [`listen`]: binding the served TCP ports, `[::]` dual-stack.
//! - [`metrics`]: the Prometheus registry.
//! - [`certs`]: `podmend certs`, a development PKI.
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]

pub mod admission;
pub mod audit;
pub mod certs;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod dind;
pub mod engine;
pub mod guard;
pub mod listen;
pub mod metrics;
pub mod quantity;
pub mod rules;
pub mod server;
pub mod storms;
pub mod target;
pub mod telemetry;
