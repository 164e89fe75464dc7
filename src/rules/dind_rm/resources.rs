//! The guard's resources: every build context and image a pod's docker commands send passes
//! through it, so it gets a real cpu request and a cpu limit wide enough not to throttle the
//! pipeline (`guardCpuLimit`, one core by default: a namespace whose ResourceQuota covers
//! `limits.cpu` refuses a pod with a container without one), a memory request and a memory
//! limit; all moved into the namespace's Container LimitRanges, which LimitRanger enforces
//! after the webhook.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{LimitRangeItem, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::super::agent_requests::{format_quantity, is_byte_resource, limit_range_floor};
use crate::quantity::{self, Milli};

/// The guard's own requests and limits, `cpu_limit` (empty: none) its cpu limit:
/// (resource, request, limit).
fn own_resources(cpu_limit: &str) -> [(&'static str, &'static str, Option<&str>); 2] {
    let cpu_limit = (!cpu_limit.is_empty()).then_some(cpu_limit);
    [
        ("cpu", "100m", cpu_limit),
        ("memory", "32Mi", Some("128Mi")),
    ]
}

/// The guard's own resources (with `cpu_limit`, empty for none) moved into the namespace's
/// Container LimitRanges: a limit no higher than a `max`, and one wherever a
/// `maxLimitRequestRatio` needs it; a request no lower than a `min` or than the ratio allows.
pub(super) fn guard_resources(
    limit_ranges: &[LimitRangeItem],
    cpu_limit: &str,
) -> ResourceRequirements {
    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    for (name, own_request, own_limit) in own_resources(cpu_limit) {
        let tightest = |field: fn(&LimitRangeItem) -> Option<&BTreeMap<String, Quantity>>| {
            limit_ranges
                .iter()
                .filter_map(|item| field(item)?.get(name))
                .filter_map(|q| quantity::parse_milli(&q.0))
                .min()
        };
        let max = tightest(|item| item.max.as_ref());
        let ratio = tightest(|item| item.max_limit_request_ratio.as_ref());
        let own_request_milli = quantity::parse_milli(own_request).unwrap_or(0);
        let own_limit_milli = own_limit.and_then(quantity::parse_milli);
        let mut request = own_request_milli.max(limit_range_floor(name, None, limit_ranges));
        let mut limit = own_limit_milli.map(|l| l.max(request));
        if let Some(max) = max {
            limit = Some(limit.map_or(max, |l| l.min(max)));
        }
        if let (None, Some(ratio)) = (limit, ratio) {
            let widest = request.saturating_mul(ratio) / 1000;
            limit = Some(if is_byte_resource(name) {
                widest / 1000 * 1000
            } else {
                widest
            });
        }
        request = request.max(limit_range_floor(name, limit, limit_ranges));
        if let Some(limit) = limit {
            request = request.min(limit);
        }
        let spelled = |milli: Milli, own: &str, own_milli: Option<Milli>| {
            Quantity(if own_milli == Some(milli) {
                own.to_string()
            } else {
                format_quantity(name, milli)
            })
        };
        requests.insert(
            name.to_string(),
            spelled(request, own_request, Some(own_request_milli)),
        );
        if let Some(limit) = limit {
            limits.insert(
                name.to_string(),
                spelled(limit, own_limit.unwrap_or(""), own_limit_milli),
            );
        }
    }
    ResourceRequirements {
        requests: Some(requests),
        limits: Some(limits),
        ..ResourceRequirements::default()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The guard's resources (cpu limit `cpu_limit`) within the LimitRange items `items`,
    /// as JSON.
    fn resources_with(items: serde_json::Value, cpu_limit: &str) -> serde_json::Value {
        let items: Vec<LimitRangeItem> = serde_json::from_value(items).expect("items");
        serde_json::to_value(guard_resources(&items, cpu_limit)).expect("serializes")
    }

    /// The same without a cpu limit of its own.
    fn resources_within(items: serde_json::Value) -> serde_json::Value {
        resources_with(items, "")
    }

    #[test]
    fn without_a_limit_range_the_guard_gets_its_own_resources() {
        let resources = resources_with(json!([]), "1");
        assert_eq!(
            resources,
            json!({"requests": {"cpu": "100m", "memory": "32Mi"},
                "limits": {"cpu": "1", "memory": "128Mi"}})
        );
        let resources = resources_within(json!([]));
        assert_eq!(
            resources,
            json!({"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}})
        );
    }

    #[test]
    fn a_limit_range_max_below_the_configured_cpu_limit_lowers_it() {
        let resources = resources_with(json!([{"type": "Container", "max": {"cpu": "500m"}}]), "1");
        assert_eq!(resources["limits"]["cpu"], "500m");
        assert_eq!(resources["requests"]["cpu"], "100m");
    }

    #[test]
    fn the_guard_resources_meet_the_namespace_limit_range() {
        let resources = resources_within(json!([
            {"type": "Container", "min": {"cpu": "200m", "memory": "100Mi"}, "max": {"memory": "200Mi"}},
            {"type": "Container", "maxLimitRequestRatio": {"cpu": "4"}}
        ]));
        assert_eq!(
            resources,
            json!({"requests": {"cpu": "200m", "memory": "104857600"},
                "limits": {"cpu": "800m", "memory": "128Mi"}})
        );
    }

    #[test]
    fn a_limit_range_max_below_the_request_lowers_the_request_to_it() {
        let resources = resources_within(json!([
            {"type": "Container", "max": {"cpu": "50m", "memory": "16Mi"}}
        ]));
        assert_eq!(
            resources,
            json!({"requests": {"cpu": "50m", "memory": "16777216"},
                "limits": {"cpu": "50m", "memory": "16777216"}})
        );
    }
}
