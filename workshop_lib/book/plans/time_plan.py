"""How long a chapter takes on Ibex: the GPUs its jobs ask for, how they queue under the per-user cap, and
about how long each job runs on an A100, estimated from the reference runs in ``book/reference/``.

One job's estimate = its start-up and evaluation as the reference measured them (not scaled: they are
mostly Python, loading and the file system) + the optimizer steps the job runs on the profile × the
reference's per-step time × the card factor. The card factor comes from NVIDIA's datasheets: an A100 has
312 TFLOP/s of dense bf16/fp16 tensor math and 2.04 TB/s of memory bandwidth against 989 TFLOP/s and
3.35 TB/s (H100 SXM) or 4.8 TB/s (H200). A step limited by arithmetic slows by the compute ratio (3.2×), one
limited by memory traffic by the bandwidth ratio (1.6× from an H100, 2.4× from an H200); the reference steps
are mostly neither (launch and host overheads), so the truth lies between, and the plan uses the compute
ratio, the longer one. The queue is simulated as SLURM's per-user limit behaves: jobs start in submission
order as soon as the GPUs of the user's running jobs leave room, later ones may pass a job that does not fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pandas as pd

from workshop_lib.book.measurements.reference_files import read_reference
from workshop_lib.book.measurements.series import choose_series
from workshop_lib.book.pages.cells import is_missing

# The per-user cap of GPUs in running jobs: one Ibex fact for the chapter plan and the class plan.
from workshop_lib.class_plan.nodes import CAP_SOURCE, PER_USER_GPU_CAP
from workshop_lib.core.durations import format_duration, parse_duration
from workshop_lib.core.gpu_cards import CARDS, Card, card_of
from workshop_lib.core.paths import REFERENCE_DIR
from workshop_lib.core.vocabulary import GPT, HF, NEMO
from workshop_lib.experiments import Experiment
from workshop_lib.sites.profiles import Profile, load_profile
from workshop_lib.sites.step_cap import step_cap

# The NeMo reference row ran under this profile's trainer.max_steps (its row records no run_settings).
NEMO_REFERENCE_PROFILE = "gpu-workstation-nemo"


def a100_factors(card: Card) -> tuple[float, float]:
    """(memory-bandwidth ratio, compute ratio): how many times longer a step limited by one or the other
    takes on an A100 than on ``card``."""
    a100 = CARDS["A100"]
    return card.bandwidth_tb_s / a100.bandwidth_tb_s, card.dense_tflops / a100.dense_tflops


def factor_sentence(cards: Sequence[Card]) -> str:
    """Which factors the estimates use, and where they come from."""
    a100 = CARDS["A100"]
    parts = []
    for card in sorted(set(cards), key=lambda c: c.name):
        bandwidth, compute = a100_factors(card)
        parts.append(f"{card.name} → A100: {compute:.1f}× by dense bf16 peak ({card.dense_tflops:.0f} against "
                     f"{a100.dense_tflops:.0f} TFLOP/s), {bandwidth:.1f}× by memory bandwidth "
                     f"({card.bandwidth_tb_s:g} against {a100.bandwidth_tb_s:g} TB/s)")
    return ("Factors from NVIDIA's datasheets: " + "; ".join(parts) + ". A step bound by arithmetic slows by the "
            "first, one bound by memory traffic by the second; the range spans both and the plan takes the "
            "longer. Start-up and evaluation are taken as the reference measured them (not scaled; on Ibex, "
            "loading a real checkpoint from the shared file system adds to it). Offloaded work runs on the host "
            "and changes little with the card, so offload rows are overestimated. The jobs of one table are all "
            "estimated from one engine on one card: NeMo's own runs where NeMo ran that table, else the PyTorch "
            "stand-in's (chapters 1-2), whose step time is its own, not NeMo's; \"like <id>\" rows borrow a "
            "measured experiment's step from the same series.")


# ---- steps ---------------------------------------------------------------------------------------
def planned_steps(experiment: Experiment, profile: Profile) -> int | None:
    """Optimizer steps the job runs on ``profile``: NeMo's trainer.max_steps, or the Trainer's full epochs
    (batches per GPU rounded up, then steps rounded up per epoch), capped by the profile's max_steps."""
    cap = profile.training.max_steps
    if experiment.engine == NEMO:
        steps = experiment.max_steps
    elif experiment.engine in (HF, GPT) and experiment.per_device_batch and experiment.epochs:
        if experiment.samples_per_gpu:
            per_gpu = experiment.samples_per_gpu
        elif experiment.samples:
            per_gpu = math.ceil(experiment.samples / experiment.gpus)
        else:
            return None
        batches = math.ceil(per_gpu / experiment.per_device_batch)
        steps = math.ceil(batches / (experiment.grad_accum or 1)) * experiment.epochs
    else:
        return None
    return step_cap(steps, cap)


