"""Containerfiles read by the local image builder: the subset of the format the
repository's files use, parsed into typed instructions and resolved into steps.

The release images are built from ``images/<name>/Containerfile`` by docker, podman or
buildah; the local build (:mod:`gpufleet.local.images`) runs the same files, so there is
one description per image. It needs only what those files use, and refuses the rest
with the file, line and what to write instead (a file that a real builder reads one way
and this one another would be worse than one it refuses):

- ``FROM image`` (one stage: no ``AS``, no ``--platform``);
- ``ARG NAME[=default]``, before ``FROM`` (usable in ``FROM``) or after it;
- ``ENV K=V ...`` and ``LABEL K=V ...`` (values quoted as in a shell);
- ``RUN command`` (shell form, run by ``/bin/sh -c``; no flags such as ``--mount``);
- ``COPY src... dest`` (sources relative to the build context; no flags);
- ``WORKDIR``, ``USER``;
- ``ENTRYPOINT`` and ``CMD`` in exec (JSON) form only.

Variables (``$NAME``, ``${NAME}``, ``${NAME:-default}``) are substituted where a real
builder substitutes them (FROM, ENV, LABEL, COPY, WORKDIR, USER; not RUN, whose shell
sees them as environment variables) from the ARGs in scope and the ENV set so far.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

SUPPORTED = ("FROM", "ARG", "ENV", "LABEL", "RUN", "COPY", "WORKDIR", "USER", "ENTRYPOINT", "CMD")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The PATH a builder gives a RUN when the image sets none (docker's and buildah's)."""
_VARIABLE = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?P<mod>:-[^}]*|[^}]*)\}"
                       r"|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))")  # fmt: skip
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


class ContainerfileError(ValueError):
    """A Containerfile the local builder cannot read the way a real builder would."""


# ------------------------------------------------------------------ instructions


@dataclass(frozen=True)
class From:
    image: str
    line: int


@dataclass(frozen=True)
class Arg:
    name: str
    default: str | None
    line: int


@dataclass(frozen=True)
class Env:
    pairs: tuple[tuple[str, str], ...]
    line: int


@dataclass(frozen=True)
class Label:
    pairs: tuple[tuple[str, str], ...]
    line: int


@dataclass(frozen=True)
class Run:
    command: str
    line: int


@dataclass(frozen=True)
class Copy:
    sources: tuple[str, ...]
    dest: str
    line: int


@dataclass(frozen=True)
class Workdir:
    path: str
    line: int


@dataclass(frozen=True)
class User:
    user: str
    line: int


@dataclass(frozen=True)
class Entrypoint:
    argv: tuple[str, ...]
    line: int


@dataclass(frozen=True)
class Cmd:
    argv: tuple[str, ...]
    line: int


Instruction = From | Arg | Env | Label | Run | Copy | Workdir | User | Entrypoint | Cmd


@dataclass(frozen=True)
class Containerfile:
    path: str
    instructions: tuple[Instruction, ...]

    @property
    def global_args(self) -> tuple[Arg, ...]:
        """The ARGs before FROM: usable in FROM only (and declared again after it)."""
        out = []
        for ins in self.instructions:
            if isinstance(ins, From):
                break
            if isinstance(ins, Arg):
                out.append(ins)
        return tuple(out)


# ------------------------------------------------------------------ parsing


def _logical_lines(text: str, path: str) -> list[tuple[int, str]]:
    """(first line number, text) of each instruction: a line ending in ``\\`` joined to the
    next without the backslash and the newline, comments and blank lines dropped (also
    inside a continuation, as BuildKit does)."""
    out: list[tuple[int, str]] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#"):
            if re.match(r"#\s*escape\s*=", stripped) and not out and not parts:
                raise ContainerfileError(f"{path}:{number}: the escape directive is not supported")
            continue
        if not stripped:
            continue
        if not parts:
            start = number
        if raw.rstrip().endswith("\\"):
            parts.append(raw.rstrip()[:-1])
            continue
        parts.append(raw)
        out.append((start, "".join(parts).strip()))
        parts = []
    if parts:
        raise ContainerfileError(f"{path}:{start}: the file ends inside a continued line")
    return out


