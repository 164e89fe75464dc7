"""Renders charts/podmend with Helm's own engine (helm-python-sdk, through
tests/chart/chart_helpers.py) for the Rust tests (tests/common/chart.rs).

Usage: chart_render.py VALUES.json RELEASE NAMESPACE
Prints one JSON document: {"templates": {TEMPLATE: TEXT}, "objects": [{"template": TEMPLATE,
"object": OBJECT}], "values": EFFECTIVE_VALUES}; NOTES.txt left out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chart"))

import yaml  # noqa: E402
from chart_helpers import effective, render_raw  # noqa: E402


def main() -> None:
    values = json.loads(Path(sys.argv[1]).read_text())
    name, namespace = sys.argv[2], sys.argv[3]
    templates = {t: text for t, text in sorted(render_raw(values, name, namespace).items()) if not t.endswith("NOTES.txt")}
    objects = []
    for template, text in templates.items():
        for doc in yaml.safe_load_all(text):
            if doc is not None:
                objects.append({"template": template, "object": doc})
    json.dump({"templates": templates, "objects": objects, "values": effective(values)}, sys.stdout)


if __name__ == "__main__":
    main()
