"""The pod scheduler's Slurm port: sbatch's arguments, squeue's and sbatch's text as Slurm
22.05 and 24.11 print it (captured from the local cluster's daemons) read in one codec, and
the tools run as processes (stand-in scripts that answer as Slurm does)."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import pytest

from gpufleet.domain import pod_groups as pg
from gpufleet.domain import well_known
from gpufleet.slurm.errors import SlurmUnavailable
from gpufleet.slurm.pod_jobs import (
    PodJobsCli,
    PodJobsConfig,
    SubmitRefused,
    comment_prefix,
    never_starts,
    parse_jobs,
    parse_submitted,
    refusal,
    sbatch_args,
)

PREFIX = well_known.POD_JOB_COMMENT_PREFIX
KEY = pg.GroupKey("team", "job", "train", "0f4c")


SQUEUE_24_11 = (
    "1|CANCELLED|gpu-node-0000|None|gpufleet-pods:team/pod/solo/uid-solo\n"
    "5|FAILED||BadConstraints|gpufleet-pods:team/group/huge/uid-huge\n"
    "6|FAILED||BadConstraints|gpufleet-pods:team/pod/greedy/uid-greedy\n"
    "3|PENDING||Resources|gpufleet-pods:team/group/big/uid-big\n"
    "2|RUNNING|gpu-node-[0000-0001]|None|gpufleet-pods:team/job/train/uid-train\n"
    "4|RUNNING|gpu-node-0000|None|(null)\n"
    "7|RUNNING|gpu-node-0000|None|gpufleet-pods:team/pod/q/uid-q\n"
)
"""``squeue -h --states=all -o '%i|%T|%N|%r|%k'`` of Slurm 24.11.5 on the local cluster: jobs
of ours running (one node; two), pending (Resources), cancelled, failed at submission (a
group too big, too many GPUs: 24.11 keeps the refused job, FAILED), and someone else's."""

SQUEUE_22_05 = (
    "1|CANCELLED|gpu-node-0000|None|gpufleet-pods:team/pod/solo/uid-solo\n"
    "6|FAILED||BadConstraints|gpufleet-pods:team/pod/greedy/uid-greedy\n"
    "3|PENDING||Resources|gpufleet-pods:team/group/big/uid-big\n"
    "5|PENDING||PartitionNodeLimit|gpufleet-pods:team/group/huge/uid-huge\n"
    "2|RUNNING|gpu-node-[0000-0001]|None|gpufleet-pods:team/job/train/uid-train\n"
    "4|RUNNING|gpu-node-0000|None|(null)\n"
    "7|RUNNING|gpu-node-0000|None|gpufleet-pods:team/pod/q/uid-q\n"
)
"""The same on Slurm 22.05.8: a group too big is accepted and waits (PartitionNodeLimit)."""

SQUEUE_REQUEUED = "2|PENDING||BeginTime|gpufleet-pods:team/job/train/uid-train\n"
"""Slurm 24.11 right after ``scontrol requeue`` of the running job 2."""

REFUSED_PARTITION = (
    "sbatch: error: invalid partition specified: no-such-partition\n"
    "sbatch: error: Batch job submission failed: Invalid partition name specified\n"
)
REFUSED_TOO_BIG = (
    "sbatch: error: Batch job submission failed: Requested node configuration is not available\n"
)
"""sbatch's standard error, Slurm 24.11 (22.05 says the same for the partition)."""


def request(**kw: object) -> pg.JobRequest:
    base = pg.JobRequest(
        key=KEY,
        job_name="team/train",
        comment=KEY.comment,
        nodes=2,
        gpus_per_node=8,
        cpus_per_node=4,
        mem_mib=1024,
    )
    return pg.JobRequest(**{**base.__dict__, **kw})  # type: ignore[arg-type]


def test_sbatch_asks_for_one_node_per_pod_with_the_largest_members_resources() -> None:
    args = sbatch_args(request(gpu_type="h100", time_minutes=90, partition="gpu"), PREFIX)
    assert args[:5] == [
        "--parsable",
        "--job-name=team/train",
        f"--comment={PREFIX}team/job/train/0f4c",
        "--nodes=2",
        "--ntasks-per-node=1",
    ]
    assert "--gres=gpu:h100:8" in args and "--cpus-per-task=4" in args
    assert "--mem=1024" in args and "--time=90" in args and "--partition=gpu" in args
    assert args[-1] == "--wrap=exec sleep infinity" and "--output=/dev/null" in args
    assert not any(a.startswith(("--account", "--qos", "--priority")) for a in args)


def test_no_memory_or_gpus_asked_means_no_option_not_zero() -> None:
    args = sbatch_args(request(mem_mib=None, gpus_per_node=0, priority=7, qos="hi"), PREFIX)
    assert not any(a.startswith(("--mem", "--gres")) for a in args)
    assert "--priority=7" in args and "--qos=hi" in args


def test_each_scheduler_name_has_a_prefix_no_other_matches() -> None:
    assert comment_prefix(well_known.POD_SCHEDULER_NAME) == PREFIX
    other = comment_prefix("team-a")
    assert other == "gpufleet-pods@team-a:" and not other.startswith(PREFIX)
    text = f"7|RUNNING|n1|None|{PREFIX}team/pod/a/u1\n8|PENDING||Priority|{other}team/pod/b/u2\n"
    assert [j.job_id for j in parse_jobs(text, PREFIX)] == [7]
    assert [j.job_id for j in parse_jobs(text, other)] == [8]


