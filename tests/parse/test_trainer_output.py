"""HF Trainer's printed dicts and trainer_state.json."""

import json
from pathlib import Path

import pytest

from workshop_lib.core.log_text import read_text
from workshop_lib.results.parse.hf import parse_trainer_output, parse_trainer_state

SAMPLES = Path(__file__).parents[1] / "samples" / "hf"


def test_printed_dicts_of_the_seed_baseline():
    log = parse_trainer_output(read_text(SAMPLES / "baseline.out"))
    assert [entry.loss for entry in log.train] == [1.8764, 1.2871, 0.9523, 0.4311]
    assert log.eval_at_epoch(1.0).eval_loss == 1.2965
    assert log.eval_at_epoch(2.0).eval_loss == 1.581
    assert log.final_eval.eval_loss == 1.779 and log.final_eval.epoch == 2.93
    assert log.evals[0].eval_samples_per_second == 39.46
    assert log.summary.train_samples_per_second == 11.26
    assert log.summary.train_loss == 0.7039
    assert log.skipped_lines == 0


def test_string_values_duplicates_and_a_cut_record():
    log = parse_trainer_output(read_text(SAMPLES / "string_values_interleaved.out"))
    # Two ranks printed the epoch-2 record on one line: both copies are read. The cut eval keeps the
    # values printed whole before the cut ('eval_samp…' is not one) and its line is reported.
    assert [entry.loss for entry in log.train] == [2.031, 1.72, 1.5, 1.5]
    assert log.evals[0].extra["eval_f1"] == pytest.approx(0.1733)
    cut = log.evals[1]
    assert (cut.eval_loss, cut.eval_runtime, cut.eval_samples_per_second, cut.epoch) == (1.844, 0.8, None, None)
    assert [problem.line for problem in log.problems] == [5]
    assert log.summary.train_runtime == 12.5 and log.summary.train_loss == 1.75
    assert log.skipped_lines == 1


def test_truncation_anywhere_never_crashes():
    text = read_text(SAMPLES / "baseline.out")
    for cut in range(0, len(text), 53):
        log = parse_trainer_output(text[:cut])
        assert len(log.train) <= 4


def test_trainer_state():
    state = parse_trainer_state(read_text(SAMPLES / "trainer_state.json"))
    assert state.global_step == 96 and state.steps_per_epoch == 32
    assert state.log.train[-1].step == 90
    assert [entry.eval_loss for entry in state.log.evals] == [1.2965, 1.581, 1.779]
    assert state.log.summary.train_runtime == 133.21


def test_trainer_state_that_is_not_json():
    with pytest.raises(ValueError):
        parse_trainer_state(read_text(SAMPLES / "trainer_state.json")[:200])
    with pytest.raises(ValueError):
        parse_trainer_state(json.dumps([1, 2]))
