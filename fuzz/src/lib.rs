//! What podmend's fuzz targets check, shared by the targets in `fuzz_targets/` and kept out of
//! them so a crash's input can be replayed through the same code (`cargo fuzz run TARGET FILE`).
//!
//! Every check only asserts what must hold for any input: no panic, answers the API server
//! accepts, patches that apply, a second pass that changes nothing, a guard that judges every
//! request the Docker daemon would route to `POST /containers/create`. A failed assertion is
//! a finding, reported with its input: never weakened to make a run pass.

/// The kube-apiserver's checks as the integration tests play them (`tests/common/`): the
/// fuzz targets judge podmend's answers exactly as the tests do.
#[allow(dead_code, clippy::all)]
#[path = "../../tests/common/k8s_rules.rs"]
pub mod k8s_rules;

pub mod audit;
pub mod guard;
pub mod review;
pub mod structured;
