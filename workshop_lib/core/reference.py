"""The book's reference folder (``core.paths.REFERENCE_DIR``): NeMo's resolved recipes, as the stand-in engines,
the fit estimate and the book read them.

``make nemo-check`` (``workshop_lib.nemo_check``) writes ``nemo/resolved.json``; this module only reads it, so
the estimate and the job scripts need not import the developer tool. Standard library only (the memory
calculator ships it).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.paths import REFERENCE_DIR, SOURCE_ROOT

RESOLVED_DIR = REFERENCE_DIR / "nemo"
RESOLVED_FILE = "resolved.json"
_WRITE_IT = "run `make nemo-check` to resolve the chapters' NeMo commands"


class MissingResolvedRecipes(WorkshopError):
    """No resolved.json in the folder: nothing was resolved yet (callers with defaults use them)."""


def load_resolved(folder: Path | None = None) -> dict[str, dict]:
    """The stored records by experiment id (default folder: ``RESOLVED_DIR``), read once per version of the
    file (every script rendered asks). Shared between callers: read them, never change them.
    MissingResolvedRecipes when there is no file; a WorkshopError naming the file when it cannot be read."""
    path = Path(folder or RESOLVED_DIR) / RESOLVED_FILE
    if not path.exists():
        raise MissingResolvedRecipes(f"{_shown(path)} is missing; {_WRITE_IT}")
    version = path.stat()
    return _read_resolved(path, version.st_mtime_ns, version.st_size)


@functools.lru_cache(maxsize=8)
def _read_resolved(path: Path, mtime_ns: int, size: int) -> dict[str, dict]:
    """`load_resolved`'s reading; keyed on the file's time and size too, so a rewritten file (`make
    nemo-check`, a test's own file) is read again."""
    try:
        return {record["id"]: record for record in json.loads(path.read_text())}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise WorkshopError(f"{_shown(path)} cannot be read as NeMo's resolved recipes ({type(error).__name__}: "
                            f"{error}); restore it (git checkout) or {_WRITE_IT}") from error


def recipe_for(experiment_id: str, folder: Path | None = None) -> dict:
    """The resolved recipe of one NeMo experiment (micro-batch, sequence length, LoRA, learning rate...)."""
    records = load_resolved(folder)
    if experiment_id not in records:
        raise WorkshopError(f"{experiment_id} has no resolved NeMo configuration in {RESOLVED_FILE}; "
                            "run `make nemo-check` after adding an experiment")
    record = records[experiment_id]
    if not record["accepted"]:
        raise WorkshopError(f"NeMo refuses {experiment_id}: " + "; ".join(record["errors"]))
    return {**record["resolved"], **record["layout"]}


def _shown(path: Path) -> Path:
    return path.relative_to(SOURCE_ROOT) if path.is_relative_to(SOURCE_ROOT) else path
