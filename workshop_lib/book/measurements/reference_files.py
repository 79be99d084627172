"""The one reader of book/reference/*.json, the measurements on real GPUs the chapters show first.

A file holds ``results`` (one row per experiment run), ``provenance`` (one record per session that measured
them: GPUs, software, date; files written before sessions were kept hold one record, not a list) and the
``profile`` its runs ran under. Every view of these files (the chapters' tables, the NeMo layouts, the time
plan, the calculator's measured runs, the engine-scaling table) reads them here, so a change of the format is
made once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from workshop_lib.core.paths import REFERENCE_DIR
from workshop_lib.jobs.states import COMPLETED

# The files the book reads, by name: chapter<N>.json for each chapter, and the engine-scaling benchmark.
REFERENCE_NAMES = ("chapter1", "chapter2", "chapter3", "chapter4", "engine_scaling")


@dataclass(frozen=True)
class ReferenceFile:
    """One file of book/reference, as stored: ``document`` is the whole JSON, the other fields its parts."""

    path: Path
    document: dict

    @property
    def results(self) -> list[dict]:
        return self.document.get("results", [])

    @property
    def provenance(self) -> list[dict]:
        """The sessions that measured the rows, always a list."""
        records = self.document.get("provenance") or []
        return records if isinstance(records, list) else [records]

    @property
    def profile(self) -> str | None:
        """The site profile the rows ran under (its training.max_steps capped the rows that record no cap)."""
        return self.document.get("profile")

    def completed(self) -> list[dict]:
        return [row for row in self.results if row.get("state") == COMPLETED]


def reference_name(chapter: int | str) -> str:
    """chapter<N> for a chapter's number, else the name as given (``engine_scaling``)."""
    return f"chapter{chapter}" if isinstance(chapter, int) else str(chapter)


def reference_path(chapter: int | str, folder: Path = REFERENCE_DIR) -> Path:
    return Path(folder) / f"{reference_name(chapter)}.json"


def read_reference(chapter: int | str, folder: Path = REFERENCE_DIR) -> ReferenceFile | None:
    """A chapter's file (chapter<N>.json), or another by name; None where it is not there yet. Read afresh
    each call: callers may change the rows they get."""
    return read_reference_file(reference_path(chapter, folder))


def read_reference_file(path: Path) -> ReferenceFile | None:
    """One reference file by its path; None where it is not there."""
    path = Path(path)
    if not path.is_file():
        return None
    return ReferenceFile(path, json.loads(path.read_text()))
