"""metrics.jsonl (the engines' shared record format)."""

from pathlib import Path

from workshop_lib.core.log_text import read_text
from workshop_lib.results.parse.metrics import parse_metrics

SAMPLE = Path(__file__).parents[1] / "samples" / "metrics" / "metrics.jsonl"


def test_complete_file():
    log = parse_metrics(read_text(SAMPLE))
    assert [record.step for record in log.steps] == [1, 2, 3, 4]
    assert log.steps[-1].loss == 5.7012
    assert log.evals[0].eval_f1 == 0.0412
    summary = log.summary
    assert summary.engine == "deepspeed" and summary.settings["zero_stage"] == 2
    assert summary.world_size == 2 and summary.local_params_per_rank == [1843712, 1843712]
    assert summary.peak_memory_mib == 412.5
    assert log.skipped_lines == 0


def test_cut_last_line_loses_only_the_summary():
    text = read_text(SAMPLE)
    log = parse_metrics(text[: len(text) - 40])
    assert len(log.steps) == 4 and log.summary is None
    assert log.skipped_lines == 1


def test_two_writers_on_one_line_and_garbage():
    lines = read_text(SAMPLE).splitlines()
    text = "\n".join([lines[0] + lines[1], "not json at all", '{"kind": "step", "step": 3}',
                      '{"kind": "mystery"}', "\x00\x00", *lines[2:]])
    log = parse_metrics(text)
    assert [record.step for record in log.steps] == [1, 2, 3, 4]
    assert log.summary is not None
    assert log.skipped_lines == 4  # prose, a step without loss, an unknown kind, NUL bytes
    assert [(problem.line, problem.reason) for problem in log.problems] == [
        (2, "no JSON record on this line (cut or not JSON)"), (3, "a step record without a readable step or loss"),
        (4, "a record of unknown kind 'mystery' (expected step, eval or summary)"),
        (5, "no JSON record on this line (cut or not JSON)")]


def test_tensor_census_fields_and_older_summaries_without_them():
    older = parse_metrics(read_text(SAMPLE)).summary
    assert older.model_state_bytes_per_rank == [] and older.step_peak_bytes_per_rank == []
    record = ('{"kind": "summary", "engine": "gpt", "world_size": 2, "model_state_bytes_per_rank": [1595928, null], '
              '"step_peak_bytes_per_rank": [7608212, "7608212"], "model_state_parts_per_rank": [{"parameters": 4}, 3]}')
    summary = parse_metrics(record).summary
    assert summary.model_state_bytes_per_rank == [1595928, None]  # a rank too short to measure: null
    assert summary.step_peak_bytes_per_rank == [7608212, 7608212]
    assert summary.model_state_parts_per_rank == [{"parameters": 4}, None]


def test_the_reader_holds_every_field_of_the_writers_schema():
    from dataclasses import fields

    from workshop_lib.core.metrics_schema import EVAL_FIELDS, STEP_FIELDS, SUMMARY_FIELDS
    from workshop_lib.results.parse.metrics import EvalRecord, RunSummary, StepRecord

    for record_type, schema in ((StepRecord, STEP_FIELDS), (EvalRecord, EVAL_FIELDS), (RunSummary, SUMMARY_FIELDS)):
        assert {field.name for field in fields(record_type)} == set(schema) - {"kind"}, record_type.__name__


def test_a_record_the_writer_accepts_reads_back_with_the_same_values():
    import json

    from workshop_lib.core.metrics_schema import validate_record

    summary = {"kind": "summary", "engine": "fsdp", "settings": {"fsdp": "FULL_SHARD"}, "model": "gpt",
               "world_size": 2, "nodes": 1, "precision": "bf16", "device": "cuda", "samples": 64,
               "train_runtime_s": 12.5, "samples_per_s": 5.12, "mean_step_time_s": 0.4, "final_loss": 2.5,
               "eval_loss": 2.7, "eval_em": None, "eval_f1": None, "trainable_params": 100, "total_params": 100,
               "local_params_per_rank": [50, 50], "peak_memory_mib_per_rank": [1000.5, 990.0],
               "peak_memory_kind": "cuda_max_allocated", "model_state_bytes_per_rank": [800, 800],
               "model_state_parts_per_rank": [{"parameters": 400}, {"parameters": 400}],
               "step_peak_bytes_per_rank": [1200, None], "training_peak_bytes_per_rank": [None, None]}
    step = {"kind": "step", "step": 3, "loss": 2.5, "lr": 1e-4, "step_time_s": 0.4, "samples_per_s": 20.0,
            "epoch": 0.5}
    for record in (summary, step):
        validate_record(record)
    log = parse_metrics("\n".join(json.dumps(record) for record in (step, summary)))
    assert vars(log.steps[0]) == {key: value for key, value in step.items() if key != "kind"}
    assert vars(log.summary) == {key: value for key, value in summary.items() if key != "kind"}
