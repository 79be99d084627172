"""One run's folder read into one row: its state, and the numbers its logs and memory monitors hold."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from workshop_lib.core.log_text import LogProblem, SkippedLines, read_log, read_text
from workshop_lib.core.run_directory import RunDirectory
from workshop_lib.jobs import footer as footer_format
from workshop_lib.jobs.footer import parse_footer
from workshop_lib.jobs.states import COMPLETED, INCOMPLETE, MISSING
from workshop_lib.results.memory import MemoryLogError, memory_summary
from workshop_lib.results.parse import hf, nemo as nemo_format
from workshop_lib.results.parse.hf import TrainerLog, parse_trainer_output, parse_trainer_state
from workshop_lib.results.parse.metrics import parse_metrics
from workshop_lib.results.parse.nccl import parse_nccl_allreduce
from workshop_lib.results.parse.nemo import parse_nemo_log
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


def _job_info(folder: Path) -> dict:
    """The run's record, or {} when it has none or it is damaged: a damaged record must not stop a chapter's
    table, and the run's logs still say what happened (`workshop status` names the damage and what to do)."""
    try:
        return read_record(folder) or {}
    except DamagedRecord:
        return {}


def read_run(folder: str | Path, experiment_id: str | None = None) -> RunResult:
    """Read everything a run directory holds into one RunResult."""
    folder = Path(folder)
    run = RunDirectory(folder)
    experiment_id = experiment_id or folder.name
    if not folder.is_dir():
        return RunResult(experiment_id=experiment_id, state=MISSING)
    job = _job_info(folder)
    values: dict = {"experiment_id": experiment_id, "run_dir": str(folder),
                    "job_id": str(job["job_id"]) if job.get("job_id") is not None else None}
    unreadable: list[UnreadableLines] = []

    def note(path: Path | str, problems: list[LogProblem]) -> None:
        if problems:
            name = Path(path).relative_to(folder) if Path(path).is_relative_to(folder) else Path(path).name
            unreadable.append(UnreadableLines(str(name), tuple(sorted(problems, key=lambda problem: problem.line))))

    named = folder / job["stdout"] if isinstance(job.get("stdout"), str) else None
    logs = run.stdout_logs()
    stdout_path = named if named and named.is_file() else (logs[-1] if logs else None)  # the latest job's
    # A log of any size: a huge one is streamed, keeping the lines these three parsers read.
    stdout = read_log(stdout_path, (*footer_format.LOG_KEYWORDS, *nemo_format.LOG_KEYWORDS,
                                    *hf.LOG_KEYWORDS)) if stdout_path else ""
    footer = parse_footer(stdout)
    values["total_time_s"] = footer.total_time_s
    nemo = parse_nemo_log(stdout)
    printed = parse_trainer_output(stdout)
    if stdout_path:
        note(stdout_path, footer.problems + nemo.problems + printed.problems)

    metrics_path = run.metrics
    metrics = parse_metrics(read_text(metrics_path)) if metrics_path.exists() else None
    if metrics is not None:
        note(metrics_path, metrics.problems)
    if metrics:
        _from_metrics(values, metrics)
    if nemo.last_step:  # NeMo's own step lines are what seeds 000/001 read
        values["train_step_time_s"] = nemo.last_step.train_step_timing_s
        _fill(values, "mean_step_time_s", nemo.mean_step_time_s)  # a job's own metrics, when written, win
        values["last_loss"] = nemo.last_step.reduced_train_loss
        values["loss_by_step"] = {step.global_step: step.reduced_train_loss for step in nemo.steps}
        if nemo.tokens_per_step is not None:
            values["tokens_per_step"] = nemo.tokens_per_step
            if values.get("mean_step_time_s"):
                values["tokens_per_s"] = nemo.tokens_per_step / values["mean_step_time_s"]
        if nemo.after_lora:
            _fill(values, "trainable_params", nemo.after_lora.trainable_params)
    state_path = run.trainer_state
    trainer_log = printed
    if state_path.exists():
        try:
            state = parse_trainer_state(read_text(state_path))
            values["steps_per_epoch"] = state.steps_per_epoch
            trainer_log = state.log if state.log.evals or state.log.summary else printed
        except ValueError as error:  # not JSON: a file cut by a job killed while saving it
            note(state_path, [LogProblem(getattr(error, "lineno", 1), "", f"not a trainer state: {error}")])
    _from_trainer_log(values, trainer_log)

    gpu_logs, cpu_logs = run.gpu_logs(), run.cpu_logs()
    if gpu_logs or cpu_logs:
        try:
            report = memory_summary(gpu_logs + cpu_logs)
        except MemoryLogError as error:
            report = None  # monitors started but wrote nothing readable: the values stay empty
            problems_by_file = error.problems
        else:
            problems_by_file = report.problems
        for path, problems in problems_by_file.items():
            note(path, problems)
        if report:
            if report.gpus:
                first = report.gpus[0]  # GPU 0 of the first node: what the seeds' tables use
                values.update(gpu0_peak_mib=first.stats.peak, gpu0_avg_mib=first.stats.average,
                              gpu0_mode_mib=first.stats.mode, gpu0_busy_avg_mib=first.stats.busy_average,
                              gpu_peak_max_mib=max(gpu.stats.peak for gpu in report.gpus))
                if first.utilization:
                    values.update(gpu0_util_avg_pct=first.utilization.average,
                                  gpu0_util_busy_avg_pct=first.utilization.busy_average,
                                  gpu0_util_peak_pct=first.utilization.peak)
            if report.cpus:
                cpu = report.cpus[0].stats
                values.update(cpu_peak_mib=cpu.peak, cpu_avg_mib=cpu.average, cpu_mode_mib=cpu.mode)
    nccl_path = run.nccl_log
    if nccl_path.exists():
        nccl = parse_nccl_allreduce(read_text(nccl_path))
        values["nccl_bus_bandwidth_gbps"] = nccl.avg_bus_bandwidth_gbps
        note(nccl_path, nccl.problems)

    finished = bool(metrics and metrics.summary) or (nemo.last_step is not None and footer.finished)
    # job.json's final_state is what the scheduler said (runs.py writes it); the files decide otherwise.
    recorded = job.get("final_state") or job.get("state")
    values["state"] = str(recorded or (COMPLETED if finished else INCOMPLETE)).split()[0]
    values["skipped_lines"] = sum(lines.skipped_lines for lines in unreadable)
    values["unreadable"] = tuple(unreadable)
    return RunResult(**{key: value for key, value in values.items() if value is not None or key == "job_id"})


