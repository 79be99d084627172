"""Who makes each run of a class day: every participant (the core), a few participants each (split across the
class, round-robin by user), or the instructor once before the day. Declared per chapter as data; a run the
table does not name gets the default rule (split, or the instructor's when it needs two 8-GPU nodes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from workshop_lib.core.errors import WorkshopError
from workshop_lib.experiments import Experiment, chapter_experiments

CORE, SPLIT, INSTRUCTOR = "core", "split", "instructor"
DEFAULT_COPIES = 2  # a split run the table does not name: made by this many participants


@dataclass(frozen=True)
class ChapterRoles:
    """One chapter's runs by who makes them. ``split`` maps a run to how many participants make it; None shares
    those runs out over the whole class (each participant makes one of them)."""

    core: tuple[str, ...] = ()
    split: dict[str, int | None] = field(default_factory=dict)
    instructor: tuple[str, ...] = ()
    why: str = ""  # one sentence for the day plan: why the chapter is cut this way


# The class day: at least one run of their own per participant and chapter; every row of the chapter's tables
# made by someone; nothing a participant submits needs two 8-GPU nodes (Ibex has 8 of them for all its users).
CLASS_ROLES: dict[int, ChapterRoles] = {
    1: ChapterRoles(
        core=("lora/llama/1-gpu",),
        split={"lora/llama/2-gpus": 2, "lora/llama/4-gpus": 2, "lora/mixtral/2-gpus": 2, "lora/mixtral/4-gpus": 2},
        instructor=("lora/llama/8-gpus", "lora/mixtral/8-gpus"),
        why="Everyone fine-tunes Llama with LoRA on one GPU; the class splits the 2- and 4-GPU rows; the 8-GPU rows "
            "would hold the reservation's 8-GPU nodes for the whole chapter, so the instructor makes them before the day."),
    2: ChapterRoles(
        split={"model-parallel/llama/tp2-dp2": None, "model-parallel/llama/tp4": None,
               "model-parallel/llama/tp8": 2},
        instructor=("model-parallel/mixtral/tp2-pp4-ep2-sp", "model-parallel/mixtral/tp4-pp2-ep2-sp"),
        why="Each participant makes one 4-GPU full fine-tune of Llama (TP 2 x DP 2 or TP 4, alternately), two make "
            "TP 8 on the 8-GPU nodes; Mixtral's full fine-tunes need two 8-GPU nodes each, so the instructor makes "
            "them before the day and the class reads their results."),
    3: ChapterRoles(
        core=("zero/baseline", "zero/single-gpu/zero2-offload"),
        split={experiment.id: 2 for experiment in chapter_experiments(3)
               if experiment.id not in ("zero/baseline", "zero/single-gpu/zero2-offload")},
        why="Everyone runs the baseline and ZeRO-2 with CPU offload on one GPU (GPU and CPU memory side by side); "
            "the class splits the other stages, the multi-GPU and the multi-node rows."),
    4: ChapterRoles(
        core=("fsdp/baseline", "fsdp/single-gpu/full-shard"),
        split={experiment.id: 2 for experiment in chapter_experiments(4)
               if experiment.id not in ("fsdp/baseline", "fsdp/single-gpu/full-shard", "fsdp/weak-scaling/16-gpus")},
        instructor=("fsdp/weak-scaling/16-gpus",),
        why="Everyone runs the baseline and FSDP on one GPU; the class splits the strategies, the multi-GPU, "
            "multi-node and custom-GPT rows; the 16-GPU weak-scaling row needs two 8-GPU nodes: the instructor's."),
}


# No participant's job asks for more GPUs than one 8-GPU node has (a 16-GPU job, even spread over 4-GPU
# nodes, holds two thirds of a participant's 24-GPU cap and a large slice of the reservation).
MAX_PARTICIPANT_JOB_GPUS = 8


def needs_two_large_nodes(experiment: Experiment) -> bool:
    """More than 4 GPUs per node on more than one node: two of Ibex's few 8-GPU nodes at once."""
    return experiment.nodes > 1 and experiment.gpus_per_node > 4


def role_of(experiment: Experiment, roles: dict[int, ChapterRoles] = CLASS_ROLES) -> str:
    chapter = roles.get(experiment.chapter, ChapterRoles())
    if (experiment.id in chapter.instructor or needs_two_large_nodes(experiment)
            or experiment.gpus > MAX_PARTICIPANT_JOB_GPUS):
        return INSTRUCTOR
    if experiment.id in chapter.core:
        return CORE
    return SPLIT


def copies_of(experiment: Experiment, roles: dict[int, ChapterRoles] = CLASS_ROLES) -> int | None:
    """How many participants make a split run (None: shared out over the class)."""
    return roles.get(experiment.chapter, ChapterRoles()).split.get(experiment.id, DEFAULT_COPIES)


