"""A layer tar of a directory keeps what the image needs (owners, modes, times, links)
and turns an overlay's upper directory into an OCI layer: a whiteout (a 0/0 character
device) becomes ``.wh.<name>``, an opaque directory gets ``.wh..wh..opq``."""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path

from gpufleet.local import images


def _tree(root: Path) -> Path:
    (root / "opt" / "app").mkdir(parents=True)
    (root / "opt" / "app" / "main.py").write_text("print('hi')\n")
    os.utime(root / "opt" / "app" / "main.py", (1_700_000_000, 1_700_000_000))
    os.link(root / "opt" / "app" / "main.py", root / "opt" / "app" / "same.py")
    (root / "opt" / "app" / "run").write_text("#!/bin/sh\n")
    (root / "opt" / "app" / "run").chmod(0o755)
    os.symlink("app/run", root / "opt" / "run")
    (root / "proc").mkdir()
    (root / "proc" / "leftover").write_text("not in a layer")
    return root


def test_a_tree_becomes_a_layer_whose_digest_is_its_sha256(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "tree")
    digest, size = images.write_layer(tree, tmp_path / "layer.tar")
    data = (tmp_path / "layer.tar").read_bytes()
    assert digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert size == len(data)
    with tarfile.open(tmp_path / "layer.tar") as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert list(members) == sorted(members), "name order, parents first"
    assert members["opt/app/main.py"].mtime == 1_700_000_000
    assert members["opt/app/same.py"].islnk()
    assert members["opt/app/same.py"].linkname == "opt/app/main.py"
    assert members["opt/app/run"].mode & 0o777 == 0o755
    assert members["opt/run"].issym() and members["opt/run"].linkname == "app/run"
    assert "proc" in members and "proc/leftover" not in members
    assert not (tmp_path / "layer.tar.tmp").exists()


def test_the_same_tree_gives_the_same_digest(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "tree")
    first = images.write_layer(tree, tmp_path / "a.tar")
    assert images.write_layer(tree, tmp_path / "b.tar") == first


def test_overlay_whiteouts_become_oci_whiteouts(tmp_path: Path) -> None:
    upper = tmp_path / "upper"
    (upper / "etc").mkdir(parents=True)
    os.mknod(upper / "etc" / "removed.conf", 0o600 | 0o020000, os.makedev(0, 0))
    (upper / "var" / "cache").mkdir(parents=True)
    os.setxattr(upper / "var" / "cache", images.OPAQUE_XATTR, b"y")
    (upper / "var" / "cache" / "new").write_text("x")
    images.write_layer(upper, tmp_path / "layer.tar", overlay_upper=True)
    with tarfile.open(tmp_path / "layer.tar") as tar:
        names = [m.name for m in tar.getmembers()]
        whiteout = tar.getmember("etc/.wh.removed.conf")
    assert "etc/removed.conf" not in names
    assert whiteout.isreg() and whiteout.size == 0
    assert names.index("var/cache/.wh..wh..opq") == names.index("var/cache") + 1
    assert "var/cache/new" in names
