"""Disk as a fit check: what each run writes, and a refusal before submitting more than the quota holds.

On Ibex a participant's runs live in /ibex/user/$USER, 1.5 TB per user, and `df` on that folder shows
the quota left (kaust-rccl/ksl-docs docs/source/systems/ibex/filesystem.rst:60-69). What a run writes:
- every run: its log, monitors and metrics (LOG_ALLOWANCE);
- a NeMo LoRA run: the adapter checkpoints NeMo's recipe keeps (save_top_k=2 plus the last, every 50
  steps; NeMo 2.4.1, book/reference/nemo/lora_llama_1-gpu.yaml), each the trainable parameters with their
  optimizer state — the frozen base model is not saved;
- a NeMo full fine-tune: no checkpoint (the workshop switches them off: scripts.NO_CHECKPOINTS); NeMo's
  default would save weights and optimizer state every 50 steps, about 0.34 TB per Llama run;
- Hugging Face and custom GPT runs: no checkpoint (`--save-checkpoints` is off in every experiment).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.vocabulary import NEMO
from workshop_lib.experiments import Experiment
from workshop_lib.sites.step_cap import step_cap

LOG_ALLOWANCE = 64 * 2**20  # logs, monitors, metrics and NeMo's event files of one run
NEMO_CHECKPOINT_EVERY = 50  # NeMo's recipe: every_n_train_steps
NEMO_CHECKPOINTS_KEPT = 3  # save_top_k=2 plus the last one
# A saved trainable parameter: bf16 weight, fp32 master copy, Adam's two fp32 moments.
CHECKPOINT_BYTES_PER_TRAINABLE = 2 + 4 + 8


class DiskError(WorkshopError):
    """The runs about to be submitted would not fit on the disk (or quota) of the runs folder."""


@dataclass(frozen=True)
class DiskNeed:
    experiment_id: str
    bytes: int
    what: str  # what the run writes, in words for the chapter's table


def disk_need(experiment: Experiment, profile) -> DiskNeed:
    """What one run of the experiment writes under this profile."""
    uses_nemo = experiment.engine == NEMO and profile.nemo.enabled
    if not (uses_nemo and experiment.peft == "lora"):
        return DiskNeed(experiment.id, LOG_ALLOWANCE, "logs and metrics (no checkpoint)")
    cap = step_cap(experiment.max_steps, profile.training.max_steps)
    saves = min(cap // NEMO_CHECKPOINT_EVERY, NEMO_CHECKPOINTS_KEPT) if cap is not None else NEMO_CHECKPOINTS_KEPT
    if saves == 0:
        return DiskNeed(experiment.id, LOG_ALLOWANCE, "logs and metrics (stops before NeMo's first checkpoint)")
    trainable = _trainable_parameters(experiment)
    each = trainable * CHECKPOINT_BYTES_PER_TRAINABLE
    return DiskNeed(experiment.id, LOG_ALLOWANCE + saves * each,
                    f"{saves} LoRA adapter checkpoint{'s' * (saves > 1)} of {_size(each)} "
                    f"({trainable / 1e6:.1f} M trainable parameters with optimizer state)")


def _trainable_parameters(experiment: Experiment) -> int:
    from workshop_lib.estimate.memory import estimate_memory
    from workshop_lib.estimate.report import setup_from_experiment

    return estimate_memory(experiment.model, setup_from_experiment(experiment)).trainable_parameters


def pending_needs(experiments, profile, is_done) -> list[DiskNeed]:
    """What the experiments that `is_done(experiment)` says still have to run will write."""
    return [disk_need(experiment, profile) for experiment in experiments if not is_done(experiment)]


def check_disk(needs: list[DiskNeed], folder: Path, free_bytes: int | None = None) -> str:
    """A line saying what the runs will write and what is free; DiskError when it does not fit."""
    folder = Path(folder)
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free if free_bytes is None else free_bytes
    total = sum(need.bytes for need in needs)
    line = f"Disk: {len(needs)} run(s) to submit write up to {_size(total)} into {folder}; {_size(free)} free there"
    if total > free:
        largest = sorted(needs, key=lambda need: need.bytes, reverse=True)[:3]
        raise DiskError(f"{line}, which is not enough. The largest: "
                        + "; ".join(f"{need.experiment_id} {_size(need.bytes)} ({need.what})" for need in largest)
                        + ". Free space (`du -sh runs/*` shows what earlier runs hold; on Ibex `df -h "
                        "/ibex/user/$USER` shows the 1.5 TB quota) or submit fewer experiments")
    return line + "."


def _size(count: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count / 1e3:.0f} kB"
