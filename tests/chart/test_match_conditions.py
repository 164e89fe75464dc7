"""The chart's webhook `matchConditions`, evaluated by a real CEL engine.

The API server evaluates each webhook's matchConditions before it sends a request: any
false skips the webhook, and an *error* with failurePolicy Ignore skips it too, silently.
So every condition must give the intended boolean, and never an error, on every request
shape the API server can produce. Here each expression of every webhook of every rendered
value set is compiled and evaluated with cel-expr-python (Google's cel-cpp) against the
captured requests in tests/fixtures, and variants built from them.

The variables are declared and bound the way the API server does it
(staging/src/k8s.io/apiserver/pkg/admission/plugin/cel/compile.go and filter.go):
- `object`, `oldObject`: declared dyn; bound to the object converted to an unstructured
  map (JSON types), or null: `object` on DELETE, `oldObject` on CREATE.
- `request`: the API server declares the object type kubernetes.AdmissionRequest and binds
  the AdmissionRequest converted to an unstructured map (CreateAdmissionRequest): fields
  with `omitempty` and no value are absent, so reading `request.subResource` of a request
  without a subresource errors. Bound here as a map with the same keys, which errors the
  same way; the field names are checked against the declared type separately.
- `namespaceObject`, `authorizer`: declared there too; a condition using them would not
  compile here, so this test would fail and have to learn them first.
A condition must be of type bool (the API server refuses any other output type).
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

import pytest
import yaml
from cel_expr_python import cel
from chart_helpers import CASES, REPO, by_kind, effective, mode, release_of, render, values_of

FIXTURES = REPO / "tests" / "fixtures"

# The fields of kubernetes.AdmissionRequest, the type the API server declares for `request`
# (BuildRequestType in compile.go): nothing else may be read from it.
REQUEST_FIELDS = {
    "kind", "resource", "subResource", "requestKind", "requestResource", "requestSubResource",
    "name", "namespace", "operation", "userInfo", "dryRun", "options",
}
# AdmissionRequest fields with `omitempty`: absent from the map when empty.
OMITTED_WHEN_EMPTY = ("subResource", "requestSubResource", "name", "namespace")
WORKLOAD_KINDS = {"Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "CronJob"}

# The conditions the chart writes, in TABLE's column order.
CONDITIONS = ("not-a-mirror-pod", "not-skipped", "pending-pods-only")


# ---------------------------------------------------------------------------------------
# requests: the captures, and variants built from them


def captured(name: str) -> dict[str, Any]:
    """The AdmissionRequest of a fixture (unwrapped when it is a whole AdmissionReview)."""
    data = json.loads((FIXTURES / name).read_text())
    return copy.deepcopy(data["request"] if data.get("kind") == "AdmissionReview" else data)


def bare(name: str) -> dict[str, Any]:
    """A bare object fixture (YAML)."""
    return yaml.safe_load((FIXTURES / name).read_text())


def annotate(request: dict[str, Any], annotations: Any) -> dict[str, Any]:
    """`request` with object.metadata.annotations replaced (None: an explicit null)."""
    request["object"]["metadata"]["annotations"] = annotations
    return request


def pod_create() -> dict[str, Any]:
    return captured("admissionreview-v1-pod-create-gke-kube-rs.json")


def pod_update() -> dict[str, Any]:
    # kubectl label on a running pod: object and oldObject differ in one label.
    request = pod_create()
    request["operation"] = "UPDATE"
    request["options"] = {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubectl-label"}
    request["oldObject"] = copy.deepcopy(request["object"])
    request["object"]["metadata"].setdefault("labels", {})["tier"] = "web"
    return request


def status_update(pod: dict[str, Any]) -> dict[str, Any]:
    """UPDATE pods/status of `pod` by its node's kubelet, shaped like the captured one."""
    request = captured("admissionrequest-pod-status-subresource-update-by-kubelet-kyverno.json")
    request["name"] = pod["metadata"]["name"]
    request["namespace"] = pod["metadata"]["namespace"]
    request["userInfo"] = {"username": f"system:node:{pod['spec']['nodeName']}", "groups": ["system:nodes", "system:authenticated"]}
    request["object"] = copy.deepcopy(pod)
    request["oldObject"] = copy.deepcopy(pod)
    return request


def virtual_node_pending() -> dict[str, Any]:
    return status_update(bare("virtual-kubelet-aci-pod-pending-with-running-containers-JENKINS-68649-reconstructed.yaml"))


