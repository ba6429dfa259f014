"""The departure notice on real Slurm daemons: a job whose comment holds
``gpufleet.io/notice`` gets SIGUSR1 on its step before its node is taken and is requeued
once it left; one that ignores it is requeued when the grace ends; one without the token
is requeued at once, as before; a syncer stopped between notice and requeue does not
lose the requeue (the record is on the Node); a noticed job that finishes its work
(exit 0) within the grace is not run again (docs/decisions/0279).

Each job is one step (``srun``) of a small shell loop: a "training step" every 0.2 s,
a marker line for each, for the SIGUSR1 it saw, and for its departure (it finishes the
step it is in and exits 75, so the batch script ends and the job fails with that code:
it wants to come back; or exits 0: its work is done)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_support import Kube, RunningSyncer, Slurm, wait_for

from gpufleet.domain import departure, well_known
from gpufleet.local.cluster import ClusterInfo
from gpufleet.slurm.metrics import SyncerMetrics
from gpufleet.slurm.syncer import SyncSettings

pytestmark = pytest.mark.integration

GRACE = 10.0
NOTICES = well_known.ANNOTATION_SLURM_NOTICES

STEP = """\
out="$1"; mode="$2"; linger="$3"; code="$4"; leave=0
if [ "$mode" = ignore ]; then
  trap 'echo "usr1 $(date +%s.%N)" >> "$out"' USR1
else
  trap 'echo "usr1 $(date +%s.%N)" >> "$out"; leave=1' USR1
fi
i=0
while true; do
  i=$((i + 1))
  echo "step $i $(date +%s.%N)" >> "$out"
  sleep 0.2 & wait $!
  if [ "$leave" = 1 ]; then
    sleep "$linger"
    echo "departed $i $(date +%s.%N)" >> "$out"
    exit "$code"
  fi
done
"""


@pytest.fixture(scope="module")
def env(local_cluster: ClusterInfo) -> Iterator[tuple[Kube, Slurm]]:
    kube, slurm = Kube(local_cluster), Slurm(local_cluster)
    for n in local_cluster.node_names:
        kube.reset_node(n)
        kube.set_state(n, "production")
    try:
        yield kube, slurm
    finally:
        slurm.cancel_all()
        slurm.undrain_all()
        for n in local_cluster.node_names:
            kube.reset_node(n)


def syncer(info: ClusterInfo) -> RunningSyncer:
    settings = SyncSettings(poll_interval_s=0.5, hold_taint=False, notice_grace_s=GRACE)
    return RunningSyncer(info, settings, SyncerMetrics()).start()


def submit(
    slurm: Slurm,
    tmp: Path,
    node: str,
    mode: str,
    comment: str,
    linger: float = 0,
    code: int = departure.DEPARTED_EXIT_CODE,
) -> int:
    step = tmp / "step.sh"
    step.write_text(STEP)
    out = tmp / f"{mode}-{node}.log"
    args = ["sbatch", "--parsable", "--requeue", f"--nodelist={node}", "--output=/dev/null"]
    if comment:
        args.append(f"--comment={comment}")
    wrap = f"srun bash {step} {out} {mode} {linger} {code}"
    job_id = int(slurm.run(*args, f"--wrap={wrap}").strip().split(";")[0])
    wait_for(f"job {job_id} stepping", lambda: out.exists() and "step 2" in out.read_text(), 30)
    return job_id


def marks(tmp: Path, mode: str, node: str) -> dict[str, float]:
    """First time of each marker kind (usr1, departed) in a job's log."""
    found: dict[str, float] = {}
    for line in (tmp / f"{mode}-{node}.log").read_text().splitlines():
        kind, *_, at = line.split()
        found.setdefault(kind, float(at))
    return found


def show(slurm: Slurm, job_id: int) -> dict[str, str]:
    text = slurm.run("scontrol", "-o", "show", "job", str(job_id))
    return dict(tok.split("=", 1) for tok in text.split() if "=" in tok)


def requeued_at(slurm: Slurm, job_id: int, timeout: float) -> float:
    """When the job was seen requeued (its restart count went up), polled every 0.1 s."""
    wait_for(f"job {job_id} requeued", lambda: show(slurm, job_id)["Restarts"] != "0", timeout)
    return time.time()


def noticed_at(kube: Kube, node: str, job_id: int, since: str) -> float:
    """When the syncer recorded its notice of ``job_id`` on ``node``, from every value the
    annotation took since resourceVersion ``since`` (taken before the node had to be
    emptied). A job that leaves at once is requeued, and its record cleared, within about
    a second of its notice: a test that read the Node only now and then, busy with Slurm
    meanwhile, could miss the record altogether."""
    got: dict[int, float] = {}

    def recorded() -> bool:
        for text in kube.annotations_since(node, NOTICES, since):
            got.update(departure.parse_notices(text))
        return job_id in got

    wait_for(f"notice of {job_id} recorded on {node}", recorded, 10, step=0.05)
    return got[job_id]


def outcome(s: RunningSyncer, kind: str) -> dict[str, float]:
    """The syncer's counts of notice outcomes once ``kind`` was counted (the metric is
    observed just after ``scontrol requeue`` returned: a moment after Slurm shows it)."""
    assert s.metrics is not None
    registry = s.metrics.registry

    def counts() -> dict[str, float]:
        return {
            o.value: registry.get_sample_value(
                "gpufleet_syncer_notice_seconds_count", {"outcome": o.value}
            )
            or 0.0
            for o in departure.Outcome
        }

    wait_for(f"outcome {kind} counted", lambda: counts()[kind] > 0, 5, step=0.05)
    return counts()


