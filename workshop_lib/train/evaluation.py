"""Exact match and F1 by greedy generation, scored like the official SQuAD v1.1 script."""

from __future__ import annotations

import re
import string
from collections import Counter

import torch

from workshop_lib.train.data import QAExample, prompt_for


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation, articles and extra whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def f1_score(prediction: str, truth: str) -> float:
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(truth).split()
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def best_over_answers(metric, prediction: str, answers: tuple[str, ...]) -> float:
    """SQuAD keeps the best score over the reference answers."""
    return max(metric(prediction, answer) for answer in answers)


@torch.no_grad()
def generate_answers(model, tokenizer, examples: list[QAExample], device, max_length: int,
                     max_new_tokens: int = 16, synced: bool = False) -> list[str]:
    """Greedy answers, one prompt at a time (no padding questions, prompts are few).

    ``synced`` keeps every rank generating until all are done — needed when parameters are
    sharded (ZeRO-3, FSDP2), where each forward is a collective.
    """
    model.eval()
    answers = []
    for example in examples:
        encoded = tokenizer(prompt_for(example), return_tensors="pt", truncation=True,
                            max_length=max_length - max_new_tokens)
        input_ids = encoded["input_ids"].to(device)
        extra = {"synced_gpus": True} if synced else {}
        output = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                max_new_tokens=max_new_tokens, do_sample=False,
                                eos_token_id=tokenizer.eos_token_id,
                                pad_token_id=tokenizer.pad_token_id, **extra)
        text = tokenizer.decode(output[0, input_ids.shape[1]:], skip_special_tokens=True)
        answers.append(text.split("\n")[0].strip())
    model.train()
    return answers


def exact_match_and_f1(predictions: list[str], examples: list[QAExample]) -> tuple[float, float]:
    """Mean EM and F1 in percent, as SQuAD reports them."""
    if not examples:
        return 0.0, 0.0
    em = sum(best_over_answers(exact_match, p, e.answers) for p, e in zip(predictions, examples))
    f1 = sum(best_over_answers(f1_score, p, e.answers) for p, e in zip(predictions, examples))
    return 100.0 * em / len(examples), 100.0 * f1 / len(examples)