# ---- the reference rows ---------------------------------------------------------------------------
def reference_rows(chapter: int, folder: Path = REFERENCE_DIR) -> list[dict]:
    return reference_data(chapter, folder)[1]


def reference_data(chapter: int, folder: Path = REFERENCE_DIR) -> tuple[list[dict], list[dict]]:
    """(provenance records, completed rows) of book/reference/chapter<N>.json."""
    stored = read_reference(chapter, folder)
    if stored is None:
        return [], []
    # Each row keeps the profile it ran under: its trainer's step cap where the row did not record one.
    return stored.provenance, [{**row, "reference_profile": stored.profile} for row in stored.completed()]


def series_rows(experiment: Experiment, rows: list[dict], provenance: list[dict] | None = None) -> list[dict]:
    """The rows one experiment's estimate may draw on: the one series (engine and card, `book.measurements.series`) its
    table shows, so a table's jobs are all estimated from NeMo's runs, or all from the stand-in's, never both.
    A table nothing measured draws on the series of the runs of the same engine and model."""
    family = [row for row in rows if row.get("group") == experiment.group and row.get("model") == experiment.model]
    family = family or [row for row in rows if row.get("engine") == experiment.engine
                        and row.get("model") == experiment.model]
    choice = choose_series(family, provenance)
    return choice.rows if choice else []


def _reference_for(experiment: Experiment, rows: list[dict]) -> dict | None:
    """The completed reference row of this experiment; for NeMo experiments NeMo's own run comes first."""
    same = [row for row in rows if row["id"] == experiment.id]
    if experiment.engine == NEMO:
        same.sort(key=lambda row: row.get("run_engine") != NEMO)
    return same[0] if same else None


_SAME_WORK = ("peft", "zero_stage", "fsdp", "offload", "pin_memory", "per_device_batch")


def _same_work_shape(row: dict, wanted: dict) -> bool:
    return all((is_missing(row.get(key)) or not row.get(key)) if not wanted[key] else row.get(key) == wanted[key]
               for key in ("num_layers", "packed_sequence"))


def _sibling_for(experiment: Experiment, rows: list[dict]) -> dict | None:
    """For an experiment nobody measured: a measured run of the same engine and model, preferring the same
    table, then the same knobs (per-GPU batch, ZeRO stage, FSDP strategy, offload), then the nearest GPU
    count, fewer GPUs first. Its per-step time stands in for this one's (the table says "like <id>")."""
    wanted = experiment.to_dict()

    def same(row: dict, key: str) -> bool:
        value = row.get(key)
        return is_missing(value) if wanted[key] is None else value == wanted[key]

    # A run of other work never stands in: the packed twin, or the model at reduced depth (num_layers).
    candidates = [row for row in rows if row.get("engine") == experiment.engine and row.get("model") == experiment.model
                  and _same_work_shape(row, wanted)]
    if not candidates:
        return None
    return min(candidates, key=lambda row: (row.get("group") != experiment.group,
                                            not all(same(row, key) for key in _SAME_WORK),
                                            abs(int(row["gpus"]) - experiment.gpus), int(row["gpus"]) > experiment.gpus))


def _reference_steps(row: dict) -> int | None:
    settings = row.get("run_settings")
    if isinstance(settings, dict) and settings.get("max_steps"):
        return int(settings["max_steps"])
    profile = NEMO_REFERENCE_PROFILE if row.get("run_engine") == NEMO else row.get("reference_profile")
    cap = load_profile(profile).training.max_steps if profile else None
    declared = row.get("max_steps")
    return step_cap(None if not declared or is_missing(declared) else declared, cap)


def _step_time(row: dict) -> float | None:
    for key in ("median_step_time_s", "mean_step_time_s"):
        value = row.get(key)
        if not is_missing(value):
            return float(value)
    return None


