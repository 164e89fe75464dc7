"""The chart's opt-in scheduled jobs: the report refresh (`reports`) and the storm clean-up
(`stormCleanup`). Rendered and linted with Helm's engine; each CronJob runs the podmend
command its values describe (arguments podmend accepts), never two at once, under the
restricted Pod Security profile like the webhook's pod, as a ServiceAccount of its own whose
RBAC grants what the values need and nothing else (tests/rbac.rs runs the binary and proves
every rule is used). The objects also go through test_chart.py's matrix (official schemas,
labels, namespaces) with the cases `jobs*` of chart_helpers.py.
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
    values_of,
)

JOB_CASES = sorted(c for c in CASES if c.startswith("jobs"))
# values key → (component label, the podmend subcommand)
JOBS = {"reports": ("reports", "audit"), "stormCleanup": ("storm-cleanup", "clean-storms")}


def job_objects(docs, label):
    return [d for d in docs if component(d) == label]


@pytest.fixture(scope="module", params=JOB_CASES)
def rendered(request):
    return rendered_case(request.param)


def test_lint_passes_with_the_jobs_on():
    for case in JOB_CASES:
        assert not lint_problems(values_of(case)), (case, lint_problems(values_of(case)))


def test_the_jobs_are_opt_in():
    docs = render({})
    assert not by_kind(docs, "CronJob")
    assert not [d for d in docs if component(d) in ("reports", "storm-cleanup")]


def test_each_cronjob_never_overlaps_and_runs_restricted_as_its_own_account(rendered):
    case, values, docs, _, namespace = rendered
    deployment = one(docs, "Deployment")
    webhook_account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    service = one(docs, "Service")
    for key, (label, _) in JOBS.items():
        job = values[key]
        objects = job_objects(docs, label)
        (cron,) = by_kind(objects, "CronJob")
        assert len(cron["metadata"]["name"]) <= 52, "a CronJob's name leaves 11 characters for its Jobs"
        spec = cron["spec"]
        assert spec["concurrencyPolicy"] == "Forbid"
        assert spec["schedule"] == job["schedule"]
        assert spec.get("timeZone", "") == job["timeZone"]
        assert spec["startingDeadlineSeconds"] == job["startingDeadlineSeconds"]
        assert spec["successfulJobsHistoryLimit"] == job["successfulJobsHistoryLimit"]
        assert spec["failedJobsHistoryLimit"] == job["failedJobsHistoryLimit"]
        job_spec = spec["jobTemplate"]["spec"]
        assert job_spec["backoffLimit"] == job["backoffLimit"]
        assert job_spec["activeDeadlineSeconds"] == job["activeDeadlineSeconds"]
        pod = job_spec["template"]["spec"]
        assert pod["restartPolicy"] == "Never"
        assert pod.get("nodeSelector", {}) == job["nodeSelector"]
        assert pod.get("tolerations", []) == job["tolerations"]
        (container,) = pod["containers"]
        assert container["resources"] == job["resources"] and container["resources"]["requests"]

        # The restricted Pod Security profile, as the webhook's pod.
        security = container["securityContext"]
        assert security["runAsNonRoot"] is True and security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert security["seccompProfile"]["type"] == "RuntimeDefault"
        assert security["readOnlyRootFilesystem"] is True
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert "hostNetwork" not in pod and "hostPID" not in pod and "volumes" not in pod

        # Its own ServiceAccount, never the webhook's.
        account = pod["serviceAccountName"]
        assert account != webhook_account
        (sa,) = by_kind(objects, "ServiceAccount")
        assert sa["metadata"] == {**sa["metadata"], "name": account, "namespace": namespace}

        # A job pod is no webhook pod: the Service, Deployment and PDB select none of them.
        labels = job_spec["template"]["metadata"]["labels"]
        assert labels == job_spec["template"]["metadata"]["labels"]
        for selector in (service["spec"]["selector"], deployment["spec"]["selector"]["matchLabels"]):
            assert not selector.items() <= labels.items(), f"{case}: {label} pods match {selector}"


def test_the_cronjobs_run_what_the_values_say_in_words_podmend_accepts(rendered):
    case, values, docs, _, _ = rendered
    for key, (label, command) in JOBS.items():
        job = values[key]
        (cron,) = by_kind(job_objects(docs, label), "CronJob")
        args = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[0] == command
        flags = dict(a.split("=", 1) for a in args if "=" in a)
        assert flags["--page-size"] == str(job["pageSize"])
        assert flags.get("--namespace", "") == job["namespace"]
        if key == "reports":
            assert args[:4] == ["audit", "--cluster", "--policy-report", "--apply"]
            assert flags["--report-format"] == job["format"]
            assert flags["--fail-on"] == "never", "findings must not fail the Job (and retry it)"
        else:
            assert flags["--threshold"] == str(job["threshold"]) and flags["--keep"] == str(job["keep"])
            assert float(flags["--deletes-per-second"]) == job["deletesPerSecond"]
            assert ("--dry-run" in args) == job["dryRun"]
            assert [a.split("=", 1)[1] for a in args if a.startswith("--reason=")] == job["reasons"]
            assert flags.get("--pushgateway", "") == job["pushgateway"]
        # clap checks every flag and value before it acts on --help.
        check = subprocess.run([str(podmend_bin()), *args, "--help"], capture_output=True, text=True)
        assert check.returncode == 0, f"{case}: podmend refuses {args}:\n{check.stderr}"


def rules_of(objects, kind):
    return [(tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"])) for o in by_kind(objects, kind) for r in o["rules"]]


def test_each_job_is_granted_what_its_values_need_and_nothing_else(rendered):
    case, values, docs, _, namespace = rendered
    for key, (label, _) in JOBS.items():
        job = values[key]
        objects = job_objects(docs, label)
        account = by_kind(objects, "ServiceAccount")[0]["metadata"]["name"]
        if not values["rbac"]["create"]:
            assert not [o for o in objects if o["kind"] in ("ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding")]
            continue
        for binding in by_kind(objects, "ClusterRoleBinding") + by_kind(objects, "RoleBinding"):
            assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
            kind = "ClusterRole" if binding["kind"] == "ClusterRoleBinding" else "Role"
            assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": account}
        for role in by_kind(objects, "Role") + by_kind(objects, "RoleBinding"):
            assert role["metadata"]["namespace"] == job["namespace"], "a Role only for a namespaced job"
        cluster, local = rules_of(objects, "ClusterRole"), rules_of(objects, "Role")
        granted = cluster + local
        for groups, resources, verbs in granted:
            assert "*" not in groups + resources + verbs, "no wildcards"
        if key == "reports":
            group, plural = ("wgpolicyk8s.io", "policyreports") if job["format"] == "policyreport" else ("openreports.io", "reports")
            reads = {("",): {"limitranges", "pods", "podtemplates", "replicationcontrollers"},
                     ("apps",): {"deployments", "replicasets", "statefulsets", "daemonsets"},
                     ("batch",): {"jobs", "cronjobs"}}
            expected = {(("",), ("nodes",), ("list",))}
            # Namespaces' toleration whitelists: the one namespace audited, or all of them.
            expected.add((("",), ("namespaces",), ("get",) if job["namespace"] else ("list",)))
            for groups, resources in reads.items():
                expected.add((groups, tuple(sorted(resources)), ("list",)))
            expected.add(((group,), (plural,), ("list", "create", "patch", "delete")))
            assert {(g, tuple(sorted(r)), v) for g, r, v in granted} == expected, case
            # Nodes and Namespaces are cluster-scoped: always the ClusterRole; the rest where
            # the audit looks.
            assert (("",), ("nodes",), ("list",)) in cluster
            assert all(r not in (("nodes",), ("namespaces",)) for _, r, _ in local)
            if job["namespace"]:
                namespace_rules = [r for o in by_kind(objects, "ClusterRole") for r in o["rules"]
                                   if r["resources"] == ["namespaces"]]
                assert [r.get("resourceNames") for r in namespace_rules] == [[job["namespace"]]], case
        else:
            expected = {(("",), ("pods",), ("list",))}
            if not job["dryRun"]:
                expected |= {(("",), ("pods",), ("delete",)), (("",), ("events",), ("create",))}
            assert set(granted) == expected, case
        if job["namespace"]:
            assert not [r for r in cluster if r[1] not in (("nodes",), ("namespaces",))], "nothing namespaced is granted cluster-wide"
        else:
            assert not local


@pytest.mark.parametrize(
    "values, expected",
    [
        pytest.param({"reports": {"schedule": "every hour"}}, ["/reports/schedule"], id="schedule-words"),
        pytest.param({"reports": {"schedule": "* * * *"}}, ["/reports/schedule"], id="schedule-four-fields"),
        pytest.param({"reports": {"format": "sarif"}}, ["/reports/format", "policyreport", "openreports"], id="report-format"),
        pytest.param({"reports": {"namespace": "Not_A_Namespace"}}, ["/reports/namespace"], id="reports-namespace"),
        pytest.param({"reports": {"timeZone": "Mars Time"}}, ["/reports/timeZone"], id="time-zone"),
        pytest.param({"reports": {"concurrencyPolicy": "Allow"}}, ["/reports", "concurrencyPolicy"], id="no-concurrency-key"),
        pytest.param({"stormCleanup": {"threshold": 0}}, ["/stormCleanup/threshold", "minimum"], id="threshold-0"),
        pytest.param({"stormCleanup": {"keep": -1}}, ["/stormCleanup/keep", "minimum"], id="keep-negative"),
        pytest.param({"stormCleanup": {"deletesPerSecond": 0}}, ["/stormCleanup/deletesPerSecond"], id="rate-0"),
        pytest.param({"stormCleanup": {"deletesPerSecond": 20000}}, ["/stormCleanup/deletesPerSecond"], id="rate-too-high"),
        pytest.param({"stormCleanup": {"reasons": ["Evicted"]}}, ["/stormCleanup/reasons/0"], id="reason-not-a-rejection"),
        pytest.param({"stormCleanup": {"pushgateway": "https://pg:9091"}}, ["/stormCleanup/pushgateway"], id="pushgateway-https"),
        pytest.param({"stormCleanup": {"dryrun": True}}, ["/stormCleanup", "dryrun"], id="typo"),
        pytest.param({"stormCleanup": {"resources": {"requests": None}}}, ["/stormCleanup/resources", "requests"], id="no-requests"),
    ],
)
def test_the_schema_refuses_bad_job_values_naming_the_key(values, expected):
    with pytest.raises(helm.HelmValuesError) as refusal:
        chart().validate_schema(values)
    with pytest.raises(helm.HelmValuesError):
        render_raw(values)
    for part in expected:
        assert part in str(refusal.value), f"{part!r} not in: {refusal.value}"
