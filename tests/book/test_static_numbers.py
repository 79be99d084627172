"""A guard against drift: every figure the static pages state is either checked here against its source or
named for what it is.

The static pages (book/*.md and the Markdown cells of the chapters) cannot compute anything, so a number they
print about a measurement or an estimate goes stale when the data or the estimator changes. This test finds
every number with a unit of memory, bandwidth, throughput or a ratio (GiB, MiB, GB/s, TFLOP/s, samples/s,
tokens/s, ms, %, N×) and requires each one to be registered below: with a check that recomputes it from
``book/reference/`` or the code it comes from (estimator, profiles, model shapes), or with the reason it is
not a result (a definition, an illustration, a quotation of the original material). A new figure that
nobody registered fails, a registered figure that no longer matches its source fails, and a registration
whose sentence has gone fails too, so the next correction cannot leave a stale copy behind. Sentences that
state measured results belong in ``workshop_lib.book.claims.sentences`` (generated when the book builds), not here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import jupytext
import pytest

from workshop_lib.book.claims.sentences import gpt_parameter_counts
from workshop_lib.core.paths import SOURCE_ROOT
from workshop_lib.estimate import model_shape, parameter_count
from workshop_lib.estimate.fit import MARGIN, check_fit
from workshop_lib.experiments import get_experiment
from workshop_lib.sites.profiles import load_profile

ROOT = SOURCE_ROOT
GIB = 2**30
# A number, then a unit; "N×" only when attached ("2.5×"): "TP 2 × DP 2" and "4 × 4" are products, not ratios.
FIGURE = re.compile(r"(?<![\w.,])(\d[\d,]*(?:\.\d+)?)(?:\s?(GiB|MiB|GB/s|TB/s|TFLOP/s|samples/s|tokens/s|ms|%)|(×))"
                    r"(?![\w/])")
NOT_CHECKED = {"definition", "illustration", "quotation", "fact"}


def static_texts(root: Path = ROOT) -> dict[str, str]:
    """Page name → the text a reader sees without executing anything."""
    texts = {str(p.relative_to(root)): p.read_text() for p in sorted((root / "book").glob("*.md"))}
    for path in sorted((root / "notebooks").glob("*.py")):
        cells = jupytext.read(path).cells
        texts[str(path.relative_to(root))] = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    return texts


@dataclass(frozen=True)
class Figure:
    page: str
    text: str  # as printed, e.g. "55.4 GiB"
    value: float
    context: str  # the surrounding words, one line


# Markup is not prose: an iframe's `width: 100%` states nothing about a measurement.
HTML_TAG = re.compile(r"<[A-Za-z][^<>]*>")


def figures(texts: dict[str, str]) -> list[Figure]:
    found = []
    for page, text in texts.items():
        text = HTML_TAG.sub(lambda tag: " " * len(tag.group(0)), text)
        for match in FIGURE.finditer(text):
            context = " ".join(text[max(0, match.start() - 90):match.end() + 40].split())
            found.append(Figure(page, match.group(0), float(match.group(1).replace(",", "")), context))
    return found


@dataclass(frozen=True)
class Registered:
    page: str
    text: str  # the figure as printed
    near: str  # words next to it that identify the sentence
    kind: str  # "estimate", "arithmetic", "setting", "measured" (checked) or one of NOT_CHECKED
    source: Callable[[], float] | str  # recomputes the value, or says why nothing is to be recomputed

    def covers(self, figure: Figure) -> bool:
        return figure.page == self.page and figure.text == self.text and self.near in figure.context


# ---- where the figures come from ----------------------------------------------------------------------
def _estimate(experiment_id: str, **change) -> Callable[[], float]:
    import dataclasses

    def predicted() -> float:
        experiment = get_experiment(experiment_id)
        return check_fit(dataclasses.replace(experiment, **change) if change else experiment, 80).predicted_gib
    return predicted


def _estimate_at_length(experiment_id: str, seq_len: int) -> Callable[[], float]:
    """NeMo's estimate for an experiment with micro-batches of ``seq_len`` tokens instead of the recipe's."""
    import dataclasses

    from workshop_lib.estimate.fit import estimate_memory, nemo_setup

    def predicted() -> float:
        experiment = get_experiment(experiment_id)
        setup = dataclasses.replace(nemo_setup(experiment, False), seq_len=seq_len)
        return estimate_memory(experiment.model, setup).total / GIB
    return predicted


SEED_MIXTRAL_TP2 = dict(nodes=1, gpus_per_node=4, tensor_parallel=2, pipeline_parallel=1, expert_parallel=2)
SEED_MIXTRAL_TP4 = dict(nodes=1, gpus_per_node=8, tensor_parallel=4, pipeline_parallel=1, expert_parallel=2)
MIXTRAL = "model-parallel/mixtral/tp2-pp4-ep2-sp"


def _model_states_gib(model: str, bytes_per_parameter: int) -> Callable[[], float]:
    return lambda: parameter_count(model_shape(model)) * bytes_per_parameter / GIB


def _bloom_share(part: str) -> Callable[[], float]:
    def share() -> float:
        shape = model_shape("bloom-560m")
        total = parameter_count(shape)
        embedding = shape.vocab_size * shape.hidden_size
        return 100 * (embedding if part == "embedding" else total - embedding) / total
    return share


def _reference(chapter: str, experiment_id: str, key: str) -> Callable[[], float]:
    def read() -> float:
        rows = json.loads((ROOT / "book" / "reference" / f"{chapter}.json").read_text())["results"]
        return float(next(r for r in rows if r["id"] == experiment_id)[key])
    return read


def _gpt_growth() -> float:
    counts = [gpt_parameter_counts(2048, 8192, 50000, 512, layers)["total"] for layers in (3, 6)]
    return counts[1] / counts[0]


REGISTRY: list[Registered] = [
    # answers.md
    Registered("book/answers.md", "8×", "falls by less than", "definition", "the ideal speed-up of 8 GPUs"),
    Registered("book/answers.md", "40 %", "Amdahl", "illustration", "Amdahl's law with an invented fixed share"),
    Registered("book/answers.md", "2.5×", "Amdahl", "illustration", "1 / 0.4, the same example"),
    Registered("book/answers.md", "1 MiB", "when is its mode", "fact", "what nvidia-smi reports for an idle GPU"),
    Registered("book/answers.md", "1 MiB", "idle GPU reads about", "fact", "what nvidia-smi reports for an idle GPU"),
    Registered("book/answers.md", "1 MiB", "the mode is 1 MiB", "fact", "what nvidia-smi reports for an idle GPU"),
    Registered("book/answers.md", "135 GiB", "model states for", "arithmetic", _model_states_gib("llama-3.1-8b", 18)),
    Registered("book/answers.md", "780 GiB", "GiB for Mixtral", "arithmetic", _model_states_gib("mixtral-8x7b", 18)),
    Registered("book/answers.md", "780 GiB", "18 bytes", "arithmetic", _model_states_gib("mixtral-8x7b", 18)),
    Registered("book/answers.md", "10 %", "margin `workshop validate`", "setting", lambda: 100 * MARGIN),
    Registered("book/answers.md", "77.8 GiB", "GPU with activa", "estimate", _estimate("model-parallel/llama/tp2")),
    Registered("book/answers.md", "55.4 GiB", "state over two ranks", "estimate",
               _estimate("model-parallel/llama/tp2-dp2")),
    Registered("book/answers.md", "55.4 GiB", "NeMo on an A100", "estimate", _estimate("model-parallel/llama/tp2-dp2")),
    Registered("book/answers.md", "40.9 GiB", "for TP 4", "estimate", _estimate("model-parallel/llama/tp4")),
    Registered("book/answers.md", "22.5 GiB", "for TP 8", "estimate", _estimate("model-parallel/llama/tp8")),
    Registered("book/answers.md", "209.4 GiB", "seed's layouts", "estimate", _estimate(MIXTRAL, **SEED_MIXTRAL_TP2)),
    Registered("book/answers.md", "104.7 GiB", "TP 4 × EP 2 on 8", "estimate", _estimate(MIXTRAL, **SEED_MIXTRAL_TP4)),
    Registered("book/answers.md", "60.9 GiB", "TP 2 × PP 4 × EP 2", "estimate", _estimate(MIXTRAL)),
    Registered("book/answers.md", "55.0 GiB", "TP 4 × PP 2 × EP 2", "estimate",
               _estimate("model-parallel/mixtral/tp4-pp2-ep2-sp")),
    Registered("book/answers.md", "54 %", "559 M parameters", "arithmetic", _bloom_share("blocks")),
    Registered("book/answers.md", "80 %", "original materi", "quotation", "the original material's figure"),
    Registered("book/answers.md", "46 %", "257 M", "arithmetic", _bloom_share("embedding")),
    Registered("book/answers.md", "5 GB/s", "threshold", "setting",
               lambda: load_profile("ibex").bandwidth_check.min_bus_bandwidth_gbps),
    Registered("book/answers.md", "100 %", "current time × 100 %", "definition", "the efficiency formula"),
    Registered("book/answers.md", "100 %", "It is 100 % when", "definition", "the efficiency formula"),
    Registered("book/answers.md", "100 %", "values above 100 %", "definition", "the efficiency formula"),
    # ibex_setup.md, reading_logs.md
    Registered("book/ibex_setup.md", "5 GB/s", "below 5 GB/s", "setting",
               lambda: load_profile("ibex").bandwidth_check.min_bus_bandwidth_gbps),
    Registered("book/reading_logs.md", "0.1 %", "under 0.1 %", "arithmetic",
               lambda: 100 * 18.9e6 / parameter_count(model_shape("mixtral-8x7b"))),
    Registered("book/reading_logs.md", "100%", "progress bar", "quotation", "a progress bar in a log excerpt"),
    Registered("book/reading_logs.md", "16273 MiB", "Peak = 16273", "quotation", "a log line of the original material"),
    Registered("book/reading_logs.md", "1924.11 MiB", "Avg = 1924.11", "quotation",
               "a log line of the original material"),
    Registered("book/reading_logs.md", "1 MiB", "Mode = 1 MiB", "quotation", "a log line of the original material"),
    Registered("book/reading_logs.md", "80 GiB", "card's 80 GiB", "setting", lambda: load_profile("ibex").gpu_memory_gib),
    Registered("book/reading_logs.md", "1 MiB", "read about 1 MiB", "fact", "what nvidia-smi reports for an idle GPU"),
    Registered("book/reading_logs.md", "1 MiB", "the mode is 1 MiB", "fact", "what nvidia-smi reports for an idle GPU"),
    Registered("book/reading_logs.md", "21658 MiB", "original BLOOM baseline", "quotation",
               "the original material's baseline log"),
    # seed_corrections.md
    Registered("book/seed_corrections.md", "78 GiB", "Llama TP 2 on", "estimate", _estimate("model-parallel/llama/tp2")),
    Registered("book/seed_corrections.md", "209 GiB", "on 4 GPUs is estimated at about", "estimate",
               _estimate(MIXTRAL, **SEED_MIXTRAL_TP2)),
    Registered("book/seed_corrections.md", "105 GiB", "on 8 at about", "estimate", _estimate(MIXTRAL, **SEED_MIXTRAL_TP4)),
    Registered("book/seed_corrections.md", "780 GiB", "states alone", "arithmetic", _model_states_gib("mixtral-8x7b", 18)),
    Registered("book/seed_corrections.md", "100 %", "exceeds 100 %", "definition", "the efficiency formula"),
    Registered("book/seed_corrections.md", "1.6×", "from 3 to 6 layers", "arithmetic", _gpt_growth),
    Registered("book/seed_corrections.md", "80 %", "said to hold about", "quotation", "the original material's figure"),
    Registered("book/seed_corrections.md", "54 %", "they hold about", "arithmetic", _bloom_share("blocks")),
    # the chapters' Markdown
    Registered("notebooks/01_data_parallel_lora.py", "1 MiB", "the idle GPU's", "fact",
               "what nvidia-smi reports for an idle GPU"),
    Registered("notebooks/02_model_parallel.py", "78 GiB", "predicted at about", "estimate",
               _estimate("model-parallel/llama/tp2")),
    Registered("notebooks/02_model_parallel.py", "10 %", "margin", "setting", lambda: 100 * MARGIN),
    Registered("book/memory_calculator.md", "10 %", "keeps 10 % of each card", "setting", lambda: 100 * MARGIN),
    Registered("notebooks/02_model_parallel.py", "105 GiB", "estimator gives about 209", "estimate",
               _estimate(MIXTRAL, **SEED_MIXTRAL_TP4)),
    Registered("notebooks/02_model_parallel.py", "55 GiB", "about 61 and", "estimate",
               _estimate("model-parallel/mixtral/tp4-pp2-ep2-sp")),
    Registered("notebooks/02_model_parallel.py", "209 GiB", "needs about 209", "estimate",
               _estimate(MIXTRAL, **SEED_MIXTRAL_TP2)),
    Registered("notebooks/02_model_parallel.py", "105 GiB", "on 8 about", "estimate",
               _estimate(MIXTRAL, **SEED_MIXTRAL_TP4)),
    Registered("notebooks/02_model_parallel.py", "78 GiB", "on 2 GPUs is predicted", "estimate",
               _estimate("model-parallel/llama/tp2")),
    Registered("notebooks/02_model_parallel.py", "68.6 GiB", "SQuAD's lengths", "estimate",
               _estimate_at_length("model-parallel/llama/tp2", 256)),
    Registered("notebooks/02_model_parallel.py", "43 %", "TP 2 × PP 4 idles", "arithmetic", lambda: 100 * 3 / 7),
    Registered("notebooks/02_model_parallel.py", "20 %", "TP 4 × PP 2", "arithmetic", lambda: 100 * 1 / 5),
    Registered("notebooks/03_deepspeed_zero.py", "8.3 GiB", "16Ψ", "arithmetic",
               lambda: 16 * _reference("chapter3", "zero/baseline", "total_params")() / GIB),
    Registered("notebooks/03_deepspeed_zero.py", "1.5×", "the communication", "definition",
               "ZeRO-3's communication volume against DDP's (the ZeRO paper)"),
    Registered("notebooks/03_deepspeed_zero.py", "100 %", "tiny efficiencies", "definition", "the efficiency formula"),
    Registered("notebooks/03_deepspeed_zero.py", "100 %", "small kernel at a time", "definition",
               "what utilization.gpu means"),
    Registered("notebooks/04_fsdp.py", "1.5×", "about 1.5× DDP", "definition",
               "FULL_SHARD's communication volume against DDP's"),
    Registered("notebooks/04_fsdp.py", "100 %", "× 100 %: 100 %", "definition", "the efficiency formula"),
    Registered("notebooks/04_fsdp.py", "100 %", "100 %: 100 % means", "definition", "the efficiency formula"),
    Registered("notebooks/04_fsdp.py", "100 %", "above and below 100 %", "definition", "the efficiency formula"),
    Registered("notebooks/04_fsdp.py", "100 %", "exceeds 100 %", "definition", "the efficiency formula"),
    Registered("notebooks/04_fsdp.py", "80 %", "It put about 80 %", "quotation", "the original material's figure"),
]


def _agrees(claimed: float, computed: float, context: str, printed: str) -> bool:
    """Equal at the printed precision; "about"/"≈"/"under" figures within 1 % (or, for "under", not above)."""
    if "under" in context and printed in context.split("under", 1)[1][:len(printed) + 2]:
        return computed <= claimed
    decimals = len(printed.split(" ")[0].rstrip("×%").split(".")[1]) if "." in printed else 0
    if abs(round(computed, decimals) - claimed) < 10 ** -(decimals + 3):
        return True
    return ("about" in context or "≈" in context) and abs(computed - claimed) <= 0.01 * max(abs(computed), 1e-9)


def unregistered(found: list[Figure], registry: list[Registered]) -> list[Figure]:
    return [figure for figure in found if not any(entry.covers(figure) for entry in registry)]


# ---- the guard ---------------------------------------------------------------------------------------
def test_every_figure_on_a_static_page_is_registered():
    missing = unregistered(figures(static_texts()), REGISTRY)
    assert not missing, "figures the static pages state without a registered source:\n" + "\n".join(
        f"  {f.page}: {f.text!r} in “…{f.context}…”" for f in missing) + (
        "\nGenerate the sentence from book/reference/ (workshop_lib.book.claims.sentences), or register the figure in "
        "tests/book/test_static_numbers.py with the check that recomputes it.")


@pytest.mark.parametrize("entry", [e for e in REGISTRY if e.kind not in NOT_CHECKED],
                         ids=lambda e: f"{e.page}:{e.text}:{e.near}")
def test_every_checked_figure_agrees_with_its_source(entry):
    covered = [f for f in figures(static_texts()) if entry.covers(f)]
    assert covered, f"{entry.page} no longer says {entry.text!r} near {entry.near!r}: drop or update its registration"
    computed = entry.source()
    for figure in covered:
        assert _agrees(figure.value, computed, figure.context, figure.text), (
            f"{entry.page} says {figure.text!r} (“…{figure.context}…”) but its source gives {computed:.4g}")


def test_every_unchecked_registration_names_a_reason_and_still_matches_a_sentence():
    texts = static_texts()
    found = figures(texts)
    for entry in REGISTRY:
        assert entry.kind in NOT_CHECKED | {"estimate", "arithmetic", "setting", "measured"}
        if entry.kind in NOT_CHECKED:
            assert isinstance(entry.source, str) and entry.source, entry
        assert any(entry.covers(f) for f in found), f"stale registration: {entry}"


def test_the_guard_catches_a_stale_copy(tmp_path):
    """The guard fails where it should: a measured figure pasted into a page, and a registered estimate that
    no longer agrees with the estimator."""
    (tmp_path / "book").mkdir()
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "book" / "answers.md").write_text(
        "Pinned memory takes ZeRO-2 + offload from 7.4 to 16.4 samples/s, 2.2× faster.\n")
    found = figures(static_texts(tmp_path))
    assert {f.text for f in unregistered(found, REGISTRY)} == {"16.4 samples/s", "2.2×"}
    stale = Figure("book/answers.md", "40.9 GiB", 40.9, "40.9 GiB for TP 4")
    assert not _agrees(stale.value, _estimate("model-parallel/llama/tp2-dp2")(), stale.context, stale.text)
    assert _agrees(40.9, _estimate("model-parallel/llama/tp4")(), stale.context, stale.text)


def test_products_are_not_mistaken_for_ratios():
    texts = {"page": "Llama TP 2 × DP 2 on 4 GPUs, batch 4 × accumulation 4, and 3.1× faster"}
    assert [f.text for f in figures(texts)] == ["3.1×"]


def test_settings_stated_in_words_match_their_declarations():
    """Counts the pages state without a unit: the per-user GPU cap, the NeMo runs' steps and global batch."""
    from workshop_lib.book.plans.time_plan import PER_USER_GPU_CAP

    texts = static_texts()
    assert f"limit of {PER_USER_GPU_CAP} GPUs per user" in " ".join(texts["book/intro.md"].split())
    nemo = get_experiment("lora/llama/1-gpu")
    for page in ("notebooks/01_data_parallel_lora.py", "notebooks/02_model_parallel.py"):
        text = " ".join(texts[page].split())
        assert f"stops after {nemo.max_steps} optimizer steps with a global batch of {nemo.global_batch}" in text, page
