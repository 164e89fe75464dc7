//! Proves that the API-server stand-ins in `tests/common` can fail: each checker is run on
//! vectors it must accept and vectors it must reject (K8S-FACTS.md "Test-vector checklist").

mod common;

use common::k8s_rules::*;
use common::schema::validate_with_schema;
use serde_json::{Value, json};

fn pod_with_spec(spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec})
}

fn spec_with_container_resources(resources: Value) -> Value {
    json!({"containers": [{"name": "c", "image": "busybox", "resources": resources}]})
}

fn spec_with_required_terms(terms: Value) -> Value {
    json!({
        "containers": [{"name": "c", "image": "busybox"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms
        }}}
    })
}

/// Runs `validate_pod_spec_with_defaults` over a table and reports every mismatch at once.
fn check_table(cases: &[(&str, Value, bool)]) {
    let mut failures = Vec::new();
    for (what, spec, valid) in cases {
        let errs = validate_pod_spec_with_defaults(spec);
        if errs.is_empty() != *valid {
            failures.push(format!(
                "{what}: expected {}, got {errs:?}",
                if *valid { "valid" } else { "invalid" }
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn field_req(key: &str, operator: &str, values: &[&str]) -> Value {
    json!({"key": key, "operator": operator, "values": values})
}

// ---------------------------------------------------------------- node affinity (§1)

#[test]
fn node_affinity_vectors_are_judged_as_the_api_server_judges_them() {
    check_table(&[
        (
            "empty nodeSelectorTerms",
            spec_with_required_terms(json!([])),
            false,
        ),
        (
            "one empty term {}",
            spec_with_required_terms(json!([{}])),
            true,
        ),
        (
            "matchFields metadata.name In [one node]",
            spec_with_required_terms(
                json!([{"matchFields": [field_req("metadata.name", "In", &["node-1"])]}]),
            ),
            true,
        ),
        (
            "matchFields metadata.name NotIn [one node]",
            spec_with_required_terms(
                json!([{"matchFields": [field_req("metadata.name", "NotIn", &["node-1"])]}]),
            ),
            true,
        ),
        (
            "matchFields key other than metadata.name",
            spec_with_required_terms(
                json!([{"matchFields": [field_req("metadata.labels", "In", &["node-1"])]}]),
            ),
            false,
        ),
        (
            "matchFields operator Exists",
            spec_with_required_terms(
                json!([{"matchFields": [field_req("metadata.name", "Exists", &["node-1"])]}]),
            ),
            false,
        ),
        (
            "matchFields with two values",
            spec_with_required_terms(
                json!([{"matchFields": [field_req("metadata.name", "In", &["a", "b"])]}]),
            ),
            false,
        ),
        (
            "matchFields value that is not a DNS subdomain",
            spec_with_required_terms(
                json!([{"matchFields": [field_req("metadata.name", "In", &["Node_1"])]}]),
            ),
            false,
        ),
        (
            "matchExpressions In without values",
            spec_with_required_terms(
                json!([{"matchExpressions": [field_req("kubernetes.io/hostname", "In", &[])]}]),
            ),
            false,
        ),
        (
            "matchExpressions Exists with values",
            spec_with_required_terms(
                json!([{"matchExpressions": [field_req("zone", "Exists", &["a"])]}]),
            ),
            false,
        ),
        (
            "matchExpressions Gt with two values",
            spec_with_required_terms(
                json!([{"matchExpressions": [field_req("cores", "Gt", &["1", "2"])]}]),
            ),
            false,
        ),
        (
            "matchExpressions unknown operator",
            spec_with_required_terms(
                json!([{"matchExpressions": [field_req("zone", "Equals", &["a"])]}]),
            ),
            false,
        ),
        (
            "matchExpressions value that is not a label value (required term)",
            spec_with_required_terms(
                json!([{"matchExpressions": [field_req("zone", "In", &["not a label"])]}]),
            ),
            false,
        ),
        (
            "preferred term weight 0",
            json!({"containers": [{"name": "c", "image": "i"}], "affinity": {"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 0, "preference": {"matchExpressions": [field_req("zone", "In", &["a"])]}}
            ]}}}),
            false,
        ),
        (
            "preferred term weight 100 with a value that is not a label value",
            json!({"containers": [{"name": "c", "image": "i"}], "affinity": {"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": {"matchExpressions": [field_req("zone", "In", &["not a label"])]}}
            ]}}}),
            true,
        ),
    ]);
}

#[test]
fn the_error_for_empty_node_selector_terms_names_the_field() {
    let errs = validate_pod_spec(&spec_with_required_terms(json!([])));
    assert_eq!(
        errs,
        vec![
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms: \
             Required value: must have at least one node selector term"
                .to_string()
        ]
    );
}

// ---------------------------------------------------------------- nodeName (§3.4)

#[test]
fn node_name_must_be_a_dns_subdomain_and_cannot_come_with_scheduling_gates() {
    check_table(&[
        (
            "nodeName node-1.example",
            json!({"containers": [{"name": "c", "image": "i"}], "nodeName": "node-1.example"}),
            true,
        ),
        (
            "nodeName with upper case",
            json!({"containers": [{"name": "c", "image": "i"}], "nodeName": "Node-1"}),
            false,
        ),
        (
            "nodeName with schedulingGates",
            json!({"containers": [{"name": "c", "image": "i"}], "nodeName": "n",
                   "schedulingGates": [{"name": "example.com/gate"}]}),
            false,
        ),
    ]);
}

