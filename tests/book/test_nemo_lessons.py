"""NeMo's lesson tables (packing, reduced-depth Mixtral): shown only where NeMo's runs exist, one engine and one
card per comparison, and the NeMo-only experiments refused by the stand-in profiles."""

from __future__ import annotations

import pandas as pd
import pytest

from workshop_lib.book.tables.nemo_lessons import lesson_tables, packing_speedup, packing_table
from workshop_lib.experiments import get_experiment, nemo_lesson_experiments
from workshop_lib.scripts.commands import nemo_factory, nemo_overrides
from workshop_lib.sites.profiles import load_profile


def _row(experiment_id: str, **values) -> dict:
    experiment = get_experiment(experiment_id)
    return {**experiment.to_dict(), "gpus": experiment.gpus, "state": "COMPLETED", "run_engine": "nemo",
            "run_gpu": "NVIDIA H100 80GB HBM3", **values}


def test_packing_ratio_is_tokens_per_second_of_one_card():
    rows = [_row("lora/llama/1-gpu", tokens_per_s=800.0, tokens_per_step=1400, mean_step_time_s=1.75),
            _row("lora/llama/1-gpu-packed", tokens_per_s=4000.0, tokens_per_step=15000, mean_step_time_s=3.75)]
    table = packing_table(pd.DataFrame(rows))
    assert list(table.frame["Tokens/s"]) == [800, 4000]
    assert "5.0x the tokens per second" in table.note
    stand_in = _row("lora/llama/1-gpu", run_engine="stand-in", tokens_per_s=None, mean_step_time_s=2.2)
    assert packing_table(pd.DataFrame([stand_in] + rows)).frame["Tokens/s"].tolist() == [800, 4000]  # NeMo's twin
    rows[1]["run_gpu"] = "NVIDIA H200"
    assert packing_speedup(rows) is None
    assert packing_table(pd.DataFrame(rows)) is None  # another card's run is no twin


def test_the_packing_sentence_and_figure_come_from_the_rows():
    from workshop_lib.book.claims import plots
    from workshop_lib.book.claims import sentences as claims

    rows = [_row("lora/llama/1-gpu", tokens_per_s=800.0, tokens_per_step=1400, mean_step_time_s=1.75,
                 gpu_peak_max_mib=20000, gpu0_util_busy_avg_pct=15.0, loss_by_step={0: 12.0, 1: 11.0}),
            _row("lora/llama/1-gpu-packed", tokens_per_s=4000.0, tokens_per_step=14000, mean_step_time_s=3.5,
                 gpu_peak_max_mib=30000, gpu0_util_busy_avg_pct=36.0, loss_by_step={0: 12.0, 1: 9.0})]
    text = claims.nemo_packing(pd.DataFrame(rows))
    assert "5.0× the tokens per second" in text and "busy 15 %" in text and "10.0× the tokens" in text
    figure = plots.loss_against_tokens(pd.DataFrame(rows))
    assert [list(line.get_xdata()) for line in figure.axes[0].lines] == [[1.4, 2.8], [14.0, 28.0]]


def test_lesson_tables_only_where_their_runs_exist():
    assert lesson_tables(1, pd.DataFrame([_row("lora/llama/1-gpu")])) == []
    assert lesson_tables(2, pd.DataFrame()) == []
    reduced = [_row(e.id, mean_step_time_s=1.0) for e in nemo_lesson_experiments() if e.chapter == 2]
    (table,) = lesson_tables(2, pd.DataFrame(reduced))
    assert list(table.frame["Layers"]) == [4, 4] and "not the chapter's 16-GPU layouts" in table.note
    assert list(table.frame["Layout"]) == ["TP 2 x DP 2 (EP 2 within DP) + SP", "TP 1 x PP 2 x DP 2 (EP 2 within DP)"]


def test_lesson_commands_are_nemos_own_options():
    packed, tp_ep, pp_ep = nemo_lesson_experiments()
    assert nemo_factory(packed, "llama31_8b") == "llama31_8b(packed_sequence=True, seq_length=2048)"
    assert "model.config.num_layers=4" in nemo_overrides(tp_ep)
    assert {"trainer.strategy.pipeline_model_parallel_size=2",
            "trainer.strategy.expert_model_parallel_size=2"} <= set(nemo_overrides(pp_ep))


@pytest.mark.parametrize("profile", ["tiny", "gpu-workstation"])
def test_the_stand_in_refuses_nemo_only_lessons(profile):
    for experiment in nemo_lesson_experiments():
        assert "lesson of NeMo itself" in load_profile(profile).unsupported_reason(experiment)
    assert load_profile("gpu-workstation-nemo").supports(nemo_lesson_experiments()[0])


def test_the_linter_reads_the_depth_a_script_asks_for():
    # The rendered Ibex script of a reduced-depth layout fits; the same script at Mixtral's 32 layers does not.
    from workshop_lib.checks.lint import lint_script
    from workshop_lib.scripts import render_script

    script = render_script(nemo_lesson_experiments()[1], "ibex")
    assert "model.config.num_layers=4" in script
    assert not [f for f in lint_script(script) if f.rule == "does-not-fit"]
    whole = script.replace("model.config.num_layers=4", "model.config.num_layers=32")
    assert [f.rule for f in lint_script(whole)] == ["does-not-fit"]
