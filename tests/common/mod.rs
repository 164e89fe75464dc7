//! Helpers shared by the integration tests: each test file is one surface of podmend.
#![allow(dead_code)]

pub mod api_stub;
pub mod chart;
pub mod control_plane;
pub mod crd_schema;
pub mod dind;
pub mod dockerd;
pub mod guard;
pub mod k8s_rules;
pub mod net;
pub mod netns;
pub mod pod_gen;
pub mod python;
pub mod raw_http;
pub mod schema;
pub mod server;
pub mod spawn;
pub mod storm;
pub mod tls;
pub mod yaml_readers;
