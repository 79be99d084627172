"""The experiments: each chapter's runs as data, one frozen value per run.

Owns: experiment.py (Experiment, its id and content hash, recipes applied to it, its summary row) and matrix.py
(the chapter registry `CHAPTER_SPECS`, the chapters' experiments, the large-GPU and engine-scaling extras, lookups
by chapter and id). This face re-exports both.
May import: core only.
"""

from workshop_lib.experiments.experiment import (
    RECIPE_LORA_RANK,
    Experiment,
    field_names,
    summary_row,
    with_recipe,
)
from workshop_lib.experiments.matrix import (
    CHAPTER_SPECS,
    CHAPTERS,
    SCALING_ENGINES,
    ChapterSpec,
    all_experiments,
    chapter_experiments,
    chapter_spec,
    engine_scaling_experiments,
    get_experiment,
    known_id,
    large_gpu_experiments,
    nemo_lesson_experiments,
    select_experiments,
)

__all__ = [
    "CHAPTER_SPECS", "CHAPTERS", "ChapterSpec", "Experiment", "RECIPE_LORA_RANK", "SCALING_ENGINES", "all_experiments",
    "chapter_experiments", "chapter_spec", "engine_scaling_experiments", "field_names", "get_experiment", "known_id",
    "large_gpu_experiments", "nemo_lesson_experiments", "select_experiments", "summary_row", "with_recipe",
]
