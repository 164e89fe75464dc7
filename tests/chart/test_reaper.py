"""The chart's opt-in node reaper (`reaper`): a DaemonSet running `podmend guard reap
--interval` against each node's Docker socket. Rendered and linted with Helm's engine; it runs
the command its values describe (arguments podmend accepts) against the socket it mounts, on
the nodes the values select, as root with every capability dropped, as a ServiceAccount of its
own that may list pods and nothing else (tests/rbac.rs runs the binary against a real dockerd
and the API stand-in and proves that list is all it sends). The objects also go through
test_chart.py's matrix (official schemas, labels, namespaces) with the cases `reaper*` of
chart_helpers.py.
"""

from __future__ import annotations

import subprocess

import helm_python as helm
import pytest
from chart_helpers import (
    CASES,
    by_kind,
    chart,
    component,
    lint_problems,
    one,
    podmend_bin,
    render,
    render_raw,
    rendered_case,
    route_constants,
    values_of,
)

REAPER_CASES = sorted(c for c in CASES if c.startswith("reaper"))


def reaper_objects(docs):
    return [d for d in docs if component(d) == "reaper"]


def pod_spec(docs):
    return one(reaper_objects(docs), "DaemonSet")["spec"]["template"]["spec"]


@pytest.fixture(scope="module", params=REAPER_CASES)
def rendered(request):
    return rendered_case(request.param)


def test_lint_passes_with_the_reaper_on():
    for case in REAPER_CASES:
        assert not lint_problems(values_of(case)), (case, lint_problems(values_of(case)))


def test_the_reaper_is_opt_in():
    docs = render({})
    assert not by_kind(docs, "DaemonSet")
    assert not reaper_objects(docs)
    assert chart().values["reaper"]["enabled"] is False


