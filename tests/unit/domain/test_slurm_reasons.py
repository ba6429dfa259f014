"""Foreign Slurm drain reasons are judged by the policy: hardware, job or admin."""

from __future__ import annotations

import pytest

from gpufleet.domain.defaults import DEFAULT_POLICY_YAML
from gpufleet.domain.explain import explain_slurm_reason
from gpufleet.domain.policy import PolicyError, default_policy, load_policy
from gpufleet.domain.slurm_reasons import (
    DEFAULT_REASONS,
    Verdict,
    classify,
    is_health_check_reason,
)


def _with_slurm_section(section: str) -> str:
    """The default policy with its ``slurm:`` section replaced."""
    head, sep, _ = DEFAULT_POLICY_YAML.partition("\nslurm:\n")
    assert sep
    return head + "\n" + section.strip() + "\n"


@pytest.mark.parametrize(
    ("reason", "verdict"),
    [
        ("NHC: check_hw_ib: mlx5_0 port 1 state DOWN", Verdict.HARDWARE),
        ("gpufleet: health gpu-count: 7 of 8 GPUs visible", Verdict.HARDWARE),
        ("Prolog error", Verdict.HARDWARE),
        ("Epilog error", Verdict.HARDWARE),
        ("Kill task failed", Verdict.HARDWARE),
        ("Not responding", Verdict.HARDWARE),
        ("Node unexpectedly rebooted boot_time=1700000000", Verdict.HARDWARE),
        ("Low RealMemory (reported:1000 < 100.00% of configured:2000)", Verdict.HARDWARE),
        ("gres/gpu count reported lower than configured (7 < 8)", Verdict.HARDWARE),
        ("batch job complete failure", Verdict.JOB),
        ("job 4711 left stray processes", Verdict.JOB),
        ("cable swap, bob", Verdict.ADMIN),
        ("", Verdict.ADMIN),
        (None, Verdict.ADMIN),
    ],
)
def test_default_patterns_judge_the_reasons_slurm_and_nhc_write(
    reason: str | None, verdict: Verdict
) -> None:
    assert classify(reason).verdict is verdict


def test_the_default_policy_carries_the_built_in_patterns() -> None:
    assert default_policy().slurm.reasons == DEFAULT_REASONS


def test_an_admin_reason_that_mentions_a_pattern_later_is_still_admin() -> None:
    # Patterns are anchored where it matters: a person's note is not a health check.
    assert classify("maintenance: NHC: retest after cable swap").verdict is Verdict.ADMIN


def test_first_match_wins_and_unmatched_is_the_policy_s_choice() -> None:
    section = """
slurm:
  unmatched: job
  reasons:
    - {pattern: 'NHC: check_fs_mount', verdict: admin, note: 'our NFS, not the node'}
    - {pattern: '^NHC:', verdict: hardware}
"""
    p = load_policy(_with_slurm_section(section))
    assert p.slurm.classify("NHC: check_fs_mount: /home not mounted").verdict is Verdict.ADMIN
    assert p.slurm.classify("NHC: check_hw_eth: eth0 down").verdict is Verdict.HARDWARE
    found = p.slurm.classify("anything else")
    assert found.verdict is Verdict.JOB and found.pattern is None
    assert "unmatched" in found.source


def test_a_bad_pattern_is_refused_with_its_place() -> None:
    with pytest.raises(PolicyError) as exc:
        load_policy(
            _with_slurm_section("slurm:\n  reasons:\n    - {pattern: '^NHC: (', verdict: hardware}")
        )
    assert "slurm" in str(exc.value) and "regular expression" in str(exc.value)
    with pytest.raises(PolicyError):
        load_policy(_with_slurm_section("slurm:\n  reasons:\n    - {pattern: x, verdict: broken}"))


def test_health_check_reasons_are_recognised_by_prefix() -> None:
    assert is_health_check_reason("gpufleet: health gemm: 400 TFLOPS < 600")
    assert not is_health_check_reason("gpufleet: GpuProblem Xid79")
    assert not is_health_check_reason("NHC: gpufleet: health")
    assert not is_health_check_reason(None)


def test_explain_says_what_each_verdict_does() -> None:
    p = default_policy()
    hw = explain_slurm_reason(p, "Kill task failed")
    assert hw.verdict == "hardware" and hw.fault is not None
    assert hw.fault.key == "slurm-drain" and hw.fault.condition == "SlurmHealthProblem"
    admin = explain_slurm_reason(p, "reserved for the benchmark, alice")
    assert admin.verdict == "admin" and admin.fault is None and "never" in admin.outcome
    job = explain_slurm_reason(p, "user alice: runaway job")
    assert job.verdict == "job" and job.fault is None
