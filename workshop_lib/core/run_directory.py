"""A run's folder and every file in it, named once: what the job script writes and what the readers read.

    runs/<experiment id>/
        job.sbatch            the rendered script                    job.json     the run's record (runs/)
        ds_config.json        DeepSpeed's config, when it has one    slurm-<job id>.out   the job's log
        train/                the entry point's output dir: metrics.jsonl, trainer_state.json
        gpu_memory_<node>.csv nvidia-smi, one per node               cpu_memory_<node>.txt  psrecord, one per node
        nccl_allreduce.txt    the bandwidth check
        attempts/ .next/ .lock .reservation.json .interrupted.json   the submitter's bookkeeping

The job scripts (slurm/templates) get these names from the render context, so a job and its readers cannot
disagree on a file's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workshop_lib.core.paths import runs_root

SCRIPT_NAME = "job.sbatch"
RECORD_NAME = "job.json"
DEEPSPEED_CONFIG_NAME = "ds_config.json"
STDOUT_PATTERN = "slurm-%j.out"  # sbatch's --output pattern; %j is the job id
STDOUT_GLOB = "slurm-*.out"
TRAIN_DIR = "train"
METRICS_NAME = "metrics.jsonl"
TRAINER_STATE_NAME = "trainer_state.json"
CPU_MEMORY_LOG = "cpu_memory.txt"  # psrecord's log of a one-node job
# One monitor log per node of a multi-node job; the job script fills in {node} (a shell variable there).
GPU_LOG_OF_NODE = "gpu_memory_{node}.csv"
CPU_LOG_OF_NODE = "cpu_memory_{node}.txt"
NCCL_LOG = "nccl_allreduce.txt"
GPU_QUERY = "timestamp,index,name,utilization.gpu,memory.used,memory.total"  # nvidia-smi's columns in the GPU log
GPU_LOG_PATTERNS = ("gpu_memory*.csv", "gpu_memory*/*.csv")
CPU_LOG_PATTERNS = ("cpu_memory*.txt", "cpu_memory*.csv", "cpu_memory*/*.txt")
# The submitter's bookkeeping (runs/): earlier attempts, the next attempt being prepared, the lock, the reservation.
ATTEMPTS_DIR = "attempts"
STAGING_DIR = ".next"
LOCK_NAME = ".lock"
RESERVATION_NAME = ".reservation.json"
# Submissions interrupted while sbatch may have been talking to the controller: a job of theirs can still be
# created after the re-run submitted its own (a late job), so status, cancel and reuse look for it here.
INTERRUPTED_NAME = ".interrupted.json"


@dataclass(frozen=True)
class RunDirectory:
    """The folder of one experiment's run under a runs folder, and the path of each of its files."""

    path: Path

    @classmethod
    def of(cls, experiment_id: str, runs_dir: Path | str | None = None) -> "RunDirectory":
        """runs_dir: the argument, else $WORKSHOP_RUNS_DIR, else <repository>/runs (core.paths.runs_root)."""
        return cls(runs_root(runs_dir) / experiment_id)

    @property
    def script(self) -> Path:
        return self.path / SCRIPT_NAME

    @property
    def record(self) -> Path:
        return self.path / RECORD_NAME

    @property
    def deepspeed_config(self) -> Path:
        return self.path / DEEPSPEED_CONFIG_NAME

    def stdout(self, job_id: str) -> Path:
        """The log of job `job_id`, where the scripts' --output (STDOUT_PATTERN) puts it."""
        return self.path / STDOUT_PATTERN.replace("%j", job_id)

    def stdout_logs(self) -> list[Path]:
        """Every job's log in the folder, sorted by name (a resubmitted run has several)."""
        return sorted(self.path.glob(STDOUT_GLOB))

    @property
    def train(self) -> Path:
        return self.path / TRAIN_DIR

    @property
    def metrics(self) -> Path:
        return self.train / METRICS_NAME

    @property
    def trainer_state(self) -> Path:
        return self.train / TRAINER_STATE_NAME

    def gpu_logs(self) -> list[Path]:
        """nvidia-smi's CSV of each node the job ran on (in the run folder itself)."""
        return sorted(self.path.glob(GPU_LOG_PATTERNS[0]))

    def cpu_logs(self) -> list[Path]:
        """psrecord's log of each node the job ran on (in the run folder itself)."""
        return sorted(self.path.glob(CPU_LOG_PATTERNS[0]))

    @property
    def cpu_memory_log(self) -> Path:
        return self.path / CPU_MEMORY_LOG

    @property
    def nccl_log(self) -> Path:
        return self.path / NCCL_LOG

    @property
    def attempts(self) -> Path:
        return self.path / ATTEMPTS_DIR

    @property
    def staging(self) -> Path:
        return self.path / STAGING_DIR

    @property
    def lock(self) -> Path:
        return self.path / LOCK_NAME

    @property
    def reservation(self) -> Path:
        return self.path / RESERVATION_NAME

    @property
    def interrupted(self) -> Path:
        return self.path / INTERRUPTED_NAME