def _fill(values: dict, key: str, value) -> None:
    """Set a value only where no better source gave one."""
    if values.get(key) is None:
        values[key] = value


def _from_metrics(values: dict, metrics) -> None:
    if metrics.steps:
        last = metrics.steps[-1]
        values["train_step_time_s"] = last.step_time_s
        values["last_loss"] = last.loss
        per_step = [step.samples_per_s for step in metrics.steps if step.samples_per_s is not None]
        if per_step:
            values["step_samples_per_s"] = sum(per_step) / len(per_step)
    summary = metrics.summary
    if summary is None:
        return
    values.update(
        mean_step_time_s=summary.mean_step_time_s, train_samples_per_s=summary.samples_per_s,
        train_runtime_s=summary.train_runtime_s, eval_loss=summary.eval_loss, eval_em=summary.eval_em,
        eval_f1=summary.eval_f1, trainable_params=summary.trainable_params, total_params=summary.total_params,
        world_size=summary.world_size, process_peak_mib=summary.peak_memory_mib,
        allocated_kind=summary.peak_memory_kind,
        local_params_max=max(summary.local_params_per_rank) if summary.local_params_per_rank else None,
        rank0_model_state_mib=_rank0_mib(summary.model_state_bytes_per_rank),
        rank0_step_peak_mib=_rank0_mib(summary.step_peak_bytes_per_rank),
        run_model=summary.model, run_precision=summary.precision, run_device=summary.device,
        run_seq_len=_int_or_none((summary.settings or {}).get("max_length")),
        run_batch=_int_or_none((summary.settings or {}).get("per_device_batch")),
        run_settings=dict(summary.settings or {}),
    )
    values.update(_allocated_peak(summary))
    if summary.final_loss is not None:
        _fill(values, "last_loss", summary.final_loss)


def _allocated_peak(summary) -> dict:
    """The peak the tables show: the training steps' where recorded, else the whole run's (older runs, CPU)."""
    training = summary.training_peak_mib_per_rank
    per_rank = training or summary.peak_memory_mib_per_rank
    if not per_rank:
        return {}
    return {"allocated_peak_mib": max(per_rank), "rank0_peak_mib": per_rank[0],
            "allocated_scope": "training steps" if training else "whole run"}


def _rank0_mib(per_rank: list) -> float | None:
    return per_rank[0] / 2**20 if per_rank and per_rank[0] is not None else None


def _int_or_none(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _from_trainer_log(values: dict, log: TrainerLog) -> None:
    if log.summary:
        values["train_loss"] = log.summary.train_loss
        _fill(values, "train_samples_per_s", log.summary.train_samples_per_second)
        _fill(values, "train_runtime_s", log.summary.train_runtime)
    epochs = {}
    for entry in log.evals:
        if entry.epoch is not None and abs(entry.epoch - round(entry.epoch)) < 0.05:
            epochs.setdefault(int(round(entry.epoch)), entry.eval_loss)
    if epochs:
        values["eval_loss_by_epoch"] = epochs
    if log.final_eval:
        _fill(values, "eval_loss", log.final_eval.eval_loss)
        values["eval_samples_per_s"] = log.evals[0].eval_samples_per_second
