"""The shown lines of a failed job are its cause, for each kind of failure the chapters can have.

Each log is shaped like the job template's (header, output, footer) with what the real tools print: the
argparse, torchrun (ChildFailedError, the elastic agent's `failed (exitcode: N)` line), psrecord
(NoSuchProcess) and bash lines were copied from runs of those programs (torch 2.x, psrecord 1.4); the SLURM
lines from this project's local cluster. A launcher's report that its child failed must never stand in
for what the child printed.
"""

from __future__ import annotations

import pytest

from workshop_lib.jobs.failures import explain
from workshop_lib.jobs.slurm_output import JobInfo

HEADER = ["Job 41 (zero-baseline) on node1, run directory /scratch/runs/zero/baseline",
          " Start time : 2026-11-25 15:30:10"]
FOOTER = ["===============================", " Job finished", " End time   : 2026-11-25 15:30:20",
          " Total time : 00:00:10", " Exit status: 1", "==============================="]
TORCHRUN_FAILED = [
    "E1125 15:30:19.136000 24747 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: {code}) "
    "local_rank: 0 (pid: 24959) of binary: /venv/bin/python3",
    "Traceback (most recent call last):",
    '  File "/venv/bin/torchrun", line 6, in <module>',
    "    sys.exit(main())",
    '  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1019, in run',
    "    elastic_launch(",
    '  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent',
    "    raise ChildFailedError(",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "============================================================",
    "workshop_lib.train.hf FAILED",
    "------------------------------------------------------------",
    "Failures:",
    "  <NO_OTHER_FAILURES>",
    "------------------------------------------------------------",
    "Root Cause (first observed failure):",
    "[0]:",
    "  time      : 2026-11-25_15:30:19",
    "  host      : node1",
    "  rank      : 0 (local_rank: 0)",
    "  exitcode  : {code} (pid: 24959) ",
    "  error_file: <N/A>",
    "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
    "============================================================"]
PSRECORD_NO_PROCESS = [
    "Attaching to process 24960",
    "Traceback (most recent call last):",
    '  File "/venv/bin/psrecord", line 6, in <module>',
    "    sys.exit(main())",
    '  File "/venv/lib/python3.11/site-packages/psrecord/main.py", line 147, in monitor',
    "    pr = psutil.Process(pid)",
    '  File "/venv/lib/python3.11/site-packages/psutil/__init__.py", line 360, in _init',
    "    raise NoSuchProcess(pid, msg=msg) from None",
    "psutil.NoSuchProcess: process PID not found (pid=24960)"]


def torchrun_failed(code: int) -> list[str]:
    return [line.format(code=code) for line in TORCHRUN_FAILED]


def rank_traceback(last_frame: str, code: str, exception: str) -> list[str]:
    return ["[rank0]: Traceback (most recent call last):",
            '[rank0]:   File "/repo/workshop_lib/train/hf.py", line 210, in main',
            "[rank0]:     trainer.train()",
            f'[rank0]:   File "{last_frame}", line 88, in run',
            f"[rank0]:     {code}",
            f"[rank0]: {exception}"]