def unnamed_runs(experiments: Sequence[Experiment], roles: dict[int, ChapterRoles] = CLASS_ROLES) -> list[str]:
    """Runs the roles table does not name (they get the default rule)."""
    named = set()
    for chapter in roles.values():
        named |= set(chapter.core) | set(chapter.split) | set(chapter.instructor)
    return [experiment.id for experiment in experiments if experiment.id not in named]


def participant_names(count: int) -> tuple[str, ...]:
    if count < 1:
        raise WorkshopError(f"--participants {count}: a class has at least 1 participant (e.g. --participants 30)")
    return tuple(f"participant-{index + 1:02d}" for index in range(count))


@dataclass(frozen=True)
class Assignment:
    """Which runs of one chapter each participant makes, in the order they submit them."""

    chapter: int
    by_participant: dict[str, tuple[Experiment, ...]]
    instructor: tuple[Experiment, ...]
    core: tuple[Experiment, ...]
    split: tuple[tuple[Experiment, tuple[str, ...]], ...]  # (run, the participants who make it)


def assign(chapter: int, participants: Sequence[str], start: int = 0,
           roles: dict[int, ChapterRoles] = CLASS_ROLES) -> tuple[Assignment, int]:
    """The chapter's runs dealt out round-robin by user, from participant ``start`` on (the next chapter goes on
    where this one stopped, so the split runs spread evenly over the day). Returns the assignment and the next
    start."""
    experiments = chapter_experiments(chapter)
    count = len(participants)
    core = tuple(e for e in experiments if role_of(e, roles) == CORE)
    instructor = tuple(e for e in experiments if role_of(e, roles) == INSTRUCTOR)
    split = [e for e in experiments if role_of(e, roles) == SPLIT]
    shared = [e for e in split if copies_of(e, roles) is None]
    fixed = [e for e in split if copies_of(e, roles) is not None]
    makers: dict[str, list[str]] = {e.id: [] for e in split}
    cursor = start
    for slot in range(count if shared else 0):  # each participant makes one of the shared runs
        makers[shared[slot % len(shared)].id].append(participants[(cursor + slot) % count])
    cursor += count if shared else 0
    for experiment in fixed:
        for _ in range(min(copies_of(experiment, roles), count)):
            makers[experiment.id].append(participants[cursor % count])
            cursor += 1
    by_participant = {name: list(core) for name in participants}
    for experiment in split:
        for name in makers[experiment.id]:
            by_participant[name].append(experiment)
    assignment = Assignment(chapter, {name: tuple(runs) for name, runs in by_participant.items()}, instructor, core,
                            tuple((e, tuple(makers[e.id])) for e in split))
    return assignment, cursor % count


# ---- one participant on the day ----------------------------------------------------------------------
PARTICIPANT_VARIABLE = "WORKSHOP_PARTICIPANT"


def class_participant(environ: dict | None = None) -> tuple[int, int] | None:
    """(your number, the class's size) from $WORKSHOP_PARTICIPANT=K/N, as the instructor hands them out (the
    order of `workshop class plan`); None when unset: every run of the chapter but the instructor's is yours."""
    import os
    import re

    value = (os.environ if environ is None else environ).get(PARTICIPANT_VARIABLE, "").strip()
    if not value:
        return None
    match = re.fullmatch(r"(\d+)/(\d+)", value)
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise WorkshopError(f"${PARTICIPANT_VARIABLE} is {value!r}: write your number and the class's size as K/N "
                            f"with 1 <= K <= N (e.g. export {PARTICIPANT_VARIABLE}=7/30, the numbers the instructor "
                            f"gave out), or unset it to run every run of the chapter")
    return int(match[1]), int(match[2])


def not_yours(chapter: int, participant: tuple[int, int] | None,
              roles: dict[int, ChapterRoles] = CLASS_ROLES) -> dict[str, str]:
    """In a class ($WORKSHOP_PARTICIPANT), the runs of the chapter that are not this participant's, each with why:
    the instructor's and the split runs other participants make. Outside a class: none."""
    if participant is None:
        return {}
    reasons = {experiment.id: (f"{experiment.id} is the instructor's run (made once before the day): the class "
                               f"reads its results; to run it yourself, name it: experiments = [\"{experiment.id}\"]")
               for experiment in chapter_experiments(chapter) if role_of(experiment, roles) == INSTRUCTOR}
    number, count = participant
    names = participant_names(count)
    start = 0
    for earlier in sorted(roles):  # the split runs go on round-robin from chapter to chapter
        assignment, start = assign(earlier, names, start, roles)
        if earlier == chapter:
            break
    else:
        return reasons
    yours = {experiment.id for experiment in assignment.by_participant[names[number - 1]]}
    for experiment, makers in assignment.split:
        if experiment.id not in yours:
            who = ", ".join(name.rsplit("-", 1)[-1] for name in makers)
            reasons[experiment.id] = (f"{experiment.id} is made by participant(s) {who} of the class (you are "
                                      f"{number} of {count}, ${PARTICIPANT_VARIABLE}); its results come from them")
    return reasons
