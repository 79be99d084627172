"""Results: what ended runs left, read into tidy rows and a chapter's table.

Owns: read.py (one run folder into one row: READERS, the kinds of log in the order they are read), readers.py
(one small reader per kind: the files it reads, the values it sets), chapter.py (a chapter's table and its
notes), parse/ (one module per log format: Trainer output, metrics.jsonl, NeMo, nvidia-smi, psrecord,
nccl-tests), memory.py (the memory monitors' summaries), class_pool.py + pool_rows.py (the class pool: rows
published into each participant's own folder of the class folder, read back by everyone with every value checked).
May import: core, experiments, jobs (the job footer), runs (the run's record).
"""

import importlib

# Loaded on first use (PEP 562): `workshop memory`, run by every job's footer, and the other `workshop`
# commands need no pandas, which the chapter's table brings in (over a second of CPU at each start).
_HOMES = {
    **dict.fromkeys(("chapter_results", "record_of", "run_note", "run_record", "unreadable_notes"), "chapter"),
    **dict.fromkeys(("COMPLETED", "INCOMPLETE", "MISSING", "RunResult", "SHOWN_PROBLEMS", "UnreadableLines",
                     "read_run"), "read"),
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