BAD_ARGUMENT = "hf.py: error: argument --model: invalid choice: 'nonsense' (choose from 'tiny-llama', 'gpt')"
NO_LAUNCHER = "/scratch/runs/zero/baseline/job.sbatch: line 12: /opt/venv/bin/torchrun: No such file or directory"
TIME_LIMIT = "slurmstepd-node1: error: *** JOB 41 ON node1 CANCELLED AT 2026-11-25T15:31:10 DUE TO TIME LIMIT ***"
MEMORY_KILL = "slurmstepd-node1: error: StepId=41.batch exceeded memory limit (433643520 > 104857600), being killed"
SIGNAL_EXCEPTION = [
    "W1125 15:31:10.000000 24747 torch/distributed/elastic/agent/server/api.py:719] Received Signals.SIGTERM "
    "death signal, shutting down workers",
    "Traceback (most recent call last):",
    '  File "/venv/bin/torchrun", line 6, in <module>',
    "    sys.exit(main())",
    '  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 84, in '
    "_terminate_process_handler",
    "    raise SignalException(f\"Process {os.getpid()} got signal: {sigval}\", sigval=sigval)",
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 24747 got signal: 15"]
DEEPSPEED_LAUNCHER = [
    "[2026-11-25 15:30:19,100] [ERROR] [launch.py:325:sigkill_handler] ['/venv/bin/python', '-u', "
    "'-m', 'workshop_lib.train.hf'] exits with return code = 1",
    "Traceback (most recent call last):",
    '  File "/venv/lib/python3.11/site-packages/deepspeed/launcher/launch.py", line 329, in sigkill_handler',
    "    raise subprocess.CalledProcessError(returncode=last_return_code, cmd=cmd)",
    "subprocess.CalledProcessError: Command '['/venv/bin/python', '-u', '-m', 'workshop_lib.train.hf']' "
    "returned non-zero exit status 1."]

# kind: (what the program printed, the launcher's report after it, the line that must be shown)
CASES = {
    "bad argument under torchrun": (["usage: hf.py [-h] --output-dir OUTPUT_DIR", BAD_ARGUMENT], torchrun_failed(2),
                                    BAD_ARGUMENT),
    "wrong launcher path, psrecord after": ([NO_LAUNCHER], PSRECORD_NO_PROCESS, "No such file or directory"),
    "wrong launcher path, psrecord first": ([], PSRECORD_NO_PROCESS + [NO_LAUNCHER], "No such file or directory"),
    "wrong launcher path, as the local cluster logged it": ([NO_LAUNCHER], PSRECORD_NO_PROCESS + [
        "workshop: error: /scratch/runs/zero/baseline: no memory log here (looked for gpu_memory*.csv and "
        "cpu_memory*.txt). Has the job started? Its monitors write these files into the run directory.",
        "Memory summary failed; the monitor files are in /scratch/runs/zero/baseline"], "No such file or directory"),
    "a Python error in a rank": (rank_traceback("/repo/workshop_lib/train/data.py", "raise FileNotFoundError(path)",
                                                "FileNotFoundError: /data/squad/train.json"), torchrun_failed(1),
                                 "FileNotFoundError: /data/squad/train.json"),
    "GPU memory": (rank_traceback("/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py",
                                  "return F.linear(input, self.weight, self.bias)",
                                  "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."),
                   torchrun_failed(1), "torch.OutOfMemoryError: CUDA out of memory"),
    "an engine not installed": (rank_traceback("/repo/workshop_lib/train/engines.py", "import deepspeed",
                                               "ModuleNotFoundError: No module named 'deepspeed'"),
                                torchrun_failed(1), "No module named 'deepspeed'"),
    "NCCL": (rank_traceback("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
                            "work = group.allreduce([tensor], opts)",
                            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
                            "unhandled system error"),
             torchrun_failed(1) + ["srun: error: node2: task 1: Exited with exit code 1"], "DistBackendError"),
    "host memory over --mem": (["step 3 loss 9.1"], [MEMORY_KILL, "slurmstepd-node1: error: Exceeded job memory limit"]
                               + SIGNAL_EXCEPTION, "exceeded memory limit"),
    "time limit": (["step 3 loss 9.1", TIME_LIMIT], SIGNAL_EXCEPTION, "DUE TO TIME LIMIT"),
    "a module or container not found": (["/scratch/runs/zero/baseline/job.sbatch: line 9: singularity: command not "
                                         "found"], [], "singularity: command not found"),
    "DeepSpeed's launcher": (rank_traceback("/repo/workshop_lib/train/data.py", "raise KeyError(name)",
                                            "KeyError: 'answers'"), DEEPSPEED_LAUNCHER, "KeyError: 'answers'"),
}
LAUNCHER_WORDS = ("ChildFailedError", "NoSuchProcess", "SignalException", "CalledProcessError", "exitcode",
                  "Exited with exit code", "exits with return code", "no memory log here")


@pytest.mark.parametrize("kind", CASES)
def test_the_shown_lines_are_the_cause_not_the_launchers_report(tmp_path, kind):
    program, launcher, cause = CASES[kind]
    path = tmp_path / "slurm-41.out"
    path.write_text("\n".join(HEADER + program + launcher + FOOTER) + "\n")
    explanation = explain(JobInfo(job_id="41", state="FAILED", exit_code=1), path)
    shown = [text for _, text in explanation.log_lines]
    assert any(cause in text for text in shown), shown
    assert not any(word in text for text in shown for word in LAUNCHER_WORDS), shown
    assert not any("Exit status" in text for text in shown)


def test_a_launchers_traceback_is_shown_when_nothing_else_says_why(tmp_path):
    path = tmp_path / "slurm-41.out"
    path.write_text("\n".join(HEADER + ["step 1"] + torchrun_failed(1) + FOOTER) + "\n")
    shown = [text for _, text in explain(JobInfo(job_id="41", state="FAILED", exit_code=1), path).log_lines]
    assert shown[0] == "Traceback (most recent call last):" and "ChildFailedError" in shown[-1]


def test_the_last_error_a_program_printed_is_shown_when_there_are_many(tmp_path):
    warnings = [f"warning: retrying error {i}" for i in range(12)]
    path = tmp_path / "slurm-41.out"
    path.write_text("\n".join(HEADER + warnings + [BAD_ARGUMENT] + torchrun_failed(2) + FOOTER) + "\n")
    shown = [text for _, text in explain(JobInfo(job_id="41", state="FAILED", exit_code=2), path).log_lines]
    assert shown[-1] == BAD_ARGUMENT and len(shown) == 8