def _pairs(rest: str, where: str, keyword: str) -> tuple[tuple[str, str], ...]:
    try:
        words = shlex.split(rest, posix=True)
    except ValueError as exc:
        raise ContainerfileError(f"{where}: {keyword}: {exc}") from exc
    if keyword == "ENV" and words and "=" not in words[0]:  # the old `ENV NAME value` form
        return ((words[0], " ".join(words[1:])),)
    out = []
    for word in words:
        name, eq, value = word.partition("=")
        if not eq or not _NAME.match(name):
            raise ContainerfileError(f"{where}: {keyword} takes NAME=value pairs, not {word!r}")
        out.append((name, value))
    if not out:
        raise ContainerfileError(f"{where}: {keyword} needs at least one NAME=value")
    return tuple(out)


def _exec_form(rest: str, where: str, keyword: str) -> tuple[str, ...]:
    try:
        argv = json.loads(rest)
    except ValueError:
        argv = None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ContainerfileError(
            f'{where}: {keyword} must be in exec form (a JSON list: ["/path", "arg"]); '
            "the shell form is not supported by the local builder"
        )
    return tuple(argv)


def _no_flags(rest: str, where: str, keyword: str) -> None:
    if rest.startswith("--"):
        flag = rest.split()[0]
        raise ContainerfileError(f"{where}: {keyword} {flag} is not supported by the local builder")


def _instruction(keyword: str, rest: str, line: int, where: str) -> Instruction:
    if keyword == "FROM":
        _no_flags(rest, where, keyword)
        words = rest.split()
        if len(words) != 1:
            raise ContainerfileError(
                f"{where}: FROM takes one image (one stage: no AS, no multi-stage builds)"
            )
        return From(words[0], line)
    if keyword == "ARG":
        words = shlex.split(rest, posix=True)
        if len(words) != 1:
            raise ContainerfileError(f"{where}: ARG declares one NAME[=default]")
        name, eq, default = words[0].partition("=")
        if not _NAME.match(name):
            raise ContainerfileError(f"{where}: ARG {name!r} is not a name")
        return Arg(name, default if eq else None, line)
    if keyword == "ENV":
        return Env(_pairs(rest, where, keyword), line)
    if keyword == "LABEL":
        return Label(_pairs(rest, where, keyword), line)
    if keyword == "RUN":
        _no_flags(rest, where, keyword)
        if rest.startswith("["):
            raise ContainerfileError(f"{where}: RUN in exec form is not supported: use shell form")
        return Run(rest, line)
    if keyword == "COPY":
        _no_flags(rest, where, keyword)
        if rest.startswith("["):
            raise ContainerfileError(f"{where}: COPY in JSON form is not supported")
        words = rest.split()
        if len(words) < 2:
            raise ContainerfileError(f"{where}: COPY needs a source and a destination")
        return Copy(tuple(words[:-1]), words[-1], line)
    if keyword in ("WORKDIR", "USER"):
        words = rest.split()
        if len(words) != 1:
            raise ContainerfileError(f"{where}: {keyword} takes one word")
        return Workdir(words[0], line) if keyword == "WORKDIR" else User(words[0], line)
    if keyword == "ENTRYPOINT":
        return Entrypoint(_exec_form(rest, where, keyword), line)
    assert keyword == "CMD"
    return Cmd(_exec_form(rest, where, keyword), line)


