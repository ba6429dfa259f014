"""Inventory files: the data centre's list of machines, as CSV or YAML.

CSV (one machine per line; ``macs`` separated by ``;`` or spaces)::

    name,macs,serial,bmc_endpoint,bmc_secret,pool,gpu_model,gpu_count,hca_count,ib_leaf,ib_block,enrollment_digest
    gpu-node-0100,aa:bb:cc:00:01:00,SN-0100,https://10.0.1.100,gpufleet-system/bmc-0100,train,NVIDIA-H100-80GB-HBM3,8,8,leaf-01,block-a,

YAML: a list (or ``machines:`` list) of ``{name, spec}`` where ``spec`` is the
Machine spec (``docs/provisioning.md``). A file with any bad entry is rejected
as a whole, and every error names its line, so nothing is half-imported.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpufleet.api.machine import MachineSpec, check_name

CSV_COLUMNS = (
    "name",
    "macs",
    "serial",
    "bmc_endpoint",
    "bmc_secret",
    "pool",
    "gpu_model",
    "gpu_count",
    "hca_count",
    "ib_leaf",
    "ib_block",
    "enrollment_digest",
)
REQUIRED_COLUMNS = CSV_COLUMNS[:5] + CSV_COLUMNS[6:9]


@dataclass(frozen=True)
class Entry:
    """One machine of an inventory file, and where it was."""

    name: str
    spec: MachineSpec
    line: int


class InventoryError(ValueError):
    """An inventory file is malformed; ``problems`` are ``(line, message)``."""

    def __init__(self, path: str, problems: list[tuple[int, str]]) -> None:
        self.path = path
        self.problems = problems
        lines = "\n".join(f"  {path}:{line}: {msg}" for line, msg in problems)
        super().__init__(f"{path}: {len(problems)} problem(s), nothing imported:\n{lines}")


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(x) for x in err["loc"])
        parts.append(f"{where}: {err['msg']}" if where else err["msg"])
    return "; ".join(parts)


def load(path: Path) -> list[Entry]:
    """Parse an inventory file by its suffix (``.csv``, ``.yaml``/``.yml``)."""
    text = path.read_text()
    if path.suffix.lower() == ".csv":
        return parse_csv(text, str(path))
    if path.suffix.lower() in (".yaml", ".yml"):
        return parse_yaml(text, str(path))
    raise InventoryError(str(path), [(0, "unknown file type: use .csv, .yaml or .yml")])


def _check_duplicates(entries: list[Entry], problems: list[tuple[int, str]]) -> None:
    names: dict[str, int] = {}
    macs: dict[str, tuple[str, int]] = {}
    for e in entries:
        if e.name in names:
            problems.append((e.line, f"machine {e.name} is also on line {names[e.name]}"))
        names.setdefault(e.name, e.line)
        for mac in e.spec.macs:
            if mac in macs and macs[mac][0] != e.name:
                other, line = macs[mac]
                problems.append((e.line, f"MAC {mac} is also {other}'s (line {line})"))
            macs.setdefault(mac, (e.name, e.line))


def parse_csv(text: str, path: str = "<csv>") -> list[Entry]:
    reader = csv.reader(io.StringIO(text))
    problems: list[tuple[int, str]] = []
    entries: list[Entry] = []
    header: list[str] | None = None
    for row in reader:
        line = reader.line_num
        if not row or all(not c.strip() for c in row) or row[0].lstrip().startswith("#"):
            continue
        if header is None:
            header = [c.strip().lower() for c in row]
            missing = [c for c in REQUIRED_COLUMNS if c not in header]
            unknown = [c for c in header if c not in CSV_COLUMNS]
            if missing or unknown:
                msg = []
                if missing:
                    msg.append(f"missing column(s): {', '.join(missing)}")
                if unknown:
                    msg.append(f"unknown column(s): {', '.join(unknown)}")
                raise InventoryError(
                    path, [(line, "; ".join(msg) + f" (columns: {', '.join(CSV_COLUMNS)})")]
                )
            continue
        if len(row) != len(header):
            problems.append((line, f"{len(row)} fields, the header has {len(header)}"))
            continue
        f = {k: v.strip() for k, v in zip(header, row, strict=True)}
        try:
            name = check_name(f["name"])
            spec = MachineSpec.model_validate(
                {
                    "macs": f["macs"].replace(";", " ").split(),
                    "serial": f["serial"],
                    "bmc": {"endpoint": f["bmc_endpoint"], "credentialsSecret": f["bmc_secret"]},
                    "pool": f.get("pool") or "default",
                    "hardware": {
                        "gpuModel": f["gpu_model"],
                        "gpuCount": f["gpu_count"],
                        "hcaCount": f["hca_count"],
                    },
                    "topology": {"leaf": f.get("ib_leaf", ""), "block": f.get("ib_block", "")},
                    "enrollmentDigest": f.get("enrollment_digest") or None,
                }
            )
        except ValidationError as exc:
            problems.append((line, f"{f.get('name') or 'machine'}: {_explain(exc)}"))
            continue
        except ValueError as exc:
            problems.append((line, str(exc)))
            continue
        entries.append(Entry(name, spec, line))
    if header is None:
        problems.append((1, "empty file: expected a header line and one line per machine"))
    _check_duplicates(entries, problems)
    if problems:
        raise InventoryError(path, sorted(problems))
    return entries


class _LineLoader(yaml.SafeLoader):
    """Records the line of every mapping, so errors can point at an entry."""


def _mapping_with_line(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Any:
    data = loader.construct_mapping(node, deep=True)
    data["__line__"] = node.start_mark.line + 1
    return data


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_with_line)


def _strip_lines(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_lines(v) for k, v in value.items() if k != "__line__"}
    if isinstance(value, list):
        return [_strip_lines(v) for v in value]
    return value


def parse_yaml(text: str, path: str = "<yaml>") -> list[Entry]:
    try:
        data = yaml.load(text, Loader=_LineLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 0
        problem = getattr(exc, "problem", None) or exc
        raise InventoryError(path, [(line, f"not valid YAML: {problem}")]) from None
    if isinstance(data, dict) and "machines" in data:
        data = data["machines"]
    if not isinstance(data, list):
        raise InventoryError(path, [(1, "expected a list of machines (or machines: [...])")])
    problems: list[tuple[int, str]] = []
    entries: list[Entry] = []
    for item in data:
        line = item.get("__line__", 0) if isinstance(item, dict) else 0
        if not isinstance(item, dict) or set(item) - {"name", "spec", "__line__"}:
            problems.append((line, "each machine is {name: ..., spec: {...}}"))
            continue
        try:
            name = check_name(str(item.get("name", "")))
            spec = MachineSpec.model_validate(_strip_lines(item.get("spec") or {}))
        except ValidationError as exc:
            problems.append((line, f"{item.get('name') or 'machine'}: {_explain(exc)}"))
            continue
        except ValueError as exc:
            problems.append((line, str(exc)))
            continue
        entries.append(Entry(name, spec, line))
    _check_duplicates(entries, problems)
    if problems:
        raise InventoryError(path, sorted(problems))
    return entries
