"""Parsing what scontrol and sacct print, and what a script asks for."""

from pathlib import Path

import pytest

from workshop_lib.jobs import slurm_output as so


@pytest.mark.parametrize("raw, state", [
    ("CANCELLED by 0", "CANCELLED"), ("COMPLETED", "COMPLETED"), ("RUNNING", "RUNNING"),
    ("OUT_OF_MEMORY", "OUT_OF_MEMORY"), ("TIMEOUT", "TIMEOUT"), ("  ", "UNKNOWN"), ("completed+", "COMPLETED"),
])
def test_normalise_state(raw, state):
    assert so.normalise_state(raw) == state


@pytest.mark.parametrize("raw, expected", [
    ("3:0", (3, None)), ("0:0", (0, None)), ("0:15", (0, 15)), ("137:9", (137, 9)), ("", (None, None)),
    (None, (None, None)), ("x:y", (None, None)),
])
def test_parse_exit_code(raw, expected):
    assert so.parse_exit_code(raw) == expected


@pytest.mark.parametrize("raw, seconds", [
    ("00:00:07", 7), ("01:02:03", 3723), ("2-00:00:01", 172801), ("05:09", 309), ("42", 42), ("INVALID", None),
])
def test_parse_elapsed(raw, seconds):
    assert so.parse_elapsed(raw) == seconds


def test_sacct_lines_with_odd_states_and_arrays():
    output = "\n".join([
        "41|train.sh|CANCELLED by 0|0:15|12|node1|None",
        "42_1|arr|COMPLETED|0:0|3|node1|None",
        "42_2|arr|FAILED|2:0|4|node2|NonZeroExitCode",
        "42_[3-4]|arr|PENDING|0:0|0|None assigned|Resources",
        "43|oom|OUT_OF_MEMORY|0:125|61|node2|None",
        "garbage line without fields",
    ])
    infos = so.job_infos_from_sacct(output)
    assert infos["41"].state == "CANCELLED" and infos["41"].signal == 15 and infos["41"].elapsed_s == 12
    assert infos["42_2"].exit_code == 2 and infos["42_[3-4]"].node_list is None
    array = infos["42"]
    assert array.state == "RUNNING"  # some tasks ended, others still wait: the array is not final
    assert not array.finished and len(array.tasks) == 3
    assert infos["43"].state == "OUT_OF_MEMORY" and infos["43"].finished


def test_array_rolls_up_to_worst_final_state():
    tasks = [so.JobInfo("7_1", "COMPLETED", 0), so.JobInfo("7_2", "TIMEOUT", 0), so.JobInfo("7_3", "COMPLETED", 0)]
    assert so.aggregate_array("7", tasks).state == "TIMEOUT"
    assert so.aggregate_array("7", tasks[::2]).state == "COMPLETED"


def test_scontrol_record_keeps_values_with_spaces():
    line = ("JobId=12 JobName=my job UserId=root(0) JobState=FAILED Reason=NonZeroExitCode ExitCode=3:0 "
            "RunTime=00:00:05 NodeList=node1 Command=/tmp/a b.sh StdOut=/tmp/out-12.txt")
    info = so.job_info_from_scontrol("12", line)
    assert (info.state, info.exit_code, info.elapsed_s, info.name) == ("FAILED", 3, 5, "my job")
    assert info.stdout_path == Path("/tmp/out-12.txt")


def test_scontrol_array_lines_aggregate():
    lines = "\n".join(
        f"JobId={20 + i} ArrayJobId=20 ArrayTaskId={i} JobName=a JobState={s} ExitCode={e} RunTime=00:00:01"
        for i, (s, e) in enumerate([("COMPLETED", "0:0"), ("RUNNING", "0:0")], start=1))
    info = so.job_info_from_scontrol("20", lines)
    assert info.state == "RUNNING" and [t.job_id for t in info.tasks] == ["20_1", "20_2"]


def test_expected_stdout_follows_the_directives_and_the_command_line_wins(tmp_path):
    script = tmp_path / "s.sh"
    script.write_text("#!/bin/bash\n#SBATCH --job-name=demo\n#SBATCH -o logs/%x-%j.out  # comment\necho hi\n")
    assert so.expected_stdout(script, tmp_path, "99") == tmp_path / "logs/demo-99.out"
    assert so.expected_stdout(script, tmp_path, "99", ["--output=/x/%j.log"]) == Path("/x/99.log")
    assert so.expected_stdout(tmp_path / "s.sh", tmp_path, "5_2", ["-o", "a-%A-%a.txt"]) == tmp_path / "a-5-2.txt"


def test_requeue_rows_of_an_unrelated_job_with_a_reused_id_are_not_attempts():
    """After a scheduler reset `sacct -D -j 12` also lists older jobs that had id 12: only rows of the same
    working directory, submitted since the run's record, are attempts of this job."""
    from datetime import datetime

    from workshop_lib.jobs.slurm import _same_job

    since = datetime.fromisoformat("2026-11-25T10:00:00").timestamp()
    origin = {"12": ("/runs/zero/baseline", since)}
    row = "12|zero-baseline|{state}|0:0|30|node1|None|10|{workdir}|{submit}"
    requeued = row.format(state="NODE_FAIL", workdir="/runs/zero/baseline", submit="2026-11-25T10:00:05")
    other_folder = row.format(state="COMPLETED", workdir="/runs/fsdp/baseline", submit="2026-11-25T10:00:05")
    long_ago = row.format(state="FAILED", workdir="/runs/zero/baseline", submit="2026-11-20T09:00:00")
    assert _same_job(requeued, origin)
    assert not _same_job(other_folder, origin) and not _same_job(long_ago, origin)
