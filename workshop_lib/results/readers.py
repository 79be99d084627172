"""One reader per kind of log a run leaves: which files it reads (named by RunDirectory) and the values it sets.

`read.READERS` lists them in the order they run; a later reader may fill a value an earlier one left empty, or
override it where its source is better (NeMo's own step lines over the job's metrics). A reader's function gets
the run being read (`RunReading`) and the files of its kind that exist, and never raises on a bad line: it notes
the lines it could not read, with their reasons.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from workshop_lib.core.log_text import LogProblem, read_log, read_text
from workshop_lib.core.run_directory import RunDirectory
from workshop_lib.jobs import footer as footer_format
from workshop_lib.results.memory import MemoryLogError, memory_summary
from workshop_lib.results.parse import hf
from workshop_lib.results.parse import nemo as nemo_format
from workshop_lib.results.parse.metrics import parse_metrics
from workshop_lib.results.parse.nccl import parse_nccl_allreduce


@dataclass
class RunReading:
    """One run folder being read: its files, the values found so far, and the lines no reader could read."""

    files: RunDirectory
    job_log: Path | None  # the latest job's log (job.json names it; else the newest slurm-*.out)
    log_keywords: tuple[str, ...]  # the lines the readers of the job log read (a huge log keeps only those)
    values: dict = field(default_factory=dict)
    parsed: dict = field(default_factory=dict)  # kind -> what its parser returned, for the readers after it
    problems: dict[str, list[LogProblem]] = field(default_factory=dict)  # file (relative) -> its bad lines
    _job_log_text: str | None = None

    def job_log_text(self) -> str:
        """The job log's text, read once for every reader of it (streamed when huge)."""
        if self._job_log_text is None:
            self._job_log_text = read_log(self.job_log, self.log_keywords) if self.job_log else ""
        return self._job_log_text

    def name(self, path: Path | str) -> str:
        path = Path(path)
        return str(path.relative_to(self.files.path) if path.is_relative_to(self.files.path) else path.name)

    def note(self, path: Path | str, problems: Sequence[LogProblem]) -> None:
        """Lines of `path` that could not be read; a file's notes from several readers are shown together."""
        self.problems.setdefault(self.name(path), []).extend(problems)

    def fill(self, key: str, value) -> None:
        """Set a value only where no better source gave one."""
        if self.values.get(key) is None:
            self.values[key] = value


@dataclass(frozen=True)
class RunReader:
    """One kind of log: the files of it in a run (existing ones are passed on), and what reads them."""

    kind: str
    files: Callable[[RunReading], Sequence[Path | None]]
    read: Callable[[RunReading, list[Path]], None]
    log_keywords: tuple[str, ...] = ()  # for readers of the job log: the lines they read


def job_log(reading: RunReading) -> list[Path | None]:
    return [reading.job_log]


# ---- the readers of today's formats, in the order read.READERS runs them ------------------------------------
def read_footer(reading: RunReading, paths: list[Path]) -> None:
    """The job template's footer: total time, and whether the script ran to its end."""
    footer = footer_format.parse_footer(reading.job_log_text())
    reading.parsed["footer"] = footer
    reading.values["total_time_s"] = footer.total_time_s
    reading.note(paths[0], footer.problems)


def read_metrics(reading: RunReading, paths: list[Path]) -> None:
    """train/metrics.jsonl, what the workshop's entry point writes: steps, and a summary at the end."""
    metrics = parse_metrics(read_text(paths[0]))
    reading.parsed["metrics"] = metrics
    reading.note(paths[0], metrics.problems)
    if not metrics:
        return
    values = reading.values
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
        reading.fill("last_loss", summary.final_loss)


def read_nemo(reading: RunReading, paths: list[Path]) -> None:
    """NeMo's own step lines in the job log (what seeds 000/001 read); they override the metrics' last step."""
    nemo = nemo_format.parse_nemo_log(reading.job_log_text())
    reading.parsed["nemo"] = nemo
    reading.note(paths[0], nemo.problems)
    if not nemo.last_step:
        return
    values = reading.values
    values["train_step_time_s"] = nemo.last_step.train_step_timing_s
    reading.fill("mean_step_time_s", nemo.mean_step_time_s)  # a job's own metrics, when written, win
    values["last_loss"] = nemo.last_step.reduced_train_loss
    values["loss_by_step"] = {step.global_step: step.reduced_train_loss for step in nemo.steps}
    if nemo.tokens_per_step is not None:
        values["tokens_per_step"] = nemo.tokens_per_step
        if values.get("mean_step_time_s"):
            values["tokens_per_s"] = nemo.tokens_per_step / values["mean_step_time_s"]
    if nemo.after_lora:
        reading.fill("trainable_params", nemo.after_lora.trainable_params)


