"""Which node image a machine boots: the provisioning service's default, or a named version.

A reimage to a named version (a MaintenancePlan's ``spec.image``) is recorded on
the Machine (``status.image``) by the controller when it re-arms the machine;
the provisioning service then serves that version's kernel, initrd and root
image from ``<images-url>/<version>/`` (:data:`FILES`). A version is one path
segment, so it cannot reach outside that directory. A machine never re-imaged
to a version boots the service's default image.
"""

from __future__ import annotations

import re

VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
"""An image version: one URL path segment (no ``/``, no ``..``), at most 63 characters."""

FILES = ("vmlinuz", "initrd.img", "rootfs.squashfs")
"""The files of one version, under ``<images-url>/<version>/`` (the node image's names)."""


def check_version(version: str) -> str:
    """``version`` if it is a valid image version, else ValueError saying what is allowed."""
    if not VERSION.match(version) or ".." in version:
        raise ValueError(
            f"image version {version!r} must be 1-63 letters, digits, '.', '_' or '-' "
            "(one path segment, starting with a letter or digit)"
        )
    return version


def urls(images_url: str, version: str) -> tuple[str, str, str]:
    """Kernel, initrd and root image URLs of ``version`` under ``images_url``."""
    base = f"{images_url.rstrip('/')}/{check_version(version)}/"
    kernel, initrd, rootfs = (base + name for name in FILES)
    return kernel, initrd, rootfs
