"""Which experiments a chapter execution covers: the parameters cell's chapter, profile, ids and recipe,
checked against the profile (what it realises, what it leaves out and why)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from workshop_lib.class_plan.roles import class_participant, needs_two_large_nodes, not_yours
from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.vocabulary import DEFAULT_RECIPE, HF, RECIPES
from workshop_lib.experiments import Experiment, chapter_experiments, get_experiment, with_recipe
from workshop_lib.sites.profiles import Profile, load_profile


@dataclass(frozen=True)
class Selection:
    """The experiments a chapter execution covers, split by whether the profile realises them."""

    chapter: int
    profile: Profile
    chosen: tuple[Experiment, ...]  # what the parameters cell asked for, in matrix order
    runnable: tuple[Experiment, ...]  # the part the profile realises
    left_out: tuple[tuple[Experiment, str], ...]  # (experiment, why) for the rest
    # What a participant submits on the day, whatever the profile realises here: the chosen runs less the
    # instructor's and, in a class ($WORKSHOP_PARTICIPANT), less those other participants make (the time plan's jobs).
    planned: tuple[Experiment, ...] = ()


def select(chapter: int, profile: Profile | str = "tiny", experiments: Sequence[str] | str | None = None,
           recipe: str = DEFAULT_RECIPE) -> Selection:
    """The chapter's experiments named in ``experiments`` (ids, or None for all), checked against the profile.

    ``recipe="tuned"`` runs the Hugging Face Trainer experiments with the workshop's tuned recipe; they
    get their own ids (``…-tuned``) and run folders, so seed results are never overwritten."""
    if recipe not in RECIPES:
        raise WorkshopError(f"recipe={recipe!r}: choose one of {', '.join(RECIPES)} (seed: as the original "
                            "material, for comparable numbers; tuned: the workshop's faster recipe)")
    profile = load_profile(profile)
    matrix = chapter_experiments(chapter)
    if experiments is None:
        chosen = matrix
    else:
        wanted = [experiments] if isinstance(experiments, str) else list(experiments)
        foreign = [get_experiment(i).id for i in wanted if get_experiment(i).chapter != chapter]
        if foreign:
            raise WorkshopError(f"{', '.join(foreign)} belong(s) to another chapter than {chapter}: "
                                f"list ids of chapter {chapter} (`workshop experiments --chapter {chapter}`)")
        # The matrix's own rows in its order, then any lesson beyond it named by id (e.g. the packed twin)
        in_matrix = {experiment.id for experiment in matrix}
        chosen = ([experiment for experiment in matrix if experiment.id in set(wanted)]
                  + [get_experiment(i) for i in dict.fromkeys(wanted) if i not in in_matrix])
    # Not yours, when the whole chapter is asked for: the instructor's runs (two 8-GPU nodes) and, in a class, the
    # runs the class plan gives other participants. Named, a run is always yours.
    others = not_yours(chapter, class_participant()) if experiments is None else {}
    others.update({e.id: f"{e.id} needs two {e.gpus_per_node}-GPU nodes: the instructor runs it once before the "
                         f"day and the class reads its results (to run it yourself, name it: experiments = "
                         f"[\"{e.id}\"])" for e in chosen if experiments is None and needs_two_large_nodes(e)})
    pairs = [(with_recipe(experiment, recipe) if experiment.engine == HF else experiment, experiment.id)
             for experiment in chosen]
    runnable, left_out = [], []
    for experiment, base_id in pairs:
        reason = profile.unsupported_reason(experiment) or others.get(base_id)
        if reason:
            left_out.append((experiment, reason))
        else:
            runnable.append(experiment)
    planned = tuple(experiment for experiment, base_id in pairs if base_id not in others)
    return Selection(chapter, profile, tuple(e for e, _ in pairs), tuple(runnable), tuple(left_out), planned)
