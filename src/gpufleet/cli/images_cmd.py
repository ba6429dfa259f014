"""``gpufleet local images``: the gpufleet and Slurm container images of this checkout."""

from __future__ import annotations

import time

import typer
from rich.console import Console

from gpufleet.cli.errors import EXIT_NO, fail

app = typer.Typer(
    help="The gpufleet and Slurm 24.11 container images, built from this checkout and "
    "Debian 13 packages, that the Helm chart runs (no registry needed to build them).",
    no_args_is_help=True,
)
console = Console(stderr=True)


@app.command()
def build() -> None:
    """Build the images into the cache, or find them there; print their references.

    Both from their Containerfiles (images/slurm, images/gpufleet), as a release builds
    them with docker: the Slurm image is the Slurm 24.11 root (`gpufleet local slurm-image
    build`, built first when missing), the gpufleet image one layer per COPY and RUN on
    it (Debian 13's Python with gpufleet's dependencies, this checkout's wheel). Beside
    them, the local cluster's CoreDNS (a static Go build; a few minutes the first time).
    Only what changed is rebuilt: after a code change, seconds. Needs root
    (overlay mounts, chroot) and the Debian mirror this host's apt uses. The result is
    an OCI image layout under ~/.cache/gpufleet/images/store/KEY, which `gpufleet local
    up --images` serves to its machines (docs/install.md).

    Example:

        sudo .venv/bin/gpufleet local images build
    """
    from gpufleet.local import images

    start = time.perf_counter()
    try:
        built = images.build(
            progress=lambda line: console.print(
                f"  {line}", highlight=False, markup=False, soft_wrap=True
            )
        )
    except images.ImageError as exc:
        fail(str(exc), hint="see docs/install.md#images", code=EXIT_NO)
    verb = f"built {', '.join(built.built)}" if built.built else "cached"
    console.print(f"{verb} ({time.perf_counter() - start:.1f} s): {built.layout}", soft_wrap=True)
    typer.echo(built.gpufleet)
    typer.echo(built.slurm)
    typer.echo(built.coredns)
