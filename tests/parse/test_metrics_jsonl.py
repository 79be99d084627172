"""metrics.jsonl (the engines' shared record format)."""

from pathlib import Path

from workshop_lib.parse.metrics import parse_metrics
from workshop_lib.parse.text import read_text

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


def test_tensor_census_fields_and_older_summaries_without_them():
    older = parse_metrics(read_text(SAMPLE)).summary
    assert older.model_state_bytes_per_rank == [] and older.step_peak_bytes_per_rank == []
    record = ('{"kind": "summary", "engine": "gpt", "world_size": 2, "model_state_bytes_per_rank": [1595928, null], '
              '"step_peak_bytes_per_rank": [7608212, "7608212"], "model_state_parts_per_rank": [{"parameters": 4}, 3]}')
    summary = parse_metrics(record).summary
    assert summary.model_state_bytes_per_rank == [1595928, None]  # a rank too short to measure: null
    assert summary.step_peak_bytes_per_rank == [7608212, 7608212]
    assert summary.model_state_parts_per_rank == [{"parameters": 4}, None]