SHORT_ENGINE_NAMES = {NEMO: "NeMo", "stand-in": "the stand-in", HF: "the HF Trainer", GPT: "the custom GPT"}


# ---- one job ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobEstimate:
    """About how long one job runs on an A100, and what the figure rests on."""

    experiment: Experiment
    steps: int | None  # optimizer steps on the profile
    basis: str  # "measured", "like <id>" or "not measured"
    reference_gpu: str | None
    reference_step_s: float | None
    overhead_s: float | None  # the reference's start-up, evaluation and end, not scaled
    low_s: float | None  # steps × step × bandwidth ratio + overhead
    high_s: float | None  # steps × step × compute ratio + overhead: the planning figure
    time_limit_s: float
    reference_engine: str | None = None  # what trained the reference row: nemo, stand-in, hf, gpt

    @property
    def planned_s(self) -> float:
        """The figure the queue uses: the high estimate, or the job's time limit where nothing was measured."""
        return self.high_s if self.high_s is not None else self.time_limit_s

    @property
    def card(self) -> Card | None:
        return card_of(self.reference_gpu)


def estimate_job(experiment: Experiment, profile: Profile, rows: list[dict],
                 provenance: list[dict] | None = None) -> JobEstimate:
    steps = planned_steps(experiment, profile)
    limit = parse_duration(profile.time_limit(experiment.chapter)) or 0.0
    rows = series_rows(experiment, rows, provenance)
    row = _reference_for(experiment, rows)
    basis = "measured"
    if row is None:
        row = _sibling_for(experiment, rows)
        basis = f"like {row['id']}" if row else "not measured"
    card = card_of(row.get("run_gpu")) if row else None
    step, ref_steps = (_step_time(row), _reference_steps(row)) if row else (None, None)
    if row is None or card is None or step is None or ref_steps is None or steps is None:
        return JobEstimate(experiment, steps, "not measured", None, None, None, None, None, limit)
    total = row.get("total_time_s")
    overhead = max(0.0, float(total) - ref_steps * step) if not is_missing(total) else 0.0
    bandwidth, compute = a100_factors(card)
    return JobEstimate(experiment, steps, basis, row.get("run_gpu"), step, overhead,
                       overhead + steps * step * bandwidth, overhead + steps * step * compute, limit,
                       row.get("run_engine") or row.get("engine"))


def estimate_chapter(experiments: Sequence[Experiment], profile: Profile | str = "ibex",
                     folder: Path = REFERENCE_DIR) -> list[JobEstimate]:
    profile = load_profile(profile)
    estimates = []
    for chapter in sorted({e.chapter for e in experiments}):
        provenance, rows = reference_data(chapter, folder)
        estimates += [estimate_job(e, profile, rows, provenance) for e in experiments if e.chapter == chapter]
    return estimates


# ---- the queue under the per-user cap ----------------------------------------------------------------
@dataclass(frozen=True)
class Slot:
    """When one job starts and ends (seconds after the first starts), and its queue wave (1 = at once)."""

    estimate: JobEstimate
    start_s: float
    end_s: float
    wave: int


def queue(estimates: Sequence[JobEstimate], cap: int = PER_USER_GPU_CAP) -> list[Slot]:
    """Simulate one user's jobs under the cap on otherwise free nodes: at each moment start, in submission
    order, every pending job whose GPUs fit beside the running ones. A job asking for more than the cap
    never starts (SLURM keeps it pending); it is left out of the result."""
    pending = [e for e in estimates if e.experiment.gpus <= cap]
    running: list[tuple[float, int]] = []  # (end, gpus)
    slots: list[Slot] = []
    now, wave = 0.0, 0
    while pending:
        free = cap - sum(gpus for _, gpus in running)
        started = []
        for e in pending:
            if e.experiment.gpus <= free:
                started.append(e)
                free -= e.experiment.gpus
        if started:
            wave += 1
        for e in started:
            pending.remove(e)
            running.append((now + e.planned_s, e.experiment.gpus))
            slots.append(Slot(e, now, now + e.planned_s, wave))
        if pending:  # wait for the next job to end
            now = min(end for end, _ in running)
            running = [(end, gpus) for end, gpus in running if end > now]
    order = {id(e): i for i, e in enumerate(estimates)}
    return sorted(slots, key=lambda slot: order[id(slot.estimate)])