def mirror_pod() -> dict[str, Any]:
    pod = bare("kube-controller-manager-mirror-pod-minikube.yaml")
    # Static pods may live in any namespace, not only the excluded kube-system: the
    # condition, not the namespace selector, is what keeps them out.
    pod["metadata"]["namespace"] = "ci"
    return pod


def mirror_pod_create() -> dict[str, Any]:
    # The kubelet creates the mirror pod: no uid, resourceVersion or status yet.
    pod = mirror_pod()
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        pod["metadata"].pop(key)
    pod["status"] = {}
    request = captured("admissionrequest-pod-create-by-replicaset-controller-kubewarden.json")
    request.update(name=pod["metadata"]["name"], namespace="ci", object=pod, oldObject=None)
    request["userInfo"] = {"username": "system:node:minikube", "groups": ["system:nodes", "system:authenticated"]}
    return request


def mirror_pod_status_pending() -> dict[str, Any]:
    pod = mirror_pod()
    pod["status"]["phase"] = "Pending"
    return status_update(pod)


def virtual_node_pending_annotations_null() -> dict[str, Any]:
    return annotate(virtual_node_pending(), None)


def deployment_skipped() -> dict[str, Any]:
    request = captured("admissionrequest-deployment-create-kubewarden-echo.json")
    request["object"]["metadata"]["annotations"]["podmend.io/skip"] = "all"
    return request


# How each request is made: a capture from tests/fixtures, or a variant built from one.
REQUESTS: dict[str, Callable[[], dict[str, Any]]] = {
    "pod CREATE by the replicaset controller": lambda: captured("admissionrequest-pod-create-by-replicaset-controller-kubewarden.json"),
    "pod CREATE by kubectl (GKE)": pod_create,
    "pod CREATE, podmend.io/skip: all": lambda: annotate(pod_create(), {"podmend.io/skip": "all"}),
    "pod CREATE, podmend.io/skip: node-affinity": lambda: annotate(pod_create(), {"podmend.io/skip": "node-affinity"}),
    "pod CREATE, annotations: null": lambda: annotate(pod_create(), None),
    "pod CREATE, annotations: {}": lambda: annotate(pod_create(), {}),
    "mirror pod CREATE by the kubelet": mirror_pod_create,
    "pod UPDATE (kubectl label)": pod_update,
    "pod DELETE (object null)": lambda: captured("admissionrequest-pod-delete-kubewarden.json"),
    "pods/status UPDATE by kubelet, Running": lambda: captured("admissionrequest-pod-status-subresource-update-by-kubelet-kyverno.json"),
    "pods/status UPDATE, virtual node, Pending": virtual_node_pending,
    "pods/status UPDATE, Pending, annotations: null": virtual_node_pending_annotations_null,
    "pods/status UPDATE, mirror pod, Pending": mirror_pod_status_pending,
    "Deployment CREATE (kubectl apply)": lambda: captured("admissionrequest-deployment-create-kubewarden-echo.json"),
    "Deployment CREATE, dry run, no namespace": lambda: captured("admissionreview-v1-deployment-create-dryrun-kube-review-generated.json"),
    "Deployment CREATE, podmend.io/skip: all": deployment_skipped,
    "Deployment UPDATE (kubectl patch)": lambda: captured("admissionrequest-deployment-update-with-oldobject-kubewarden-echo.json"),
    "Deployment UPDATE (kubectl label, k3s)": lambda: captured("admissionrequest-deployment-update-label-k3s-pepr.json"),
    "Job CREATE": lambda: captured("admissionrequest-job-create-kubewarden.json"),
    "CronJob CREATE": lambda: captured("admissionrequest-cronjob-create-kubewarden.json"),
    "DaemonSet CREATE": lambda: captured("admissionrequest-daemonset-create-kubewarden.json"),
    "ConfigMap CREATE (no rule sends it)": lambda: captured("admissionrequest-configmap-create-unhandled-kind-pepr-log.json"),
}

