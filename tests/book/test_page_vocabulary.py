"""Participant pages speak to participants: no words of the people who built the references ("lent" machines,
"measured here", the `run_engine` field, "emulated nodes" of a "local executor"), neither in the static pages
nor in the captions and sentences generated from book/reference/."""

from __future__ import annotations

import re

import pytest
from test_static_numbers import static_texts

DEVELOPMENT_WORDS = [
    re.compile(r"\blent\b", re.I),  # the machines the reference sessions borrowed
    re.compile(r"run_engine"),  # a field of the reference files, not a word for readers
    re.compile(r"\bemulated nodes?\b|\blocal executor\b", re.I),
    # "here" meaning the team's machines: "measured here", "on a GPU here", "ran here"
    re.compile(r"\b(?:measured|ran|run|trained|GPUs?|machines?|cards?) here\b", re.I),
]


def offending(text: str) -> list[str]:
    found = []
    for pattern in DEVELOPMENT_WORDS:
        for match in pattern.finditer(text):
            found.append(" ".join(text[max(0, match.start() - 60):match.end() + 30].split()))
    return found


def test_the_patterns_catch_what_they_should():
    assert offending("the machine lent to us") and offending("stand-in rows (run_engine stand-in)")
    assert offending("as the local executor ran two emulated nodes") and offending("NeMo measured here")
    assert not offending("Here: the scripts set EP") and not offending("Your runs are shown here")


@pytest.mark.parametrize("page, text", sorted(static_texts().items()), ids=lambda value: str(value)[:40])
def test_static_pages_use_no_development_words(page, text):
    assert not offending(text), f"{page}: {offending(text)}"


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_generated_captions_and_sentences_use_no_development_words():
    from workshop_lib.book.claims import sentences as claims
    from workshop_lib.book.plans.time_plan import chapter_plan
    from workshop_lib.book.reference import nemo_views as nemo_reference
    from workshop_lib.book.reference.chapter_views import reference_caption, reference_results, reference_series
    from workshop_lib.experiments import chapter_experiments

    texts = []
    for chapter in (1, 2, 3, 4):
        loaded = reference_results(chapter)
        for choice, frame in reference_series(chapter, loaded):
            for _, rows in frame.groupby("group"):
                texts.append(reference_caption(loaded[0], rows, f"book/reference/chapter{chapter}.json", choice))
        texts += list(chapter_plan(chapter_experiments(chapter))[::2])
    for chapter in (1, 2):
        texts += [nemo_reference.provenance_line(chapter), nemo_reference.stand_in_caveat(chapter),
                  nemo_reference.nemo_run_line(chapter) or ""]
        texts += nemo_reference.memory_sentences(nemo_reference.measured_table(chapter))
    four = reference_results(4)[1]
    texts += [claims.gpt_architecture(four), claims.fsdp_single_gpu(four), claims.fsdp_strategies(four)]
    found = [hit for text in texts for hit in offending(text)]
    assert not found, found
