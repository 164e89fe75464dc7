"""What the chart tests share: rendering charts/podmend with Helm's own engine
(helm-python-sdk), the podmend binary under test, and the matrix of values every test walks.

Imported by the test modules beside it (pytest puts this directory on sys.path).
"""

from __future__ import annotations

import base64
import copy
import os
import re
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "podmend"
RELEASE = "podmend"
NAMESPACE = "podmend-system"


@lru_cache(maxsize=1)
def route_constants() -> dict[str, str]:
    """The route constants of src/server/paths.rs, e.g. {"MUTATE": "/mutate"}."""
    text = (REPO / "src" / "server" / "paths.rs").read_text()
    constants = dict(re.findall(r'pub const (\w+): &str = "([^"]*)";', text))
    for name in ("MUTATE", "VALIDATE", "HEALTHZ", "READYZ", "METRICS"):
        assert name in constants, f"src/server/paths.rs has no `pub const {name}: &str`"
    return constants


@lru_cache(maxsize=1)
def podmend_bin() -> Path:
    """The podmend binary: $PODMEND_BIN, else target/debug/podmend, built when missing."""
    if os.environ.get("PODMEND_BIN"):
        path = Path(os.environ["PODMEND_BIN"])
        assert path.is_file(), f"PODMEND_BIN={path} does not exist"
        return path
    path = REPO / "target" / "debug" / "podmend"
    if not path.is_file():
        subprocess.run(["cargo", "build", "--locked", "--bin", "podmend"], cwd=REPO, check=True)
    return path


@lru_cache(maxsize=1)
def chart() -> helm.Chart:
    return helm.Chart.load(str(CHART_DIR))


def render_raw(values: dict[str, Any], name: str = RELEASE, namespace: str = NAMESPACE) -> dict[str, str]:
    return chart().render(copy.deepcopy(values), name=name, namespace=namespace)