def test_squeue_lines_that_are_not_ours_are_skipped() -> None:
    text = (
        "5|RUNNING|n1|None|(null)\n"
        f"6_1|RUNNING|n1|None|{PREFIX}team/pod/a/u\n"  # an array task: never ours
        f"9|RUNNING|n1|None|{PREFIX}not a key\n"
        "garbage\n"
        f"10|RUNNING|n[1-2]|None|{PREFIX}team/group/g/-|with a bar\n"
    )
    assert parse_jobs(text, PREFIX) == []


def test_parse_submitted_reads_the_id_with_or_without_a_cluster() -> None:
    assert parse_submitted("4242\n") == 4242
    assert parse_submitted("4242;cluster\n") == 4242
    with pytest.raises(SlurmUnavailable):
        parse_submitted("")


def tool(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_the_port_runs_one_squeue_and_tells_refusals_from_an_absent_controller(
    tmp_path: Path,
) -> None:
    calls = tmp_path / "calls"
    tool(tmp_path, "squeue", f'echo "$@" >> {calls}\nprintf "%s" "$SQUEUE_TEXT"\n')
    tool(tmp_path, "sbatch", 'printf "%s\\n" "$SBATCH_ERR" >&2\nexit 1\n')
    text = f"12|RUNNING|gpu-node-[0001-0002]|None|{PREFIX}team/job/train/0f4c\n"

    async def go() -> None:
        port = PodJobsCli(
            PodJobsConfig(bin_dir=str(tmp_path), env={"SQUEUE_TEXT": text, "SBATCH_ERR": ""})
        )
        (job,) = await port.jobs()
        assert (job.job_id, job.key, job.state) == (12, KEY, "RUNNING")
        assert job.nodes == ("gpu-node-0001", "gpu-node-0002")
        assert calls.read_text().split() == ["-h", "--states=all", "-o", "%i|%T|%N|%r|%k"]
        for err, raised in (
            (
                "sbatch: error: Batch job submission failed: Invalid partition name specified",
                SubmitRefused,
            ),
            (
                "sbatch: error: Batch job submission failed: Unable to contact slurm controller "
                "(connect failure)",
                SlurmUnavailable,
            ),
        ):
            port = PodJobsCli(PodJobsConfig(bin_dir=str(tmp_path), env={"SBATCH_ERR": err}))
            with pytest.raises(raised) as info:
                await port.submit(request())
            if raised is SubmitRefused:
                assert info.value.message == "Invalid partition name specified"  # type: ignore[attr-defined]

    asyncio.run(go())


def test_refusal_keeps_slurms_reason_only() -> None:
    assert (
        refusal(
            "sbatch: error: Batch job submission failed: Requested node configuration is not "
            "available\n"
        )
        == "Requested node configuration is not available"
    )
    assert refusal("sbatch: error: invalid partition specified: nope\n") == (
        "invalid partition specified: nope"
    )
    assert refusal("") == "sbatch refused the job"


def test_a_requeued_job_is_kept_off_the_nodes_found_unfit(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    tool(tmp_path, "scontrol", f'echo "$@" >> {calls}\n')

    async def go() -> None:
        port = PodJobsCli(PodJobsConfig(bin_dir=str(tmp_path)))
        await port.requeue(12, ("gpu-node-0003", "gpu-node-0001"))
        await port.requeue(13)

    asyncio.run(go())
    assert calls.read_text().splitlines() == [
        "requeue 12",
        "update JobId=12 ExcNodeList=gpu-node-[0001,0003]",
        "requeue 13",
    ]


def test_squeue_of_slurm_24_11_and_22_05_read_into_the_jobs_of_ours() -> None:
    def seen(text: str) -> dict[int, tuple[str, str, tuple[str, ...], str, str]]:
        return {
            j.job_id: (j.key.name, j.state, j.nodes, j.reason, j.key.kind)
            for j in parse_jobs(text, PREFIX)
        }

    new = seen(SQUEUE_24_11)
    assert new[2] == ("train", "RUNNING", ("gpu-node-0000", "gpu-node-0001"), "", "job")
    assert new[3] == ("big", "PENDING", (), "Resources", "group")
    assert new[1] == ("solo", "CANCELLED", ("gpu-node-0000",), "", "pod")
    assert new[5][1:4] == ("FAILED", (), "BadConstraints")
    assert 4 not in new  # someone else's job (no comment)
    old = seen(SQUEUE_22_05)
    assert old[5] == ("huge", "PENDING", (), "PartitionNodeLimit", "group")
    assert old[2] == new[2] and 4 not in old
    (requeued,) = parse_jobs(SQUEUE_REQUEUED, PREFIX)
    assert (requeued.state, requeued.nodes, requeued.reason) == ("PENDING", (), "BeginTime")


def test_what_a_pending_job_waits_for_tells_whether_it_ever_starts() -> None:
    jobs = {j.key.name: j for j in parse_jobs(SQUEUE_22_05, PREFIX)}
    assert never_starts(jobs["huge"])  # 22.05: more nodes than the partition has
    assert not never_starts(jobs["big"])  # waits for resources
    assert not never_starts(jobs["train"])  # running
    assert not any(never_starts(j) for j in parse_jobs(SQUEUE_24_11, PREFIX))  # FAILED: ended


def test_slurms_refusals_read_as_it_printed_them() -> None:
    assert refusal(REFUSED_PARTITION) == "Invalid partition name specified"
    assert refusal(REFUSED_TOO_BIG) == "Requested node configuration is not available"