def test_the_daemonset_runs_guard_reap_against_the_socket_it_mounts(rendered):
    case, values, docs, _, _ = rendered
    reaper = values["reaper"]
    spec = pod_spec(docs)
    (container,) = spec["containers"]
    args = container["args"]
    upstream = args[2].removeprefix("--upstream=unix://")
    expected = [
        "guard",
        "reap",
        f"--upstream=unix://{upstream}",
        # The kubelet expands $(NODE_NAME) from the container's env.
        "--node-name=$(NODE_NAME)",
        f"--interval={reaper['interval']}",
        f"--metrics-listen=[::]:{reaper['metricsPort']}",
    ]
    if reaper["imagesHigh"]:
        expected += [f"--images-high={reaper['imagesHigh']}", f"--images-low={reaper['imagesLow']}",
                     f"--image-min-age={reaper['imageMinAge']}"]
    if reaper["dryRun"]:
        expected.append("--dry-run")
    expected.append(f"--log-format={values['logFormat']}")
    assert args == expected, case

    # The upstream is the node's socket, mounted from the hostPath of type Socket, and that
    # is the only thing of the node's the pod has.
    (volume,) = spec["volumes"]
    assert volume["hostPath"] == {"path": reaper["dockerSocket"], "type": "Socket"}
    (mount,) = container["volumeMounts"]
    assert mount == {"name": volume["name"], "mountPath": upstream}
    assert not upstream.startswith(("/run/", "/var/run/")), "under /podmend, as the guard mounts it"
    for host_field in ("hostNetwork", "hostPID", "hostIPC"):
        assert host_field not in spec
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["RUST_LOG"]["value"] == values["logLevel"]

    # Probes and metrics on the --metrics-listen port, at the routes podmend serves: the
    # daemon answering (/readyz) is both readiness and liveness (a daemon restart replaces
    # the socket file a container's mount still holds; a restarted container mounts the new).
    routes = route_constants()
    assert container["ports"] == [{"name": "metrics", "containerPort": reaper["metricsPort"], "protocol": "TCP"}]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": routes["READYZ"], "port": "metrics"}, probe
    liveness = container["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 120, "a daemon restart is waited for"

    # clap checks every flag and value before it acts on --help.
    local = [a.replace("$(NODE_NAME)", "node-a") for a in args]
    check = subprocess.run([str(podmend_bin()), *local, "--help"], capture_output=True, text=True)
    assert check.returncode == 0, f"{case}: podmend refuses {local}:\n{check.stderr}"


def test_the_reaper_runs_as_root_with_nothing_else(rendered):
    _, _, docs, _, _ = rendered
    spec = pod_spec(docs)
    (container,) = spec["containers"]
    # Root, for dockerd's root-owned 0660 socket; no capability, no escalation, no writes.
    assert spec["securityContext"] == {"runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0,
                                       "seccompProfile": {"type": "RuntimeDefault"}}
    assert container["securityContext"] == {
        "runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0, "privileged": False,
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert spec.get("automountServiceAccountToken", True), "it lists pods with its token"


def test_the_reaper_goes_where_the_values_say(rendered):
    case, values, docs, _, _ = rendered
    reaper = values["reaper"]
    daemonset = one(reaper_objects(docs), "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    # Every Linux node unless the values narrow it.
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux", **reaper["nodeSelector"]}
    assert spec.get("affinity", {}) == reaper["affinity"]
    assert spec.get("tolerations", []) == reaper["tolerations"]
    assert spec.get("priorityClassName", "") == reaper["priorityClassName"]
    assert spec.get("imagePullSecrets", []) == values["imagePullSecrets"]
    assert daemonset["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                                   "rollingUpdate": {"maxUnavailable": reaper["maxUnavailable"]}}
    (container,) = spec["containers"]
    assert container["resources"] == reaper["resources"] and container["resources"]["requests"]
    if case == "reaper":
        # The defaults: every NoSchedule taint tolerated (tainted CI pools), never NoExecute.
        assert spec["tolerations"] == [{"operator": "Exists", "effect": "NoSchedule"}]


def test_the_reaper_is_its_own_component_granted_only_to_list_pods(rendered):
    case, values, docs, _, namespace = rendered
    objects = reaper_objects(docs)
    spec = pod_spec(docs)
    account = spec["serviceAccountName"]
    webhook = one([d for d in docs if component(d) is None], "Deployment")["spec"]["template"]
    assert account != webhook["spec"]["serviceAccountName"]
    (sa,) = by_kind(objects, "ServiceAccount")
    assert sa["metadata"]["name"] == account and sa["metadata"]["namespace"] == namespace

    # Its pods are no webhook pods: the webhook's Service, Deployment and PDB select none.
    labels = one(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    selectors = [one([d for d in docs if component(d) is None], "Service")["spec"]["selector"],
                 webhook["metadata"]["labels"]]
    selectors += [p["spec"]["selector"]["matchLabels"] for p in by_kind(docs, "PodDisruptionBudget")]
    for selector in selectors:
        assert not selector.items() <= labels.items(), f"{case}: reaper pods match {selector}"

    rbac = [o for o in objects if o["kind"] in ("ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding")]
    if not values["rbac"]["create"]:
        assert not rbac
        return
    (role,) = by_kind(objects, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    (binding,) = by_kind(objects, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    assert not by_kind(objects, "Role") and not by_kind(objects, "RoleBinding")


def test_the_reaper_is_scraped_with_the_webhook_under_the_same_switch(rendered):
    _, values, docs, _, _ = rendered
    objects = reaper_objects(docs)
    services = [d for d in by_kind(docs, "Service") if d["metadata"]["labels"].get("app.kubernetes.io/component") == "reaper"]
    if not values["metrics"]["serviceMonitor"]["enabled"]:
        assert not services and not by_kind(objects, "ServiceMonitor")
        return
    (service,) = services
    assert service["spec"]["clusterIP"] == "None", "headless: each pod is a target"
    labels = one(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": values["reaper"]["metricsPort"], "targetPort": "metrics", "protocol": "TCP"}]
    (monitor,) = by_kind(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()


@pytest.mark.parametrize(
    "values, expected",
    [
        pytest.param({"reaper": {"enabled": "yes"}}, ["/reaper/enabled", "boolean"], id="enabled-string"),
        pytest.param({"reaper": {"dockerSocket": "docker.sock"}}, ["/reaper/dockerSocket"], id="socket-relative"),
        pytest.param({"reaper": {"dockerSocket": "/var/run/"}}, ["/reaper/dockerSocket"], id="socket-directory"),
        pytest.param({"reaper": {"interval": "5 minutes"}}, ["/reaper/interval"], id="interval-words"),
        pytest.param({"reaper": {"interval": "0s"}}, ["/reaper/interval"], id="interval-zero"),
        pytest.param({"reaper": {"imagesHigh": "50GB"}}, ["/reaper/imagesHigh"], id="size-unit"),
        pytest.param({"reaper": {"imagesLow": "-1Gi"}}, ["/reaper/imagesLow"], id="size-negative"),
        pytest.param({"reaper": {"imagesHigh": 50}}, ["/reaper/imagesHigh", "string"], id="size-number"),
        pytest.param({"reaper": {"imageMinAge": "2 min"}}, ["/reaper/imageMinAge"], id="min-age-words"),
        pytest.param({"reaper": {"metricsPort": 0}}, ["/reaper/metricsPort", "minimum"], id="port-0"),
        pytest.param({"reaper": {"maxUnavailable": 0}}, ["/reaper/maxUnavailable"], id="max-unavailable-0"),
        pytest.param({"reaper": {"maxUnavailable": "0%"}}, ["/reaper/maxUnavailable"], id="max-unavailable-0-percent"),
        pytest.param({"reaper": {"affinity": {"podAntiAffinity": {}}}}, ["/reaper/affinity", "podAntiAffinity"], id="affinity-pods"),
        pytest.param({"reaper": {"tolerations": [{"operator": "Maybe"}]}}, ["/reaper/tolerations/0/operator"], id="toleration-operator"),
        pytest.param({"reaper": {"resources": {"requests": None}}}, ["/reaper/resources", "requests"], id="no-requests"),
        pytest.param({"reaper": {"hostNetwork": True}}, ["/reaper", "hostNetwork"], id="typo"),
    ],
)
def test_the_schema_refuses_bad_reaper_values_naming_the_key(values, expected):
    with pytest.raises(helm.HelmValuesError) as refusal:
        chart().validate_schema(values)
    with pytest.raises(helm.HelmValuesError):
        render_raw(values)
    for part in expected:
        assert part in str(refusal.value), f"{part!r} not in: {refusal.value}"


@pytest.mark.parametrize(
    "reaper, expected",
    [
        pytest.param({"imagesHigh": "50Gi"}, 'reaper.imagesHigh ("50Gi") and reaper.imagesLow ("") make the image budget together',
                     id="high-without-low"),
        pytest.param({"imagesLow": "40Gi"}, 'reaper.imagesHigh ("") and reaper.imagesLow ("40Gi") make the image budget together',
                     id="low-without-high"),
        pytest.param({"imagesHigh": "50Gi", "imagesLow": "60G"}, "reaper.imagesLow (60G) is above reaper.imagesHigh (50Gi)",
                     id="low-above-high"),
        pytest.param({"imagesHigh": "1.5Gi", "imagesLow": "1537Mi"}, "reaper.imagesLow (1537Mi) is above reaper.imagesHigh (1.5Gi)",
                     id="low-above-high-by-a-mebibyte"),
    ],
)
def test_an_image_budget_podmend_would_refuse_fails_the_render(reaper, expected):
    values = {"reaper": {"enabled": True, **reaper}}
    chart().validate_schema(values)  # each key is valid on its own
    with pytest.raises(helm.HelmRenderError) as refusal:
        render_raw(values)
    assert expected in str(refusal.value)
    # Disabled, the same values are no error: nothing runs with them.
    render_raw({"reaper": {**values["reaper"], "enabled": False}})


def test_equal_marks_and_mixed_units_are_a_budget_podmend_accepts():
    for high, low in (("50Gi", "50Gi"), ("100G", "80Gi"), ("1536Mi", "1.5Gi")):
        docs = render({"reaper": {"enabled": True, "imagesHigh": high, "imagesLow": low}})
        args = pod_spec(docs)["containers"][0]["args"]
        assert f"--images-high={high}" in args and f"--images-low={low}" in args
