"""SQuAD for causal-LM fine-tuning: loading, the prompt, tokenization, weak-scaling subsets.

``--data`` takes ``squad`` (the hub data set, as on Ibex), ``synthetic`` (generated here into
``$WORKSHOP_DATA_DIR``), a folder holding ``train.jsonl``/``validation.jsonl``, or one SQuAD-format
JSON file (flat records like the hub's, or the official nested v1.1 layout). All of them go
through ``datasets.load_dataset`` and end as the same list of :class:`QAExample`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from workshop_lib.core.errors import WorkshopError
from workshop_lib.train.runtime import Runtime, barrier
from workshop_lib.train.synthetic import ensure_synthetic_squad, write_atomically

MAX_LENGTH = 512
LOCAL_TOKENIZER_VOCAB = 512
IGNORE_INDEX = -100  # label value the cross-entropy loss skips


@dataclass(frozen=True)
class QAExample:
    question: str
    context: str
    answers: tuple[str, ...]


@dataclass(frozen=True)
class SquadSplits:
    train: list[QAExample]
    validation: list[QAExample]
    source: str


def data_dir() -> Path:
    return Path(os.environ.get("WORKSHOP_DATA_DIR", Path.home() / ".cache" / "workshop" / "data"))


def prompt_for(example: QAExample) -> str:
    """The seeds' prompt, up to the point where the model must continue with the answer."""
    return f"Question: {example.question} Context: {example.context} Answer:"


def training_text(example: QAExample, eos_token: str) -> str:
    return f"{prompt_for(example)} {example.answers[0]}{eos_token}"


# ---------------------------------------------------------------- loading

def _examples_from_rows(rows) -> list[QAExample]:
    return [QAExample(row["question"], row["context"], tuple(row["answers"]["text"]) or ("",))
            for row in rows]


def _flatten_nested_squad(path: Path) -> list[dict]:
    """The official SQuAD v1.1 file nests paragraphs and questions under ``data``."""
    document = json.loads(path.read_text(encoding="utf-8"))
    rows = []
    for article in document["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                rows.append({"question": qa["question"], "context": paragraph["context"],
                             "answers": {"text": [a["text"] for a in qa["answers"]]}})
    return rows


def _is_nested_squad(path: Path) -> bool:
    """True for the official layout: one JSON object with a ``data`` list (not JSON lines)."""
    with path.open(encoding="utf-8") as stream:
        head = stream.read(4096).lstrip()
    return head.startswith("{") and head[1:].lstrip().startswith(('"data"', '"version"'))


def _load_json_files(files: dict[str, str]):
    try:
        import datasets
    except ImportError:  # a GPU box without `datasets`: read the same JSON lines by hand
        return {split: [json.loads(line) for line in Path(path).read_text().splitlines() if line]
                for split, path in files.items()}
    loaded = datasets.load_dataset("json", data_files=files)
    return {split: loaded[split] for split in files}


def load_squad(spec: str, runtime: Runtime, validation_holdout: int = 200) -> SquadSplits:
    """Train and validation examples for ``--data spec`` (see the module docstring)."""
    if spec == "squad":
        import datasets

        loaded = datasets.load_dataset("squad")
        return SquadSplits(_examples_from_rows(loaded["train"]),
                           _examples_from_rows(loaded["validation"]), "squad")
    if spec == "synthetic":
        if runtime.is_local_main:
            ensure_synthetic_squad(data_dir())
        barrier()
        # Already there after the barrier; a node whose rank 0 wrote to a folder this node cannot
        # see generates its own identical copy.
        spec_path = ensure_synthetic_squad(data_dir())
    else:
        spec_path = Path(spec).expanduser()
    if spec_path.is_dir():
        files = {split: str(spec_path / f"{split}.jsonl") for split in ("train", "validation")}
        missing = [f for f in files.values() if not Path(f).exists()]
        if missing:
            raise WorkshopError(f"--data {spec}: folder lacks {', '.join(missing)}; give a folder "
                                "with train.jsonl and validation.jsonl, a JSON file, 'squad' or 'synthetic'")
        splits = _load_json_files(files)
        return SquadSplits(_examples_from_rows(splits["train"]),
                           _examples_from_rows(splits["validation"]), str(spec_path))
    if spec_path.is_file():
        if _is_nested_squad(spec_path):
            rows = _flatten_nested_squad(spec_path)
        else:
            rows = _load_json_files({"train": str(spec_path)})["train"]
        examples = _examples_from_rows(rows)
        if len(examples) <= validation_holdout:
            raise WorkshopError(f"--data {spec}: only {len(examples)} records; a single file needs more "
                                f"than {validation_holdout} (the last {validation_holdout} are held out "
                                "for validation)")
        return SquadSplits(examples[:-validation_holdout], examples[-validation_holdout:], str(spec_path))
    raise WorkshopError(f"--data {spec!r} is neither 'squad', 'synthetic', a folder nor a JSON file "
                        "that exists; check the path")


