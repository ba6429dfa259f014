"""``gpufleet local image``: build and show the node image the local cluster's machines boot."""

from __future__ import annotations

import json
import time

import typer
from rich.console import Console

from gpufleet.local import node_image

app = typer.Typer(
    help="The stateless node image (Debian 13, kubelet, containerd, cloud-init) that the "
    "local cluster's machines network-boot.",
    no_args_is_help=True,
)
console = Console(stderr=True)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


@app.command()
def build(
    rebuild: bool = typer.Option(
        False, "--rebuild", help="Build even if the cache has this image (e.g. Debian updates)."
    ),
) -> None:
    """Build the node image into the cache, unless it is there already.

    Needs root (debootstrap, chroot), the Debian mirror this host's apt uses
    (GPUFLEET_DEBIAN_MIRROR overrides it), the Go module proxy and pip's index;
    about 5 minutes on 2 cores, then cached under ~/.cache/gpufleet/node-image/KEY,
    where KEY changes with any input (scripts/node-image/, deps/, the venv's versions).

    Example:

        sudo .venv/bin/gpufleet local image build
    """
    start = time.perf_counter()
    try:
        inputs = node_image.Inputs.of_checkout()
        console.print(f"node image {inputs.key()}")
        report = node_image.build(
            inputs=inputs,
            rebuild=rebuild,
            progress=lambda line: console.print(
                f"  {line}", highlight=False, markup=False, soft_wrap=True
            ),
        )
    except node_image.NodeImageError as exc:
        console.print(f"error: {exc}", highlight=False, markup=False)
        raise typer.Exit(1) from None
    image = report.image
    verb = "built" if report.built else "cached"
    sizes = ", ".join(f"{name} {_mib(size)}" for name, size in image.sizes().items())
    took = time.perf_counter() - start  # with the key: hashing the inputs
    console.print(f"{verb} ({took:.1f} s): {image.directory}", soft_wrap=True)
    console.print(f"  {sizes}", highlight=False)


@app.command()
def show(
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
) -> None:
    """Where this checkout's node image is, its key, sizes and how it was built.

    Exits 1 when it has not been built (the key it would have is printed).

    Example:

        gpufleet local image show
        gpufleet local image show --json | jq .files
    """
    start = time.perf_counter()
    try:
        key = node_image.Inputs.of_checkout().key()
    except node_image.NodeImageError as exc:
        console.print(f"error: {exc}", highlight=False, markup=False)
        raise typer.Exit(1) from None
    image = node_image.find(key)
    lookup_ms = (time.perf_counter() - start) * 1000
    if image is None:
        console.print(
            f"no node image {key} in {node_image.cache_root()}: run `gpufleet local image build`",
            highlight=False,
        )
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps({"directory": str(image.directory), **image.manifest}, indent=2))
        return
    m = image.manifest
    out = Console()
    out.print(f"key:        {image.key}", highlight=False)
    out.print(f"directory:  {image.directory}", highlight=False)
    for name, size in image.sizes().items():
        out.print(f"  {name:<16} {_mib(size):>12}", highlight=False)
    out.print(f"kernel:     {m.get('kernel', '?')}", highlight=False)
    versions = m.get("versions", {})
    if isinstance(versions, dict):
        out.print(
            "packages:   " + ", ".join(f"{k} {v}" for k, v in versions.items()), highlight=False
        )
    out.print(f"built:      {m.get('built_at', '?')} in {m.get('build_seconds', '?')} s")
    out.print(f"lookup:     {lookup_ms:.0f} ms (key from the checkout, manifest and sizes checked)")
