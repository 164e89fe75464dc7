//! Paginated lists (`limit` and `continue`), with progress on a terminal: how `audit
//! --cluster`, the report clean-up and `clean-storms` read the cluster, never a whole
//! collection in one answer. A list whose continue token expires (410 Gone) goes on with the
//! token the API server gives for the rest, and says so on stderr.

use std::fmt::{self, Debug};
use std::future::Future;
use std::io::Write as _;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::{Client, Resource};
use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::{Map, Value};

use super::client::{ClusterAuditError, list_error};
use super::thousands;

/// Lists page by page, reporting progress.
#[derive(Debug, Clone)]
pub(crate) struct Lister<'a> {
    /// Objects per list request (`limit`); at least 1.
    pub page_size: u32,
    /// Only this namespace; `None` for all namespaces.
    pub namespace: Option<&'a str>,
    /// Write `\rlisting pods… N` to stderr while listing.
    pub progress: bool,
    /// What the command needs when a list is forbidden (the end of the 403 message).
    pub needs: &'static str,
}

impl Lister<'_> {
    /// Calls `each` on every object of `api`, `page_size` at a time, following `continue`.
    pub async fn list<K>(
        &self,
        api: Api<K>,
        what: &str,
        each: impl FnMut(K),
    ) -> Result<usize, ClusterAuditError>
    where
        K: Resource + Clone + DeserializeOwned + Debug,
    {
        Ok(self
            .list_with(api, what, ListParams::default(), each)
            .await?
            .0)
    }

    /// [`Self::list`] with label and field selectors in `params` (its `limit` and `continue`
    /// are the lister's); returns the objects listed and the list requests sent.
    pub async fn list_with<K>(
        &self,
        api: Api<K>,
        what: &str,
        params: ListParams,
        each: impl FnMut(K),
    ) -> Result<(usize, usize), ClusterAuditError>
    where
        K: Resource + Clone + DeserializeOwned + Debug,
    {
        let fetch = |params: ListParams| {
            let api = api.clone();
            async move {
                let page = api.list(&params).await?;
                Ok((page.items, page.metadata.continue_))
            }
        };
        self.pages(what, params, fetch, each).await
    }

    /// Calls `each` on every object of `resource` (a kind the Rust types need not know) as the
    /// JSON the API server shows for it alone: `apiVersion` and `kind` set, `managedFields`
    /// dropped (no rule reads them). Each list page is read straight into `Value`s: read as
    /// kube's `DynamicObject`, every object was buffered whole by serde's `flatten` and its
    /// metadata typed and written back, and `audit --cluster` took 1.15–1.4× the CPU
    /// (BENCHMARKS.md, issue 17, twenty-second pass). Returns what [`Self::list_with`]
    /// returns.
    pub async fn list_json(
        &self,
        client: &Client,
        resource: &ApiResource,
        what: &str,
        params: ListParams,
        mut each: impl FnMut(Value),
    ) -> Result<(usize, usize), ClusterAuditError> {
        let url = DynamicObject::url_path(resource, self.namespace);
        let fetch = |params: ListParams| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let request = kube::core::Request::new(url)
                    .list(&params)
                    .map_err(kube::Error::BuildRequest)?;
                let page: JsonPage = client.request(request).await?;
                Ok((page.items, page.metadata.continue_))
            }
        };
        let api_version = Value::from(resource.api_version.as_str());
        let kind = Value::from(resource.kind.as_str());
        self.pages(what, params, fetch, |item: ListedObject| {
            let mut object = Map::with_capacity(item.0.len() + 2);
            object.insert("apiVersion".into(), api_version.clone());
            object.insert("kind".into(), kind.clone());
            for (key, value) in item.0 {
                if key != "apiVersion" && key != "kind" {
                    object.insert(key, value);
                }
            }
            each(Value::Object(object));
        })
        .await
    }

    /// Fetches page after page with `fetch`, `page_size` at a time, following `continue`, and
    /// calls `each` on every item; returns the items and the list requests sent.
    async fn pages<T, Page>(
        &self,
        what: &str,
        params: ListParams,
        mut fetch: impl FnMut(ListParams) -> Page,
        mut each: impl FnMut(T),
    ) -> Result<(usize, usize), ClusterAuditError>
    where
        Page: Future<Output = Result<(Vec<T>, Option<String>), kube::Error>>,
    {
        let scope = self.scope(what);
        let mut params = params.limit(self.page_size.max(1));
        params.continue_token = None;
        let mut count = 0usize;
        let mut requests = 0usize;
        self.show(what, count);
        let mut expired = 0;
        loop {
            requests += 1;
            let (items, continue_token) = match fetch(params.clone()).await {
                Ok(page) => page,
                Err(error) => match token_after_expiry(&error, &params) {
                    Some(token) if expired < MAX_EXPIRED => {
                        expired += 1;
                        eprintln!("{}", going_on_after_expiry(what, &scope));
                        params = params.continue_token(&token);
                        continue;
                    }
                    _ => return Err(list_error(what, &scope, self.needs, error)),
                },
            };
            for item in items {
                each(item);
                count += 1;
            }
            self.show(what, count);
            match continue_token.filter(|token| !token.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        Ok((count, requests))
    }

    /// `in namespace ci`, `in all namespaces`, or `of the cluster` for cluster-scoped kinds.
    pub fn scope(&self, what: &str) -> String {
        match (what, self.namespace) {
            ("nodes", _) => "of the cluster".to_string(),
            (_, Some(ns)) => format!("in namespace {ns}"),
            (_, None) => "in all namespaces".to_string(),
        }
    }

    fn show(&self, what: &str, count: usize) {
        if self.progress {
            let line = format!("listing {what}… {}", thousands(count));
            let mut stderr = std::io::stderr().lock();
            // Pad so a shorter line covers a longer one before it; progress is best effort.
            let _ = write!(stderr, "\r{line:<40}");
            let _ = stderr.flush();
        }
    }
}

/// Expired continue tokens one list goes on from, at most: each expiry means a page took
/// longer than the API server keeps the list's snapshot, and a list that keeps expiring is
/// better run again than patched together from ever newer states.
const MAX_EXPIRED: usize = 3;

/// The token to go on with when `error` is a 410 Gone on a continued list that carries one.
///
/// When the etcd revision a `continue` token reads at has been compacted, the API server
/// answers 410 (`ResourceExpired`) and puts in the Status' `metadata.continue` a token for the
/// rest of the list at the latest revision (`handleCompactedErrorForPaging` in
/// `k8s.io/apiserver/pkg/storage/etcd3/store.go`; its message says so: "use the continue token
/// in this response to retrieve the remainder of the results"). Going on with it lists every
/// object after the last one listed, as it is now: no object twice, none of the pages already
/// read again.
fn token_after_expiry(error: &kube::Error, params: &ListParams) -> Option<String> {
    match error {
        kube::Error::Api(status) if status.code == 410 && params.continue_token.is_some() => status
            .metadata
            .as_ref()
            .and_then(|meta| meta.continue_.clone())
            .filter(|token| !token.is_empty()),
        _ => None,
    }
}

/// The log line for a list that goes on after its continue token expired.
fn going_on_after_expiry(what: &str, scope: &str) -> String {
    format!(
        "podmend: listing {what} {scope}: the continue token expired (410 Gone: the API server no longer keeps the list's snapshot); going on with the token it gave, from the object after the last one listed, as the cluster is now (objects created or deleted meanwhile may or may not be listed)"
    )
}

/// A list page as [`Lister::list_json`] reads it: the list's metadata and its items.
#[derive(Deserialize)]
struct JsonPage {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default)]
    items: Vec<ListedObject>,
}

