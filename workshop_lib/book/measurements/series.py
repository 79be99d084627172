"""One series at a time: the rows a table, a plot or a sentence may compare are one engine's on one kind of card.

A ratio between NeMo and its PyTorch stand-in, or between an H100 and an H200, measures the engine or the card,
not the layout, so the book never forms one. Here, in one place: what a stored row's series is (`series_of`), which
series a family of rows shows (`choose_series`: NeMo where it ran; within the engine, the card with the most rows,
then the card measured last), which provenance records describe a series (`series_provenance`), and the guard that
raises where anything would divide rows of two series (`same_series`).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.gpu_cards import CARDS
from workshop_lib.core.vocabulary import NEMO
from workshop_lib.jobs.states import COMPLETED


class MixedSeriesError(WorkshopError):
    """A table or a sentence would divide rows of two engines or two kinds of card."""


@dataclass(frozen=True, order=True)
class Series:
    """What trained a set of rows (``nemo``, ``stand-in``, ``hf``, ``gpt``) and on which card ("H100"); ``None``
    where a row does not say (a participant's own runs: one profile, one machine)."""

    engine: str | None
    card: str | None


def row_engine(row: dict) -> str | None:
    """What trained a row: its ``run_engine``, else the engine its experiment declares."""
    for key in ("run_engine", "engine"):
        value = row.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def card_name(gpu: str | None) -> str | None:
    """The kind of card in a GPU name as nvidia-smi prints it: "NVIDIA H100 80GB HBM3" → "H100"."""
    if not isinstance(gpu, str) or not gpu.strip():
        return None
    name = gpu.split(",")[0].strip()
    return next((key for key in CARDS if key in name.upper()), name)


def series_of(row: dict) -> Series:
    return Series(row_engine(row), card_name(row.get("run_gpu")))


def same_series(*rows: dict) -> Series | None:
    """The one series of ``rows``; raises MixedSeriesError where they are of two engines or two cards."""
    found = {series_of(row) for row in rows if row}
    if len(found) > 1:
        named = "; ".join(f"{row.get('id', '?')}: {describe(series_of(row))}" for row in rows if row)
        raise MixedSeriesError(
            f"Refusing to divide rows of different engines or cards ({named}): such a ratio measures the engine or "
            "the card, not the layout. Compare rows of one series: workshop_lib.book.measurements.series.choose_series picks one "
            "for each table.")
    return next(iter(found), None)


ENGINE_NAMES = {NEMO: "NeMo", "stand-in": "the PyTorch stand-in (not NeMo)", "hf": "the Hugging Face Trainer",
                "gpt": "the custom GPT's FSDP loop"}


def describe(series: Series) -> str:
    """"NeMo on H100" for a caption or an error."""
    engine = ENGINE_NAMES.get(series.engine, series.engine or "an unnamed engine")
    return f"{engine} on {series.card or 'an unrecorded card'}"


# ---- which provenance records describe a series ----------------------------------------------------------------
def record_card(record: dict) -> str | None:
    gpus = record.get("gpus") or []
    return card_name(gpus[0]) if gpus else None


def record_profile(record: dict) -> str | None:
    """The profile the reference driver ran under (its ``--profile``), None where the command does not say."""
    words = _command_words(record)
    for index, word in enumerate(words[:-1]):
        if word == "--profile":
            return words[index + 1]
        if word.startswith("--profile="):
            return word.split("=", 1)[1]
    return None


def record_ran_nemo(record: dict) -> bool:
    """Whether the session trained with NeMo itself: its profile enables NeMo (else: NeMo was installed)."""
    profile = record_profile(record)
    if profile:
        from workshop_lib.sites.profiles import load_profile

        try:
            return bool(load_profile(profile).nemo.enabled)
        except (WorkshopError, OSError, ValueError):
            pass  # a profile this checkout no longer has: fall back on what was installed
    version = record.get("nemo_toolkit")
    return bool(version) and not str(version).startswith("unavailable")


def record_ids(record: dict) -> set[str] | None:
    """The experiments the session was asked to run (its ``--only``), None for "all that fit"."""
    words = _command_words(record)
    if "--only" not in words:
        return None
    ids = []
    for word in words[words.index("--only") + 1:]:
        if word.startswith("--"):
            break
        ids.append(word)
    return set(ids)


def _command_words(record: dict) -> list[str]:
    try:
        return shlex.split(str(record.get("command") or ""))
    except ValueError:
        return str(record.get("command") or "").split()


def series_provenance(provenance: list[dict], series: Series, ids: set[str] | None = None) -> list[dict]:
    """The records of the sessions that ran this series: the same card, NeMo or not as the series is, and (where
    the command names its experiments) one of ``ids``. Falls back to the card's records, then to all, for files
    written before the commands said what they ran."""
    on_card = [p for p in provenance if series.card is None or record_card(p) == series.card]
    wanted = [p for p in on_card if record_ran_nemo(p) == (series.engine == NEMO)
              and (ids is None or record_ids(p) is None or record_ids(p) & ids)]
    return wanted or on_card or list(provenance)


def newest_date(provenance: list[dict], series: Series, ids: set[str] | None = None) -> str:
    dates = [str(p.get("date", ""))[:10] for p in series_provenance(provenance, series, ids) if p.get("date")]
    return max(dates, default="")


# ---- which series a family shows -------------------------------------------------------------------------------
@dataclass(frozen=True)
class SeriesChoice:
    """The series a family of rows shows, its rows, the rows left out, and why this series, in words."""

    series: Series
    rows: list[dict]
    left_out: list[dict] = field(default_factory=list)
    reason: str = ""

    def left_out_text(self, source: str) -> str:
        """"Not shown: …" for a caption; empty where nothing was left out."""
        if not self.left_out:
            return ""
        counts: dict[Series, int] = {}
        for row in self.left_out:
            counts[series_of(row)] = counts.get(series_of(row), 0) + 1
        parts = [f"{count} row{'s' if count > 1 else ''} by {describe(series)}"
                 for series, count in sorted(counts.items(), key=lambda item: (str(item[0].engine), str(item[0].card)))]
        return (f"Not shown, and kept in {source}: {', '.join(parts)}; a table compares rows of one engine on "
                "one kind of card.")


def choose_series(rows: list[dict], provenance: list[dict] | None = None) -> SeriesChoice | None:
    """The series a family of rows (one table's) shows: NeMo's where NeMo completed any; else the engine with the
    most completed rows. Within it the card with the most rows, ties going to the card measured last."""
    if not rows:
        return None
    provenance = provenance or []
    done = [row for row in rows if row.get("state") == COMPLETED] or rows
    engines: dict[str | None, int] = {}
    for row in done:
        engines[row_engine(row)] = engines.get(row_engine(row), 0) + 1
    engine = NEMO if NEMO in engines else max(engines, key=lambda name: (engines[name], str(name)))
    cards: dict[str | None, int] = {}
    for row in done:
        if row_engine(row) == engine:
            cards[card_name(row.get("run_gpu"))] = cards.get(card_name(row.get("run_gpu")), 0) + 1
    ids = {str(row.get("id")) for row in done}

    def rank(card):
        return cards[card], newest_date(provenance, Series(engine, card), ids), str(card)

    card = max(cards, key=rank)
    series = Series(engine, card)
    chosen = [row for row in rows if series_of(row) == series]
    left_out = [row for row in rows if series_of(row) != series]
    why_engine = ("NeMo itself ran rows of this table, so they are the ones shown" if engine == NEMO and
                  len(engines) > 1 else "")
    if len(cards) == 1:
        why_card = ""
    elif sorted(cards.values())[-1] > sorted(cards.values())[-2]:
        why_card = f"{card}: the card with the most rows of this table ({cards[card]} of {sum(cards.values())})"
    else:
        why_card = f"{card}: of cards with as many rows, the one measured last ({newest_date(provenance, series, ids)})"
    reason = "; ".join(part for part in (why_engine, why_card) if part)
    return SeriesChoice(series, chosen, left_out, reason)


__all__ = ["MixedSeriesError", "Series", "SeriesChoice", "card_name", "choose_series", "describe", "newest_date",
           "record_card", "record_ids", "record_profile", "record_ran_nemo", "row_engine", "same_series",
           "series_of", "series_provenance"]
