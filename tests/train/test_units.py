"""Fast checks of the pieces the entry points are built from (no torchrun)."""

from __future__ import annotations

import json

import pytest

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.metrics_schema import SchemaError, validate_record
from workshop_lib.train import synthetic
from workshop_lib.train.data import (
    IGNORE_INDEX,
    CausalLMDataset,
    QAExample,
    load_squad,
    prompt_for,
    weak_scaling_subset,
)
from workshop_lib.train.evaluation import exact_match_and_f1, f1_score, normalize_answer
from workshop_lib.train.models import build_config, model_spec
from workshop_lib.train.runtime import Runtime


def _runtime():
    import torch

    return Runtime(rank=0, local_rank=0, world_size=1, local_world_size=1, device=torch.device("cpu"))


def test_synthetic_data_is_deterministic_with_correct_answer_spans():
    first, second = synthetic.generate_split(300, seed=7), synthetic.generate_split(300, seed=7)
    assert first == second
    assert first != synthetic.generate_split(300, seed=8)
    for record in first:
        start = record["answers"]["answer_start"][0]
        assert record["context"][start:].startswith(record["answers"]["text"][0])
    words = sorted(len(r["context"].split()) for r in first)
    assert words[0] < 80 and words[len(words) // 2] > 80 and words[-1] > 250  # a spread, not one length


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_synthetic_files_are_written_once_and_load_through_the_same_code(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_DATA_DIR", str(tmp_path))
    splits = load_squad("synthetic", _runtime())
    assert len(splits.train) == synthetic.SYNTHETIC_TRAIN_SIZE
    assert len(splits.validation) == synthetic.SYNTHETIC_VALIDATION_SIZE
    assert not list(tmp_path.rglob("*.tmp"))  # temporary files were renamed into place
    # The same records as one nested SQuAD v1.1 file: the loader flattens it identically.
    nested = {"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": e.context, "qas": [{"id": str(i), "question": e.question,
                                        "answers": [{"text": e.answers[0], "answer_start": 0}]}]}
        for i, e in enumerate(splits.train[:250])]}]}
    path = tmp_path / "nested.json"
    path.write_text(json.dumps(nested))
    from_file = load_squad(str(path), _runtime(), validation_holdout=50)
    assert from_file.train == splits.train[:200] and from_file.validation == splits.train[200:250]


def test_missing_data_path_is_a_user_error(tmp_path):
    with pytest.raises(WorkshopError, match="neither"):
        load_squad(str(tmp_path / "nope.json"), _runtime())


def test_weak_scaling_subset_grows_with_world_size_and_refuses_too_much():
    examples = [QAExample(f"q{i}", "c", ("a",)) for i in range(10)]
    assert len(weak_scaling_subset(examples, 3, 2)) == 6
    with pytest.raises(WorkshopError, match="samples per GPU"):
        weak_scaling_subset(examples, 3, 4)


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_labels_ignore_padding_and_prompt_follows_the_seeds(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_DATA_DIR", str(tmp_path))
    from workshop_lib.train.data import local_tokenizer

    tokenizer = local_tokenizer(_runtime())
    example = QAExample("Who?", "Some context here.", ("Ada",))
    assert prompt_for(example) == "Question: Who? Context: Some context here. Answer:"
    dataset = CausalLMDataset([example], tokenizer, max_length=64)
    item = dataset[0]
    padded = item["attention_mask"] == 0
    assert padded.any() and (item["labels"][padded] == IGNORE_INDEX).all()
    assert (item["labels"][~padded] == item["input_ids"][~padded]).all()
    assert dataset.max_token_id < 512  # below every model's vocabulary, tiny or real


def test_squad_scoring_matches_the_official_rules():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert f1_score("eiffel tower in paris", "the Eiffel Tower") == pytest.approx(2 * 0.5 * 1 / 1.5)
    em, f1 = exact_match_and_f1(["Paris", "x"], [QAExample("", "", ("paris",)), QAExample("", "", ("y",))])
    assert (em, f1) == (50.0, 50.0)


def test_schema_rejects_missing_fields_and_wrong_types():
    good = {"kind": "step", "step": 1, "loss": 1.0, "lr": 0.1, "step_time_s": 0.5,
            "samples_per_s": 2.0, "epoch": 0.5}
    validate_record(good)
    with pytest.raises(SchemaError):
        validate_record({k: v for k, v in good.items() if k != "lr"})
    with pytest.raises(SchemaError):
        validate_record({**good, "step": "1"})
    with pytest.raises(SchemaError):
        validate_record({**good, "loss": float("nan")})


def test_summary_schema_takes_one_census_entry_per_rank():
    summary = {"kind": "summary", "engine": "gpt", "settings": {}, "model": "gpt", "world_size": 2, "nodes": 1,
               "precision": "fp32", "device": "cpu", "samples": 8, "train_runtime_s": 1.0, "samples_per_s": 8.0,
               "mean_step_time_s": 0.1, "final_loss": 6.0, "eval_loss": None, "eval_em": None, "eval_f1": None,
               "trainable_params": 10, "total_params": 10, "local_params_per_rank": [5, 5],
               "peak_memory_mib_per_rank": [500.0, 500.0], "peak_memory_kind": "cpu_max_rss",
               "model_state_bytes_per_rank": [80, None], "model_state_parts_per_rank": [{"parameters": 20}, None],
               # a rank that ran fewer than two steps records null
               "step_peak_bytes_per_rank": [200, None], "training_peak_bytes_per_rank": [None, None]}
    validate_record(summary)
    with pytest.raises(SchemaError, match="entries"):
        validate_record({**summary, "step_peak_bytes_per_rank": [200, 1.5]})
    with pytest.raises(SchemaError, match="world size"):
        validate_record({**summary, "model_state_bytes_per_rank": [80]})


def test_bloom_560m_random_init_config_has_the_real_dimensions():
    config = build_config(model_spec("bloom-560m"))
    assert (config.hidden_size, config.n_layer, config.n_head, config.vocab_size) == (1024, 24, 16, 250880)
    with pytest.raises(WorkshopError, match="registry"):
        model_spec("bloom-7b")


def test_a_requeued_job_keeps_the_earlier_attempts_metrics(tmp_path, monkeypatch):
    from workshop_lib.train.metrics import MetricsWriter

    first = MetricsWriter(tmp_path, enabled=True)
    first.step(1, 9.0, 1e-4, 0.5, 8, 0.1)
    first.step(2, 8.0, 1e-4, 0.5, 8, 0.2)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # SLURM started the job again (NODE_FAIL, requeue)
    second = MetricsWriter(tmp_path, enabled=True)
    second.step(1, 9.1, 1e-4, 0.5, 8, 0.1)
    kept = (tmp_path / "metrics.attempt0.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in kept] == [1, 2]
    assert [json.loads(line)["loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [9.1]
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")  # a plain rerun into the same folder starts afresh
    MetricsWriter(tmp_path, enabled=True)
    assert (tmp_path / "metrics.jsonl").read_text() == "" and not (tmp_path / "metrics.attempt-1.jsonl").exists()
