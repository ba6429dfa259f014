"""A machine re-imaged to a version boots that version's files, or nothing."""

from __future__ import annotations

import pytest

from gpufleet.domain import boot_images
from gpufleet.provision import render

CONFIG = render.BootConfig(
    apiserver="10.0.0.1:6443",
    ca_hash="sha256:" + "0" * 64,
    public_url="http://10.0.0.2:8080",
    images_url="http://10.0.0.2/images",
)


def test_the_default_image_is_the_services_own() -> None:
    script = render.ipxe(CONFIG, "n1", "aa:bb:cc:00:00:01")
    assert f"kernel {CONFIG.kernel_url} " in script and f"fetch={CONFIG.image_url}" in script
    assert "image default" in script


def test_a_version_boots_its_own_three_files() -> None:
    script = render.ipxe(CONFIG, "n1", "aa:bb:cc:00:00:01", image="2026.11-r2")
    assert "kernel http://10.0.0.2/images/2026.11-r2/vmlinuz " in script
    assert "initrd http://10.0.0.2/images/2026.11-r2/initrd.img" in script
    assert "fetch=http://10.0.0.2/images/2026.11-r2/rootfs.squashfs" in script


def test_a_version_without_an_images_url_is_not_served() -> None:
    default_only = render.BootConfig(apiserver="a:1", ca_hash="sha256:x", public_url="http://p")
    with pytest.raises(render.ImageNotServed, match="only its default image"):
        render.ipxe(default_only, "n1", "aa:bb:cc:00:00:01", image="v2")


@pytest.mark.parametrize("bad", ["../etc", "v2/../../x", "", "-v2", "a" * 64, "v 2", "v2?x=1"])
def test_a_version_is_one_path_segment(bad: str) -> None:
    with pytest.raises(ValueError):
        boot_images.check_version(bad)
    with pytest.raises(render.ImageNotServed):
        render.boot_files(CONFIG, bad)


def test_a_plan_refuses_a_version_that_could_not_be_served() -> None:
    from pydantic import ValidationError

    from gpufleet.api.maintenanceplan import MaintenancePlanSpec

    base = {"nodeSelector": {"gpufleet.io/pool": "train"}, "action": "reimage"}
    assert MaintenancePlanSpec.model_validate({**base, "image": "v2"}).image == "v2"
    with pytest.raises(ValidationError, match="one path segment"):
        MaintenancePlanSpec.model_validate({**base, "image": "../v2"})
