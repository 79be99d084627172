"""Every table of the seeds, with the seeds' columns, filled from the runs of a chapter.

Derived columns are computed from the measured ones, never typed:

* time scaling (seeds 000/001) = T_base / T_N of the total job time; peak-memory scaling = peak_base / peak_N
  (how many times less GPU 0 holds; both as the seeds define them);
* strong scaling (fixed data set: seed 003's BLOOM and custom-GPT tables): Samples/s Scale Factor =
  S_N / S_1, Runtime Scale Factor = speedup = T_1 / T_N, and an added Parallel Efficiency (%) =
  T_1 / (N·T_N) × 100 (N counted relative to the first row's GPUs);
* weak scaling (equal work per GPU: seed 002's multi-GPU and multi-node tables, seed 003's depth table):
  efficiency = T_1 / T_N × 100 (100 % = no overhead). Seed 003 printed it upside down (T_N / T_1, which
  grows past 100 % as runs slow down); this module uses T_1 / T_N. Seed 002's tables had no derived
  rows: they gain "Train Runtime (s)", "Throughput Scaling" (S_N / S_1) and "Weak Scaling Efficiency"
  rows, against the one-GPU ZeRO-0 run (same recipe, 500 samples per GPU) and the 2-node run.

Column sets are the seeds' own (``SEED_COLUMNS`` lists them; ``ADDED_COLUMNS`` the derived extras).
Where the seeds had a column for the command that submits the job, it shows the `workshop submit`
command of the experiment. One deliberate difference: seed 002's stage-comparison tables have a blank
first header (here "Metric"). Seed 003's "GPU Utilization (%)" columns, and the same column added wherever a
table shows GPU memory, hold GPU 0's nvidia-smi utilization.gpu averaged over the samples taken while
training (memory at or above half its peak; see workshop_lib.results.memory).

On the tiny profile there is no GPU and no nvidia-smi log: the GPU 0 columns of the NeMo-style tables
(chapters 1-2, filled by the LoRA/TP stand-in engines from metrics.jsonl) then show rank 0's peak from
the engine (``cpu_max_rss``: the whole process) and the table note says so; the others stay "n/a".

A run that did not complete shows its state (MISSING, FAILED, TIMEOUT, …) in every measured cell; a
value a completed run did not record shows as "n/a". Nothing is ever shown as 0.

The package: ``columns`` (how a cell is read, shared), ``nemo`` (chapters 1-2), ``zero`` (chapter 3), ``fsdp``
(chapter 4), ``summary`` (what chapters 3 and 4 share), ``render`` (a chapter's tables, for a profile, as text).
It may import core/, experiments, results and book.pages.cells / book.measurements.series / book.measurements.memory_predictions; never the chapter
facade. Every ratio goes through ``columns.ratio``, which refuses rows of two engines or two cards.
"""

from workshop_lib.book.tables.columns import ADDED_COLUMNS, SEED_COLUMNS, Table, ran_fixed_steps, step_time_key
from workshop_lib.book.tables.nemo import layout_name
from workshop_lib.book.tables.render import (
    MODEL_NAMES,
    chapter_tables,
    drop_unrecorded,
    for_stand_ins,
    long_form,
    rename_models,
    render_tables,
    stand_in_names,
    tables_from_results,
)

__all__ = ["ADDED_COLUMNS", "MODEL_NAMES", "SEED_COLUMNS", "Table", "chapter_tables", "drop_unrecorded",
           "for_stand_ins", "layout_name", "long_form", "ran_fixed_steps", "rename_models", "render_tables",
           "stand_in_names", "step_time_key", "tables_from_results"]