def render(values: dict[str, Any], name: str = RELEASE, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """Every object the chart renders (tests hooks included), NOTES.txt left out."""
    docs = []
    for template, text in sorted(render_raw(values, name, namespace).items()):
        if template.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc is not None:
                doc["__template"] = template
                docs.append(doc)
    return docs


def strip(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "__template"}


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def effective(values: dict[str, Any]) -> dict[str, Any]:
    """The values a release uses: chart defaults with `values` on top."""
    return deep_merge(chart().values, values)


def mode(value: Any) -> str:
    return "off" if value is False else value


def deny_active(values: dict[str, Any]) -> bool:
    """Whether some rule of these effective values refuses objects (mode or templates deny):
    only then does the chart register the validating webhook."""
    rules = values["rules"]
    return any(
        mode(rules[r][key]) == "deny"
        for r in ("nodeAffinity", "agentRequests", "dindRm", "virtualNodePhase")
        for key in ("mode", "templates")
        if key in rules[r]
    )


def webhook_configurations(docs: list[dict[str, Any]], values: dict[str, Any]) -> list[dict[str, Any]]:
    """The mutating configuration, and the validating one, which is there exactly while a rule
    denies (checked here)."""
    validating = by_kind(docs, "ValidatingWebhookConfiguration")
    assert len(validating) == (1 if deny_active(values) else 0), [v["metadata"]["name"] for v in validating]
    return [one(docs, "MutatingWebhookConfiguration"), *validating]


def is_test_hook(doc: dict[str, Any]) -> bool:
    """Whether `doc` exists only during `helm test`."""
    return (doc["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"


# The objects of the scheduled jobs and the node reaper carry their component label
# (templates/_jobs.tpl, templates/reaper.yaml).
COMPONENTS = ("reports", "storm-cleanup", "reaper")


def component(doc: dict[str, Any]) -> str | None:
    """`app.kubernetes.io/component` of `doc`, if any."""
    return (doc["metadata"].get("labels") or {}).get("app.kubernetes.io/component")


def webhook_objects(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What `helm install` creates for the webhook: no `helm test` hooks, no job or reaper objects."""
    return [d for d in docs if not is_test_hook(d) and component(d) not in COMPONENTS]


def one_container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


@lru_cache(maxsize=1)
def dev_ca_bundle() -> str:
    """Base64 of a real CA certificate, from `podmend certs`."""
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [str(podmend_bin()), "certs", "--dns", f"{RELEASE}.{NAMESPACE}.svc", "--out", out],
            check=True,
            capture_output=True,
        )
        return base64.b64encode((Path(out) / "ca.crt").read_bytes()).decode()


# ---------------------------------------------------------------------------------------
# the matrix


def cases() -> dict[str, dict[str, Any]]:
    return {
        "defaults": {},
        "tls-certManager": {"tls": {"mode": "certManager"}},
        "tls-certManager-existing-issuer": {
            "tls": {"mode": "certManager", "certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}
        },
        "tls-secret": {"tls": {"mode": "secret", "secret": {"name": "podmend-serving", "caBundle": "CA_BUNDLE"}}},
        "replicas-1": {"replicaCount": 1},
        "replicas-1-fail-with-pdb": {"replicaCount": 1, "webhook": {"failurePolicy": "Fail"}},
        "fail-timeout-30": {"webhook": {"failurePolicy": "Fail", "timeoutSeconds": 30}},
        "timeout-1-no-pdb-no-spread": {
            "webhook": {"timeoutSeconds": 1},
            "podDisruptionBudget": {"enabled": False},
            "topologySpread": {"enabled": False},
        },
        "node-affinity-off": {"rules": {"nodeAffinity": {"mode": "off"}}},
        "node-affinity-warn": {"rules": {"nodeAffinity": {"mode": "warn", "templates": "deny"}}},
        "agent-requests-off": {"rules": {"agentRequests": {"mode": "off"}}},
        "dind-rm-off": {"rules": {"dindRm": {"mode": "off"}}},
        "every-rule-off": {
            "rules": {
                "nodeAffinity": {"mode": "off"},
                "agentRequests": {"mode": "off"},
                "dindRm": {"mode": "off"},
            }
        },
        "every-template-off-yaml-false": {
            # unquoted YAML `off` arrives as false
            "rules": {
                "nodeAffinity": {"templates": False},
                "agentRequests": {"templates": False},
                "dindRm": {"templates": False},
            }
        },
        "templates-enforce": {"rules": {"agentRequests": {"templates": "enforce"}}},
        "virtual-node-phase-on": {"rules": {"virtualNodePhase": {"mode": "enforce"}}},
        # The status webhook stays fail-open and gets the caBundle like the others.
        "virtual-node-phase-fail-tls-secret": {
            "rules": {"virtualNodePhase": {"mode": "enforce"}},
            "webhook": {"failurePolicy": "Fail"},
            "tls": {"mode": "secret", "secret": {"name": "podmend-serving", "caBundle": "CA_BUNDLE"}},
        },
        "virtual-node-phase-warn-custom-nodes": {
            "rules": {"virtualNodePhase": {"mode": "warn", "nodeSelector": {"kubernetes.azure.com/role": "agent", "type": "virtual-kubelet"}}}
        },
        "rules-customised": {
            "rules": {
                "nodeAffinity": {"tolerateNodeTaints": False, "ignoreTaints": ["example.com/maintenance"],
                                 "schedulers": ["default-scheduler", "volcano"],
                                 "rewriteConstrainedPods": True, "skipPriorityClasses": True},
                "agentRequests": {
                    "presets": ["jenkins-agent"],
                    "selectors": [
                        {"matchLabels": {"app": "ci-agent"}},
                        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["agent"]}]},
                    ],
                    "resources": ["cpu", "memory", "ephemeral-storage"],
                    "onlyPinned": False,
                    "limitFromRequest": True,
                    "zeroExclusiveCpus": True,
                },
                "dindRm": {"policy": "deny", "minAge": "90s", "maxExited": 0, "nodeAgents": "guard", "sidecarMode": "container",
                           "guardImage": "registry.example/podmend:1", "daemonImages": ["registry.example/ci/dind:*"]},
            }
        },
        "namespace-selector-extras": {
            "webhook": {
                "skipNamespaces": ["ci-system", "kube-system"],
                "namespaceSelector": {
                    "matchLabels": {"podmend.io/enabled": "true"},
                    "matchExpressions": [{"key": "env", "operator": "In", "values": ["dev", "ci"]}],
                },
                "objectSelector": {"matchExpressions": [{"key": "podmend.io/opt-out", "operator": "DoesNotExist"}]},
                "annotations": {"example.com/owner": "platform"},
            }
        },
        "monitoring": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}, "dashboard": {"enabled": True}}},
        "pod-placement-and-image": {
            "image": {"digest": "sha256:" + "ab" * 32},
            "imagePullSecrets": [{"name": "regcred"}],
            "priorityClassName": "system-cluster-critical",
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}]}]}}},
            "podAnnotations": {"sidecar.istio.io/inject": "false"},
            "podLabels": {"team": "platform"},
            "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"}},
            "podDisruptionBudget": {"minAvailable": "50%"},
            "logFormat": "text",
            "logLevel": "info,podmend=debug",
        },
        "existing-service-account": {"serviceAccount": {"create": False, "name": "podmend-sa"}},
        "client-ca-secret": {"tls": {"clientCA": {"secretName": "apiserver-client-ca"}}},
        "client-ca-configmap-certManager": {
            "tls": {"mode": "certManager", "clientCA": {"configMapName": "apiserver-client-ca", "key": "client-ca.pem"}}
        },
        "no-rbac": {"rbac": {"create": False}},
        "node-affinity-deny": {"rules": {"nodeAffinity": {"mode": "deny"}}},
        # Every TLS mode with tls.clientCA (self: client-ca-secret; certManager:
        # client-ca-configmap-certManager): `helm test` goes through the API server.
        "tls-secret-client-ca": {
            "tls": {"mode": "secret", "secret": {"name": "podmend-serving", "caBundle": "CA_BUNDLE"},
                    "clientCA": {"secretName": "apiserver-client-ca"}}
        },
        "client-ca-opt-in-namespaces": {
            "tls": {"clientCA": {"secretName": "apiserver-client-ca"}},
            "rules": {"nodeAffinity": {"mode": "warn"}},
            "webhook": {
                "namespaceSelector": {"matchLabels": {"podmend.io/enabled": "true"}},
                "objectSelector": {"matchLabels": {"podmend.io/opt-in": "yes"}},
            },
            "tests": {"namespace": "ci"},
        },
        "client-ca-no-rbac": {"tls": {"clientCA": {"configMapName": "apiserver-client-ca"}}, "rbac": {"create": False}},
        # The scheduled jobs, cluster-wide with the defaults, and namespaced with every option.
        "jobs": {"reports": {"enabled": True}, "stormCleanup": {"enabled": True}},
        "jobs-namespaced-openreports-dry-run": {
            "reports": {"enabled": True, "format": "openreports", "namespace": "ci", "schedule": "@daily",
                        "timeZone": "Europe/Berlin", "pageSize": 100, "nodeSelector": {"kubernetes.io/os": "linux"}},
            "stormCleanup": {"enabled": True, "dryRun": True, "namespace": "ci", "threshold": 100, "keep": 0,
                             "deletesPerSecond": 2.5, "reasons": ["OutOfcpu", "NodeAffinity"],
                             "pushgateway": "http://pushgateway.monitoring:9091",
                             "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]},
        },
        "jobs-no-rbac": {"reports": {"enabled": True}, "stormCleanup": {"enabled": True}, "rbac": {"create": False}},
        # The node reaper with its defaults, and with every option (and the monitoring).
        "reaper": {"reaper": {"enabled": True}},
        "reaper-budget-dry-run-monitoring": {
            "reaper": {
                "enabled": True, "dockerSocket": "/run/docker.sock", "interval": "90s",
                "imagesHigh": "100G", "imagesLow": "80Gi", "imageMinAge": "10m", "dryRun": True,
                "metricsPort": 9100, "priorityClassName": "system-node-critical",
                "nodeSelector": {"node.example/runtime": "docker"},
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "node.example/pool", "operator": "NotIn", "values": ["gpu"]}]}]}}},
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ci", "effect": "NoSchedule"}],
                "maxUnavailable": "20%",
                "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}},
            },
            "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
            "imagePullSecrets": [{"name": "regcred"}],
            "logFormat": "text",
        },
        "reaper-no-rbac": {"reaper": {"enabled": True}, "rbac": {"create": False}},
    }


CASES = cases()
# Release name and namespace per case, to catch names hard-coded in templates.
RELEASES = {
    "namespace-selector-extras": ("ops-podmend", "ops"),
    "tls-certManager": ("mend", "platform"),
    # fullname at its 40-character limit: the CronJob names must still fit 52.
    "jobs-namespaced-openreports-dry-run": ("podmend-release-named-at-the-forty-limit", "ops"),
    "reaper-budget-dry-run-monitoring": ("ci-podmend", "platform"),
}


def values_of(case: str) -> dict[str, Any]:
    values = copy.deepcopy(CASES[case])
    if values.get("tls", {}).get("secret", {}).get("caBundle") == "CA_BUNDLE":
        values["tls"]["secret"]["caBundle"] = dev_ca_bundle()
    return values


def release_of(case: str) -> tuple[str, str]:
    return RELEASES.get(case, (RELEASE, NAMESPACE))


def rendered_case(case: str) -> tuple[str, dict[str, Any], list[dict[str, Any]], str, str]:
    """A case of the matrix rendered as its release: (case, effective values, documents,
    release name, namespace)."""
    values = values_of(case)
    name, namespace = release_of(case)
    return case, effective(values), render(values, name, namespace), name, namespace


def lint_problems(values: dict[str, Any] | None = None) -> list[Any]:
    """What `helm lint --strict` reports at the minimum and a current Kubernetes: errors and
    messages of warning severity or worse, with the version they came at (empty: clean)."""
    found = []
    for kube_version in ("v1.29.0", "v1.37.0"):
        args = (values,) if values is not None else ()
        report = helm.lint(str(CHART_DIR), *args, strict=True, namespace=NAMESPACE, kube_version=kube_version)
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        if report["errors"] or problems:
            found.append((kube_version, report))
    return found
