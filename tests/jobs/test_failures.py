"""Failure explanations read from logs shaped like the job template's (header, training output, memory
summary, footer), with the lines SLURM itself writes into a log (copied from the local cluster)."""

from __future__ import annotations

from workshop_lib.jobs.failures import explain, important_lines
from workshop_lib.jobs.slurm_output import JobInfo

HEADER = ["Job 41 (zero-baseline) on node1, run directory /scratch/runs/zero/baseline",
          " Start time : 2026-11-22 16:55:33"]
FOOTER = ["CPU Memory Usage [node1]", "   Peak =    812 MiB", "   Average = 640.12 MiB", "   Mode =    630 MiB",
          "   Busy average = 700.00 MiB", "",
          "Avg / Average and Mode count every sample, idle ones before and after training included.",
          "Busy avg counts only samples at or above 80% of that device's own peak (training running).",
          "===============================",
          " Job finished", " End time   : 2026-11-22 16:56:40", " Total time : 00:01:07", " Exit status: 1",
          "==============================="]
TRACEBACK = ["[rank0]: Traceback (most recent call last):",
             '[rank0]:   File "/venv/lib/python3.12/runpy.py", line 198, in _run_module_as_main',
             "[rank0]:     return _run_code(code, main_globals, None,",
             '[rank0]:   File "/repo/workshop_lib/train/hf.py", line 210, in main',
             "[rank0]:     trainer.train()",
             '[rank0]:   File "/repo/workshop_lib/train/data.py", line 88, in load',
             "[rank0]:     raise FileNotFoundError(path)",
             "[rank0]: FileNotFoundError: /data/squad/train.json"]


def log(tmp_path, lines):
    path = tmp_path / "slurm-41.out"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_failed_run_shows_the_traceback_at_line_17_not_the_footer(tmp_path):
    progress = [f"step {i} loss 10.{i}" for i in range(13)]
    chatter = [f"rank {i} exiting" for i in range(26)]  # a 64-line log: the traceback is line 17
    path = log(tmp_path, HEADER + [""] + progress + TRACEBACK + chatter + FOOTER)
    assert len(path.read_text().splitlines()) == 64
    explanation = explain(JobInfo(job_id="41", state="FAILED", exit_code=1, elapsed_s=67, time_limit_s=600), path)
    numbers = [number for number, _ in explanation.log_lines]
    texts = [text for _, text in explanation.log_lines]
    assert numbers[0] == 17 and texts[0].endswith("Traceback (most recent call last):")
    assert texts[-1].endswith("FileNotFoundError: /data/squad/train.json")
    assert any("data.py" in text for text in texts) and not any("runpy" in text for text in texts)
    assert not any("Exit status" in text or "Total time" in text or "Memory Usage" in text for text in texts)
    assert explanation.headline() == "job 41 FAILED: exit code 1, after 00:01:07 of its 00:10:00 limit"
    assert "Fix the cause" in explanation.hint and "checks passed" not in explanation.text()


def test_timeout_names_the_limit_and_how_to_raise_it(tmp_path):
    cancelled = "slurmstepd-node1: error: *** JOB 41 ON node1 CANCELLED AT 2026-11-22T17:02:35 DUE TO TIME LIMIT ***"
    path = log(tmp_path, HEADER + ["step 1", "step 2", cancelled])
    explanation = explain(JobInfo(job_id="41", state="TIMEOUT", exit_code=0, signal=15, elapsed_s=95,
                                  time_limit_s=60), path)
    assert explanation.headline() == "job 41 TIMEOUT: signal 15 (SIGTERM), after 00:01:35 of its 00:01:00 limit"
    assert explanation.log_lines == ((5, cancelled),)
    assert explanation.hint.startswith("it used all of its 00:01:00: raise the limit (#SBATCH --time")


def test_memory_killed_without_cgroups_reads_as_out_of_memory_with_the_prediction(tmp_path):
    # What this project's local cluster (jobacct_gather OverMemoryKill) wrote for a job over --mem=100M.
    killed = ["slurmstepd-node1: error: StepId=17.batch exceeded memory limit (433643520 > 104857600), being killed",
              "slurmstepd-node1: error: Exceeded job memory limit",
              "slurmstepd-node1: error: *** JOB 17 ON node1 CANCELLED AT 2026-11-22T16:50:16 ***"]
    path = log(tmp_path, HEADER + ["allocated"] + killed)
    explanation = explain(JobInfo(job_id="17", state="FAILED", exit_code=0, signal=9, reason="JobLaunchFailure"),
                          path, predicted="3.1 GiB per GPU")
    assert [text for _, text in explanation.log_lines][:2] == killed[:2]
    assert "going over --mem" in explanation.hint and "lower the per-device batch" in explanation.hint
    assert explanation.hint.endswith("The estimator predicted 3.1 GiB per GPU.")
    assert "signal 9 (SIGKILL)" in explanation.headline() and "reason: over its --mem" in explanation.headline()
    assert "JobLaunchFailure" not in explanation.headline()  # SLURM's reason of a launch, not of this kill


def test_node_fail_cancelled_and_lost_each_have_their_own_hint(tmp_path):
    path = log(tmp_path, HEADER)
    hints = {state: explain(JobInfo(job_id="9", state=state), path).hint
             for state in ("NODE_FAIL", "CANCELLED", "LOST", "OUT_OF_MEMORY")}
    assert "node failed" in hints["NODE_FAIL"] and "scancel" in hints["CANCELLED"]
    assert "attempts/" in hints["LOST"] and "--mem" in hints["OUT_OF_MEMORY"]
    requeued = explain(JobInfo(job_id="9", state="FAILED", exit_code=2), path, earlier_attempts=("NODE_FAIL on node1",))
    assert "earlier attempt: NODE_FAIL on node1" in requeued.text()


def test_without_traceback_the_first_error_lines_and_a_missing_log_is_said():
    lines = ["Job 3 started", "loading", "bash: torchrun: command not found", "done"]
    assert important_lines("\n".join(lines)) == [(3, "bash: torchrun: command not found")]
    assert important_lines("a\nb\n" + "\n".join(FOOTER)) == [(1, "a"), (2, "b")]
    missing = explain(JobInfo(job_id="5", state="FAILED", exit_code=1), None)
    assert missing.log_lines == () and "Hint:" in missing.text()