def weak_scaling_subset(examples: list[QAExample], per_gpu: int, world_size: int) -> list[QAExample]:
    """The first ``per_gpu × world_size`` examples: each GPU gets the same amount of work."""
    wanted = per_gpu * world_size
    if wanted > len(examples):
        raise WorkshopError(f"weak scaling asks for {per_gpu} samples per GPU × {world_size} GPUs = "
                            f"{wanted}, but the data set has only {len(examples)}; lower "
                            "--samples-per-gpu or use a larger data set")
    return examples[:wanted]


def first_examples(examples: list[QAExample], count: int, what: str) -> list[QAExample]:
    if count > len(examples):
        raise WorkshopError(f"{what} asks for {count} examples but there are only {len(examples)}")
    return examples[:count]


# ---------------------------------------------------------------- tokenizer

def _train_local_tokenizer(path: Path, vocab_size: int) -> None:
    from tokenizers import ByteLevelBPETokenizer

    folder = ensure_synthetic_squad(data_dir())
    rows = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines()]
    corpus = [f"Question: {r['question']} Context: {r['context']} Answer: {r['answers']['text'][0]}"
              for r in rows]
    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(corpus, vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=["<pad>", "<eos>", "<unk>"], show_progress=False)
    write_atomically(path, tokenizer.to_str())


def local_tokenizer(runtime: Runtime, vocab_size: int = LOCAL_TOKENIZER_VOCAB):
    """A byte-level BPE tokenizer trained on the synthetic corpus, cached in the data folder.

    Used for tiny models and for ``--random-init`` real architectures when the hub is out of reach.
    Its ids stay below ``vocab_size``; a model with a larger vocabulary simply never sees the
    remaining rows of its embedding (they still cost memory and compute in the output layer).
    """
    from transformers import PreTrainedTokenizerFast

    path = data_dir() / f"bpe-tokenizer-{vocab_size}.json"
    if runtime.is_local_main and not path.exists():
        _train_local_tokenizer(path, vocab_size)
    barrier()
    if not path.exists():  # another node's rank 0 made it on a folder this node cannot see
        _train_local_tokenizer(path, vocab_size)
    return PreTrainedTokenizerFast(tokenizer_file=str(path), pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", bos_token="<eos>")


def hub_tokenizer(hub_name: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hub_name)
    if tokenizer.pad_token is None:  # Llama ships without one
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# ---------------------------------------------------------------- tokenized data

class CausalLMDataset(torch.utils.data.Dataset):
    """Prompt + answer padded to ``max_length``; labels copy the ids with padding set to -100."""

    def __init__(self, examples: list[QAExample], tokenizer, max_length: int = MAX_LENGTH):
        texts = [training_text(e, tokenizer.eos_token) for e in examples]
        encoded = tokenizer(texts, max_length=max_length, truncation=True, padding="max_length",
                            return_tensors="pt")
        self.input_ids = encoded["input_ids"]
        self.attention_mask = encoded["attention_mask"]
        self.labels = self.input_ids.masked_fill(self.attention_mask == 0, IGNORE_INDEX)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids[index], "attention_mask": self.attention_mask[index],
                "labels": self.labels[index]}

    @property
    def max_token_id(self) -> int:
        return int(self.input_ids.max())
