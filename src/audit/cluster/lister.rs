//! Paginated lists (`limit` and `continue`), with progress on a terminal: how `audit
//! --cluster`, the report clean-up and `clean-storms` read the cluster, never a whole
//! collection in one answer.

use std::fmt::Debug;
use std::io::Write as _;

use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

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
    /// The API of `resource` in the lister's namespace, or across all namespaces.
    pub fn dynamic_api(&self, client: &Client, resource: &ApiResource) -> Api<DynamicObject> {
        match self.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
            None => Api::all_with(client.clone(), resource),
        }
    }

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
        mut each: impl FnMut(K),
    ) -> Result<(usize, usize), ClusterAuditError>
    where
        K: Resource + Clone + DeserializeOwned + Debug,
    {
        let scope = self.scope(what);
        let mut params = params.limit(self.page_size.max(1));
        params.continue_token = None;
        let mut count = 0usize;
        let mut requests = 0usize;
        self.show(what, count);
        loop {
            requests += 1;
            let page = api
                .list(&params)
                .await
                .map_err(|error| list_error(what, &scope, self.needs, error))?;
            for item in page.items {
                each(item);
                count += 1;
            }
            self.show(what, count);
            match page.metadata.continue_.filter(|token| !token.is_empty()) {
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
