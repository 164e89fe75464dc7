//! `charts/podmend` rendered with Helm's own engine (helm-python-sdk, `chart_render.py`
//! beside this file), for tests that run what the chart deploys.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::python::run_script;

/// One rendered object and the template it came from.
#[derive(Debug, Clone, Deserialize)]
pub struct Rendered {
    pub template: String,
    pub object: Value,
}

/// A whole render.
#[derive(Debug, Clone, Deserialize)]
pub struct Render {
    /// Template name → rendered text (comments kept).
    pub templates: BTreeMap<String, String>,
    pub objects: Vec<Rendered>,
    /// The chart's defaults with the given values on top.
    pub values: Value,
}

impl Render {
    /// Every object but `helm test` hooks: what `helm install` creates.
    pub fn installed(&self) -> Vec<&Value> {
        self.objects
            .iter()
            .map(|r| &r.object)
            .filter(|o| {
                o.pointer("/metadata/annotations/helm.sh~1hook")
                    .and_then(Value::as_str)
                    != Some("test")
            })
            .collect()
    }

    /// The installed objects of `kind`.
    pub fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.installed()
            .into_iter()
            .filter(|o| o["kind"] == kind)
            .collect()
    }
}

/// Renders the chart with `values` as release `name` in `namespace`.
pub fn render(values: &Value, name: &str, namespace: &str) -> Render {
    try_render(values, name, namespace)
        .unwrap_or_else(|error| panic!("rendering the chart failed: {error}"))
}

/// Renders the chart with `values` as release `name` in `namespace`, or says why Helm
/// refused: the schema's or a template's (`fail`) message, as Helm's error gives it.
pub fn try_render(values: &Value, name: &str, namespace: &str) -> Result<Render, String> {
    let output = run_script(
        &["helm_python", "yaml"],
        "chart_render.py",
        values,
        &[name, namespace],
    );
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&output.stdout).expect("the render as JSON"))
}
