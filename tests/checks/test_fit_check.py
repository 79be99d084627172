"""The fit rule: a NeMo experiment predicted not to fit the profile's GPUs is refused, with the
prediction, the limit and a layout that fits; the chapter matrices fit an 80 GB A100."""

from __future__ import annotations

import dataclasses

import pytest
from repo_paths import REPO

from workshop_lib.checks.experiment_rules import validate_experiment
from workshop_lib.checks.findings import ValidationError
from workshop_lib.estimate.fit import MARGIN, check_fit, predict
from workshop_lib.experiments import chapter_experiments, get_experiment
from workshop_lib.scripts import render_script
from workshop_lib.sites.profiles import load_profile

SEED_001_MIXTRAL = {  # chapter 2's Mixtral layouts before the redesign: one node, no pipeline
    "tp2-ep2-sp": dict(nodes=1, gpus_per_node=4, tensor_parallel=2, pipeline_parallel=1, expert_parallel=2),
    "tp4-ep2-sp": dict(nodes=1, gpus_per_node=8, tensor_parallel=4, pipeline_parallel=1, expert_parallel=2),
}


def _seed_layout(name: str):
    base = get_experiment("model-parallel/mixtral/tp2-pp4-ep2-sp")
    return dataclasses.replace(base, id=f"model-parallel/mixtral/{name}", **SEED_001_MIXTRAL[name])


@pytest.mark.parametrize("chapter", [1, 2])
def test_every_chapter_row_fits_an_80_gb_a100_with_the_margin(chapter):
    ibex = load_profile("ibex")
    for experiment in chapter_experiments(chapter):
        verdict = check_fit(experiment, ibex.gpu_memory_gib)
        assert verdict.fits, verdict.message()
        assert [f for f in validate_experiment(experiment, ibex) if f.rule == "does-not-fit"] == []


@pytest.mark.parametrize("name, predicted", [("tp2-ep2-sp", 209.4), ("tp4-ep2-sp", 104.7)])
def test_the_seed_mixtral_layouts_are_refused_with_the_prediction_and_a_layout_that_fits(name, predicted):
    experiment = _seed_layout(name)
    findings = [f for f in validate_experiment(experiment, load_profile("ibex")) if f.rule == "does-not-fit"]
    assert len(findings) == 1 and findings[0].is_error
    message, fix = findings[0].message, findings[0].fix
    assert f"needs {predicted:.1f} GiB per GPU" in message
    assert f"{80 * (1 - MARGIN):.1f} GiB usable of the profile's 80 GiB GPUs" in message
    assert "2 nodes x 8 GPUs" in fix and "PP=" in fix  # full fine-tuning needs two nodes and pipeline stages
    with pytest.raises(ValidationError, match="does-not-fit"):
        render_script(experiment, "ibex")


def test_the_suggested_layout_fits_by_the_same_estimate():
    verdict = check_fit(_seed_layout("tp2-ep2-sp"), 80)
    where, layout = verdict.suggestion.split(", ", 1)
    sizes = dict(part.split("=") for part in layout.split(" (")[0].replace(" + SP", "").split(" x "))
    trial = dataclasses.replace(_seed_layout("tp2-ep2-sp"), nodes=2, gpus_per_node=8,
                                tensor_parallel=int(sizes["TP"]), pipeline_parallel=int(sizes["PP"]),
                                expert_parallel=int(sizes["EP"]))
    assert where == "2 nodes x 8 GPUs" and check_fit(trial, 80).fits


def test_llama_tp2_on_two_gpus_fits_an_h200_but_not_an_a100():
    experiment = get_experiment("model-parallel/llama/tp2")
    assert not check_fit(experiment, 80).fits and check_fit(experiment, 140).fits
    assert "4 GPUs, TP=2 x PP=1" in check_fit(experiment, 80).suggestion  # DP 2 halves the optimizer states
    render_script(experiment, "gpu-workstation")  # the stand-in's own estimate fits an H200


def test_stand_in_estimates_follow_what_the_stand_in_holds():
    mixtral = get_experiment("lora/mixtral/2-gpus")
    nemo, stand_in = predict(mixtral), predict(mixtral, stand_in=True)
    # NeMo splits the experts over EP=2; the DDP stand-in keeps the whole 16-bit base on every GPU.
    assert stand_in.parameters > 1.8 * nemo.parameters
    assert stand_in.setup.resolved_engine == "ddp" and nemo.setup.resolved_engine == "megatron"


def test_tiny_profile_has_no_gpu_memory_and_no_fit_check():
    assert load_profile("tiny").gpu_memory_gib is None
    assert [f for f in validate_experiment(_seed_layout("tp2-ep2-sp"), load_profile("tiny"))
            if f.rule == "does-not-fit"] == []


def test_the_predictions_quoted_in_the_book_are_the_estimators():
    """Answers, chapter 2 and the seed corrections quote predictions: they must be what the estimator says."""

    root = REPO
    answers = (root / "book" / "answers.md").read_text()
    chapter = (root / "notebooks" / "02_model_parallel.py").read_text()
    corrections = (root / "book" / "seed_corrections.md").read_text()
    exact = {f"{check_fit(get_experiment(i), 80).predicted_gib:.1f} GiB" for i in (
        "model-parallel/llama/tp2-dp2", "model-parallel/llama/tp4", "model-parallel/llama/tp8",
        "model-parallel/llama/tp2", "model-parallel/mixtral/tp2-pp4-ep2-sp", "model-parallel/mixtral/tp4-pp2-ep2-sp")}
    exact |= {f"{check_fit(_seed_layout(name), 80).predicted_gib:.1f} GiB" for name in SEED_001_MIXTRAL}
    for quoted in exact:
        assert quoted in answers, quoted
    for name in SEED_001_MIXTRAL:
        about = f"about {check_fit(_seed_layout(name), 80).predicted_gib:.0f} GiB"
        assert about in corrections or about.replace(" GiB", "") in chapter, about
    assert f"about {check_fit(get_experiment('model-parallel/llama/tp2'), 80).predicted_gib:.0f} GiB" in chapter


def test_the_fit_reads_nemos_resolved_recipe_uses_defaults_without_one_and_refuses_a_damaged_one(tmp_path,
                                                                                                  monkeypatch):
    import json
    import re

    from workshop_lib.core import reference
    from workshop_lib.core.errors import WorkshopError
    from workshop_lib.estimate.fit import RECIPE_DEFAULTS, nemo_setup

    experiment = get_experiment("lora/llama/1-gpu")
    monkeypatch.setattr(reference, "RESOLVED_DIR", tmp_path)
    path = tmp_path / reference.RESOLVED_FILE
    path.write_text(json.dumps([{"id": experiment.id, "accepted": True, "layout": {"micro_batch": 2},
                                 "resolved": {"seq_length": 1024}}]))
    assert (nemo_setup(experiment).batch, nemo_setup(experiment).seq_len) == (2, 1024)
    path.unlink()  # nothing resolved yet: the recipes' defaults
    setup = nemo_setup(experiment)
    assert (setup.batch, setup.seq_len) == (RECIPE_DEFAULTS["micro_batch"], RECIPE_DEFAULTS["seq_length"])
    path.write_text('[{"id": "lora/llama/1-gpu", "accepted": tr')  # cut short while written
    damaged = rf"{re.escape(str(path))} cannot be read as NeMo's resolved recipes .*make nemo-check"
    with pytest.raises(WorkshopError, match=damaged):
        nemo_setup(experiment)