def parse(text: str, path: str = "Containerfile") -> Containerfile:
    """The instructions of a Containerfile; :class:`ContainerfileError` for what the
    local builder does not read (an unknown instruction, a second stage, a flag)."""
    instructions: list[Instruction] = []
    for line, logical in _logical_lines(text, path):
        where = f"{path}:{line}"
        keyword, _, rest = logical.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword not in SUPPORTED:
            raise ContainerfileError(
                f"{where}: {keyword} is not supported by the local builder "
                f"(it reads {', '.join(SUPPORTED)})"
            )
        if not rest:
            raise ContainerfileError(f"{where}: {keyword} needs arguments")
        ins = _instruction(keyword, rest, line, where)
        if isinstance(ins, From) and any(isinstance(i, From) for i in instructions):
            raise ContainerfileError(f"{where}: a second FROM (multi-stage) is not supported")
        if not isinstance(ins, (From, Arg)) and not any(isinstance(i, From) for i in instructions):
            raise ContainerfileError(f"{where}: {keyword} before FROM")
        instructions.append(ins)
    if not any(isinstance(i, From) for i in instructions):
        raise ContainerfileError(f"{path}: no FROM")
    return Containerfile(path, tuple(instructions))


def load(path: Path, *, relative_to: Path | None = None) -> Containerfile:
    """:func:`parse` of the file at ``path`` (named relative to ``relative_to`` in errors)."""
    name = path.relative_to(relative_to).as_posix() if relative_to else str(path)
    return parse(path.read_text(), name)


# ------------------------------------------------------------------ resolving


def substitute(value: str, variables: Mapping[str, str], where: str = "") -> str:
    """``$NAME``, ``${NAME}`` and ``${NAME:-default}`` replaced from ``variables`` (an
    unset name is empty, as in a real builder)."""

    def one(m: re.Match[str]) -> str:
        name = m["braced"] or m["plain"]
        mod = m["mod"] or ""
        if mod and not mod.startswith(":-"):
            raise ContainerfileError(f"{where}: ${{{name}{mod}}}: only ${{NAME:-default}} is read")
        found = variables.get(name, "")
        if mod and not found:
            return substitute(mod[2:], variables, where)
        return found

    return _VARIABLE.sub(one, value)


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an OCI image config a Containerfile sets."""

    env: tuple[tuple[str, str], ...] = ()
    user: str = ""
    working_dir: str = ""
    entrypoint: tuple[str, ...] | None = None
    cmd: tuple[str, ...] | None = None
    labels: tuple[tuple[str, str], ...] = ()

    def with_env(self, pairs: tuple[tuple[str, str], ...]) -> ImageConfig:
        env = dict(self.env)
        env.update(pairs)
        return replace(self, env=tuple(env.items()))

    def as_oci(self) -> dict[str, object]:
        """The ``config`` object of an OCI image config (empty fields left out)."""
        out: dict[str, object] = {}
        if self.env:
            out["Env"] = [f"{k}={v}" for k, v in self.env]
        if self.user:
            out["User"] = self.user
        if self.working_dir:
            out["WorkingDir"] = self.working_dir
        if self.entrypoint is not None:
            out["Entrypoint"] = list(self.entrypoint)
        if self.cmd is not None:
            out["Cmd"] = list(self.cmd)
        if self.labels:
            out["Labels"] = dict(self.labels)
        return out


DEBIAN_CONFIG = ImageConfig(env=(("PATH", DEFAULT_PATH),), cmd=("bash",))
"""The config of Debian's official images (``debian:<suite>``, ``-slim``)."""


@dataclass(frozen=True)
class RunStep:
    """A RUN: its command, the environment its shell gets (the image's ENV and the ARGs in
    scope), the user and directory it runs as and in."""

    command: str
    env: tuple[tuple[str, str], ...]
    user: str
    working_dir: str
    line: int


@dataclass(frozen=True)
class CopyStep:
    sources: tuple[str, ...]
    dest: str
    """Absolute (a relative COPY destination is resolved against WORKDIR); a trailing
    ``/`` means a directory."""
    line: int


Step = RunStep | CopyStep


