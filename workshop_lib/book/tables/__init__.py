"""Every table of the seeds, with the seeds' columns, filled from the runs of a chapter (see `render`).

Owns the chapter tables: which columns each seed table has and how each cell is read from a run's record.
May import core/, experiments, results and book.cells / book.predictions; never the chapter facade.
"""

from workshop_lib.book.tables.render import (
    ADDED_COLUMNS, MODEL_NAMES, SEED_COLUMNS, Table, chapter_tables, drop_unrecorded, for_stand_ins, layout_name,
    long_form, ran_fixed_steps, rename_models, render_tables, stand_in_names, step_time_key, tables_from_results,
)

__all__ = ["ADDED_COLUMNS", "MODEL_NAMES", "SEED_COLUMNS", "Table", "chapter_tables", "drop_unrecorded",
           "for_stand_ins", "layout_name", "long_form", "ran_fixed_steps", "rename_models", "render_tables",
           "stand_in_names", "step_time_key", "tables_from_results"]