# What every condition must give for each request, and which webhooks the request then
# reaches (rules and conditions; with every webhook rendered: virtual-node-phase on,
# templates active). "-": none. A skip annotation other than "all" is for podmend to
# read per rule, so that request is still sent.
TABLE = """
case                                           | not-a-mirror-pod | not-skipped | pending-pods-only | webhooks called
pod CREATE by the replicaset controller        | true             | true        | false             | mutate, validate
pod CREATE by kubectl (GKE)                    | true             | true        | false             | mutate, validate
pod CREATE, podmend.io/skip: all               | true             | false       | false             | -
pod CREATE, podmend.io/skip: node-affinity     | true             | true        | false             | mutate, validate
pod CREATE, annotations: null                  | true             | true        | false             | mutate, validate
pod CREATE, annotations: {}                    | true             | true        | false             | mutate, validate
mirror pod CREATE by the kubelet               | false            | true        | false             | -
pod UPDATE (kubectl label)                     | true             | true        | false             | -
pod DELETE (object null)                       | true             | true        | false             | -
pods/status UPDATE by kubelet, Running         | true             | true        | false             | -
pods/status UPDATE, virtual node, Pending      | true             | true        | true              | status
pods/status UPDATE, Pending, annotations: null | true             | true        | true              | status
pods/status UPDATE, mirror pod, Pending        | false            | true        | true              | -
Deployment CREATE (kubectl apply)              | true             | true        | false             | mutate, validate
Deployment CREATE, dry run, no namespace       | true             | true        | false             | mutate, validate
Deployment CREATE, podmend.io/skip: all        | true             | false       | false             | -
Deployment UPDATE (kubectl patch)              | true             | true        | false             | mutate, validate
Deployment UPDATE (kubectl label, k3s)         | true             | true        | false             | mutate, validate
Job CREATE                                     | true             | true        | false             | mutate, validate
CronJob CREATE                                 | true             | true        | false             | mutate, validate
DaemonSet CREATE                               | true             | true        | false             | mutate, validate
ConfigMap CREATE (no rule sends it)            | true             | true        | false             | -
"""


@dataclass(frozen=True)
class Case:
    """One row of TABLE."""

    name: str
    build: Callable[[], dict[str, Any]]
    expected: dict[str, bool]
    called: frozenset[str] = field(default_factory=frozenset)


def parse_table() -> list[Case]:
    rows = [[cell.strip() for cell in line.split("|")] for line in TABLE.strip().splitlines()]
    header, rows = rows[0], rows[1:]
    assert header == ["case", *CONDITIONS, "webhooks called"], header
    assert [r[0] for r in rows] == list(REQUESTS), "TABLE and REQUESTS list the same cases in the same order"
    cases = []
    for name, *results, called in rows:
        assert set(results) <= {"true", "false"}, name
        webhooks = frozenset() if called == "-" else frozenset(f"{w.strip()}.podmend.io" for w in called.split(","))
        cases.append(Case(name, REQUESTS[name], {c: r == "true" for c, r in zip(CONDITIONS, results)}, webhooks))
    return cases


CASES_TABLE = parse_table()


# ---------------------------------------------------------------------------------------
# the API server's side: variables, rules


def cel_request(request: dict[str, Any]) -> dict[str, Any]:
    """`request` as the API server binds it: the AdmissionRequest without object and
    oldObject (root variables of their own), empty omitempty fields absent."""
    bound = {k: v for k, v in request.items() if k not in ("object", "oldObject", "uid")}
    for key in OMITTED_WHEN_EMPTY:
        if not bound.get(key):
            bound.pop(key, None)
    return bound


@lru_cache(maxsize=1)
def cel_env() -> cel.Env:
    return cel.NewEnv(variables={
        "object": cel.Type.DYN,
        "oldObject": cel.Type.DYN,
        "request": cel.Type.Map(cel.Type.STRING, cel.Type.DYN),
    })


@lru_cache(maxsize=None)
def compiled(expression: str) -> cel.Expression:
    expr = cel_env().compile(expression)
    assert expr.return_type() == cel.Type.BOOL, f"must evaluate to bool, not {expr.return_type().name()}: {expression}"
    return expr


def evaluate(expression: str, request: dict[str, Any], where: str) -> bool:
    """The condition's value on `request`; an evaluation error fails the test, naming `where`."""
    value = compiled(expression).eval(data={
        "object": request.get("object"),
        "oldObject": request.get("oldObject"),
        "request": cel_request(request),
    })
    assert value.type() == cel.Type.BOOL, f"{where}: evaluation error {value.value()}\n{expression}"
    return value.value()


def rules_match(webhook: dict[str, Any], request: dict[str, Any]) -> bool:
    """Whether one of the webhook's rules matches the request (the chart writes exact
    names only: no wildcards, tests/chart/test_chart.py checks)."""
    resource = request["resource"]
    name = resource["resource"] + (f"/{request['subResource']}" if request.get("subResource") else "")
    return any(
        request["operation"] in rule["operations"]
        and resource["group"] in rule["apiGroups"]
        and resource["version"] in rule["apiVersions"]
        and name in rule["resources"]
        for rule in webhook["rules"]
    )


