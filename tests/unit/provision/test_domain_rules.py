"""Pure Day-0 rules: hardware comparison, the condition format, who may get a token."""

from __future__ import annotations

from gpufleet.domain import enrollment, inventory, node_reports
from gpufleet.domain.inventory import Hardware

H100 = Hardware("NVIDIA-H100-80GB-HBM3", 8, 8)


def test_nvml_and_feature_discovery_spellings_of_a_model_are_equal() -> None:
    assert inventory.differences(H100, Hardware("NVIDIA H100 80GB HBM3", 8, 8)) == ()


def test_each_difference_is_said_in_words() -> None:
    diffs = inventory.differences(H100, Hardware("NVIDIA-A100-SXM4-80GB", 7, 6))
    assert diffs == (
        "GPU model: expected NVIDIA-H100-80GB-HBM3, observed NVIDIA-A100-SXM4-80GB",
        "GPU count: expected 8, observed 7",
        "InfiniBand HCA count: expected 8, observed 6",
    )
    assert inventory.describe(diffs).startswith("inventory mismatch: GPU model")


def test_the_hardware_report_round_trips_and_garbage_decodes_to_none() -> None:
    report = node_reports.hardware(Hardware("NVIDIA H100 80GB HBM3", 8, 4))
    assert report.key == "gpufleet.io/hardware"
    assert inventory.decode(report.value) == Hardware("NVIDIA-H100-80GB-HBM3", 8, 4)
    assert inventory.decode("gpu-model=X gpu-count=eight hca-count=1") is None
    assert inventory.decode("") is None
    node = {"metadata": {"annotations": {report.key: report.value}}}
    assert node_reports.hardware_of(node) == Hardware("NVIDIA-H100-80GB-HBM3", 8, 4)
    # an older agent's condition is read when there is no annotation
    legacy = {
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "GpufleetHardware", "status": "False", "message": report.value},
            ]
        }
    }
    assert node_reports.hardware_of(legacy) == Hardware("NVIDIA-H100-80GB-HBM3", 8, 4)
    assert node_reports.hardware_of({"metadata": {"annotations": {report.key: "junk"}}}) is None


def test_token_format_is_kubeadms() -> None:
    tid, secret = enrollment.token_from("abcdef0123456789abcdef")
    assert enrollment.parse_token(f"{tid}.{secret}") == ("abcdef", "0123456789abcdef")
    assert enrollment.parse_token("ABCDEF.0123456789abcdef") is None
    assert enrollment.parse_token("abcdef.0123") is None
    assert enrollment.secret_name(tid) == "bootstrap-token-abcdef"


def test_a_random_token_skips_bytes_that_would_bias_it_and_draws_more_when_short() -> None:
    draws: list[int] = []

    def token_bytes(n: int) -> bytes:
        draws.append(n)
        # 252-255 would make 0-3 likelier than the rest: they are skipped, and a draw
        # that leaves fewer than 22 characters is followed by another.
        return bytes([252, 0, 255, 36, 35] + [1] * 10) if len(draws) == 1 else bytes(range(32))

    tid, secret = enrollment.random_token(token_bytes)
    assert len(draws) == 2
    assert tid + secret == "a" + "a" + "9" + "b" * 10 + "abcdefghi"


def test_a_token_secret_is_kubeadms_with_labels_only_when_given() -> None:
    body = enrollment.secret_body(
        "abcdef", "0123456789abcdef", 0.0, namespace="kube-system", description="d"
    )
    assert body["type"] == enrollment.SECRET_TYPE
    assert body["metadata"] == {"name": "bootstrap-token-abcdef", "namespace": "kube-system"}
    data = body["stringData"]
    assert isinstance(data, dict)
    assert all(data[usage] == "true" for usage in enrollment.USAGES)
    assert data["auth-extra-groups"] == enrollment.EXTRA_GROUPS
    assert data["expiration"] == "1970-01-01T00:00:00Z"
    labelled = enrollment.secret_body(
        "abcdef", "0123456789abcdef", 0.0, namespace="ns", description="d", labels={"k": "v"}
    )
    assert labelled["metadata"] == {"name": "bootstrap-token-abcdef", "namespace": "ns",
                                    "labels": {"k": "v"}}  # fmt: skip


def _auth(**kw: object) -> enrollment.Verdict:
    args: dict[str, object] = {
        "presented_secret": None,
        "secret_digest": enrollment.digest("s3cret"),
        "presented_serial": None,
        "inventory_serial": "SN-1",
        "bmc_serial": "SN-1",
    }
    args.update(kw)
    return enrollment.authenticate(**args)  # type: ignore[arg-type]


def test_enrollment_secret_is_checked_against_its_digest() -> None:
    assert _auth(presented_secret="s3cret").allowed
    assert not _auth(presented_secret="guess").allowed
    # a wrong secret is refused even with the right serial
    assert not _auth(presented_secret="guess", presented_serial="SN-1").allowed
    assert not _auth(presented_secret="s3cret", secret_digest=None).allowed


def test_serial_must_agree_with_the_bmc_and_the_inventory_and_a_silent_bmc_fails_closed() -> None:
    assert _auth(presented_serial="SN-1").allowed
    assert not _auth(presented_serial="SN-2").allowed
    assert not _auth(presented_serial="SN-1", bmc_serial=None).allowed
    assert not _auth(presented_serial="SN-9", bmc_serial="SN-9").allowed  # not the inventoried box
    assert not _auth().allowed  # nothing presented


def test_only_an_armed_machine_gets_a_token() -> None:
    now = 1000.0
    assert enrollment.may_issue(enrollment.TokenState(armed=True), now).allowed
    issued = enrollment.TokenState(armed=False, token_id="abcdef", issued_at=990, expires_at=1900)
    verdict = enrollment.may_issue(issued, now)
    assert not verdict.allowed and "already issued" in verdict.reason
    expired = enrollment.TokenState(armed=False, token_id="abcdef", issued_at=10, expires_at=20)
    assert "expired" in enrollment.may_issue(expired, now).reason
    assert not enrollment.may_issue(enrollment.TokenState(armed=False), now).allowed


def test_rearm_status_arms_and_says_who() -> None:
    status = enrollment.rearm_status(by="gpufleet-controller", at=0, reason="reimage of n1")
    assert status["armed"] is True and status["armedBy"] == "gpufleet-controller"
    assert status["armedAt"] == "1970-01-01T00:00:00Z"
