"""In a pod the controller logs in with its ServiceAccount; given a kubeconfig, with that.
(kopf's kubeconfig login alone found no credentials in the chart's pods: they crashed.)"""

from __future__ import annotations

from pathlib import Path

import kopf
import pytest

from gpufleet.lifecycle.operator import service_account_login, uses_service_account


def test_a_pod_without_kubeconfig_uses_its_service_account(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("eyJ...")
    assert uses_service_account({}, str(token))


def test_a_named_kubeconfig_wins_over_the_service_account(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("eyJ...")
    assert not uses_service_account({"KUBECONFIG": "/etc/kubeconfig"}, str(token))


def test_outside_a_pod_the_kubeconfig(tmp_path: Path) -> None:
    assert not uses_service_account({}, str(tmp_path / "no-token"))


def _service_account(tmp_path: Path) -> Path:
    (tmp_path / "token").write_text("eyJhbGciOi.token\n")
    (tmp_path / "namespace").write_text("gpufleet")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    return tmp_path


def test_the_service_account_login_dials_the_address_the_kubelet_gave(tmp_path: Path) -> None:
    sa = _service_account(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    info = service_account_login(env, str(sa))
    # Not https://kubernetes.default.svc: that name needs cluster DNS.
    assert info.server == "https://10.96.0.1:443"
    assert info.token == "eyJhbGciOi.token"
    assert info.default_namespace == "gpufleet"
    assert info.ca_path == str(sa / "ca.crt")


def test_an_ipv6_service_address_is_bracketed(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert service_account_login(env, str(_service_account(tmp_path))).server == (
        "https://[fd00::1]:6443"
    )


def test_no_service_address_is_a_login_error(tmp_path: Path) -> None:
    with pytest.raises(kopf.LoginError, match="KUBERNETES_SERVICE_HOST"):
        service_account_login({}, str(_service_account(tmp_path)))
