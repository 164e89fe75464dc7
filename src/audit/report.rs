//! STUB: replaced by the report helper (table, JSON, SARIF, patch renderers).
use super::Report;
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
    Sarif,
    Patch,
    Yaml,
}
pub fn table(_r: &Report, _color: bool) -> String {
    String::new()
}
pub fn json(_r: &Report) -> String {
    String::new()
}
pub fn sarif(_r: &Report, _v: &str) -> String {
    String::new()
}
pub fn patches(_r: &Report) -> String {
    String::new()
}