@lru_cache(maxsize=None)
def webhooks_of(case: str) -> tuple[dict[str, Any], ...]:
    name, namespace = release_of(case)
    docs = render(values_of(case), name, namespace)
    configs = by_kind(docs, "MutatingWebhookConfiguration") + by_kind(docs, "ValidatingWebhookConfiguration")
    return tuple(w for config in configs for w in config["webhooks"])


def templates_active(case: str) -> bool:
    rules = effective(values_of(case))["rules"]
    return any(
        mode(rules[r]["mode"]) != "off" and mode(rules[r]["templates"]) != "off"
        for r in ("nodeAffinity", "agentRequests", "dindRm")
    )


# ---------------------------------------------------------------------------------------
# the tests


def test_the_table_covers_every_condition_the_chart_renders():
    rendered = {c["name"] for case in CASES for w in webhooks_of(case) for c in w["matchConditions"]}
    assert rendered == set(CONDITIONS), f"conditions without expectations: {rendered - set(CONDITIONS)}"
    for case in CASES_TABLE:
        assert set(case.expected) == set(CONDITIONS), case.name
    # Each outcome of each condition is seen at least once.
    for condition in CONDITIONS:
        assert {case.expected[condition] for case in CASES_TABLE} == {True, False}, condition


def test_conditions_read_only_fields_the_api_server_declares_for_request():
    for case in CASES:
        for webhook in webhooks_of(case):
            for condition in webhook["matchConditions"]:
                used = set(re.findall(r"\brequest\.(\w+)", condition["expression"]))
                assert used <= REQUEST_FIELDS, f"{condition['name']}: request has no {used - REQUEST_FIELDS}"


@pytest.mark.parametrize("case", CASES_TABLE, ids=[c.name for c in CASES_TABLE])
def test_every_condition_gives_the_expected_boolean_without_error(case):
    request = case.build()
    assert (request["object"] is None) == (request["operation"] == "DELETE"), "object is null on DELETE only"
    if request["operation"] == "CREATE":
        assert request.get("oldObject") is None, "oldObject is null on CREATE"
    for values_case in sorted(CASES):
        for webhook in webhooks_of(values_case):
            for condition in webhook["matchConditions"]:
                where = f"values {values_case}, webhook {webhook['name']}, condition {condition['name']}"
                got = evaluate(condition["expression"], request, where)
                expected = case.expected[condition["name"]]
                assert got is expected, f"{where}: {got}, expected {expected}\n{condition['expression']}"


@pytest.mark.parametrize("case", CASES_TABLE, ids=[c.name for c in CASES_TABLE])
def test_each_request_reaches_exactly_the_webhooks_it_should(case):
    # Rules and conditions together (namespace and object selectors aside): what the API
    # server would send to podmend for this request, in every value set.
    request = case.build()
    workload = request["kind"]["kind"] in WORKLOAD_KINDS
    for values_case in sorted(CASES):
        webhooks = webhooks_of(values_case)
        called = {
            w["name"] for w in webhooks
            if rules_match(w, request)
            and all(evaluate(c["expression"], request, f"{values_case} {w['name']} {c['name']}") for c in w["matchConditions"])
        }
        expected = set(case.called) & {w["name"] for w in webhooks}
        if workload and not templates_active(values_case):
            expected = set()
        assert called == expected, f"{values_case}: {sorted(called)}, expected {sorted(expected)}"


def test_an_unguarded_condition_errors_on_null_annotations():
    # The engine here errors exactly where the API server's does: the guard is needed.
    unguarded = ("object == null || !has(object.metadata.annotations) || "
                 "!('kubernetes.io/config.mirror' in object.metadata.annotations)")
    value = compiled(unguarded).eval(data={
        "object": annotate(pod_create(), None)["object"], "oldObject": None, "request": {},
    })
    assert value.type() != cel.Type.BOOL, f"expected an evaluation error, got {value.value()}"
    # And reading an absent request field errors, as the API server's unstructured map does.
    absent = compiled("request.subResource == 'status'").eval(data={
        "object": None, "oldObject": None, "request": cel_request(pod_create()),
    })
    assert absent.type() != cel.Type.BOOL

