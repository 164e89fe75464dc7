//! The CA bundle in the webhook configurations: `webhooks[*].clientConfig.caBundle` of every
//! configuration `--webhook-configurations` names, set by JSON Patch, each webhook guarded by
//! a `test` of its name so that a configuration edited meanwhile is not patched blindly.

use axum::http::Request;
use kube::Client;
use serde_json::{Value, json};

use super::{SelfTlsError, is_code};

/// A webhook configuration kind: its `kind` and its resource (plural).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WebhookKind {
    kind: &'static str,
    plural: &'static str,
}

const KINDS: [WebhookKind; 2] = [
    WebhookKind {
        kind: "MutatingWebhookConfiguration",
        plural: "mutatingwebhookconfigurations",
    },
    WebhookKind {
        kind: "ValidatingWebhookConfiguration",
        plural: "validatingwebhookconfigurations",
    },
];

/// The kinds an entry of `--webhook-configurations` may be, and its name: `PLURAL/NAME` is
/// that kind only, a bare `NAME` (or an unknown plural) either kind.
fn kinds_and_name(entry: &str) -> (Vec<WebhookKind>, String) {
    let qualified = entry.split_once('/').and_then(|(plural, name)| {
        KINDS
            .iter()
            .find(|kind| kind.plural == plural)
            .map(|kind| (vec![*kind], name.to_string()))
    });
    qualified.unwrap_or_else(|| (KINDS.to_vec(), entry.to_string()))
}

/// Sets the caBundle of every webhook of each configuration in `entries` to `encoded`
/// (base64 of the PEM bundle); true when some configuration did not have it yet. An entry
/// that names no configuration of any of its kinds is an error, and so is a patch whose
/// stored result does not carry the bundle in every webhook.
pub(super) async fn patch_ca_bundles(
    client: &Client,
    entries: &[String],
    encoded: &str,
) -> Result<bool, SelfTlsError> {
    let mut changed = false;
    for entry in entries {
        let (kinds, name) = kinds_and_name(entry);
        let mut found = false;
        for kind in kinds {
            match patch_ca_bundle(client, kind, &name, encoded).await? {
                Patched::NotFound => {}
                Patched::Unchanged => found = true,
                Patched::Changed => (found, changed) = (true, true),
            }
        }
        if !found {
            return Err(SelfTlsError::WebhookNotFound { name });
        }
    }
    Ok(changed)
}

/// What patching one configuration did.
enum Patched {
    NotFound,
    /// Every webhook had the bundle already.
    Unchanged,
    /// The API server stored the bundle in every webhook.
    Changed,
}

/// Patches one configuration.
async fn patch_ca_bundle(
    client: &Client,
    kind: WebhookKind,
    name: &str,
    encoded: &str,
) -> Result<Patched, SelfTlsError> {
    let url = format!(
        "/apis/admissionregistration.k8s.io/v1/{}/{name}",
        kind.plural
    );
    let failed = |action: &'static str| {
        move |source| SelfTlsError::Webhook {
            action,
            kind: kind.kind,
            name: name.to_string(),
            source: Box::new(source),
        }
    };
    let bad_name = || SelfTlsError::WebhookName {
        name: name.to_string(),
    };
    let get = Request::get(&url)
        .body(Vec::new())
        .map_err(|_| bad_name())?;
    let object: Value = match client.request(get).await {
        Ok(object) => object,
        Err(e) if is_code(&e, 404) => return Ok(Patched::NotFound),
        Err(e) => return Err(failed("read")(e)),
    };
    let ops = ca_bundle_patch(&object, encoded);
    if ops.is_empty() {
        return Ok(Patched::Unchanged);
    }
    let body = serde_json::to_vec(&ops).unwrap_or_default();
    let patch = Request::patch(&url)
        .header("Content-Type", "application/json-patch+json")
        .body(body)
        .map_err(|_| bad_name())?;
    // The answer is the configuration as stored: it must carry the bundle everywhere.
    let stored: Value = client.request(patch).await.map_err(failed("patch"))?;
    if !ca_bundle_patch(&stored, encoded).is_empty() {
        return Err(SelfTlsError::CaBundleNotStored {
            kind: kind.kind,
            name: name.to_string(),
        });
    }
    tracing::info!(
        kind = kind.kind,
        name = %name,
        webhooks = ops.len() / 2,
        "caBundle updated"
    );
    Ok(Patched::Changed)
}

/// The JSON Patch that sets `encoded` as the caBundle of every webhook of `configuration`
/// that does not have it yet, each `add` behind a `test` of the webhook's name; empty when
/// every webhook has it.
fn ca_bundle_patch(configuration: &Value, encoded: &str) -> Vec<Value> {
    let webhooks = configuration
        .get("webhooks")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut ops = Vec::new();
    for (i, webhook) in webhooks.iter().enumerate() {
        if webhook
            .pointer("/clientConfig/caBundle")
            .and_then(Value::as_str)
            == Some(encoded)
        {
            continue;
        }
        ops.push(json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": webhook.get("name")}));
        ops.push(json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": encoded}));
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_qualified_entry_is_that_kind_only_and_a_bare_name_either() {
        let (kinds, name) = kinds_and_name("validatingwebhookconfigurations/podmend");
        assert_eq!(name, "podmend");
        assert_eq!(kinds, [KINDS[1]]);
        let (kinds, name) = kinds_and_name("podmend");
        assert_eq!(name, "podmend");
        assert_eq!(kinds, KINDS);
    }

    #[test]
    fn only_webhooks_without_the_bundle_are_patched_each_behind_a_test_of_its_name() {
        let configuration = json!({"webhooks": [
            {"name": "a", "clientConfig": {"caBundle": "bmV3"}},
            {"name": "b", "clientConfig": {"caBundle": "b2xk"}},
            {"name": "c", "clientConfig": {}},
        ]});
        assert_eq!(
            ca_bundle_patch(&configuration, "bmV3"),
            [
                json!({"op": "test", "path": "/webhooks/1/name", "value": "b"}),
                json!({"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": "bmV3"}),
                json!({"op": "test", "path": "/webhooks/2/name", "value": "c"}),
                json!({"op": "add", "path": "/webhooks/2/clientConfig/caBundle", "value": "bmV3"}),
            ]
        );
        assert!(ca_bundle_patch(&json!({"webhooks": []}), "bmV3").is_empty());
    }
}
