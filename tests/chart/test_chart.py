"""The Helm chart, rendered and linted with Helm's own engine (PyPI helm-python-sdk).

Every rendered object of a matrix of values is checked against the official Kubernetes
schemas (PyPI kubernetes-validate, strict: unknown fields are errors) at the newest version
and at the chart's minimum (kubeVersion >= 1.29), and against the invariants that keep the
webhook working: the Service and paths the webhook configurations call exist, the config
the chart writes is one podmend accepts, the webhook never sees its own namespace or
kube-system, renders are stable. Bad values must be refused by values.schema.json with a
message that names the key.

Run through `cargo test --test chart` (tests/chart.rs), or directly:
    .venv/bin/python -m pytest -q tests/chart
The podmend binary comes from $PODMEND_BIN, else target/debug/podmend (built if missing).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from chart_helpers import (
    CASES,
    CHART_DIR,
    REPO,
    by_kind,
    chart,
    component,
    dev_ca_bundle,
    effective,
    is_test_hook,
    lint_problems,
    mode,
    one,
    one_container,
    podmend_bin,
    release_of,
    render,
    render_raw,
    route_constants,
    strip,
    values_of,
    webhook_configurations,
    webhook_objects,
)
from kubernetes_validate.utils import SchemaNotFoundError

# The newest schemas kubernetes-validate carries, and the chart's kubeVersion floor.
KUBERNETES_VERSIONS = ("1.37.0", "1.29.0")
# Custom resources: kubernetes-validate has no schema for them. Only these may be skipped.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
}
# The kinds with a pod template, from podmend's own kinds table (src/target.rs, passed in by
# tests/chart.rs): the webhook must be sent exactly these, so a kind added there reaches the chart.
WORKLOAD_RULES = {
    tuple(entry.split("/", 1)) for entry in os.environ["PODMEND_WORKLOAD_RESOURCES"].split(",")
}


# ---------------------------------------------------------------------------------------
# helpers


def schema_error(values: dict[str, Any]) -> str:
    """The message values.schema.json refuses `values` with (fails if it accepts them)."""
    with pytest.raises(helm.HelmValuesError) as schema_refusal:
        chart().validate_schema(values)
    with pytest.raises(helm.HelmValuesError) as render_refusal:
        render_raw(values)
    for line in str(schema_refusal.value).splitlines():
        assert line in str(render_refusal.value), "install refuses what validate_schema refuses"
    return str(schema_refusal.value)


# ---------------------------------------------------------------------------------------
# lint and stability


def test_lint_passes_without_warnings_at_the_minimum_and_a_current_kubernetes():
    problems = lint_problems()
    assert not problems, json.dumps(problems, indent=2)


def test_chart_metadata_requires_kubernetes_1_29():
    # Native sidecars (the dind-rm guard) and webhook matchConditions need 1.29.
    metadata = chart().metadata
    assert metadata["apiVersion"] == "v2"
    assert metadata["kubeVersion"] == ">=1.29.0-0"
    assert metadata["appVersion"] == re.search(r'^version = "([^"]+)"', (REPO / "Cargo.toml").read_text(), re.M).group(1)


@pytest.mark.parametrize("case", ["defaults", "tls-certManager", "tls-secret", "monitoring"])
def test_two_renders_are_identical(case):
    name, namespace = release_of(case)
    assert render_raw(values_of(case), name, namespace) == render_raw(values_of(case), name, namespace)


def test_no_template_generates_secrets_or_reads_the_cluster():
    # genCA/lookup-based certificates change on every render (helm#9426): GitOps tools would
    # roll the webhook on every sync. TLS material is made at run time or by cert-manager.
    forbidden = re.compile(r"\b(genCA|genSelfSignedCert|genSignedCert|genPrivateKey|lookup|randAlphaNum|randAscii|uuidv4|now)\b")
    for template in chart().templates:
        actions = " ".join(re.findall(r"\{\{.*?\}\}", template["data"], re.S))
        found = forbidden.findall(actions)
        assert not found, f"{template['name']} uses {found}"


# ---------------------------------------------------------------------------------------
# the matrix: schema and invariants


@pytest.fixture(scope="module", params=sorted(CASES))
def rendered(request):
    case = request.param
    values = values_of(case)
    name, namespace = release_of(case)
    return case, effective(values), render(values, name, namespace), name, namespace


def test_every_object_passes_the_official_schema(rendered):
    case, _, docs, _, _ = rendered
    skipped = set()
    failures = []
    for doc in docs:
        obj = strip(doc)
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except SchemaNotFoundError:
                skipped.add((obj["apiVersion"], obj["kind"]))
            except kubernetes_validate.ValidationError as error:
                path = ".".join(str(p) for p in error.path)
                failures.append(f"{doc['__template']} {obj['kind']}/{obj['metadata']['name']} @ {version}: {path}: {error.message}")
    assert not failures, "\n".join(failures)
    assert skipped <= CRD_KINDS, f"{case}: no schema for {skipped - CRD_KINDS}; only {CRD_KINDS} may be skipped"


def config_check(path: Path, text: str) -> subprocess.CompletedProcess[str]:
    path.write_text(text)
    return subprocess.run([str(podmend_bin()), "config", "--check", str(path)], capture_output=True, text=True)


def test_the_config_map_is_a_config_podmend_accepts(rendered, tmp_path):
    case, values, docs, _, namespace = rendered
    config_map = one(docs, "ConfigMap") if not values["metrics"]["dashboard"]["enabled"] else next(
        d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d["data"]
    )
    text = config_map["data"]["config.yaml"]
    config = yaml.safe_load(text)
    check = config_check(tmp_path / "config.yaml", text)
    assert check.returncode == 0, f"{case}: podmend config --check refused the chart's config:\n{check.stdout}{check.stderr}\n---\n{text}"

    assert set(config) == {"excludeNamespaces", "rules"}
    assert "kube-system" in config["excludeNamespaces"] and namespace in config["excludeNamespaces"]
    for ns in values["webhook"]["skipNamespaces"]:
        assert ns in config["excludeNamespaces"]
    rules = values["rules"]
    expected_rules = {"node-affinity", "agent-requests", "dind-rm"}
    if mode(rules["virtualNodePhase"]["mode"]) != "off":
        expected_rules.add("virtual-node-phase")
    assert set(config["rules"]) == expected_rules, f"{case}: {sorted(config['rules'])}"
    for key, name in (("nodeAffinity", "node-affinity"), ("agentRequests", "agent-requests"), ("dindRm", "dind-rm")):
        assert config["rules"][name]["mode"] == mode(rules[key]["mode"])
        assert config["rules"][name]["templates"] == mode(rules[key]["templates"])
    na, ar, dr = config["rules"]["node-affinity"], config["rules"]["agent-requests"], config["rules"]["dind-rm"]
    assert na["tolerateNodeTaints"] == rules["nodeAffinity"]["tolerateNodeTaints"]
    assert na["ignoreTaints"] == rules["nodeAffinity"]["ignoreTaints"]
    for key in ("presets", "selectors", "resources", "onlyPinned", "limitFromRequest", "zeroExclusiveCpus"):
        assert ar[key] == rules["agentRequests"][key]
    # dind-rm: exactly the keys podmend's config has for it, nothing the schema of this
    # podmend version would refuse.
    assert set(dr) == {"mode", "templates", "policy", "minAge", "maxExited", "nodeAgents", "sidecarMode", "guardImage",
                       "guardImageNeedsPullSecret", "guardCpuLimit", "daemonImages", "kubeletRootDir"}
    for key in ("policy", "minAge", "maxExited", "nodeAgents", "sidecarMode", "guardCpuLimit", "daemonImages", "kubeletRootDir"):
        assert dr[key] == rules["dindRm"][key], f"{case}: dind-rm {key}"
    image = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert dr["guardImage"] == (rules["dindRm"]["guardImage"] or image), "the guard defaults to the webhook's own image"
    # The chart's image from a registry with pull secrets: those exist in the release
    # namespace only, so pods elsewhere without one are left alone.
    assert dr["guardImageNeedsPullSecret"] == (
        rules["dindRm"]["guardImageNeedsPullSecret"] or (not rules["dindRm"]["guardImage"] and bool(values["imagePullSecrets"]))
    ), case
    if "virtual-node-phase" in config["rules"]:
        assert config["rules"]["virtual-node-phase"] == {
            "mode": mode(rules["virtualNodePhase"]["mode"]),
            "nodeSelector": rules["virtualNodePhase"]["nodeSelector"],
        }


def test_the_webhooks_call_the_service_and_routes_podmend_serves(rendered):
    _, values, docs, _, namespace = rendered
    routes = route_constants()
    service = one(webhook_objects(docs), "Service")
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]
    container = one_container(deployment)
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container_ports == {"https": 8443, "metrics": 9090}

    # the Service selects the webhook pods and forwards 443 to the HTTPS port
    assert service["metadata"]["namespace"] == namespace
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    https = next(p for p in service["spec"]["ports"] if p["name"] == "https")
    assert https["port"] == 443
    assert container_ports[https["targetPort"]] == 8443
    args = container["args"]
    assert args[0] == "serve"
    assert "--listen=[::]:8443" in args and "--metrics-listen=[::]:9090" in args

    for config in webhook_configurations(docs, values):
        kind = config["kind"]
        path = routes["MUTATE"] if kind.startswith("Mutating") else routes["VALIDATE"]
        assert config["webhooks"], kind
        for webhook in config["webhooks"]:
            target = webhook["clientConfig"]["service"]
            assert target == {"name": service["metadata"]["name"], "namespace": namespace, "path": path, "port": https["port"]}, kind

    # probes on the plain-HTTP metrics port, at the server's routes
    assert container["livenessProbe"]["httpGet"] == {"path": routes["HEALTHZ"], "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": routes["READYZ"], "port": "metrics"}

    # Each ServiceMonitor selects exactly one Service (the webhook's, or the reaper's), and a
    # port of it, at the metrics route.
    services = by_kind(docs, "Service")
    for monitor in by_kind(docs, "ServiceMonitor"):
        endpoint = monitor["spec"]["endpoints"][0]
        assert endpoint["path"] == routes["METRICS"]
        selected = [s for s in services if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
        assert len(selected) == 1, f"{monitor['metadata']['name']} selects {[s['metadata']['name'] for s in selected]}"
        assert endpoint["port"] in {p["name"] for p in selected[0]["spec"]["ports"]}
        assert component(monitor) == component(selected[0])

    # the helm test pod calls the same Service and routes
    test_pod = next(d for d in by_kind(docs, "Pod") if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test")
    env = {e["name"]: e.get("value") for e in test_pod["spec"]["containers"][0]["env"]}
    assert env["URL"] == f"https://{service['metadata']['name']}.{namespace}.svc:{https['port']}"
    assert env["MUTATE_PATH"] == routes["MUTATE"] and env["VALIDATE_PATH"] == routes["VALIDATE"]


# TLS self-management (tls.mode self) is rendered ahead of the server: until `podmend serve`
# knows these flags, they are left out of the check below (and nothing else is).
SELF_TLS_FLAGS = ("--tls-self-manage", "--tls-secret", "--webhook-configurations")


@lru_cache(maxsize=1)
def serve_help() -> str:
    return subprocess.run([str(podmend_bin()), "serve", "--help"], capture_output=True, text=True, check=True).stdout


def test_the_container_args_are_flags_podmend_serve_accepts(rendered):
    _, _, docs, _, _ = rendered
    args = one_container(one(docs, "Deployment"))["args"]
    if "--tls-self-manage" not in serve_help():
        args = [a for a in args if not a.startswith(SELF_TLS_FLAGS)]
    # clap checks every flag and value before it acts on --help, so this parses the
    # arguments without starting a server.
    check = subprocess.run([str(podmend_bin()), *args, "--help"], capture_output=True, text=True)
    assert check.returncode == 0, f"podmend refuses the chart's arguments {args}:\n{check.stderr}"



def test_the_webhook_configurations_are_safe_and_as_set(rendered):
    case, values, docs, _, namespace = rendered
    rules_values = values["rules"]
    templates_active = any(
        mode(rules_values[r]["mode"]) != "off" and mode(rules_values[r]["templates"]) != "off"
        for r in ("nodeAffinity", "agentRequests", "dindRm")
    )
    status_active = mode(rules_values["virtualNodePhase"]["mode"]) != "off"
    for config in webhook_configurations(docs, values):
        kind = config["kind"]
        mutating = kind.startswith("Mutating")
        names = [w["name"] for w in config["webhooks"]]
        if mutating and status_active:
            assert names == ["mutate.podmend.io", "status.podmend.io"], names
        else:
            assert len(names) == 1 and "status.podmend.io" not in names, f"{case}: {names}"
        for webhook in config["webhooks"]:
            status_webhook = webhook["name"] == "status.podmend.io"
            assert webhook["admissionReviewVersions"] == ["v1"]
            assert webhook["sideEffects"] == "None"
            assert webhook["matchPolicy"] == "Equivalent"
            # The status webhook is fail-open whatever webhook.failurePolicy says.
            assert webhook["failurePolicy"] == ("Ignore" if status_webhook else values["webhook"]["failurePolicy"])
            assert webhook["timeoutSeconds"] == values["webhook"]["timeoutSeconds"]
            if status_webhook:
                assert webhook["reinvocationPolicy"] == "Never"
            elif mutating:
                assert webhook["reinvocationPolicy"] == "IfNeeded"
            else:
                assert "reinvocationPolicy" not in webhook

            rules = webhook["rules"]
            resources = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
            assert not any("binding" in r for _, r in resources), f"{kind} sees pods/binding"
            assert not any(r in ("*", "pods/*") for _, r in resources)
            status_rules = [r for r in rules if "pods/status" in r["resources"]]
            if status_webhook:
                # One rule, and nothing but status writes.
                assert rules == [{"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                  "resources": ["pods/status"], "scope": "Namespaced"}], rules
            else:
                assert not status_rules, f"{case}: {webhook['name']} has a pods/status rule"
                pod_rules = [r for r in rules if r["resources"] == ["pods"]]
                assert len(pod_rules) == 1 and pod_rules[0]["operations"] == ["CREATE"], "Pods: CREATE only"
                workload = {gr for gr in resources if gr in WORKLOAD_RULES}
                assert workload == (WORKLOAD_RULES if templates_active else set()), f"{case}: {kind} workload rules"
            for rule in rules:
                if any((g, r) in WORKLOAD_RULES for g in rule["apiGroups"] for r in rule["resources"]):
                    assert sorted(rule["operations"]) == ["CREATE", "UPDATE"]
            for rule in rules:
                assert rule["apiVersions"] == ["v1"] and rule["scope"] == "Namespaced"

            selector = webhook["namespaceSelector"]
            names = [e for e in selector["matchExpressions"] if e["key"] == "kubernetes.io/metadata.name"]
            assert names and names[0]["operator"] == "NotIn"
            excluded = set(names[0]["values"])
            assert {"kube-system", namespace} <= excluded
            assert set(values["webhook"]["skipNamespaces"]) <= excluded
            assert {"key": "podmend.io/ignore", "operator": "DoesNotExist"} in selector["matchExpressions"]
            for extra in values["webhook"]["namespaceSelector"]["matchExpressions"]:
                assert extra in selector["matchExpressions"]
            assert selector.get("matchLabels", {}) == values["webhook"]["namespaceSelector"]["matchLabels"]
            object_selector = values["webhook"]["objectSelector"]
            if object_selector["matchLabels"] or object_selector["matchExpressions"]:
                assert webhook["objectSelector"] == object_selector
            else:
                assert "objectSelector" not in webhook

            conditions = {c["name"]: c["expression"] for c in webhook["matchConditions"]}
            mirror = conditions["not-a-mirror-pod"]
            assert "'kubernetes.io/config.mirror' in object.metadata.annotations" in mirror
            assert mirror.startswith("object == null ||"), "guard for DELETE, where object is null"
            assert "!has(object.metadata.annotations)" in mirror
            # An explicit null is guarded too (tests/chart/test_match_conditions.py evaluates it).
            assert "object.metadata.annotations == null" in mirror
            assert "object.metadata.annotations == null" in conditions["not-skipped"]
            skip = conditions["not-skipped"]
            assert "'podmend.io/skip'" in skip and "'all'" in skip and skip.startswith("object == null ||")
            # Only the status webhook filters by phase; it only ever sees UPDATE, where
            # `object` is the Pod, and it guards every field it reads with has().
            pending = conditions.get("pending-pods-only")
            if status_webhook:
                assert pending == (
                    "object != null && has(object.status) && has(object.status.phase) && "
                    "object.status.phase == 'Pending'"
                ), pending
            else:
                assert pending is None, f"{case}: {webhook['name']} filters by phase"
            assert not any("request.subResource" in e for e in conditions.values()), (
                "request.subResource is absent (not \"\") without a subresource: reading it errors"
            )


def test_no_object_mentions_pods_binding(rendered):
    _, _, docs, _, _ = rendered
    for doc in docs:
        assert "pods/binding" not in json.dumps(strip(doc)), doc["__template"]


def test_the_deployment_is_hardened_and_highly_available(rendered):
    case, values, docs, name, namespace = rendered
    deployment = one(docs, "Deployment")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    container = one_container(deployment)
    assert spec["replicas"] == values["replicaCount"]
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0

    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 65532
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert security["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert container["resources"]["requests"] and container["resources"]["limits"]

    if values["topologySpread"]["enabled"]:
        (spread,) = pod["topologySpreadConstraints"]
        assert spread["topologyKey"] == "kubernetes.io/hostname"
        assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
        assert spread["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    else:
        assert "topologySpreadConstraints" not in pod
    if values["priorityClassName"]:
        assert pod["priorityClassName"] == values["priorityClassName"]
    else:
        assert "priorityClassName" not in pod

    pdbs = by_kind(docs, "PodDisruptionBudget")
    if values["podDisruptionBudget"]["enabled"]:
        (pdb,) = pdbs
        assert pdb["spec"]["minAvailable"] == values["podDisruptionBudget"]["minAvailable"]
        assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    else:
        assert not pdbs

    # config and TLS mounted where the flags point
    args = container["args"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    flag = lambda f: next(a.split("=", 1)[1] for a in args if a.startswith(f + "="))  # noqa: E731
    assert flag("--config") == mounts["config"] + "/config.yaml"
    assert flag("--tls-cert") == mounts["tls"] + "/tls.crt" and flag("--tls-key") == mounts["tls"] + "/tls.key"
    config_maps = [d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d["data"]]
    assert volumes["config"]["configMap"]["name"] == config_maps[0]["metadata"]["name"]
    assert "subPath" not in json.dumps(container["volumeMounts"]), "subPath mounts never see updates"
    assert flag("--shutdown-seconds") == str(values["shutdownSeconds"])
    assert flag("--shutdown-delay-seconds") == str(values["shutdownDelaySeconds"])
    assert flag("--cache-stale-seconds") == str(values["cacheStaleSeconds"])
    assert values["shutdownDelaySeconds"] + values["shutdownSeconds"] < pod["terminationGracePeriodSeconds"]

    # the ServiceAccount the pods run as is the one RBAC binds (the `helm test` hooks and the
    # scheduled jobs have their own, checked in test_helm_test.py and test_jobs.py)
    installed = webhook_objects(docs)
    account = pod["serviceAccountName"]
    accounts = [d["metadata"]["name"] for d in by_kind(installed, "ServiceAccount")]
    assert accounts == ([account] if values["serviceAccount"]["create"] else [])
    for binding in by_kind(installed, "ClusterRoleBinding") + by_kind(installed, "RoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    roles = by_kind(installed, "ClusterRole")
    if values["rbac"]["create"]:
        read = roles[0]["rules"][0]
        # list and watch feed the caches; tests/rbac.rs proves no get is ever sent.
        assert read == {"apiGroups": [""], "resources": ["nodes", "namespaces", "limitranges"], "verbs": ["list", "watch"]}
    else:
        assert not roles and not by_kind(docs, "Role") and not by_kind(docs, "ClusterRole")


def test_tls_mode_wiring(rendered):
    case, values, docs, name, namespace = rendered
    tls = values["tls"]
    installed = webhook_objects(docs)  # the TLS RBAC, not `helm test`'s or the jobs'
    deployment = one(docs, "Deployment")
    container = one_container(deployment)
    args = container["args"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    secret_name = (
        f"{name}-tls" if tls["mode"] == "self" and "secret" not in volumes["tls"] else volumes["tls"]["secret"]["secretName"]
    )
    configs = webhook_configurations(docs, values)
    mutating, validating = configs[0], (configs[1:] or [None])[0]
    self_flags = [a for a in args if a.startswith(("--tls-self-manage", "--tls-secret", "--webhook-configurations"))]
    certificates = by_kind(docs, "Certificate")
    test_pod = next(d for d in by_kind(docs, "Pod") if d["metadata"]["annotations"].get("helm.sh/hook") == "test")
    test_volumes = {v["name"]: v for v in test_pod["spec"]["volumes"]}

    if tls["mode"] == "self":
        # podmend writes the certificate it keeps in the Secret into a writable in-memory dir.
        assert volumes["tls"] == {"name": "tls", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
        tls_mount = next(m for m in container["volumeMounts"] if m["name"] == "tls")
        assert not tls_mount.get("readOnly", False)
        env = {e["name"]: e for e in container["env"]}
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        service = one(webhook_objects(docs), "Service")["metadata"]["name"]
        self_flags = [a for a in args if a.startswith(("--tls-self-manage", "--tls-secret", "--webhook-configurations", "--tls-service"))]
        assert self_flags == [
            "--tls-self-manage",
            f"--tls-secret={secret_name}",
            # Each by its kind: the RBAC grants each name on its own kind only.
            # The validating one only while it is registered (while a rule denies).
            f"--webhook-configurations=mutatingwebhookconfigurations/{mutating['metadata']['name']}"
            + (f",validatingwebhookconfigurations/{validating['metadata']['name']}" if validating else ""),
            f"--tls-service={service}",
        ]
        assert f"--tls-validity-days={tls['self']['validityDays']}" in args
        assert f"--tls-renew-before-days={tls['self']['renewBeforeDays']}" in args
        for config in configs:
            assert all("caBundle" not in w["clientConfig"] for w in config["webhooks"]), "written at run time"
            assert "cert-manager.io/inject-ca-from" not in config["metadata"].get("annotations", {})
        assert not certificates and not by_kind(docs, "Issuer")
        if values["rbac"]["create"]:
            role = one(installed, "Role")
            assert role["metadata"]["namespace"] == namespace
            scoped = [r for r in role["rules"] if "resourceNames" in r]
            # Renewal replaces the Secret (update); tests/rbac.rs proves no patch is ever sent.
            assert scoped == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [secret_name], "verbs": ["get", "update"]}]
            unscoped = [r for r in role["rules"] if "resourceNames" not in r]
            assert unscoped == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}], "create cannot be scoped by name"
            cluster_rules = one(installed, "ClusterRole")["rules"]
            webhook_rules = [r for r in cluster_rules if r["apiGroups"] == ["admissionregistration.k8s.io"]]
            assert {(r["resources"][0], tuple(r["resourceNames"]), tuple(r["verbs"])) for r in webhook_rules} == {
                (f"{c['kind'].lower()}s", (c["metadata"]["name"],), ("get", "patch")) for c in configs
            }
        assert test_volumes["tls"]["secret"]["secretName"] == secret_name
    else:
        assert not self_flags
        assert not by_kind(installed, "Role")
        if values["rbac"]["create"]:
            cluster_rules = one(installed, "ClusterRole")["rules"]
            assert all(r["apiGroups"] == [""] for r in cluster_rules), "no webhook configuration access without self mode"

    # Only cert-manager issues the certificate after the pod starts: serve waits for its files.
    assert ("--tls-wait-for-files" in args) == (tls["mode"] == "certManager"), args

    if tls["mode"] == "certManager":
        serving = next(c for c in certificates if c["spec"]["secretName"] == secret_name)
        for config in configs:
            assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{namespace}/{serving['metadata']['name']}"
            assert all("caBundle" not in w["clientConfig"] for w in config["webhooks"])
        service = one(webhook_objects(docs), "Service")["metadata"]["name"]
        assert f"{service}.{namespace}.svc" in serving["spec"]["dnsNames"]
        assert serving["spec"]["duration"] == tls["certManager"]["duration"]
        assert serving["spec"]["renewBefore"] == tls["certManager"]["renewBefore"]
        issuer_ref = tls["certManager"]["issuerRef"]
        if issuer_ref["name"]:
            assert serving["spec"]["issuerRef"] == issuer_ref
            assert len(certificates) == 1 and not by_kind(docs, "Issuer")
        else:
            issuers = {i["metadata"]["name"]: i["spec"] for i in by_kind(docs, "Issuer")}
            ca_issuer = issuers[serving["spec"]["issuerRef"]["name"]]
            ca_cert = next(c for c in certificates if c["spec"].get("isCA"))
            assert ca_issuer == {"ca": {"secretName": ca_cert["spec"]["secretName"]}}
            assert issuers[ca_cert["spec"]["issuerRef"]["name"]] == {"selfSigned": {}}
        assert test_volumes["tls"]["secret"]["secretName"] == secret_name
    else:
        assert not certificates

    if tls["mode"] == "secret":
        assert secret_name == tls["secret"]["name"] and "optional" not in volumes["tls"]["secret"]
        for config in configs:
            assert all(w["clientConfig"]["caBundle"] == tls["secret"]["caBundle"] for w in config["webhooks"])
        env = {e["name"]: e.get("value") for e in test_pod["spec"]["containers"][0]["env"]}
        assert env["CA_BUNDLE"] == tls["secret"]["caBundle"]
        assert "tls" not in test_volumes
        assert base64.b64decode(tls["secret"]["caBundle"]).startswith(b"-----BEGIN CERTIFICATE-----")


def test_client_ca_wiring(rendered):
    _, values, docs, _, _ = rendered
    client_ca = values["tls"]["clientCA"]
    deployment = one(docs, "Deployment")
    container = one_container(deployment)
    flags = [a for a in container["args"] if a.startswith("--client-ca")]
    mounts = [m for m in container["volumeMounts"] if m["name"] == "client-ca"]
    volumes = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "client-ca"]
    if not (client_ca["secretName"] or client_ca["configMapName"]):
        assert not flags and not mounts and not volumes
        return
    assert flags == ["--client-ca=/etc/podmend/client-ca/ca.crt"]
    assert mounts == [{"name": "client-ca", "mountPath": "/etc/podmend/client-ca", "readOnly": True}]
    items = [{"key": client_ca["key"], "path": "ca.crt"}]
    if client_ca["secretName"]:
        # Not optional: without the CA podmend would refuse to start rather than serve open.
        assert volumes == [{"name": "client-ca", "secret": {"secretName": client_ca["secretName"], "items": items}}]
    else:
        assert volumes == [{"name": "client-ca", "configMap": {"name": client_ca["configMapName"], "items": items}}]


def test_optional_monitoring_objects(rendered):
    _, values, docs, _, _ = rendered
    assert bool(by_kind(webhook_objects(docs), "ServiceMonitor")) == values["metrics"]["serviceMonitor"]["enabled"]
    # The reaper's metrics are scraped under the same switch, with the same settings.
    reaper_monitors = [d for d in by_kind(docs, "ServiceMonitor") if component(d) == "reaper"]
    assert bool(reaper_monitors) == (values["metrics"]["serviceMonitor"]["enabled"] and values["reaper"]["enabled"])
    for monitor in reaper_monitors:
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["interval"] == values["metrics"]["serviceMonitor"]["interval"]
        assert endpoint["scrapeTimeout"] == values["metrics"]["serviceMonitor"]["scrapeTimeout"]
        assert values["metrics"]["serviceMonitor"]["labels"].items() <= monitor["metadata"]["labels"].items()
    dashboards = [d for d in by_kind(docs, "ConfigMap") if "podmend.json" in d.get("data", {})]
    assert bool(dashboards) == values["metrics"]["dashboard"]["enabled"]
    for dashboard in dashboards:
        assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
        json.loads(dashboard["data"]["podmend.json"])


def test_every_object_is_labelled_and_namespaced_in_the_release(rendered):
    _, values, docs, name, namespace = rendered
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == name, doc["__template"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        if doc["kind"] in cluster_scoped:
            assert "namespace" not in doc["metadata"]
        elif is_test_hook(doc) and doc["kind"] in ("Role", "RoleBinding"):
            # `helm test` with tls.clientCA may create Pods (dry run) in tests.namespace only.
            assert doc["metadata"]["namespace"] == values["tests"]["namespace"], doc["__template"]
        elif doc["kind"] in ("Role", "RoleBinding") and component(doc) in JOB_KEYS:
            # A job limited to one namespace is granted there only.
            assert doc["metadata"]["namespace"] == values[JOB_KEYS[component(doc)]]["namespace"], doc["__template"]
        else:
            assert doc["metadata"]["namespace"] == namespace, doc["__template"]
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), "duplicate objects"


# The values key of each job component.
JOB_KEYS = {"reports": "reports", "storm-cleanup": "stormCleanup"}


# ---------------------------------------------------------------------------------------
# values the schema or validate.yaml must refuse, with a message naming the problem


@pytest.mark.parametrize(
    "values, expected",
    [
        pytest.param({"replicaCont": 3}, ["additional properties", "replicaCont"], id="typo-top-level"),
        pytest.param({"webhook": {"failurePolicyy": "Fail"}}, ["/webhook", "failurePolicyy"], id="typo-nested"),
        pytest.param({"rules": {"nodeAfinity": {"mode": "off"}}}, ["/rules", "nodeAfinity"], id="typo-rule"),
        pytest.param({"webhook": {"timeoutSeconds": 31}}, ["/webhook/timeoutSeconds", "30"], id="timeout-31"),
        pytest.param({"webhook": {"timeoutSeconds": 0}}, ["/webhook/timeoutSeconds", "1"], id="timeout-0"),
        pytest.param({"webhook": {"failurePolicy": "Sometimes"}}, ["/webhook/failurePolicy", "Ignore", "Fail"], id="failure-policy"),
        pytest.param({"tls": {"mode": "foo"}}, ["/tls/mode", "self", "certManager", "secret"], id="tls-mode"),
        pytest.param({"tls": {"mode": "secret"}}, ["/tls/secret", "name", "caBundle"], id="tls-secret-without-name-and-ca"),
        pytest.param({"tls": {"mode": "secret", "secret": {"name": "x"}}}, ["/tls/secret", "caBundle"], id="tls-secret-without-ca"),
        pytest.param({"tls": {"mode": "secret", "secret": {"name": "x", "caBundle": "not base64!"}}}, ["/tls/secret/caBundle"], id="ca-not-base64"),
        pytest.param({"replicaCount": 0}, ["/replicaCount", "minimum"], id="replicas-0"),
        pytest.param({"tls": {"self": {"renewBeforeDays": 0}}}, ["/tls/self/renewBeforeDays", "minimum"], id="renew-before-0"),
        pytest.param({"replicaCount": "2"}, ["/replicaCount", "integer"], id="replicas-string"),
        pytest.param({"rules": {"nodeAffinity": {"mode": "fix"}}}, ["/rules/nodeAffinity/mode", "enforce"], id="rule-mode"),
        pytest.param({"rules": {"dindRm": {"policy": "keep"}}}, ["/rules/dindRm/policy", "collect", "rm"], id="dind-policy"),
        pytest.param({"rules": {"dindRm": {"minAge": "5 minutes"}}}, ["/rules/dindRm/minAge"], id="dind-min-age-words"),
        pytest.param({"rules": {"dindRm": {"minAge": 300}}}, ["/rules/dindRm/minAge", "string"], id="dind-min-age-number"),
        pytest.param({"rules": {"dindRm": {"maxExited": -1}}}, ["/rules/dindRm/maxExited", "minimum"], id="dind-max-exited-negative"),
        pytest.param({"rules": {"dindRm": {"nodeAgents": "ignore"}}}, ["/rules/dindRm/nodeAgents", "skip", "guard"], id="dind-node-agents"),
        pytest.param({"rules": {"dindRm": {"daemonImages": ["*"]}}}, ["/rules/dindRm/daemonImages/0"], id="dind-daemon-images-all"),
        pytest.param({"rules": {"dindRm": {"daemonImages": ["docker:2?-dind"]}}}, ["/rules/dindRm/daemonImages/0"], id="dind-daemon-images-wildcard"),
        pytest.param({"rules": {"dindRm": {"guardImage": "my image"}}}, ["/rules/dindRm/guardImage"], id="dind-guard-image-space"),
        pytest.param({"rules": {"dindRm": {"guardCpuLimit": "1 core"}}}, ["/rules/dindRm/guardCpuLimit"], id="dind-guard-cpu-limit-not-a-quantity"),
        pytest.param({"rules": {"virtualNodePhase": {"mode": "deny"}}}, ["/rules/virtualNodePhase/mode"], id="vnp-deny"),
        pytest.param({"rules": {"agentRequests": {"resources": ["nvidia.com/gpu"]}}}, ["/rules/agentRequests/resources/0"], id="gpu-zeroed"),
        pytest.param({"rules": {"agentRequests": {"presets": ["gitlab"]}}}, ["/rules/agentRequests/presets/0"], id="unknown-preset"),
        pytest.param({"rules": {"agentRequests": {"selectors": [{}]}}}, ["/rules/agentRequests/selectors/0"], id="empty-selector"),
        pytest.param({"webhook": {"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Equals"}]}}},
                     ["/webhook/namespaceSelector/matchExpressions/0/operator"], id="selector-operator"),
        pytest.param({"image": {"digest": "latest"}}, ["/image/digest"], id="digest"),
        pytest.param({"securityContext": {"runAsUsr": 1}}, ["/securityContext", "runAsUsr"], id="security-context-typo"),
        pytest.param({"tls": {"clientCA": {"secretName": "Client_CA"}}}, ["/tls/clientCA/secretName"], id="client-ca-secret-name"),
        pytest.param({"tls": {"clientCA": {"key": "ca/crt"}}}, ["/tls/clientCA/key"], id="client-ca-key"),
        pytest.param({"tests": {"namespace": "CI_Jobs"}}, ["/tests/namespace"], id="tests-namespace"),
        pytest.param({"webhook": {"url": "https://local host:8443"}}, ["/webhook/url"], id="webhook-url-space"),
    ],
)
def test_the_schema_refuses_bad_values_naming_the_key(values, expected):
    message = schema_error(values)
    for part in expected:
        assert part in message, f"{part!r} not in: {message}"


@pytest.mark.parametrize(
    "values, expected",
    [
        pytest.param({"replicaCount": 1, "webhook": {"failurePolicy": "Fail"}, "podDisruptionBudget": {"enabled": False}},
                     "failurePolicy Fail with replicaCount 1", id="fail-single-replica-no-pdb"),
        pytest.param({"shutdownSeconds": 30}, "shutdownDelaySeconds + shutdownSeconds (5 + 30) must be below terminationGracePeriodSeconds (30)", id="shutdown-vs-grace"),
        pytest.param({"shutdownDelaySeconds": 10}, "shutdownDelaySeconds + shutdownSeconds (10 + 20) must be below terminationGracePeriodSeconds (30)", id="shutdown-delay-vs-grace"),
        pytest.param({"tls": {"secret": {"name": "x"}}}, "tls.secret.* is only used with tls.mode secret", id="secret-values-in-self-mode"),
        pytest.param({"podDisruptionBudget": {"minAvailable": 3}}, "minAvailable (3) is above replicaCount (2)", id="pdb-above-replicas"),
        pytest.param({"podDisruptionBudget": {"minAvailable": 2}}, "minAvailable (2) keeps all 2 replicas up", id="pdb-equal-to-replicas"),
        pytest.param({"podDisruptionBudget": {"minAvailable": "100%"}}, "minAvailable (100%) keeps all 2 replicas up", id="pdb-hundred-percent"),
        pytest.param({"replicaCount": 3, "podDisruptionBudget": {"minAvailable": "67%"}}, "minAvailable (67%) keeps all 3 replicas up", id="pdb-percent-rounds-up-to-all"),
        pytest.param({"serviceAccount": {"create": False}}, "serviceAccount.create is false", id="rbac-without-account"),
        pytest.param({"tls": {"clientCA": {"secretName": "a", "configMapName": "b"}}},
                     "tls.clientCA: set secretName or configMapName, not both", id="client-ca-from-both"),
        pytest.param({"tls": {"self": {"validityDays": 30, "renewBeforeDays": 30}}},
                     "tls.self.renewBeforeDays (30) must be below tls.self.validityDays (30)", id="renew-before-validity"),
        pytest.param({"tls": {"clientCA": {"secretName": "a"}}, "tests": {"namespace": "kube-system"}},
                     "tests.namespace kube-system is never sent to the webhook", id="client-ca-test-namespace-excluded"),
        pytest.param({"tls": {"clientCA": {"secretName": "a"}}, "webhook": {"skipNamespaces": ["default"]}},
                     "tests.namespace default is never sent to the webhook", id="client-ca-test-namespace-skipped"),
    ],
)
def test_impossible_combinations_fail_the_render(values, expected):
    chart().validate_schema(values)  # each key is valid on its own
    with pytest.raises(helm.HelmRenderError) as refusal:
        render_raw(values)
    assert expected in str(refusal.value)


def test_cert_manager_certificates_fit_its_common_name_limit_with_the_longest_names():
    # cert-manager refuses a commonName over 64 characters: a release and namespace of 63
    # each made the serving certificate's <service>.<namespace>.svc far longer, and failed
    # helm install. The serving certificate names DNS names only.
    docs = render({"tls": {"mode": "certManager"}}, name="r" * 53, namespace="n" * 63)
    certificates = [d for d in docs if d["kind"] == "Certificate"]
    assert len(certificates) == 2, certificates
    for certificate in certificates:
        assert len(certificate["spec"].get("commonName", "")) <= 64, certificate["spec"]
    serving = [c for c in certificates if not c["spec"].get("isCA")]
    assert len(serving) == 1 and "commonName" not in serving[0]["spec"], serving
    assert serving[0]["spec"]["dnsNames"], serving


@pytest.mark.parametrize(
    ("rules", "registered"),
    [
        pytest.param({}, False, id="defaults"),
        pytest.param({"nodeAffinity": {"mode": "deny"}}, True, id="pods-deny"),
        pytest.param({"dindRm": {"templates": "deny"}}, True, id="templates-deny"),
        pytest.param({"dindRm": {"policy": "deny"}}, False, id="guard-policy-deny-is-not-a-mode"),
    ],
)
def test_the_validating_webhook_is_registered_only_while_a_rule_denies(rules, registered):
    # With no rule in deny it answers "allowed" to every pod and workload write, and during an
    # outage each of those writes waits for its timeout once more.
    values = {"rules": rules}
    docs = render(values)
    validating = by_kind(docs, "ValidatingWebhookConfiguration")
    assert len(validating) == (1 if registered else 0)
    args = one_container(one(docs, "Deployment"))["args"]
    named = next(a for a in args if a.startswith("--webhook-configurations="))
    assert ("validatingwebhookconfigurations/" in named) == registered, named
    cluster_rules = one(webhook_objects(docs), "ClusterRole")["rules"]
    granted = {r["resources"][0] for r in cluster_rules if r["apiGroups"] == ["admissionregistration.k8s.io"]}
    assert granted == ({"mutatingwebhookconfigurations", "validatingwebhookconfigurations"} if registered
                       else {"mutatingwebhookconfigurations"})


@pytest.mark.parametrize(
    ("values", "needs"),
    [
        pytest.param({}, False, id="public-image"),
        pytest.param({"imagePullSecrets": [{"name": "regcred"}]}, True, id="private-registry"),
        pytest.param({"imagePullSecrets": [{"name": "regcred"}], "rules": {"dindRm": {"guardImage": "mirror.example/podmend:1"}}},
                     False, id="guard-image-elsewhere"),
        pytest.param({"rules": {"dindRm": {"guardImageNeedsPullSecret": True}}}, True, id="said-so"),
    ],
)
def test_a_private_registry_makes_dind_pods_without_a_pull_secret_be_left_alone(values, needs):
    # imagePullSecrets exist in the release namespace only: a DinD pod elsewhere without a
    # pull secret would wait in Init:ErrImagePull for the chart's image as its guard.
    config_map = next(d for d in by_kind(render(values), "ConfigMap") if "config.yaml" in d["data"])
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert config["rules"]["dind-rm"]["guardImageNeedsPullSecret"] is needs


def test_the_webhook_port_is_a_value_that_the_container_and_the_service_follow():
    # Some managed control planes reach nodes on 443 only: the container then listens on 443,
    # unprivileged, through the pod's own net.ipv4.ip_unprivileged_port_start.
    docs = render({"webhook": {"port": 443}})
    deployment = one(docs, "Deployment")
    container = one_container(deployment)
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"https": 443, "metrics": 9090}
    assert "--listen=[::]:443" in container["args"]
    assert deployment["spec"]["template"]["spec"]["securityContext"]["sysctls"] == [
        {"name": "net.ipv4.ip_unprivileged_port_start", "value": "443"}
    ]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    service = one(webhook_objects(docs), "Service")
    https = next(p for p in service["spec"]["ports"] if p["name"] == "https")
    assert https["port"] == 443 and https["targetPort"] == "https"
    # Above 1024 nothing is added to the pod's security context.
    default = one(render({}), "Deployment")["spec"]["template"]["spec"]["securityContext"]
    assert "sysctls" not in default
    with pytest.raises(helm.HelmRenderError) as refusal:
        render_raw({"webhook": {"port": 9090}})
    assert "webhook.port 9090 is the metrics port" in str(refusal.value)


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({"replicaCount": 3, "podDisruptionBudget": {"minAvailable": 2}}, id="two-of-three"),
        pytest.param({"replicaCount": 3, "podDisruptionBudget": {"minAvailable": "50%"}}, id="half-of-three-rounds-to-two"),
        pytest.param({"replicaCount": 1, "podDisruptionBudget": {"minAvailable": 1}}, id="single-replica-trade-off"),
    ],
)
def test_a_budget_that_still_allows_an_eviction_renders(values):
    # The disruption controller allows an eviction while fewer than all replicas must stay
    # up; one replica of one is the documented single-replica trade-off (NOTES warns).
    docs = render_raw(values)
    assert docs


def test_webhook_url_renders_objects_the_api_server_accepts_and_lints_clean():
    # A podmend outside the cluster (tests/chart.rs checks what is and is not rendered): the
    # webhook configurations with clientConfig.url pass the official schemas, and lint is clean.
    values = {
        "webhook": {"url": "https://localhost:8443"},
        "tls": {"mode": "secret", "secret": {"caBundle": dev_ca_bundle()}},
        "rules": {"virtualNodePhase": {"mode": "enforce"}},
        "reaper": {"enabled": True},
        "reports": {"enabled": True},
        "stormCleanup": {"enabled": True},
        "metrics": {"serviceMonitor": {"enabled": True}, "dashboard": {"enabled": True}},
    }
    failures = []
    for doc in render(values):
        obj = strip(doc)
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except SchemaNotFoundError:
                assert (obj["apiVersion"], obj["kind"]) in CRD_KINDS
            except kubernetes_validate.ValidationError as error:
                failures.append(f"{doc['__template']} {obj['kind']} @ {version}: {list(error.path)}: {error.message}")
    assert not failures, "\n".join(failures)
    problems = lint_problems(values)
    assert not problems, json.dumps(problems, indent=2)


# ---------------------------------------------------------------------------------------
# the chart's documentation and schema stay complete


def resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
    return node


def test_the_schema_is_closed_and_described():
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    problems = []

    def walk(node: dict[str, Any], path: str) -> None:
        if "properties" in node:
            if node.get("additionalProperties") is not False:
                problems.append(f"{path}: additionalProperties is not false")
            for key, child in node["properties"].items():
                if "description" not in child:
                    problems.append(f"{path}.{key}: no description")
                if path == "" and key == "global":
                    continue  # Helm's own key for parent charts
                walk(resolve(schema, child), f"{path}.{key}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(resolve(schema, node[key]), f"{path}[{key}]")
        for key in ("anyOf", "allOf", "oneOf"):
            for child in node.get(key, []):
                walk(resolve(schema, child), path)

    walk(schema, "")
    for name, definition in schema["definitions"].items():
        walk(definition, f"definitions.{name}")
    assert not problems, "\n".join(problems)


def test_every_value_the_schema_names_has_a_comment_in_values_yaml():
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, str, dict[str, Any] | None]] = []  # (indent, key, schema node of that key)
    missing = []
    for number, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z0-9_.\-/]+):(\s|$)", line)
        if not match:
            continue
        indent, key = len(match.group(1)), match.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = resolve(schema, stack[-1][2]) if stack and stack[-1][2] is not None else (schema if not stack else None)
        node = None
        if parent is not None and "properties" in parent:
            node = parent["properties"].get(key)
            assert node is not None, f"values.yaml line {number + 1}: {key} is not in values.schema.json"
            previous = lines[number - 1].strip() if number else ""
            if not previous.startswith("#") and "#" not in line:
                missing.append(f"line {number + 1}: {'.'.join([k for _, k, _ in stack] + [key])}")
        stack.append((indent, key, node))
    assert not missing, "values without a comment:\n" + "\n".join(missing)


def test_the_dashboard_uses_the_metrics_podmend_exports():
    readme_metrics = set(re.findall(r"`(podmend_[a-z_]+)`", (REPO / "README.md").read_text()))
    dashboard = json.loads((CHART_DIR / "dashboards" / "podmend.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {re.sub(r"_(bucket|sum|count)$", "", m) for e in exprs for m in re.findall(r"podmend_[a-z_]+", e)}
    assert used <= readme_metrics, f"metrics not in README.md: {used - readme_metrics}"
    for needed in (
        "podmend_admission_requests_total",
        "podmend_admission_duration_seconds",
        "podmend_rule_actions_total",
        "podmend_tls_certificate_expiry_timestamp_seconds",
    ):
        assert needed in used, needed
