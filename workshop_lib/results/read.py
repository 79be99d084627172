"""One run's folder read into one row: its state, and the numbers its logs and memory monitors hold."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from workshop_lib.core.log_text import LogProblem, SkippedLines
from workshop_lib.core.run_directory import RunDirectory
from workshop_lib.jobs import footer as footer_format
from workshop_lib.jobs.states import COMPLETED, INCOMPLETE, MISSING
from workshop_lib.results import readers
from workshop_lib.results.parse import hf
from workshop_lib.results.parse import nemo as nemo_format
from workshop_lib.results.readers import RunReader, RunReading
from workshop_lib.runs.record import DamagedRecord, read_record

SHOWN_PROBLEMS = 3  # unreadable lines named per file; the rest are counted


@dataclass(frozen=True)
class UnreadableLines(SkippedLines):
    """The lines of one file of a run that the parsers could not read, each with its reason."""

    file: str  # relative to the run directory
    problems: tuple[LogProblem, ...]

    def note(self) -> str:
        """`2 lines of slurm-7.out could not be read: line 14: why; line 20: why` (the first few only)."""
        count = self.skipped_lines
        named = "; ".join(f"line {problem.line}: {problem.reason}" for problem in self.problems[:SHOWN_PROBLEMS])
        more = f"; and {count - SHOWN_PROBLEMS} more" if count > SHOWN_PROBLEMS else ""
        return f"{count} line{'s' if count > 1 else ''} of {self.file} could not be read: {named}{more}."


@dataclass(frozen=True)
class RunResult:
    """Every number the tables need from one run; None where the run did not produce it."""

    experiment_id: str
    state: str
    run_dir: str | None = None
    job_id: str | None = None
    total_time_s: int | None = None  # from the job footer
    train_step_time_s: float | None = None  # last logged step
    mean_step_time_s: float | None = None
    last_loss: float | None = None  # last logged training loss (NeMo: reduced_train_loss)
    train_loss: float | None = None  # Trainer's final train_loss (mean over the run)
    eval_loss: float | None = None
    eval_loss_by_epoch: dict[int, float] = field(default_factory=dict)
    eval_em: float | None = None
    eval_f1: float | None = None
    train_samples_per_s: float | None = None  # the trainer's own figure
    step_samples_per_s: float | None = None  # mean of the per-step figures (seed 003's "callback")
    eval_samples_per_s: float | None = None
    train_runtime_s: float | None = None
    # NeMo run without the container: real (unpadded) tokens of one optimizer step, and per second of mean step
    tokens_per_step: float | None = None
    tokens_per_s: float | None = None
    loss_by_step: dict[int, float] = field(default_factory=dict)  # NeMo's reduced_train_loss per global step
    steps_per_epoch: int | None = None
    trainable_params: int | None = None
    total_params: int | None = None
    world_size: int | None = None
    gpu0_peak_mib: float | None = None  # GPU 0 of the first node, from nvidia-smi
    gpu0_avg_mib: float | None = None
    gpu0_mode_mib: float | None = None
    gpu0_busy_avg_mib: float | None = None
    gpu_peak_max_mib: float | None = None  # the largest peak of any GPU of any node
    # GPU 0's nvidia-smi utilization.gpu (%): over every sample, over the busy samples (training), and its peak
    gpu0_util_avg_pct: float | None = None
    gpu0_util_busy_avg_pct: float | None = None
    gpu0_util_peak_pct: float | None = None
    # The engine's own per-rank peak (max over ranks): on a GPU the allocator's peak over the training steps
    # (allocated_scope "training steps"); a run from before that was recorded, or a CPU run, gives the
    # process's peak ("whole run": evaluation and answer generation included, or the RSS on a CPU)
    allocated_peak_mib: float | None = None
    allocated_kind: str | None = None  # cuda_max_allocated or cpu_max_rss
    allocated_scope: str | None = None  # "training steps" or "whole run"
    rank0_peak_mib: float | None = None  # the same of rank 0 (GPU 0 of the first node)
    process_peak_mib: float | None = None  # the process's peak, max over ranks, whatever the scope above
    # Tensor bytes of rank 0 on the second optimizer step (workshop_lib.train.tensor_census), what the
    # memory estimator predicts: model states at the update, and the step's peak of live tensors
    rank0_model_state_mib: float | None = None
    rank0_step_peak_mib: float | None = None
    local_params_max: int | None = None  # the most parameters any rank holds (shows sharding)
    # What actually ran (a profile realises an experiment with its own model, precision, lengths):
    run_model: str | None = None  # e.g. tiny-bloom for bloom-560m on the tiny profile
    run_precision: str | None = None
    run_device: str | None = None  # cpu | cuda
    run_seq_len: int | None = None  # tokens per sample (settings.max_length)
    run_batch: int | None = None  # micro batch per rank (settings.per_device_batch)
    run_settings: dict = field(default_factory=dict)  # the summary's engine settings, as recorded
    cpu_peak_mib: float | None = None
    cpu_avg_mib: float | None = None
    cpu_mode_mib: float | None = None
    nccl_bus_bandwidth_gbps: float | None = None
    skipped_lines: int = 0
    unreadable: tuple[UnreadableLines, ...] = ()  # which lines, of which file, and why


# Every kind of log a run leaves, in the order they are read (readers.py says what each reads and sets). A new
# format: a parser and reader function in one module, an entry here, a field of RunResult for what it adds.
READERS = (
    RunReader("footer", readers.job_log, readers.read_footer, footer_format.LOG_KEYWORDS),
    RunReader("metrics", lambda reading: [reading.files.metrics], readers.read_metrics),
    RunReader("nemo", readers.job_log, readers.read_nemo, nemo_format.LOG_KEYWORDS),
    RunReader("trainer", readers.trainer_files, readers.read_trainer, hf.LOG_KEYWORDS),
    RunReader("memory", readers.memory_files, readers.read_memory),
    RunReader("nccl", lambda reading: [reading.files.nccl_log], readers.read_nccl),
)


def _job_info(folder: Path) -> dict:
    """The run's record, or {} when it has none or it is damaged: a damaged record must not stop a chapter's
    table, and the run's logs still say what happened (`workshop status` names the damage and what to do)."""
    try:
        return read_record(folder) or {}
    except DamagedRecord:
        return {}


