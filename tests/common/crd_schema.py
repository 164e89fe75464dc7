"""Validates objects against the openAPIV3Schema of a CustomResourceDefinition version, with
the `jsonschema` package (tests/common/crd_schema.rs runs it).

Input: a JSON file {"checks": [{"crd": PATH, "version": "v1alpha2", "strict": bool,
"objects": [...]}]}. Output: one line per problem, `CHECK_INDEX OBJECT_INDEX PATH: MESSAGE`,
and exit status 1 when there is one.

A CRD's schema is OpenAPI v3; the keywords these CRDs use (type, properties, items, required,
enum, additionalProperties, format) mean the same in JSON Schema draft 7. The `x-kubernetes-*`
extensions are ignored. `strict` adds what the API server does beyond validation: a field the
structural schema does not declare is pruned on write, silently; strict reports it as an error
(an object with `properties` and neither `additionalProperties` nor
`x-kubernetes-preserve-unknown-fields` is closed). `metadata` is the API server's own and is
left open, as the CRD leaves it.
"""

from __future__ import annotations

import copy
import json
import sys

import jsonschema
import yaml


def version_schema(crd_path: str, version: str) -> dict:
    with open(crd_path) as handle:
        docs = [d for d in yaml.safe_load_all(handle) if d]
    (crd,) = docs
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            return entry["schema"]["openAPIV3Schema"]
    raise SystemExit(f"{crd_path} has no version {version}")


def closed(node: dict) -> dict:
    node = copy.deepcopy(node)

    def walk(n: dict) -> None:
        if "properties" in n and "additionalProperties" not in n and not n.get("x-kubernetes-preserve-unknown-fields"):
            n["additionalProperties"] = False
        for child in n.get("properties", {}).values():
            walk(child)
        if isinstance(n.get("items"), dict):
            walk(n["items"])
        if isinstance(n.get("additionalProperties"), dict):
            walk(n["additionalProperties"])

    walk(node)
    return node


def main() -> int:
    with open(sys.argv[1]) as handle:
        checks = json.load(handle)["checks"]
    problems = []
    for c, check in enumerate(checks):
        schema = version_schema(check["crd"], check["version"])
        if check["strict"]:
            schema = closed(schema)
        validator = jsonschema.Draft7Validator(schema)
        for o, obj in enumerate(check["objects"]):
            for error in validator.iter_errors(obj):
                path = "/".join(str(p) for p in error.absolute_path)
                problems.append(f"{c} {o} /{path}: {error.message[:300]}")
    for line in problems[:200]:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
