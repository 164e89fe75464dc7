//! STUB: replaced by the cluster helper.
use super::Report;
use crate::engine::Engine;
use std::path::Path;
#[derive(Debug, thiserror::Error)]
pub enum ClusterAuditError {
    #[error("stub")]
    Stub,
}
pub async fn client_for(
    _k: Option<&Path>,
    _c: Option<&str>,
) -> Result<kube::Client, ClusterAuditError> {
    Err(ClusterAuditError::Stub)
}
pub struct ClusterAuditOptions {
    pub namespace: Option<String>,
    pub page_size: u32,
    pub progress: bool,
}
pub async fn audit_cluster(
    _c: kube::Client,
    _e: &Engine,
    _o: &ClusterAuditOptions,
    _r: &mut Report,
) -> Result<(), ClusterAuditError> {
    Ok(())
}
pub fn policy_reports(_r: &Report) -> Vec<serde_json::Value> {
    vec![]
}
pub async fn apply_policy_reports(
    _c: kube::Client,
    _r: &[serde_json::Value],
) -> Result<usize, ClusterAuditError> {
    Ok(0)
}
