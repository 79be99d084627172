"""The ``padding`` and ``grouping`` features: each batch cut to its longest sample, batches of similar lengths.

The data sets (``workshop_lib.train.data``) pad every sample to the full length, as the seeds do. Here
they are seen without that padding (:class:`UnpaddedView`), so a length-grouped sampler sees the real
lengths, and the collator pads each batch again, only as far as its longest sample needs.
"""

from __future__ import annotations

import torch

from workshop_lib.core.errors import WorkshopError
from workshop_lib.train.data import IGNORE_INDEX

PAD_MULTIPLE = 16  # dynamic padding rounds the batch length up to this (tensor-core friendly)


class UnpaddedView(torch.utils.data.Dataset):
    """A padded ``CausalLMDataset`` seen sample by sample without its padding, so a
    length-grouped sampler sees the real lengths and the collator pads per batch."""

    def __init__(self, padded):
        self.padded = padded
        self.lengths = padded.attention_mask.sum(dim=1).tolist()

    def __len__(self) -> int:
        return len(self.padded)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        length = self.lengths[index]
        return {key: value[:length] for key, value in self.padded[index].items()}


class DynamicPaddingCollator:
    """Stack samples, cutting (or padding) them to the longest real length in the batch.

    Works on padded samples (``CausalLMDataset``) and on unpadded ones (``padded=False``) alike;
    the padding side is the right, as the tokenizer pads, so cutting only drops pad columns.
    """

    def __init__(self, pad_token_id: int, multiple: int = PAD_MULTIPLE, max_length: int | None = None):
        self.pad_token_id = pad_token_id
        self.multiple = multiple
        self.max_length = max_length

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        lengths = [int(f["attention_mask"].sum()) for f in features]
        target = -(-max(lengths) // self.multiple) * self.multiple
        if self.max_length is not None:
            target = min(target, self.max_length)
        batch = {"input_ids": torch.full((len(features), target), self.pad_token_id, dtype=torch.long),
                 "attention_mask": torch.zeros((len(features), target), dtype=torch.long),
                 "labels": torch.full((len(features), target), IGNORE_INDEX, dtype=torch.long)}
        for row, (feature, length) in enumerate(zip(features, lengths)):
            for key in batch:
                batch[key][row, :length] = feature[key][:length]
        return batch


def sampler_arguments(training_argument_names: set[str] | None = None) -> dict:
    """The TrainingArguments that turn on length grouping in this transformers version (its arguments'
    names unless given)."""
    if training_argument_names is None:
        import dataclasses

        from transformers import TrainingArguments

        training_argument_names = {f.name for f in dataclasses.fields(TrainingArguments)}
    if "train_sampling_strategy" in training_argument_names:  # transformers >= 5.2x
        return {"train_sampling_strategy": "group_by_length"}
    if "group_by_length" in training_argument_names:
        return {"group_by_length": True}
    raise WorkshopError("this transformers version has no length-grouped sampler; drop +grouping")
