"""The Slurm side's own errors: what went wrong, and whether waiting helps."""

from __future__ import annotations


class SlurmError(RuntimeError):
    """A Slurm call failed."""


class SlurmUnavailable(SlurmError):
    """slurmrestd or slurmctld did not answer (or answered nonsense): the Slurm
    view is unknown, so the syncer fails closed until it answers again."""


class SlurmCommandFailed(SlurmError):
    """scontrol ran and refused (e.g. ``Invalid node state specified``)."""

    def __init__(self, argv: list[str], returncode: int, stderr: str) -> None:
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr.strip()
        super().__init__(f"{' '.join(argv)} exited {returncode}: {self.stderr}")
