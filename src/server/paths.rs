//! Every route podmend serves. The Helm chart's webhook configurations use the same
//! strings (a test checks), so a renamed route cannot silently turn into a 404.

/// The mutating webhook: repairs (`enforce`) and warnings (`warn`).
pub const MUTATE: &str = "/mutate";
/// The validating webhook: rejections (`deny`).
pub const VALIDATE: &str = "/validate";
/// Prometheus metrics, on the plain-HTTP metrics port.
pub const METRICS: &str = "/metrics";
/// Liveness: the process answers.
pub const HEALTHZ: &str = "/healthz";
/// Readiness: certificate loaded, caches synced, not shutting down.
pub const READYZ: &str = "/readyz";
/// The null webhook, served only with `serve --benchmark-null-route`: the same server stack
/// answering `allowed: true` without decoding the body, so the load generator can measure
/// podmend's cost as a ratio to it in one run.
pub const NULL: &str = "/null";
