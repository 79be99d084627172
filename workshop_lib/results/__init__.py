"""Results: what ended runs left, read into tidy rows and a chapter's table.

Owns: read.py (one run folder into one row), chapter.py (a chapter's table and its notes), parse/ (one module per
log format: Trainer output, metrics.jsonl, NeMo, nvidia-smi, psrecord, nccl-tests), memory.py (the memory
monitors' summaries), class_pool.py + pool_rows.py (the class pool: rows published into each participant's own
folder of the class folder, read back by everyone with every value checked).
May import: core, experiments, jobs (the job footer), runs (the run's record).
"""

from workshop_lib.results.chapter import chapter_results, record_of, run_note, run_record, unreadable_notes
from workshop_lib.results.read import (
    COMPLETED, INCOMPLETE, MISSING, RunResult, SHOWN_PROBLEMS, UnreadableLines, read_run,
)

__all__ = [
    "COMPLETED", "INCOMPLETE", "MISSING", "RunResult", "SHOWN_PROBLEMS", "UnreadableLines", "chapter_results",
    "read_run", "record_of", "run_note", "run_record", "unreadable_notes",
]