def trainer_files(reading: RunReading) -> list[Path | None]:
    return [reading.job_log, reading.files.trainer_state]


def read_trainer(reading: RunReading, paths: list[Path]) -> None:
    """The HF Trainer's log dicts in the job log, or its trainer_state.json where it saved one (that wins)."""
    printed = hf.parse_trainer_output(reading.job_log_text())
    if reading.job_log is not None and reading.job_log in paths:
        reading.note(reading.job_log, printed.problems)
    trainer_log = printed
    state_path = reading.files.trainer_state
    if state_path in paths:
        try:
            state = hf.parse_trainer_state(read_text(state_path))
            reading.values["steps_per_epoch"] = state.steps_per_epoch
            trainer_log = state.log if state.log.evals or state.log.summary else printed
        except ValueError as error:  # not JSON: a file cut by a job killed while saving it
            reading.note(state_path, [LogProblem(getattr(error, "lineno", 1), "", f"not a trainer state: {error}")])
    _from_trainer_log(reading, trainer_log)


def memory_files(reading: RunReading) -> list[Path]:
    return reading.files.gpu_logs() + reading.files.cpu_logs()


def read_memory(reading: RunReading, paths: list[Path]) -> None:
    """The GPU (nvidia-smi) and CPU (psrecord) monitors: GPU 0 of the first node, as the seeds' tables show."""
    try:
        report = memory_summary(paths)
    except MemoryLogError as error:
        report = None  # monitors started but wrote nothing readable: the values stay empty
        problems_by_file = error.problems
    else:
        problems_by_file = report.problems
    for path, problems in problems_by_file.items():
        reading.note(path, problems)
    if not report:
        return
    if report.gpus:
        first = report.gpus[0]
        reading.values.update(gpu0_peak_mib=first.stats.peak, gpu0_avg_mib=first.stats.average,
                              gpu0_mode_mib=first.stats.mode, gpu0_busy_avg_mib=first.stats.busy_average,
                              gpu_peak_max_mib=max(gpu.stats.peak for gpu in report.gpus))
        if first.utilization:
            reading.values.update(gpu0_util_avg_pct=first.utilization.average,
                                  gpu0_util_busy_avg_pct=first.utilization.busy_average,
                                  gpu0_util_peak_pct=first.utilization.peak)
    if report.cpus:
        cpu = report.cpus[0].stats
        reading.values.update(cpu_peak_mib=cpu.peak, cpu_avg_mib=cpu.average, cpu_mode_mib=cpu.mode)


def read_nccl(reading: RunReading, paths: list[Path]) -> None:
    """nccl-tests' all-reduce check of a multi-node job: its average bus bandwidth."""
    nccl = parse_nccl_allreduce(read_text(paths[0]))
    reading.values["nccl_bus_bandwidth_gbps"] = nccl.avg_bus_bandwidth_gbps
    reading.note(paths[0], nccl.problems)


# ---- helpers ------------------------------------------------------------------------------------------------
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


def _from_trainer_log(reading: RunReading, log: hf.TrainerLog) -> None:
    values = reading.values
    if log.summary:
        values["train_loss"] = log.summary.train_loss
        reading.fill("train_samples_per_s", log.summary.train_samples_per_second)
        reading.fill("train_runtime_s", log.summary.train_runtime)
    epochs = {}
    for entry in log.evals:
        if entry.epoch is not None and abs(entry.epoch - round(entry.epoch)) < 0.05:
            epochs.setdefault(int(round(entry.epoch)), entry.eval_loss)
    if epochs:
        values["eval_loss_by_epoch"] = epochs
    if log.final_eval:
        reading.fill("eval_loss", log.final_eval.eval_loss)
        values["eval_samples_per_s"] = log.evals[0].eval_samples_per_second
