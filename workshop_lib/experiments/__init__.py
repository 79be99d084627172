"""The experiments: each chapter's runs as data, one frozen value per run.

Owns: experiment.py (Experiment, its id and content hash, recipes applied to it, its summary row) and matrix.py
(the chapters' experiments, the large-GPU and engine-scaling extras, lookups by chapter and id). This face
re-exports both.
May import: core only.
"""

from workshop_lib.experiments.experiment import (
    CHAPTERS, Experiment, RECIPE_LORA_RANK, field_names, summary_row, with_recipe,
)
from workshop_lib.experiments.matrix import (
    SCALING_ENGINES, all_experiments, chapter_experiments, engine_scaling_experiments, get_experiment,
    large_gpu_experiments, nemo_lesson_experiments, select_experiments,
)

__all__ = [
    "CHAPTERS", "Experiment", "RECIPE_LORA_RANK", "SCALING_ENGINES", "all_experiments", "chapter_experiments",
    "engine_scaling_experiments", "field_names", "get_experiment", "large_gpu_experiments", "nemo_lesson_experiments", "select_experiments",
    "summary_row", "with_recipe",
]
