"""Reads YAML the way Kubernetes tools do and the way YAML 1.2 does, and compares with the
value the text was meant to hold.

Usage: yaml_readers.py CASES.json
CASES.json is a list of {"name": ..., "yaml": ..., "expected": ...}: each `yaml` is one
document, `expected` the JSON value it must read back as. Every case is read by

- pyyaml: PyYAML's pure-Python SafeLoader, YAML 1.1 resolution (`yes`, `on`, `0777`, `1:20`,
  `2001-12-14` are a boolean, numbers, a date), as kubectl, Helm and the API server resolve;
- pyyaml-libyaml: PyYAML's CSafeLoader, the same resolution over libyaml's scanner;
- ruamel-1.2: ruamel.yaml's pure-Python safe loader, YAML 1.2 (its default version).

Prints {"checked": N, "failures": [{"name", "reader", "problem"}]} as JSON. The comparison
is exact: same types (a bool is not an int, an int is not a float), same key order, floats
equal bit for bit (sign of zero included). Exits 2, saying what to install, when a reader
is missing or does not resolve the way it is expected to.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Callable

try:
    import yaml
    from ruamel.yaml import YAML
except ImportError as error:  # pragma: no cover - the message is the point
    sys.exit(f"{error}: run scripts/test (it installs tests/requirements.txt into .venv)")


def pyyaml(loader: Any) -> Callable[[str], list[Any]]:
    return lambda text: list(yaml.load_all(text, Loader=loader))


def ruamel_1_2() -> Callable[[str], list[Any]]:
    reader = YAML(typ="safe", pure=True)
    return lambda text: list(reader.load_all(text))


if not getattr(yaml, "__with_libyaml__", False):
    sys.exit("PyYAML was built without libyaml (no CSafeLoader): reinstall the pinned wheel")

READERS: dict[str, Callable[[str], list[Any]]] = {
    "pyyaml": pyyaml(yaml.SafeLoader),
    "pyyaml-libyaml": pyyaml(yaml.CSafeLoader),
    "ruamel-1.2": ruamel_1_2(),
}

# Each reader must resolve as the YAML version it stands for, or the comparison proves nothing.
SELF_CHECK = {
    "pyyaml": {"yes": True, "0777": 511, "1_000": 1000, "1e3": "1e3"},
    "pyyaml-libyaml": {"on": True, "0777": 511, "1:20": 80, "1e3": "1e3"},
    "ruamel-1.2": {"yes": "yes", "on": "on", "0o17": 15, "1e3": 1000.0, "true": True},
}


def difference(got: Any, expected: Any, path: str) -> str | None:
    """Where and how `got` differs from `expected`, or None when they are the same."""
    if type(got) is not type(expected):
        return f"{path}: read {type(got).__name__} {got!r}, expected {type(expected).__name__} {expected!r}"
    if isinstance(expected, dict):
        if list(got) != list(expected):
            return f"{path}: keys {list(got)!r}, expected {list(expected)!r}"
        for key in expected:
            found = difference(got[key], expected[key], f"{path}/{key}")
            if found:
                return found
        return None
    if isinstance(expected, list):
        if len(got) != len(expected):
            return f"{path}: {len(got)} items, expected {len(expected)}"
        for index, (a, b) in enumerate(zip(got, expected)):
            found = difference(a, b, f"{path}/{index}")
            if found:
                return found
        return None
    if isinstance(expected, float):
        same = got == expected and math.copysign(1.0, got) == math.copysign(1.0, expected)
        return None if same else f"{path}: read {got!r}, expected {expected!r}"
    return None if got == expected else f"{path}: read {got!r}, expected {expected!r}"


def main() -> int:
    for reader, table in SELF_CHECK.items():
        for text, value in table.items():
            got = READERS[reader](f"k: {text}\n")[0]["k"]
            if difference(got, value, text):
                print(f"{reader} reads {text!r} as {got!r}, not {value!r}: wrong version installed?")
                return 2
    with open(sys.argv[1], encoding="utf-8") as handle:
        cases = json.load(handle)
    checked = 0
    failures = []
    for case in cases:
        for reader, read in READERS.items():
            checked += 1
            try:
                documents = read(case["yaml"])
            except Exception as error:  # every reader error is a finding
                problem = f"cannot read it: {type(error).__name__}: {error}"
            else:
                if len(documents) != 1:
                    problem = f"{len(documents)} documents, expected 1"
                else:
                    problem = difference(documents[0], case["expected"], "")
            if problem:
                failures.append({"name": case["name"], "reader": reader, "problem": problem})
    json.dump({"checked": checked, "failures": failures}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