@dataclass(frozen=True)
class Plan:
    """What a Containerfile builds with given build args: its base, its steps in order and
    the image config it ends with."""

    base: str
    steps: tuple[Step, ...]
    config: ImageConfig
    args: tuple[tuple[str, str], ...] = field(default=())
    """The ARGs in scope after FROM and their values."""


def base_image(cf: Containerfile, build_args: Mapping[str, str]) -> str:
    """The FROM image with the global ARGs substituted."""
    values = _arg_values(cf.global_args, build_args, {})
    ins = next(i for i in cf.instructions if isinstance(i, From))
    image = substitute(ins.image, values, f"{cf.path}:{ins.line}")
    if not image:
        raise ContainerfileError(f"{cf.path}:{ins.line}: FROM names no image")
    return image


def _arg_values(
    args: tuple[Arg, ...], build_args: Mapping[str, str], variables: Mapping[str, str]
) -> dict[str, str]:
    out: dict[str, str] = {}
    for arg in args:
        if arg.name in build_args:
            out[arg.name] = build_args[arg.name]
        elif arg.default is not None:
            out[arg.name] = substitute(arg.default, {**variables, **out})
    return out


def plan(
    cf: Containerfile,
    build_args: Mapping[str, str],
    base_config: Callable[[str], ImageConfig],
) -> Plan:
    """Resolve ``cf`` with ``build_args``: ``base_config(image)`` is the config of the FROM
    image (its ENV, WORKDIR... are inherited, as in a real builder)."""
    base = base_image(cf, build_args)
    config = base_config(base)
    args: dict[str, str] = {}
    steps: list[Step] = []
    after_from = False
    for ins in cf.instructions:
        if isinstance(ins, From):
            after_from = True
            continue
        if not after_from:
            continue
        where = f"{cf.path}:{ins.line}"
        variables = {**args, **dict(config.env)}
        if isinstance(ins, Arg):
            value = build_args.get(ins.name)
            if value is None and ins.default is not None:
                value = substitute(ins.default, variables, where)
            if value is None:  # declared without a default: a global ARG's value, if any
                value = _arg_values(cf.global_args, build_args, {}).get(ins.name)
            if value is not None:
                args[ins.name] = value
        elif isinstance(ins, Env):
            config = config.with_env(
                tuple((k, substitute(v, {**variables}, where)) for k, v in ins.pairs)
            )
        elif isinstance(ins, Label):
            labels = dict(config.labels)
            labels.update((k, substitute(v, variables, where)) for k, v in ins.pairs)
            config = replace(config, labels=tuple(labels.items()))
        elif isinstance(ins, Workdir):
            path = substitute(ins.path, variables, where)
            config = replace(
                config, working_dir=str(PurePosixPath(config.working_dir or "/", path))
            )
        elif isinstance(ins, User):
            config = replace(config, user=substitute(ins.user, variables, where))
        elif isinstance(ins, Entrypoint):
            # As in docker: a new ENTRYPOINT drops the CMD the base image had.
            config = replace(config, entrypoint=ins.argv, cmd=None)
        elif isinstance(ins, Cmd):
            config = replace(config, cmd=ins.argv)
        elif isinstance(ins, Run):
            env = dict(args)
            env.update(config.env)
            env.setdefault("PATH", DEFAULT_PATH)
            steps.append(
                RunStep(ins.command, tuple(env.items()), config.user, config.working_dir or "/",
                        ins.line)
            )  # fmt: skip
        else:
            sources = tuple(substitute(s, variables, where) for s in ins.sources)
            dest = substitute(ins.dest, variables, where)
            if not dest.startswith("/"):
                dest = str(PurePosixPath(config.working_dir or "/", dest)) + (
                    "/" if dest.endswith("/") else ""
                )
            steps.append(CopyStep(sources, dest, ins.line))
    return Plan(base, tuple(steps), config, tuple(args.items()))
