"""A deterministic SQuAD-format data set for machines without the hub.

Each example is a paragraph of made-up encyclopedia prose, a question about one fact in it, and
the answer as a span of the paragraph (``answer_start`` is a character offset, as in SQuAD v1.1).
Paragraph lengths follow a log-normal spread like SQuAD's (median ~110 words, a long tail past 400),
so padding, truncation at 512 tokens and the cost per sample look like the real thing.
"""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
from pathlib import Path

SYNTHETIC_TRAIN_SIZE = 4000
SYNTHETIC_VALIDATION_SIZE = 400
SYNTHETIC_VERSION = 1  # bump when the generator changes, so cached files are regenerated

_SYLLABLES = ["ka", "ro", "mi", "ta", "len", "dor", "vi", "sa", "bel", "nor", "quin", "ash",
              "tor", "el", "mar", "gan", "fi", "lo", "ber", "wen", "cal", "da", "rus", "ion"]
_FILLER = ("the of and in to a was is for on as by with from that at its which also were an "
           "their has been his it or are first most other new during after into time city river "
           "year people early later known region century main large built area history south "
           "north world local small several population government court school university "
           "because between public major under state family among each named around period").split()
_FACTS = [  # (statement, question, which field is the answer)
    ("{place} was founded in {year} by {person}.", "In what year was {place} founded?", "year"),
    ("{place} was founded in {year} by {person}.", "Who founded {place}?", "person"),
    ("The river {river} flows through {place} for {number} kilometres.",
     "Which river flows through {place}?", "river"),
    ("The river {river} flows through {place} for {number} kilometres.",
     "How many kilometres does the {river} flow through {place}?", "number"),
    ("In {year}, {person} became the first governor of {place}.",
     "Who became the first governor of {place}?", "person"),
    ("The main export of {place} is {good}.", "What is the main export of {place}?", "good"),
    ("{person} wrote {number} books about {place} before {year}.",
     "How many books did {person} write about {place}?", "number"),
]
_GOODS = ["copper", "wool", "salt", "timber", "olive oil", "silk", "tin", "coffee", "glass", "wheat"]


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(syllables))


def _name(rng: random.Random) -> str:
    return _word(rng, rng.randint(2, 3)).capitalize()


def _filler_sentence(rng: random.Random) -> str:
    words = [rng.choice(_FILLER) for _ in range(rng.randint(8, 22))]
    if rng.random() < 0.3:
        words[rng.randrange(len(words))] = _name(rng)
    return " ".join(words).capitalize() + "."


def _paragraph_words(rng: random.Random) -> int:
    # log-normal around 110 words: most paragraphs 60-200 words, a few past 400 (SQuAD-like).
    return int(min(650, max(25, math.exp(rng.gauss(math.log(110), 0.45)))))


def make_example(index: int, rng: random.Random) -> dict:
    """One SQuAD-format record (the flat layout of the hub's ``squad`` data set)."""
    slots = {"place": _name(rng), "person": f"{_name(rng)} {_name(rng)}", "river": _name(rng),
             "year": str(rng.randint(1100, 1990)), "number": str(rng.randint(2, 900)),
             "good": rng.choice(_GOODS)}
    statement, question, answer_field = rng.choice(_FACTS)
    fact = statement.format(**slots)
    target_words = _paragraph_words(rng)
    sentences = []
    while sum(len(s.split()) for s in sentences) < target_words:
        sentences.append(_filler_sentence(rng))
    sentences.insert(rng.randrange(len(sentences) + 1), fact)
    context = " ".join(sentences)
    answer = slots[answer_field]
    answer_start = context.index(fact) + fact.index(answer)
    return {"id": f"synthetic-{index:06d}", "title": slots["place"], "context": context,
            "question": question.format(**slots),
            "answers": {"text": [answer], "answer_start": [answer_start]}}


def generate_split(size: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [make_example(i, rng) for i in range(size)]


def write_atomically(path: Path, text: str) -> None:
    """Write to a temporary file in the same folder, then rename: readers never see half a file,
    and several jobs writing the same deterministic content at once cannot corrupt it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def synthetic_dir(data_dir: Path) -> Path:
    return data_dir / f"synthetic-squad-v{SYNTHETIC_VERSION}"


def ensure_synthetic_squad(data_dir: Path) -> Path:
    """Create (once) ``train.jsonl`` and ``validation.jsonl`` under ``data_dir``; return the folder."""
    folder = synthetic_dir(data_dir)
    for split, size, seed in (("train", SYNTHETIC_TRAIN_SIZE, 1234),
                              ("validation", SYNTHETIC_VALIDATION_SIZE, 5678)):
        path = folder / f"{split}.jsonl"
        if not path.exists():
            lines = "".join(json.dumps(record) + "\n" for record in generate_split(size, seed))
            write_atomically(path, lines)
    return folder