def read_run(folder: str | Path, experiment_id: str | None = None) -> RunResult:
    """Read everything a run directory holds into one RunResult: each reader of READERS in turn."""
    folder = Path(folder)
    experiment_id = experiment_id or folder.name
    if not folder.is_dir():
        return RunResult(experiment_id=experiment_id, state=MISSING)
    run = RunDirectory(folder)
    job = _job_info(folder)
    named = folder / job["stdout"] if isinstance(job.get("stdout"), str) else None
    logs = run.stdout_logs()
    reading = RunReading(files=run, job_log=named if named and named.is_file() else (logs[-1] if logs else None),
                         log_keywords=tuple(keyword for reader in READERS for keyword in reader.log_keywords))
    reading.values.update(experiment_id=experiment_id, run_dir=str(folder),
                          job_id=str(job["job_id"]) if job.get("job_id") is not None else None)
    for reader in READERS:
        paths = [path for path in reader.files(reading) if path is not None and path.exists()]
        if paths:
            reader.read(reading, paths)
    unreadable = tuple(UnreadableLines(name, tuple(sorted(problems, key=lambda problem: problem.line)))
                       for name, problems in reading.problems.items() if problems)
    # job.json's final_state is what the scheduler said (runs.py writes it); the files decide otherwise.
    recorded = job.get("final_state") or job.get("state")
    values = reading.values
    values["state"] = str(recorded or (COMPLETED if _finished(reading) else INCOMPLETE)).split()[0]
    values["skipped_lines"] = sum(lines.skipped_lines for lines in unreadable)
    values["unreadable"] = unreadable
    return RunResult(**{key: value for key, value in values.items() if value is not None or key == "job_id"})


def _finished(reading: RunReading) -> bool:
    """The job's own summary record, or NeMo's step lines followed by the footer of a script that ran to its end."""
    metrics, nemo, footer = (reading.parsed.get(kind) for kind in ("metrics", "nemo", "footer"))
    return bool(metrics and metrics.summary) or (nemo is not None and nemo.last_step is not None
                                                 and footer is not None and footer.finished)
