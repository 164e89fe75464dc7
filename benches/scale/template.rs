//! JSON templates rendered by concatenation: an object serialized once with `@@var@@`
//! markers inside its strings, then each copy is the literal pieces with the values put in.
//! Rendering a 3 KB pod is a few copies, so the stand-in can page 100,000 pods without
//! holding them and without spending on JSON what the process under test should get.

use anyhow::Context as _;
use serde_json::Value;

enum Part {
    Literal(Vec<u8>),
    Var(usize),
}

pub struct Template {
    parts: Vec<Part>,
}

impl Template {
    /// `value` serialized, its `@@name@@` markers bound to the positions of `vars`. A value
    /// put in later lands inside a JSON string, so it must need no escaping.
    pub fn new(value: &Value, vars: &[&str]) -> anyhow::Result<Template> {
        let text = serde_json::to_string(value).context("serialize a template")?;
        let mut parts = Vec::new();
        let mut rest = text.as_str();
        while let Some(start) = rest.find("@@") {
            let after = &rest[start + 2..];
            let end = after
                .find("@@")
                .with_context(|| format!("unclosed @@ marker in {}", &rest[start..]))?;
            let name = &after[..end];
            let index = vars
                .iter()
                .position(|v| *v == name)
                .with_context(|| format!("template marker @@{name}@@ is not one of {vars:?}"))?;
            parts.push(Part::Literal(rest.as_bytes()[..start].to_vec()));
            parts.push(Part::Var(index));
            rest = &after[end + 2..];
        }
        parts.push(Part::Literal(rest.as_bytes().to_vec()));
        Ok(Template { parts })
    }

    /// Appends one copy with `values` (in the order of the `vars` given to [`Template::new`]).
    pub fn render(&self, out: &mut Vec<u8>, values: &[&str]) {
        for part in &self.parts {
            match part {
                Part::Literal(bytes) => out.extend_from_slice(bytes),
                Part::Var(i) => out.extend_from_slice(values[*i].as_bytes()),
            }
        }
    }
}
