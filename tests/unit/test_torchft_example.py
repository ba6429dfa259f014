"""The replica-group example's pure parts (fingerprint, bit flip, data, checkpoints) and
the reader of its events (gpufleet.demo.replica_events); no processes."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import torch

from gpufleet.demo.replica_events import (
    checkpoint_blocking,
    first_step_in_quorum,
    parse_events,
    survivor_gap,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchft-replicas" / "train.py"
spec = importlib.util.spec_from_file_location("torchft_train", EXAMPLE)
assert spec and spec.loader
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)


def test_the_fingerprint_is_blake2b_over_every_parameters_float32_bytes() -> None:
    model = train.build_model()
    h = hashlib.blake2b(digest_size=8)
    for _, p in model.named_parameters():
        h.update(p.detach().numpy().astype("float32").tobytes())
    assert train.fingerprint(model) == h.hexdigest()
    assert len(train.fingerprint(model)) == 16
    # Every group starts from the same weights.
    assert train.fingerprint(train.build_model()) == train.fingerprint(model)


def test_the_bit_flip_changes_bit_20_of_the_first_weight_and_nothing_else() -> None:
    model = train.build_model()
    before = [p.detach().clone() for p in model.parameters()]
    fp = train.fingerprint(model)
    train.flip_bit(model)
    after = list(model.parameters())
    first_bits = before[0].view(-1).view(torch.int32)[0].item()
    assert after[0].detach().view(-1).view(torch.int32)[0].item() == first_bits ^ (1 << 20)
    assert torch.equal(after[0].detach().view(-1)[1:], before[0].view(-1)[1:])
    assert all(torch.equal(a.detach(), b) for a, b in zip(after[1:], before[1:], strict=True))
    assert train.fingerprint(model) != fp


def test_a_steps_batch_depends_on_the_step_and_the_share_only() -> None:
    x1, y1 = train.batch(7, 0)
    x2, y2 = train.batch(7, 0)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(train.batch(7, 1)[0], x1)
    assert not torch.equal(train.batch(8, 0)[0], x1)


def test_the_checkpoint_copy_is_taken_before_the_step_goes_on(tmp_path: Path) -> None:
    seen: list[tuple[str, dict[str, object]]] = []
    ckpt = train.AsyncCheckpointer(tmp_path, lambda kind, **kw: seen.append((kind, kw)), keep=2)
    weights = torch.zeros(4)
    for step in (10, 20, 30):
        weights += 1  # the training goes on while the writer thread saves
        assert ckpt.save(step, {"w": weights, "torchft": {"step": step}}) >= 0
    ckpt.close()
    assert sorted(p.name for p in tmp_path.glob("step-*.pt")) == [
        "step-00000020.pt",
        "step-00000030.pt",
    ]
    latest = ckpt.latest()
    assert latest is not None and latest["torchft"] == {"step": 30}
    assert torch.equal(latest["w"], torch.full((4,), 3.0))
    assert [k for k, _ in seen] == ["checkpoint-saved"] * 3


def test_the_sim_gpu_file_gives_speed_and_flip_step(tmp_path: Path) -> None:
    (tmp_path / "n1.json").write_text(json.dumps({"speed": 0.5, "sdc_flip_at_step": 12}))
    (tmp_path / "n2.json").write_text("{half")
    gpu = train.sim_gpu(str(tmp_path), "n1")
    assert (train.sim_speed(gpu), gpu["sdc_flip_at_step"]) == (0.5, 12)
    assert train.sim_gpu(str(tmp_path), "n2") == {}
    assert train.sim_gpu(None, "n1") == {}


def line(kind: str, group: str, t: float, step: int, **kw: object) -> str:
    return json.dumps({"kind": kind, "group": group, "t": t, "step": step, "job": "1", **kw})


def test_events_are_read_once_and_what_a_departure_cost_is_measured() -> None:
    text = "\n".join(
        [
            line("start", "g0", 0.0, 0, recovered_from="init"),
            line("step", "g0", 1.0, 1, quorum=2),
            line("step", "g0", 2.0, 2, quorum=2),
            line("checkpoint", "g0", 2.0, 2, blocking_s=0.004),
            line("step-discarded", "g0", 2.5, 3),
            line("step", "g0", 4.0, 3, quorum=1),
            line("step", "g0", 5.0, 5, quorum=2),
            line("departed", "g1", 2.1, 2),
            '{"kind": "step", "group": "g0"',  # a line being written
            line("future-kind", "g0", 9.0, 9),
        ]
    )
    events = parse_events(text)
    assert len(events) == 8
    gap = survivor_gap(events, "g0", 2.1, 4.5)
    assert (gap.steps_lost, gap.gap_steps, gap.gap_s) == (1, 1, 2.0)
    assert first_step_in_quorum(events, "g0", 3.0, 2) == events[-2]
    assert checkpoint_blocking(events) == [0.004]
