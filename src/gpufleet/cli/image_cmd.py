"""``gpufleet local image``: build and show the node image the local cluster's machines boot."""

from __future__ import annotations

import time

import typer
from rich.console import Console, RenderableType
from rich.text import Text

from gpufleet.cli.errors import EXIT_NO, fail
from gpufleet.cli.output import Column, Format, JsonOpt, OutputOpt, chosen, emit, table

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
    from gpufleet.local import node_image

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
        fail(str(exc), hint="see docs/provisioning.md#the-node-image", code=EXIT_NO)
    image = report.image
    verb = "built" if report.built else "cached"
    sizes = ", ".join(f"{name} {_mib(size)}" for name, size in image.sizes().items())
    took = time.perf_counter() - start  # with the key: hashing the inputs
    console.print(f"{verb} ({took:.1f} s): {image.directory}", soft_wrap=True)
    console.print(f"  {sizes}", highlight=False)


FILE_COLUMNS = (
    Column("FILE"),
    Column("SIZE", justify="right"),
    Column("SHA256", wide=True),
)


@app.command()
def show(output: OutputOpt = Format.TABLE, as_json: JsonOpt = False) -> None:
    """Where this checkout's node image is, its key, sizes and how it was built.

    Exits 1 when it has not been built (the key it would have is printed).
    -o json or yaml prints the manifest (inputs, files, versions, build steps).

    Example:

        gpufleet local image show
        gpufleet local image show -o json | jq .files
    """
    from gpufleet.local import node_image

    fmt = chosen(output, as_json)
    start = time.perf_counter()
    try:
        key = node_image.Inputs.of_checkout().key()
    except node_image.NodeImageError as exc:
        fail(str(exc))
    image = node_image.find(key)
    lookup_ms = (time.perf_counter() - start) * 1000
    if image is None:
        fail(
            f"no node image {key} in {node_image.cache_root()}",
            hint="build it with: sudo .venv/bin/gpufleet local image build",
            code=EXIT_NO,
        )
    m = image.manifest
    files = m.get("files", {})
    assert isinstance(files, dict)

    def draw(wide: bool) -> list[RenderableType]:
        versions = m.get("versions", {})
        lines = [
            f"key:        {image.key}",
            f"directory:  {image.directory}",
            f"kernel:     {m.get('kernel', '?')}",
        ]
        if isinstance(versions, dict):
            lines.append("packages:   " + ", ".join(f"{k} {v}" for k, v in versions.items()))
        lines += [
            f"built:      {m.get('built_at', '?')} in {m.get('build_seconds', '?')} s",
            f"lookup:     {lookup_ms:.0f} ms (key from the checkout, manifest and sizes checked)",
        ]
        rows = [
            (name, _mib(int(info["bytes"])), str(info.get("sha256", "")))
            for name, info in files.items()
        ]
        return [Text("\n".join(lines)), table(FILE_COLUMNS, rows, wide=wide)]

    emit(fmt, {"directory": str(image.directory), **m}, draw)