def _count(number: int, word: str) -> str:
    return f"{number} {word}" + ("" if number == 1 else "s")


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds >= 7200:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 600 else f"{seconds / 60:.1f} min"


def plan_table(slots: Sequence[Slot]) -> pd.DataFrame:
    rows = []
    for slot in slots:
        e = slot.estimate
        rows.append({
            "experiment": e.experiment.id, "GPUs": e.experiment.gpus, "nodes": e.experiment.nodes,
            "steps on Ibex": e.steps if e.steps is not None else "n/a",
            "from the reference": (f"{e.basis}, {e.reference_step_s:.2f} s/step by "
                                   f"{SHORT_ENGINE_NAMES.get(e.reference_engine, e.reference_engine)} on {e.card.name}"
                                   if e.high_s is not None else "not measured: the time limit is assumed"),
            "A100 estimate": (f"{_minutes(e.low_s)} – {_minutes(e.high_s)}" if e.high_s is not None
                              else f"≤ {format_duration(e.time_limit_s)}"),
            "time limit": format_duration(e.time_limit_s),
            "queue wave": slot.wave, "starts after": _minutes(slot.start_s), "ends after": _minutes(slot.end_s)})
    return pd.DataFrame(rows)


def plan_sentence(chapter: int, slots: Sequence[Slot], estimates: Sequence[JobEstimate],
                  cap: int = PER_USER_GPU_CAP) -> str:
    """The chapter's demand, its queue under the cap and its duration, in words, from the same numbers."""
    total = sum(e.experiment.gpus for e in estimates)
    jobs = len(estimates)
    largest = max((e.experiment.gpus for e in estimates), default=0)
    text = (f"Chapter {chapter} submits {_count(jobs, 'job')} asking for {total} GPUs in all (the largest {largest}). "
            f"{CAP_SOURCE} lets one user hold at most {cap} GPUs in running jobs, ")
    waiting = [s for s in slots if s.wave > 1]
    if total <= cap:
        text += "so all of them can run at once. "
    else:
        text += (f"so {len(waiting)} of them ({_count(sum(s.estimate.experiment.gpus for s in waiting), 'GPU')}) "
                 f"{'stays' if len(waiting) == 1 else 'stay'} pending until earlier ones end and leave room. ")
    never = [e for e in estimates if e.experiment.gpus > cap]
    if never:
        text += f"{', '.join(e.experiment.id for e in never)} ask(s) for more than {cap} GPUs and never start. "
    measured = [e for e in estimates if e.high_s is not None]
    if measured:
        low, high = (sum(e.low_s for e in measured), sum(e.high_s for e in measured))
        text += (f"On A100s the {_count(len(measured), 'estimated job')} take about {_minutes(low)} – {_minutes(high)} of job "
                 f"time together; ")
    if slots:
        text += (f"with free nodes the chapter's last job ends about {_minutes(max(s.end_s for s in slots))} after the "
                 "first starts (plan figure; a busy cluster adds its own wait). ")
    unmeasured = [e for e in estimates if e.high_s is None]
    if unmeasured:
        text += (f"{_count(len(unmeasured), 'job')} of this chapter have no reference run of their kind ({', '.join(e.experiment.id for e in unmeasured)}): "
                 "the plan counts their full time limit.")
    return text.strip()


def chapter_plan(experiments: Sequence[Experiment], profile: Profile | str = "ibex",
                 folder: Path = REFERENCE_DIR) -> tuple[str, pd.DataFrame, str]:
    """(sentence, table, factor sentence) for the experiments of one chapter."""
    estimates = estimate_chapter(experiments, profile, folder)
    slots = queue(estimates)
    chapter = experiments[0].chapter if experiments else 0
    cards = [e.card for e in estimates if e.card is not None]
    return plan_sentence(chapter, slots, estimates), plan_table(slots), factor_sentence(cards) if cards else ""


__all__ = ["CARDS", "CAP_SOURCE", "PER_USER_GPU_CAP", "Card", "JobEstimate", "Slot", "a100_factors", "card_of",
           "chapter_plan", "estimate_chapter", "estimate_job", "factor_sentence", "plan_sentence", "plan_table",
           "planned_steps", "queue"]
