#!/usr/bin/env python3
"""Builds the fuzz seed corpora from tests/fixtures/ and examples/. The output is committed;
run this again (with the tests' .venv Python, which has PyYAML) when the fixtures change:

    .venv/bin/python fuzz/seeds/make-seeds.py

review/        every AdmissionReview and AdmissionRequest fixture as a whole AdmissionReview body,
               every fixture object with a pod spec wrapped in a CREATE review, and every
               fixture Pod with a status wrapped in an UPDATE pods/status review.
audit_reader/  every YAML fixture and audit input as it is.
guard_http/    client streams of the guard's tests (first byte: how the stream is cut).
"""
import glob
import json
import os

import yaml

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SEEDS = os.path.join(ROOT, "fuzz", "seeds")
GROUPS = {"Pod": "", "Deployment": "apps", "ReplicaSet": "apps", "StatefulSet": "apps",
          "DaemonSet": "apps", "Job": "batch", "CronJob": "batch"}


SEEN = set()


def out(target, name, data):
    """Writes one seed, unless the target already has one with the same bytes."""
    data = data if isinstance(data, bytes) else data.encode()
    if (target, data) in SEEN:
        return
    SEEN.add((target, data))
    os.makedirs(os.path.join(SEEDS, target), exist_ok=True)
    with open(os.path.join(SEEDS, target, name), "wb") as f:
        f.write(data)


def review_of(obj, uid):
    kind = obj.get("kind", "")
    version = obj.get("apiVersion", "v1").rsplit("/", 1)[-1]
    request = {"uid": uid, "kind": {"group": GROUPS.get(kind, ""), "version": version, "kind": kind},
               "namespace": obj.get("metadata", {}).get("namespace", "default"),
               "operation": "CREATE", "object": obj, "oldObject": None, "dryRun": False}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def status_review_of(pod, uid):
    """An UPDATE pods/status review, as virtual-kubelet's UpdateStatus makes the API server send."""
    review = review_of(pod, uid)
    request = review["request"]
    request.update({"subResource": "status", "operation": "UPDATE", "oldObject": pod,
                    "userInfo": {"username": "system:node:virtual-node-aci-linux", "groups": ["system:nodes"]}})
    return review


def main():
    # Regression seeds (`regression-*`, from fuzz findings) are kept; the rest is rebuilt.
    for target in ("review", "audit_reader", "guard_http"):
        for path in glob.glob(os.path.join(SEEDS, target, "*")):
            if not os.path.basename(path).startswith("regression-"):
                os.remove(path)
    fixtures = os.path.join(ROOT, "tests", "fixtures")
    for path in sorted(glob.glob(os.path.join(fixtures, "admissionreview-*.json")) +
                       [os.path.join(ROOT, "examples", "review-pod-nodename-agent.json")]):
        out("review", os.path.basename(path), open(path, "rb").read())
    for path in sorted(glob.glob(os.path.join(fixtures, "admissionrequest-*.json"))):
        request = json.load(open(path))
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        out("review", os.path.basename(path), json.dumps(body, indent=1))
    objects = []
    for path in sorted(glob.glob(os.path.join(fixtures, "*.yaml"))):
        out("audit_reader", os.path.basename(path), open(path, "rb").read())
        for i, doc in enumerate(yaml.safe_load_all(open(path))):
            if isinstance(doc, dict):
                objects.append((f"{os.path.basename(path)[:-5]}-{i}", doc))
    for path in sorted(glob.glob(os.path.join(fixtures, "cluster", "*.json"))):
        objects.append((os.path.basename(path)[:-5], json.load(open(path))))
    for name, obj in objects:
        if obj.get("kind") in GROUPS:
            out("review", f"wrapped-{name}.json", json.dumps(review_of(obj, f"seed-{name}"), indent=1))
        if obj.get("kind", "Pod") == "Pod" and "status" in obj and "spec" in obj:
            pod = dict(obj, apiVersion="v1", kind="Pod")
            out("review", f"status-{name}.json", json.dumps(status_review_of(pod, f"seed-status-{name}"), indent=1))
    for path in sorted(glob.glob(os.path.join(fixtures, "audit", "*", "*", "*.yaml"))):
        case = path.split(os.sep)[-3]
        out("audit_reader", f"{case}-{os.path.basename(path)}", open(path, "rb").read())

    body = '{"Image":"busybox:latest","Cmd":["true"],"HostConfig":{"NetworkMode":"none"}}'
    compose = ('{"Image":"busybox","Labels":{"com.docker.compose.project":"ci"},'
               '"HostConfig":{"RestartPolicy":{"Name":"always"},"AutoRemove":false}}')
    spellings = '{"Image":"busybox:latest","hostconfig":{"AutoRemove":false},"HostConfig":{"AutoRemove":true}}'

    def request(method, target, body, close=True):
        connection = "Connection: close\r\n" if close else ""
        return (f"{method} {target} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n{connection}\r\n{body}")

    def chunked(target, body):
        half = len(body) // 2
        return (f"POST {target} HTTP/1.1\r\nHost: docker\r\nTransfer-Encoding: chunked\r\n\r\n"
                f"{half:x}\r\n{body[:half]}\r\n{len(body) - half:x};ext=1\r\n{body[half:]}\r\n0\r\nX-Trailer: 1\r\n\r\n")

    streams = {
        "create-versioned": request("POST", "/v1.41/containers/create?name=ci-job", body),
        "create-upper-case": request("POST", "/V1.41/Containers/Create", body),
        "create-double-slashes": request("POST", "//containers//create/", body),
        "create-percent-encoded": request("POST", "/containers%2Fcreate", body),
        "create-absolute-form": request("POST", "http://docker/v1.41/containers/create", body),
        "create-lower-case-method": request("post", "/containers/create", body),
        "create-chunked": chunked("/v1.41/containers/create", body),
        "create-compose-restart": request("POST", "/v1.47/containers/create", compose),
        "create-two-spellings": request("POST", "/containers/create", spellings),
        "pipelined-ping-then-create": "GET /_ping HTTP/1.1\r\nHost: docker\r\n\r\n" + request(
            "POST", "/v1.41/containers/create", body),
        "pipelined-creates": request("POST", "/containers/create", body, False) + chunked(
            "/containers%2Fcreate", body),
        "length-and-chunked": ("POST /containers/create HTTP/1.1\r\nHost: docker\r\n"
                               f"Content-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n\r\n{body}"),
        "http10-keep-alive": ("GET /v1.41/version HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
                              "POST /containers/json HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}"),
        "attach-upgrade": ("POST /v1.41/containers/abc/attach?stream=1&stdin=1 HTTP/1.1\r\nHost: docker\r\n"
                           "Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"),
        "response-chunked": "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    }
    for i, (name, stream) in enumerate(streams.items()):
        out("guard_http", name, bytes([i * 7 % 64]) + stream.encode())


if __name__ == "__main__":
    main()
