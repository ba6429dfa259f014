"""The release as the workflow makes it: both charts at the project's version, every step of
the GitHub workflows a script of this repository, the CHANGELOG's section found by the script
the release uses. The packaging and the OCI push themselves run against a real registry in
tests/integration/test_chart_release.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

import gpufleet

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
NOTES = ROOT / "scripts" / "release" / "release-notes"


@pytest.mark.parametrize("chart", ["gpufleet", "gpufleet-crds"])
def test_both_charts_carry_the_project_version_and_need_kubernetes_1_30(chart: str) -> None:
    meta = yaml.safe_load((ROOT / "deploy" / "helm" / chart / "Chart.yaml").read_text())
    assert (meta["version"], meta["appVersion"]) == (gpufleet.__version__, gpufleet.__version__)
    assert meta["kubeVersion"] == ">=1.30.0-0"  # ValidatingAdmissionPolicy v1


def _runs(workflow: str) -> list[str]:
    jobs = yaml.safe_load((WORKFLOWS / workflow).read_text())["jobs"]
    return [step["run"] for job in jobs.values() for step in job["steps"] if "run" in step]


@pytest.mark.parametrize("workflow", ["ci.yml", "release.yml"])
def test_every_script_a_workflow_runs_is_here_and_executable(workflow: str) -> None:
    called = {m for run in _runs(workflow) for m in re.findall(r"(?:scripts|\.ci)/[\w./-]+", run)}
    assert called, workflow
    for path in called:
        assert (ROOT / path).is_file() and (ROOT / path).stat().st_mode & 0o111, path


def test_ci_runs_the_readme_test_command() -> None:
    assert ".ci/run" in _runs("ci.yml")[-1]
    assert "exec scripts/test" in (ROOT / ".ci" / "run").read_text()


def test_the_release_runs_the_scripts_the_chart_test_runs() -> None:
    runs = "\n".join(_runs("release.yml"))
    for step in (
        'scripts/release/release-notes --released "${GITHUB_REF_NAME}"',
        'scripts/release/package-chart --version "${GITHUB_REF_NAME}"',
        'scripts/release/push-chart "oci://ghcr.io/${owner}/charts"',
        'scripts/release/build-images --push --registry "ghcr.io/${owner}"',
    ):
        assert step in runs, step
    on = yaml.safe_load((WORKFLOWS / "release.yml").read_text())[True]  # YAML 1.1: on = True
    assert list(on) == ["push"] and on["push"]["tags"]


def test_release_notes_print_the_versions_changelog_section() -> None:
    out = subprocess.run(
        [str(NOTES), f"v{gpufleet.__version__}"], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith(f"## [{gpufleet.__version__}]")
    assert "\n## " not in out  # the next section is not part of it
    missing = subprocess.run([str(NOTES), "99.0.0"], capture_output=True, text=True)
    assert missing.returncode == 1
    assert "no section ## [99.0.0]" in missing.stderr


def test_a_tag_is_refused_while_its_changelog_section_says_unreleased(tmp_path: Path) -> None:
    script = tmp_path / "scripts" / "release" / "release-notes"
    script.parent.mkdir(parents=True)
    script.write_bytes(NOTES.read_bytes())
    script.chmod(0o755)
    (tmp_path / "CHANGELOG.md").write_text(
        "# Changelog\n\n## [1.2.0] - unreleased\n\nNext.\n\n## [1.1.0] - 2026-11-01\n\nDone.\n"
    )
    pending = subprocess.run([str(script), "--released", "v1.2.0"], capture_output=True, text=True)
    assert pending.returncode == 1 and "says unreleased" in pending.stderr
    done = subprocess.run([str(script), "--released", "v1.1.0"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "## [1.1.0] - 2026-11-01\n\nDone.\n"