def test_notice_then_requeue_once_left_or_at_grace_and_no_token_at_once(
    env, local_cluster: ClusterInfo, tmp_path: Path
) -> None:
    kube, slurm = env
    told, deaf, plain = local_cluster.node_names[:3]
    s = syncer(local_cluster)
    try:
        j_told = submit(slurm, tmp_path, told, "leave", "team-a gpufleet.io/notice")
        j_deaf = submit(slurm, tmp_path, deaf, "ignore", "gpufleet.io/notice")
        j_plain = submit(slurm, tmp_path, plain, "leave", "")
        since = {n: kube.resource_version(n) for n in (told, deaf)}
        for n in (told, deaf, plain):
            kube.set_condition(n, "GpuProblem", "True", "Xid79")

        # No token: requeued at once, as before; its step never saw a notice.
        requeued_at(slurm, j_plain, 10)
        assert "usr1" not in marks(tmp_path, "leave", plain)
        assert NOTICES not in (kube.node(plain)["metadata"].get("annotations") or {})

        # The token: noticed (recorded on the Node first), left, then requeued.
        t_notice = noticed_at(kube, told, j_told, since[told])
        t_requeue = requeued_at(slurm, j_told, GRACE)
        seen = marks(tmp_path, "leave", told)
        assert t_notice <= seen["usr1"] <= seen["departed"] <= t_requeue
        # Requeued because it left, not at the grace.
        assert outcome(s, "left") == {"left": 1, "grace_expired": 0, "ended": 0}

        # The token, ignored: requeued when the grace ended, not before.
        d_notice = noticed_at(kube, deaf, j_deaf, since[deaf])
        d_requeue = requeued_at(slurm, j_deaf, GRACE + 10)
        assert "usr1" in marks(tmp_path, "ignore", deaf)
        assert d_requeue >= d_notice + GRACE
        assert outcome(s, "grace_expired") == {"left": 1, "grace_expired": 1, "ended": 0}
        assert s.metrics is not None
        assert s.metrics.registry.get_sample_value("gpufleet_syncer_notices_total") == 2
        wait_for("records cleared", lambda: kube.annotation(deaf, NOTICES) is None, 10)
        print(
            f"\nnotice -> USR1 in the step {seen['usr1'] - t_notice:.2f} s -> departed "
            f"{seen['departed'] - t_notice:.2f} s -> requeue seen {t_requeue - t_notice:.2f} s; "
            f"ignored: requeue seen {d_requeue - d_notice:.2f} s after its notice (grace {GRACE})"
        )
    finally:
        s.stop()
        slurm.cancel_all()
        for n in (told, deaf, plain):
            kube.set_condition(n, "GpuProblem", "False", "Healthy")
        slurm.undrain_all()


def test_a_syncer_stopped_between_notice_and_requeue_still_requeues(
    env, local_cluster: ClusterInfo, tmp_path: Path
) -> None:
    kube, slurm = env
    node = local_cluster.node_names[3]
    first = syncer(local_cluster)
    restarted: RunningSyncer | None = None
    try:
        # It finishes its step and lingers 2 s before it leaves: the syncer is gone by then.
        job_id = submit(slurm, tmp_path, node, "leave", "gpufleet.io/notice", linger=2)
        since = kube.resource_version(node)
        kube.set_condition(node, "GpuProblem", "True", "Xid79")
        noticed_at(kube, node, job_id, since)
        wait_for("the step saw the notice", lambda: "usr1" in marks(tmp_path, "leave", node), 10)
        first.stop()  # its memory (what it signalled) is gone; the Node keeps the record
        wait_for("job left", lambda: show(slurm, job_id)["JobState"] == "FAILED", 15)
        assert show(slurm, job_id)["ExitCode"] == "75:0"  # it departed: it wants to come back
        assert show(slurm, job_id)["Restarts"] == "0"
        restarted = syncer(local_cluster)
        requeued_at(slurm, job_id, 10)
        assert outcome(restarted, "left") == {"left": 1, "grace_expired": 0, "ended": 0}
        wait_for("record cleared", lambda: kube.annotation(node, NOTICES) is None, 10)
    finally:
        if restarted is not None:
            restarted.stop()
        slurm.cancel_all()
        kube.set_condition(node, "GpuProblem", "False", "Healthy")
        slurm.undrain_all()


def test_a_noticed_job_that_finishes_its_work_within_the_grace_is_not_run_again(
    env, local_cluster: ClusterInfo, tmp_path: Path
) -> None:
    kube, slurm = env
    node = local_cluster.node_names[3]
    s = syncer(local_cluster)
    try:
        # On its notice it finishes the step it is in and exits 0: its work is done.
        job_id = submit(slurm, tmp_path, node, "leave", "gpufleet.io/notice", code=0)
        since = kube.resource_version(node)
        kube.set_condition(node, "GpuProblem", "True", "Xid79")
        noticed_at(kube, node, job_id, since)
        wait_for("job done", lambda: show(slurm, job_id)["JobState"] == "COMPLETED", 10)
        assert outcome(s, "ended") == {"left": 0, "grace_expired": 0, "ended": 1}
        wait_for("record cleared", lambda: kube.annotation(node, NOTICES) is None, 10)
        time.sleep(1.5)  # three more polls: still not requeued
        job = show(slurm, job_id)
        assert (job["JobState"], job["ExitCode"], job["Restarts"]) == ("COMPLETED", "0:0", "0")
    finally:
        s.stop()
        slurm.cancel_all()
        kube.set_condition(node, "GpuProblem", "False", "Healthy")
        slurm.undrain_all()