// ---------------------------------------------------------------- resources (§4.1-§4.3)

#[test]
fn resource_vectors_are_judged_as_the_api_server_judges_them() {
    check_table(&[
        (
            "requests.cpu 0 with limits.cpu 500m",
            spec_with_container_resources(
                json!({"requests": {"cpu": "0"}, "limits": {"cpu": "500m"}}),
            ),
            true,
        ),
        (
            "requests.cpu 0 and requests.memory 0 without limits",
            spec_with_container_resources(json!({"requests": {"cpu": "0", "memory": "0"}})),
            true,
        ),
        (
            "request above limit",
            spec_with_container_resources(
                json!({"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}),
            ),
            false,
        ),
        (
            "negative request",
            spec_with_container_resources(json!({"requests": {"cpu": "-1"}})),
            false,
        ),
        (
            "unparsable quantity",
            spec_with_container_resources(json!({"requests": {"cpu": "1 core"}})),
            false,
        ),
        (
            "nvidia.com/gpu request 0 with limit 1",
            spec_with_container_resources(
                json!({"requests": {"nvidia.com/gpu": "0", "cpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}),
            ),
            false,
        ),
        (
            "nvidia.com/gpu limit 1 only (defaulting copies it to the request)",
            spec_with_container_resources(json!({"limits": {"nvidia.com/gpu": "1"}})),
            true,
        ),
        (
            "nvidia.com/gpu request without a limit",
            spec_with_container_resources(json!({"requests": {"nvidia.com/gpu": "1"}})),
            false,
        ),
        (
            "nvidia.com/gpu half a device",
            spec_with_container_resources(json!({"limits": {"nvidia.com/gpu": "500m"}})),
            false,
        ),
        (
            "hugepages-2Mi request 0 with limit 2Mi",
            spec_with_container_resources(json!({
                "requests": {"hugepages-2Mi": "0", "memory": "64Mi"},
                "limits": {"hugepages-2Mi": "2Mi", "memory": "64Mi"}})),
            false,
        ),
        (
            "hugepages-2Mi 4Mi with memory",
            spec_with_container_resources(
                json!({"limits": {"hugepages-2Mi": "4Mi", "memory": "64Mi"}}),
            ),
            true,
        ),
        (
            "hugepages-2Mi without cpu or memory",
            spec_with_container_resources(json!({"limits": {"hugepages-2Mi": "4Mi"}})),
            false,
        ),
        (
            "hugepages-2Mi 3Mi is not a whole number of pages",
            spec_with_container_resources(
                json!({"limits": {"hugepages-2Mi": "3Mi", "memory": "64Mi"}}),
            ),
            false,
        ),
        (
            "unknown unprefixed resource name",
            spec_with_container_resources(json!({"requests": {"gpu": "1"}})),
            false,
        ),
        (
            "init container request above limit",
            json!({"containers": [{"name": "c", "image": "i"}],
                   "initContainers": [{"name": "i", "image": "i",
                       "resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}}]}),
            false,
        ),
    ]);
}

#[test]
fn pod_level_resources_are_judged_as_the_api_server_judges_them() {
    let spec = |pod: Value, container: Value| json!({"resources": pod, "containers": [{"name": "c", "image": "i", "resources": container}]});
    check_table(&[
        (
            "pod requests cover the container requests",
            spec(
                json!({"requests": {"cpu": "1"}}),
                json!({"requests": {"cpu": "500m"}}),
            ),
            true,
        ),
        (
            "pod requests below the container requests",
            spec(
                json!({"requests": {"cpu": "100m"}}),
                json!({"requests": {"cpu": "500m"}}),
            ),
            false,
        ),
        (
            "container limit above the pod limit",
            spec(
                json!({"limits": {"cpu": "1"}}),
                json!({"limits": {"cpu": "2"}}),
            ),
            false,
        ),
        (
            "pod-level ephemeral-storage is not supported",
            spec(json!({"requests": {"ephemeral-storage": "1Gi"}}), json!({})),
            false,
        ),
        (
            "container ephemeral-storage request with pod-level cpu",
            spec(
                json!({"requests": {"cpu": "1"}}),
                json!({"requests": {"ephemeral-storage": "1Gi"}}),
            ),
            true,
        ),
        (
            "pod-level claims",
            spec(json!({"claims": [{"name": "x"}]}), json!({})),
            false,
        ),
    ]);
}

#[test]
fn qos_class_follows_compute_pod_qos() {
    let cases = [
        (
            "requests.cpu 0 with limits.cpu 500m",
            spec_with_container_resources(
                json!({"requests": {"cpu": "0"}, "limits": {"cpu": "500m"}}),
            ),
            "Burstable",
        ),
        (
            "cpu and memory requests 0, no limits",
            spec_with_container_resources(json!({"requests": {"cpu": "0", "memory": "0"}})),
            "BestEffort",
        ),
        (
            "cpu and memory requests 0, limits 0",
            spec_with_container_resources(json!({
                "requests": {"cpu": "0", "memory": "0"}, "limits": {"cpu": "0", "memory": "0"}})),
            "BestEffort",
        ),
        (
            "cpu and memory requests 0, limits 1 and 1Gi",
            spec_with_container_resources(json!({
                "requests": {"cpu": "0", "memory": "0"}, "limits": {"cpu": "1", "memory": "1Gi"}})),
            "Burstable",
        ),
        (
            "limits only (defaulted to requests)",
            spec_with_container_resources(json!({"limits": {"cpu": "1", "memory": "1Gi"}})),
            "Guaranteed",
        ),
        (
            "no resources at all",
            json!({"containers": [{"name": "c", "image": "i"}]}),
            "BestEffort",
        ),
        (
            "pod-level cpu and memory limits only",
            json!({"resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
                   "containers": [{"name": "c", "image": "i"}]}),
            "Guaranteed",
        ),
        (
            "pod-level requests only",
            json!({"resources": {"requests": {"cpu": "1"}},
                   "containers": [{"name": "c", "image": "i"}]}),
            "Burstable",
        ),
    ];
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(what, spec, want)| {
            let got = qos_class(spec);
            (got != *want).then(|| format!("{what}: expected {want}, got {got}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------- tolerations

#[test]
fn tolerations_are_judged_as_the_api_server_judges_them() {
    let spec = |t: Value| json!({"containers": [{"name": "c", "image": "i"}], "tolerations": [t]});
    check_table(&[
        ("blanket Exists", spec(json!({"operator": "Exists"})), true),
        (
            "key Equal value NoSchedule",
            spec(
                json!({"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "azure", "effect": "NoSchedule"}),
            ),
            true,
        ),
        (
            "Exists with a value",
            spec(json!({"key": "k", "operator": "Exists", "value": "v"})),
            false,
        ),
        (
            "unknown effect",
            spec(json!({"key": "k", "operator": "Exists", "effect": "NoRun"})),
            false,
        ),
        (
            "empty key with Equal",
            spec(json!({"operator": "Equal", "value": ""})),
            false,
        ),
        (
            "tolerationSeconds without NoExecute",
            spec(
                json!({"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}),
            ),
            false,
        ),
        (
            "unknown operator",
            spec(json!({"key": "k", "operator": "In"})),
            false,
        ),
    ]);
}

// ---------------------------------------------------------------- LimitRanger (§4.5)

fn container_item(field: &str, resources: Value) -> Value {
    json!({"type": "Container", field: resources})
}

#[test]
fn limit_ranger_vectors_are_judged_as_the_api_server_judges_them() {
    let spec = |resources: Value| spec_with_container_resources(resources);
    let cases = [
        (
            "min cpu 100m with request 0",
            spec(json!({"requests": {"cpu": "0"}})),
            container_item("min", json!({"cpu": "100m"})),
            false,
        ),
        (
            "min cpu 100m with request 100m",
            spec(json!({"requests": {"cpu": "100m"}})),
            container_item("min", json!({"cpu": "100m"})),
            true,
        ),
        (
            "min cpu 100m without a request",
            spec(json!({})),
            container_item("min", json!({"cpu": "100m"})),
            false,
        ),
        (
            "maxLimitRequestRatio 10 with request 0",
            spec(json!({"requests": {"cpu": "0"}, "limits": {"cpu": "1"}})),
            container_item("maxLimitRequestRatio", json!({"cpu": "10"})),
            false,
        ),
        (
            "request 250m limit 1 with ratio 4",
            spec(json!({"requests": {"cpu": "250m"}, "limits": {"cpu": "1"}})),
            container_item("maxLimitRequestRatio", json!({"cpu": "4"})),
            true,
        ),
        (
            "request 250m limit 1 with ratio 3",
            spec(json!({"requests": {"cpu": "250m"}, "limits": {"cpu": "1"}})),
            container_item("maxLimitRequestRatio", json!({"cpu": "3"})),
            false,
        ),
        (
            "max memory 1Gi with limit 2Gi",
            spec(json!({"limits": {"memory": "2Gi"}})),
            container_item("max", json!({"memory": "1Gi"})),
            false,
        ),
        (
            "max memory 1Gi without a limit",
            spec(json!({"requests": {"memory": "512Mi"}})),
            container_item("max", json!({"memory": "1Gi"})),
            false,
        ),
        (
            "Pod type: summed requests 2 x 300m against max 500m",
            json!({"containers": [
                {"name": "a", "image": "i", "resources": {"requests": {"cpu": "300m"}, "limits": {"cpu": "300m"}}},
                {"name": "b", "image": "i", "resources": {"requests": {"cpu": "300m"}, "limits": {"cpu": "300m"}}}]}),
            json!({"type": "Pod", "max": {"cpu": "500m"}}),
            false,
        ),
        (
            "Pod type: summed requests 2 x 200m against max 500m",
            json!({"containers": [
                {"name": "a", "image": "i", "resources": {"requests": {"cpu": "200m"}, "limits": {"cpu": "200m"}}},
                {"name": "b", "image": "i", "resources": {"requests": {"cpu": "200m"}, "limits": {"cpu": "200m"}}}]}),
            json!({"type": "Pod", "max": {"cpu": "500m"}}),
            true,
        ),
    ];
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(what, spec, item, valid)| {
            let errs = limit_ranger_validate(spec, std::slice::from_ref(item));
            (errs.is_empty() != *valid).then(|| format!("{what}: got {errs:?}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn limit_ranger_accepts_a_whole_limit_range_object() {
    let limit_range = json!({"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "l"},
        "spec": {"limits": [container_item("min", json!({"cpu": "100m"}))]}});
    let errs = limit_ranger_validate(
        &spec_with_container_resources(json!({"requests": {"cpu": "0"}})),
        &[limit_range],
    );
    assert_eq!(
        errs,
        vec!["minimum cpu usage per Container is 100m, but request is 0".to_string()]
    );
}

// ---------------------------------------------------------------- quantities

#[test]
fn quantities_parse_exactly() {
    let nanos = |s: &str| Quantity::parse(s).map(|q| q.nanos());
    let unit = 1_000_000_000i128;
    assert_eq!(nanos("0"), Ok(0));
    assert_eq!(nanos("500m"), Ok(unit / 2));
    assert_eq!(nanos("1.5"), Ok(3 * unit / 2));
    assert_eq!(nanos(".5"), Ok(unit / 2));
    assert_eq!(nanos("1."), Ok(unit));
    assert_eq!(nanos("1Ki"), Ok(1024 * unit));
    assert_eq!(nanos("1.5Gi"), Ok(1_610_612_736 * unit));
    assert_eq!(nanos("2k"), Ok(2000 * unit));
    assert_eq!(nanos("1e3"), Ok(1000 * unit));
    assert_eq!(nanos("1E-3"), Ok(unit / 1000));
    assert_eq!(nanos("+1e+2"), Ok(100 * unit));
    assert_eq!(nanos("1E"), Ok(10i128.pow(18) * unit));
    assert_eq!(nanos("-250m"), Ok(-unit / 4));
    assert_eq!(nanos("7n"), Ok(7));
    assert_eq!(nanos("3u"), Ok(3000));
    // Rounded up to a nano-unit, capped at 2^63-1.
    assert_eq!(nanos("0.1n"), Ok(1));
    assert_eq!(nanos("1e30"), Ok(i128::from(i64::MAX) * unit));
    for bad in [
        "", ".", "1 ", "1ki", "1.5.5", "1e", "abc", "1m5", "--1", "1Kib",
    ] {
        assert!(Quantity::parse(bad).is_err(), "{bad:?} must not parse");
    }
}

#[test]
fn quantity_values_round_up_like_go() {
    let q = |s: &str| Quantity::parse(s).unwrap();
    assert_eq!(q("1500m").value(), 2);
    assert_eq!(q("0.1m").milli_value(), 1);
    assert_eq!(q("1Gi").milli_value(), 1_073_741_824_000);
    assert_eq!(q("0.1m").round_up_to_milli().to_string(), "1m");
    assert_eq!(Quantity::from_json(&json!(2)).unwrap(), q("2"));
    assert_eq!(Quantity::from_json(&json!(" 250m ")).unwrap(), q("250m"));
    assert!(q("1Gi") > q("1G"));
    assert_eq!(q("1000m"), q("1"));
}

// ---------------------------------------------------------------- defaulting and patches (§4.2, §5.4)

#[test]
fn pod_defaulting_copies_missing_requests_from_limits_but_keeps_an_explicit_zero() {
    let mut pod = pod_with_spec(json!({"containers": [
        {"name": "a", "image": "i", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
        {"name": "b", "image": "i", "resources": {"requests": {"cpu": "0"}, "limits": {"cpu": "500m"}}}
    ], "initContainers": [
        {"name": "init", "image": "i", "resources": {"limits": {"memory": "64Mi"}}}
    ]}));
    apply_pod_defaults(&mut pod);
    assert_eq!(
        pod.pointer("/spec/containers/0/resources/requests"),
        Some(&json!({"cpu": "1", "memory": "1Gi"}))
    );
    assert_eq!(
        pod.pointer("/spec/containers/1/resources/requests"),
        Some(&json!({"cpu": "0"}))
    );
    assert_eq!(
        pod.pointer("/spec/initContainers/0/resources/requests"),
        Some(&json!({"memory": "64Mi"}))
    );
}

#[test]
fn pod_defaulting_leaves_workload_templates_alone() {
    let mut deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"template": {"spec": {
        "containers": [{"name": "a", "image": "i", "resources": {"limits": {"cpu": "1"}}}]}}}});
    let before = deployment.clone();
    apply_pod_defaults(&mut deployment);
    assert_eq!(deployment, before);
}

#[test]
fn a_patch_that_removes_a_request_gets_it_back_from_the_limit() {
    let pod = pod_with_spec(spec_with_container_resources(
        json!({"requests": {"cpu": "250m"}, "limits": {"cpu": "1"}}),
    ));
    let patch = br#"[{"op":"remove","path":"/spec/containers/0/resources/requests/cpu"}]"#;
    let patched = apply_patch_as_api_server(&pod, patch).unwrap();
    assert_eq!(
        patched.pointer("/spec/containers/0/resources/requests/cpu"),
        Some(&json!("1"))
    );
}

#[test]
fn patches_are_applied_like_the_mutating_dispatcher_applies_them() {
    let pod = pod_with_spec(json!({"containers": [{"name": "c", "image": "i"}], "nodeName": "n"}));
    // Empty patch and [] change nothing.
    assert_eq!(apply_patch_as_api_server(&pod, b"").unwrap(), pod);
    assert_eq!(apply_patch_as_api_server(&pod, b"[]").unwrap(), pod);
    // A working patch.
    let patched =
        apply_patch_as_api_server(&pod, br#"[{"op":"remove","path":"/spec/nodeName"}]"#).unwrap();
    assert!(patched.pointer("/spec/nodeName").is_none());
    // Undecodable patches and missing paths are errors.
    for bad in [
        &b"{}"[..],
        b"not json",
        b"[1]",
        br#"[{"op":"replace","path":"/spec/missing","value":1}]"#,
        br#"[{"op":"remove","path":"/spec/affinity/nodeAffinity"}]"#,
    ] {
        assert!(
            apply_patch_as_api_server(&pod, bad).is_err(),
            "{} must fail",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn pod_specs_are_found_in_every_workload_kind() {
    let spec = json!({"containers": []});
    let objects = [
        json!({"kind": "Pod", "spec": spec}),
        json!({"kind": "Deployment", "spec": {"template": {"spec": spec}}}),
        json!({"kind": "ReplicaSet", "spec": {"template": {"spec": spec}}}),
        json!({"kind": "StatefulSet", "spec": {"template": {"spec": spec}}}),
        json!({"kind": "DaemonSet", "spec": {"template": {"spec": spec}}}),
        json!({"kind": "Job", "spec": {"template": {"spec": spec}}}),
        json!({"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"spec": spec}}}}}),
    ];
    for object in &objects {
        assert_eq!(pod_spec_of(object), Some(&spec), "{}", object["kind"]);
    }
    assert_eq!(pod_spec_of(&json!({"kind": "ConfigMap", "data": {}})), None);
}

#[test]
fn validate_object_reports_template_errors_under_the_template_path() {
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"template": {"spec": {
        "containers": [{"name": "c", "image": "i"}], "nodeName": "Bad_Node"}}}});
    let errs = validate_object(&deployment);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with("spec.template.spec.nodeName: Invalid value"),
        "{errs:?}"
    );
}

// ---------------------------------------------------------------- AdmissionReview responses (§5.2)

const UID: &str = "705ab4f5-6393-11e8-b7cc-42010a800002";

fn review(response: Value) -> Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

#[test]
fn well_formed_admission_responses_are_accepted() {
    // [{"op":"add","path":"/metadata/labels/a","value":"b"}]
    let patch = r#"[{"op":"add","path":"/metadata/labels/a","value":"b"}]"#;
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(patch);
    assert_eq!(
        verify_admission_response(
            UID,
            &review(
                json!({"uid": UID, "allowed": true, "patchType": "JSONPatch", "patch": encoded})
            ),
            true
        ),
        Ok(Some(patch.as_bytes().to_vec()))
    );
    assert_eq!(
        verify_admission_response(UID, &review(json!({"uid": UID, "allowed": true})), true),
        Ok(None)
    );
    assert_eq!(
        verify_admission_response(
            UID,
            &review(
                json!({"uid": UID, "allowed": false, "status": {"code": 403, "message": "no"}})
            ),
            false
        ),
        Ok(None)
    );
}

#[test]
fn malformed_admission_responses_are_rejected() {
    use base64::Engine as _;
    let patch = r#"[{"op":"add","path":"/metadata/labels/a","value":"b"}]"#;
    let encoded = base64::engine::general_purpose::STANDARD.encode(patch);
    // 55 bytes: the padded encoding ends in "==".
    let odd = r#"[{"op":"add","path":"/metadata/labels/ab","value":"b"}]"#;
    let padded = base64::engine::general_purpose::STANDARD.encode(odd);
    let unpadded = base64::engine::general_purpose::STANDARD_NO_PAD.encode(odd);
    assert_eq!(format!("{unpadded}=="), padded);
    assert_eq!(
        verify_admission_response(
            UID,
            &review(
                json!({"uid": UID, "allowed": true, "patchType": "JSONPatch", "patch": padded})
            ),
            true
        ),
        Ok(Some(odd.as_bytes().to_vec()))
    );
    let url_safe = base64::engine::general_purpose::URL_SAFE
        .encode(r#"[{"op":"add","path":"/a","value":"??>"}]"#);
    assert!(url_safe.contains(['-', '_']), "{url_safe}");
    let object_patch = base64::engine::general_purpose::STANDARD.encode(r#"{"op":"add"}"#);
    let cases: Vec<(&str, Value, bool)> = vec![
        ("allowed missing", review(json!({"uid": UID})), true),
        (
            "allowed as a string",
            review(json!({"uid": UID, "allowed": "true"})),
            true,
        ),
        (
            "uid mismatch",
            review(json!({"uid": "other", "allowed": true})),
            true,
        ),
        ("uid missing", review(json!({"allowed": true})), true),
        (
            "response missing",
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
            true,
        ),
        (
            "wrong apiVersion",
            json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",
                   "response": {"uid": UID, "allowed": true}}),
            true,
        ),
        (
            "apiVersion and kind missing",
            json!({"response": {"uid": UID, "allowed": true}}),
            true,
        ),
        (
            "patch as an array of numbers (kube-core's serialisation)",
            review(
                json!({"uid": UID, "allowed": true, "patchType": "JSONPatch",
                          "patch": patch.as_bytes()}),
            ),
            true,
        ),
        (
            "patch as a JSON array of operations",
            review(
                json!({"uid": UID, "allowed": true, "patchType": "JSONPatch",
                          "patch": serde_json::from_str::<Value>(patch).unwrap()}),
            ),
            true,
        ),
        (
            "patchType without patch",
            review(json!({"uid": UID, "allowed": true, "patchType": "JSONPatch"})),
            true,
        ),
        (
            "patch without patchType",
            review(json!({"uid": UID, "allowed": true, "patch": encoded})),
            true,
        ),
        (
            "empty patchType",
            review(json!({"uid": UID, "allowed": true, "patchType": "", "patch": encoded})),
            true,
        ),
        (
            "patchType MergePatch",
            review(
                json!({"uid": UID, "allowed": true, "patchType": "MergePatch", "patch": encoded}),
            ),
            true,
        ),
        (
            "unpadded base64",
            review(
                json!({"uid": UID, "allowed": true, "patchType": "JSONPatch", "patch": unpadded}),
            ),
            true,
        ),
        (
            "url-safe base64",
            review(
                json!({"uid": UID, "allowed": true, "patchType": "JSONPatch", "patch": url_safe}),
            ),
            true,
        ),
        (
            "patch that decodes to an object, not an array",
            review(
                json!({"uid": UID, "allowed": true, "patchType": "JSONPatch", "patch": object_patch}),
            ),
            true,
        ),
        (
            "validating webhook returning a patch",
            review(
                json!({"uid": UID, "allowed": true, "patchType": "JSONPatch", "patch": encoded}),
            ),
            false,
        ),
        (
            "validating webhook returning only a patchType",
            review(json!({"uid": UID, "allowed": true, "patchType": "JSONPatch"})),
            false,
        ),
    ];
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(what, body, mutating)| {
            verify_admission_response(UID, body, *mutating)
                .ok()
                .map(|got| format!("{what}: accepted, returned {got:?}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------- official schema

#[test]
fn the_schema_check_accepts_valid_objects_and_rejects_wrong_types_and_unknown_fields() {
    let valid_pod = pod_with_spec(json!({"containers": [{"name": "c", "image": "busybox",
        "resources": {"requests": {"cpu": "0"}, "limits": {"cpu": "500m"}}}]}));
    let generate_name_pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "p-"}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
    validate_with_schema(&[valid_pod.clone(), generate_name_pod], true)
        .expect("valid pods must pass the strict schema check");

    let wrong_type = pod_with_spec(json!({"containers": "x"}));
    let err = validate_with_schema(&[valid_pod.clone(), wrong_type], false)
        .expect_err("containers: \"x\" must fail");
    assert!(err.contains("object 1 (Pod/p)"), "{err}");
    assert!(!err.contains("object 0"), "{err}");

    let unknown_field =
        pod_with_spec(json!({"containers": [{"name": "c", "image": "i", "bogus": 1}]}));
    validate_with_schema(std::slice::from_ref(&unknown_field), false)
        .expect("non-strict mode ignores unknown fields");
    let err = validate_with_schema(&[unknown_field], true).expect_err("strict mode rejects them");
    assert!(err.contains("bogus"), "{err}");

    let unknown_kind =
        json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}});
    validate_with_schema(&[unknown_kind], false)
        .expect_err("a kind without a schema is a failure, not a skip");
}

// ---------------------------------------------------------------- pods/status UPDATE (§6.1)

/// A stored Pod on a virtual-kubelet node: one regular init container (done), one sidecar
/// (terminated), one app container (terminated with `exit_code`).
fn stored_pod(restart_policy: &str, exit_code: i64) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "p", "namespace": "default", "uid": "uid-1", "resourceVersion": "7",
            "generation": 1, "creationTimestamp": "2024-01-01T00:00:00Z",
            "labels": {"app": "demo"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                "uid": "uid-rs", "controller": true}]
        },
        "spec": {
            "nodeName": "vk-node", "restartPolicy": restart_policy,
            "initContainers": [
                {"name": "init", "image": "busybox"},
                {"name": "sidecar", "image": "envoy", "restartPolicy": "Always"}
            ],
            "containers": [{"name": "app", "image": "busybox"}]
        },
        "status": {
            "phase": "Pending", "qosClass": "BestEffort", "observedGeneration": 1,
            "hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}],
            "podIP": "10.1.0.5", "podIPs": [{"ip": "10.1.0.5"}],
            "conditions": [{"type": "PodScheduled", "status": "True", "observedGeneration": 1}],
            "initContainerStatuses": [
                {"name": "init", "state": {"terminated": {"exitCode": 0}}},
                {"name": "sidecar", "state": {"terminated": {"exitCode": 0}}}
            ],
            "containerStatuses": [
                {"name": "app", "state": {"terminated": {"exitCode": exit_code}}}
            ]
        }
    })
}

/// `pod` with `status.containerStatuses` (or `initContainerStatuses`) entry `name` running.
fn with_running(mut pod: Value, list: &str, name: &str) -> Value {
    for status in pod["status"][list].as_array_mut().unwrap() {
        if status["name"] == name {
            status["state"] = json!({"running": {"startedAt": "2024-01-01T00:01:00Z"}});
        }
    }
    pod
}

fn expect_refused(old: &Value, new: &Value, needle: &str) {
    match pod_status_update_as_api_server(old, new) {
        Ok(stored) => panic!("expected an error containing {needle:?}, got stored {stored}"),
        Err(errs) => assert!(
            errs.iter().any(|e| e.contains(needle)),
            "expected an error containing {needle:?}, got {errs:?}"
        ),
    }
}

fn expect_stored(old: &Value, new: &Value) -> Value {
    pod_status_update_as_api_server(old, new)
        .unwrap_or_else(|errs| panic!("expected the update to be stored, got {errs:?}"))
}

#[test]
fn spec_edits_on_pods_status_are_discarded_and_the_old_spec_is_stored() {
    let old = stored_pod("Always", 0);
    let mut new = old.clone();
    new["spec"]["containers"][0]["image"] = json!("nginx");
    new["spec"]["nodeSelector"] = json!({"zone": "a"});
    new["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "0"}});
    new["metadata"]["labels"]["patched"] = json!("yes");
    new["status"]["message"] = json!("patched by a webhook");

    let stored = expect_stored(&old, &new);
    assert_eq!(
        stored["spec"], old["spec"],
        "the stored spec is the old one"
    );
    assert_eq!(
        stored["metadata"]["labels"]["patched"], "yes",
        "label edits persist"
    );
    assert_eq!(
        stored["status"]["message"], "patched by a webhook",
        "status edits persist"
    );
}

#[test]
fn a_phase_change_from_pending_to_running_is_accepted_and_kept() {
    let old = stored_pod("Always", 0);
    let mut new = with_running(old.clone(), "containerStatuses", "app");
    new["status"]["phase"] = json!("Running");
    let stored = expect_stored(&old, &new);
    assert_eq!(stored["status"]["phase"], "Running");
}

#[test]
fn a_node_name_change_through_pods_status_is_discarded_before_validation_could_refuse_it() {
    // ValidatePodStatusUpdate has "status.nodeName: may not be changed directly", but
    // PrepareForUpdate already copied the old spec, so the real API server never reaches it.
    let old = stored_pod("Always", 0);
    let mut new = old.clone();
    new["spec"]["nodeName"] = json!("other-node");
    let stored = expect_stored(&old, &new);
    assert_eq!(stored["spec"]["nodeName"], "vk-node");
}

#[test]
fn changing_the_qos_class_is_refused_but_clearing_it_backfills_the_old_one() {
    let old = stored_pod("Always", 0);
    let mut changed = old.clone();
    changed["status"]["qosClass"] = json!("Guaranteed");
    expect_refused(
        &old,
        &changed,
        "status.qosClass: Invalid value: \"Guaranteed\": field is immutable",
    );

    let mut cleared = old.clone();
    cleared["status"]
        .as_object_mut()
        .unwrap()
        .remove("qosClass");
    assert_eq!(
        expect_stored(&old, &cleared)["status"]["qosClass"],
        "BestEffort"
    );
}

#[test]
fn a_terminated_container_may_not_run_again_unless_the_restart_policy_allows_it() {
    let cases = [
        ("Never", 0, false),
        ("Never", 1, false),
        ("OnFailure", 0, false),
        ("OnFailure", 1, true),
        ("Always", 0, true),
        ("Always", 1, true),
    ];
    let mut failures = Vec::new();
    for (policy, exit_code, allowed) in cases {
        let old = stored_pod(policy, exit_code);
        let new = with_running(old.clone(), "containerStatuses", "app");
        let got = pod_status_update_as_api_server(&old, &new);
        let ok = match &got {
            Ok(_) => allowed,
            Err(errs) => {
                !allowed
                    && errs.iter().any(|e| {
                        e == "status.containerStatuses[0].state: Forbidden: may not be \
                              transitioned to non-terminated state"
                    })
            }
        };
        if !ok {
            failures.push(format!("{policy}, exit {exit_code}: got {got:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_sidecar_may_run_again_after_terminating_but_a_regular_init_container_may_not() {
    let old = stored_pod("Never", 0);
    let sidecar = with_running(old.clone(), "initContainerStatuses", "sidecar");
    expect_stored(&old, &sidecar);

    let init = with_running(old.clone(), "initContainerStatuses", "init");
    expect_refused(
        &old,
        &init,
        "status.initContainerStatuses[0].state: Forbidden: may not be transitioned",
    );
}

#[test]
fn custom_condition_types_must_be_qualified_names() {
    let old = stored_pod("Always", 0);
    let with_condition = |ty: &str| {
        let mut new = old.clone();
        new["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": ty, "status": "True"}));
        new
    };
    expect_stored(&old, &with_condition("example.com/vk-ready"));
    expect_stored(&old, &with_condition("Ready"));
    expect_refused(
        &old,
        &with_condition("not a type!"),
        "metadata.conditions[1].Type",
    );
}

#[test]
fn pods_status_keeps_the_fields_the_status_endpoint_does_not_own() {
    let mut old = stored_pod("Always", 0);
    old["metadata"]["deletionTimestamp"] = json!("2024-01-02T00:00:00Z");
    old["metadata"]["deletionGracePeriodSeconds"] = json!(30);
    old["status"]["conditions"][0]["observedGeneration"] = json!(4);

    let mut new = old.clone();
    let meta = new["metadata"].as_object_mut().unwrap();
    meta.remove("deletionTimestamp");
    meta.remove("deletionGracePeriodSeconds");
    meta.remove("ownerReferences");
    meta.insert("generation".into(), json!(9));
    new["status"]
        .as_object_mut()
        .unwrap()
        .remove("observedGeneration");
    new["status"]["conditions"][0]
        .as_object_mut()
        .unwrap()
        .remove("observedGeneration");

    let stored = expect_stored(&old, &new);
    for key in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "ownerReferences",
        "generation",
    ] {
        assert_eq!(
            stored["metadata"][key], old["metadata"][key],
            "metadata.{key}"
        );
    }
    assert_eq!(stored["status"]["observedGeneration"], 1);
    assert_eq!(stored["status"]["conditions"][0]["observedGeneration"], 4);

    // A Pod that is not being deleted cannot be made so through pods/status.
    let old = stored_pod("Always", 0);
    let mut new = old.clone();
    new["metadata"]["deletionTimestamp"] = json!("2024-01-02T00:00:00Z");
    assert!(
        expect_stored(&old, &new)["metadata"]
            .get("deletionTimestamp")
            .is_none()
    );

    // And no new finalizers while it is being deleted.
    let mut old = stored_pod("Always", 0);
    old["metadata"]["deletionTimestamp"] = json!("2024-01-02T00:00:00Z");
    let mut new = old.clone();
    new["metadata"]["finalizers"] = json!(["example.com/hold"]);
    expect_refused(&old, &new, "metadata.finalizers: Forbidden");
}

#[test]
fn pods_status_metadata_edits_are_validated() {
    let old = stored_pod("Always", 0);
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut new = old.clone();
        f(&mut new);
        new
    };
    expect_refused(
        &old,
        &edit(&|p| p["metadata"]["name"] = json!("q")),
        "metadata.name",
    );
    expect_refused(
        &old,
        &edit(&|p| p["metadata"]["uid"] = json!("uid-2")),
        "metadata.uid",
    );
    expect_refused(
        &old,
        &edit(&|p| p["metadata"]["labels"]["bad key!"] = json!("v")),
        "metadata.labels",
    );
    expect_refused(
        &old,
        &edit(&|p| p["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "x"})),
        "may not add mirror pod annotation",
    );
    // An omitted uid is taken from the stored object.
    let stored = expect_stored(
        &old,
        &edit(&|p| {
            p["metadata"].as_object_mut().unwrap().remove("uid");
        }),
    );
    assert_eq!(stored["metadata"]["uid"], "uid-1");
}

#[test]
fn pod_and_host_ips_must_parse_and_host_ip_must_match_the_first_host_ips_entry() {
    let old = stored_pod("Always", 0);
    let with_status = |patch: Value| {
        let mut new = old.clone();
        for (k, v) in patch.as_object().unwrap() {
            new["status"][k] = v.clone();
        }
        new
    };
    let accepted = [
        json!({"podIPs": [{"ip": "10.1.0.6"}, {"ip": "fd00::6"}]}),
        json!({"podIPs": [{"ip": "010.001.000.006"}]}),
        json!({"hostIP": "fd00::1", "hostIPs": [{"ip": "fd00::1"}, {"ip": "10.0.0.1"}]}),
    ];
    let refused = [
        (
            json!({"podIPs": [{"ip": "10.1.0.300"}]}),
            "status.podIPs[0]: Invalid value",
        ),
        (
            json!({"podIPs": [{"ip": "10.1.0.6"}, {"ip": "10.1.0.7"}]}),
            "one IP for each IP family",
        ),
        (
            json!({"podIPs": [{"ip": "fd00::6"}, {"ip": "fd00::6"}]}),
            "Duplicate value",
        ),
        (
            json!({"hostIP": "10.0.0.2", "hostIPs": [{"ip": "10.0.0.1"}]}),
            "status.hostIPs[0].ip: Invalid value: \"10.0.0.1\": must be equal to `hostIP`",
        ),
    ];
    let mut failures = Vec::new();
    for patch in accepted {
        if let Err(errs) = pod_status_update_as_api_server(&old, &with_status(patch.clone())) {
            failures.push(format!("{patch}: expected accepted, got {errs:?}"));
        }
    }
    for (patch, needle) in refused {
        match pod_status_update_as_api_server(&old, &with_status(patch.clone())) {
            Err(errs) if errs.iter().any(|e| e.contains(needle)) => {}
            got => failures.push(format!("{patch}: expected {needle:?}, got {got:?}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
