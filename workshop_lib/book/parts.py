"""Each chapter's parts, declared as data: the key a notebook passes to ``nb.show_results(selection, [key])``,
the tables it shows (``Table.key`` of `book.tables`) and the builders of its figures (`book.claims.figures`).

One declaration serves the notebooks, the tables and the figures, so a misspelt key is an error that names the
chapter's parts instead of a silent "No reference measurement". Parts are listed in the chapter's order; their
figures come in that order. Chapters 1-2's ``memory`` and ``loss`` are figure-only parts (no notebook asks for
them yet). Which chapters exist is the chapter registry's (`experiments.CHAPTER_SPECS`): every chapter there has its
parts here, and there are none for a chapter it does not have (tests/test_chapter_registry.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from workshop_lib.book.claims import figures
from workshop_lib.book.claims.figures import FigureBuilder
from workshop_lib.core.errors import WorkshopError
from workshop_lib.experiments import chapter_spec


@dataclass(frozen=True)
class Part:
    key: str
    tables: tuple[str, ...]  # the Table.key values of the tables the part shows
    figures: tuple[FigureBuilder, ...] = ()


def _nemo_parts(model_figure: FigureBuilder) -> tuple[Part, ...]:
    return (Part("llama", ("llama",), (model_figure,)), Part("mixtral", ("mixtral",), (model_figure,)),
            Part("memory", (), (figures.memory_per_process,)), Part("loss", (), (figures.loss_per_run,)))


PARTS: dict[int, tuple[Part, ...]] = {
    1: _nemo_parts(figures.data_parallel_speedup) + (Part("packing", ("llama-packing",), (figures.packing_loss,)),),
    2: _nemo_parts(figures.step_time_per_layout) + (Part("mixtral-reduced", ("mixtral-reduced",)),),
    3: (Part("baseline", ("baseline",)),
        Part("single-gpu", ("single-gpu",), (figures.zero_one_gpu,)),
        Part("multi-gpu", ("multi-gpu",), (figures.zero_weak_scaling,)),
        Part("two-gpus", ("two-gpus",), (figures.zero_two_gpus,)),
        Part("multi-node", ("multi-node",), (figures.zero_weak_scaling,)),
        Part("prediction", ("prediction",))),
    4: (Part("baseline", ("baseline",)),
        Part("strategies", ("strategies",), (figures.fsdp_strategies,)),
        Part("multi-gpu", ("multi-gpu",), (figures.fsdp_one_node,)),
        Part("multi-node", ("multi-node",)),
        Part("gpt", ("gpt",), (figures.gpt_loss,)),
        Part("gpt-multi-node", ("gpt-multi-node",)),
        Part("weak-scaling", ("weak-scaling",), (figures.gpt_depth,)),
        Part("prediction", ("prediction",))),
}


def lookup(chapter: int, keys: Sequence[str] | str) -> tuple[Part, ...]:
    """The chapter's parts named in ``keys``, in the chapter's order; a WorkshopError naming the chapter's
    parts for a key it does not have."""
    chapter_spec(chapter)  # a chapter the registry does not have is an error that lists those it has
    if chapter not in PARTS:
        raise WorkshopError(f"chapter {chapter} has no parts yet: declare them in PARTS of workshop_lib/book/parts.py")
    wanted = [keys] if isinstance(keys, str) else list(keys)
    parts = PARTS[chapter]
    unknown = [key for key in wanted if key not in {part.key for part in parts}]
    if unknown:
        raise WorkshopError(f"chapter {chapter} has parts {', '.join(part.key for part in parts)}; got "
                            f"{', '.join(map(repr, unknown))}: name one of them in show_results(selection, [...])")
    return tuple(part for part in parts if part.key in wanted)


def table_keys(parts: Sequence[Part]) -> tuple[str, ...]:
    """The Table.key values the parts show, each once."""
    return tuple(dict.fromkeys(key for part in parts for key in part.tables))