/// One listed object's fields, its metadata without `managedFields`, which are passed over
/// unread rather than built and dropped.
struct ListedObject(Map<String, Value>);

impl<'de> Deserialize<'de> for ListedObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_map(FieldsVisitor { top: true })
            .map(ListedObject)
    }
}

/// The fields of a listed object (`top`), or of its metadata, whose `managedFields` it skips.
struct FieldsVisitor {
    top: bool,
}

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = Map<String, Value>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if self.top && key == "metadata" {
                let metadata = map.next_value::<Metadata>()?;
                fields.insert(key, metadata.0);
            } else if !self.top && key == "managedFields" {
                map.next_value::<IgnoredAny>()?;
            } else {
                fields.insert(key, map.next_value()?);
            }
        }
        Ok(fields)
    }
}

/// An object's metadata as JSON, without `managedFields`: an object, or `null` as it came;
/// anything else is an error, as it is for the API's own types.
struct Metadata(Value);

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(MetadataVisitor).map(Metadata)
    }
}

struct MetadataVisitor;

impl<'de> Visitor<'de> for MetadataVisitor {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("an object's metadata")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        FieldsVisitor { top: false }
            .visit_map(map)
            .map(Value::Object)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn page(items: Value) -> JsonPage {
        let body = json!({"metadata": {"continue": "next"}, "items": items});
        serde_json::from_value(body).expect("a list page")
    }

    #[test]
    fn a_listed_object_keeps_every_field_but_its_managed_fields() {
        let listed = page(json!([{
            "metadata": {
                "name": "a",
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
                "labels": {"app": "a"},
                "somethingNew": 1
            },
            "spec": {"containers": [{"name": "c", "futureField": true}]},
            "status": {"phase": "Running"}
        }]));
        assert_eq!(listed.metadata.continue_.as_deref(), Some("next"));
        let [object] = &listed.items[..] else {
            panic!("one item");
        };
        assert_eq!(
            Value::Object(object.0.clone()),
            json!({
                "metadata": {"name": "a", "labels": {"app": "a"}, "somethingNew": 1},
                "spec": {"containers": [{"name": "c", "futureField": true}]},
                "status": {"phase": "Running"}
            })
        );
    }

    #[test]
    fn managed_fields_are_dropped_only_from_the_metadata() {
        let listed = page(json!([{"metadata": null, "spec": {"managedFields": 1}}]));
        assert_eq!(
            Value::Object(listed.items[0].0.clone()),
            json!({"metadata": null, "spec": {"managedFields": 1}})
        );
    }

    #[test]
    fn metadata_that_is_not_an_object_is_refused_as_the_api_types_refuse_it() {
        let body = json!({"items": [{"metadata": "a"}]});
        assert!(serde_json::from_value::<JsonPage>(body).is_err());
    }

    #[test]
    fn a_page_without_items_or_metadata_is_an_empty_last_page() {
        let listed: JsonPage = serde_json::from_value(json!({"kind": "PodList"})).expect("a page");
        assert!(listed.items.is_empty());
        assert_eq!(listed.metadata.continue_, None);
    }
}
