"""Hot spares: which verified nodes wait out of training work, and which one steps in.

A large synchronous job restarts at full size only if a healthy node can take
the place of the one that failed. A *hot spare* is a node in ``production``
(burn-in or verification passed) that gpufleet keeps out of training work:
Kubernetes taints it (``gpufleet.io/spare:NoSchedule``, label
``gpufleet.io/spare=true``) and the Slurm syncer drains it with the reason
``gpufleet: spare``. The moment a node of its pool leaves production, a spare
is *promoted*: taint and label go, the syncer resumes it in Slurm, and the
job's next allocation finds it.

Rules (the policy's ``spares`` says how many each pool keeps):

* A node that **enters production** while its pool has fewer spares than it
  wants becomes a spare (:func:`becomes_spare`, called by ``decide``): a
  repaired node refills the pool before it takes work again. Nodes already
  serving are never turned into spares (that would take work away from them).
* The pool's **training capacity** is its size less the spares it wants.
  Whenever fewer nodes than that serve outside the spare pool, spares are
  promoted to make up the difference (:func:`promotions`), lowest name first.

The controller and the simulator both call these functions, so a policy's
spare pool is judged by the code that runs it.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet.domain.policy import Policy
from gpufleet.domain.records import FleetView, NodeRecord
from gpufleet.domain.states import NodeState


def becomes_spare(record: NodeRecord, fleet: FleetView, policy: Policy) -> bool:
    """Whether a node entering production now should wait as a spare."""
    pool = fleet.pool(record.pool)
    return pool.spares < policy.spares.wanted(pool.size)


def promotions(records: Iterable[NodeRecord], policy: Policy) -> tuple[str, ...]:
    """The spares to promote now, per pool, so that its training capacity is served.

    Capacity is the pool's size less the spares it wants; serving nodes are
    those in production that are not spares. Deterministic (lowest names first)
    so that two passes over the same records choose the same nodes.
    """
    by_pool: dict[str, list[NodeRecord]] = {}
    for r in records:
        by_pool.setdefault(r.pool, []).append(r)
    chosen: list[str] = []
    for members in by_pool.values():
        serving = sum(1 for r in members if r.state is NodeState.PRODUCTION and not r.spare)
        missing = shortfall(len(members), serving, policy)
        chosen.extend(choose((r.name for r in members if r.is_spare), missing))
    return tuple(sorted(chosen))


def shortfall(pool_size: int, serving: int, policy: Policy) -> int:
    """How many more nodes a pool's training capacity needs than ``serving`` give it."""
    return max(0, pool_size - policy.spares.wanted(pool_size) - serving)


def choose(spares: Iterable[str], count: int) -> list[str]:
    """Which ``count`` spares step in: the lowest names (deterministic)."""
    return sorted(spares)[:count] if count > 0 else []
