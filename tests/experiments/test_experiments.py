"""The chapters' matrices as data: every seed row present, ids readable, hashes stable."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest
from repo_paths import TESTS

from workshop_lib.checks.experiment_rules import validate_experiment
from workshop_lib.cli import main
from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.paths import SLURM_DIR
from workshop_lib.experiments import CHAPTERS, all_experiments, chapter_experiments, get_experiment, select_experiments


def by_group(chapter: int, group: str):
    return [experiment for experiment in chapter_experiments(chapter) if experiment.group == group]


def test_ids_are_unique_readable_and_start_with_the_chapter_track():
    experiments = all_experiments()
    ids = [experiment.id for experiment in experiments]
    assert len(ids) == len(set(ids))
    tracks = {chapter: {row.id.split("/")[0] for row in chapter_experiments(chapter)} for chapter in CHAPTERS}
    assert tracks[1] == {"lora"} and tracks[3] == {"zero"}
    assert all(len(track) == 1 for track in tracks.values()), f"each chapter's ids start with its one track: {tracks}"
    assert len({track.pop() for track in tracks.values()}) == len(CHAPTERS), "no two chapters share a track"
    for experiment in experiments:
        assert re.fullmatch(r"[a-z0-9-]+(/[a-z0-9-]+)+", experiment.id), experiment.id


def test_every_experiment_passes_its_own_validation():
    for experiment in all_experiments():
        assert validate_experiment(experiment) == [], experiment.id


def test_chapter_1_lora_rows_and_mixtral_expert_parallel():
    llama = by_group(1, "llama")
    mixtral = by_group(1, "mixtral")
    assert [experiment.gpus for experiment in llama] == [1, 2, 4, 8]
    assert [experiment.gpus for experiment in mixtral] == [2, 4, 8]
    for experiment in llama + mixtral:
        assert experiment.peft == "lora"
        assert (experiment.max_steps, experiment.global_batch, experiment.warmup_steps,
                experiment.limit_val_batches) == (250, 8, 50, 10)
    assert all(experiment.expert_parallel == experiment.gpus for experiment in mixtral)


def test_chapter_2_model_parallel_layouts_divide_the_gpus_and_never_use_lora():
    experiments = chapter_experiments(2)
    assert [(e.tensor_parallel, e.gpus) for e in by_group(2, "llama")] == [(2, 4), (4, 4), (8, 8)]
    # Full fine-tuning of Mixtral does not fit one 8-GPU node: two nodes, pipeline stages across them.
    assert [(e.tensor_parallel, e.pipeline_parallel, e.expert_parallel, e.nodes, e.gpus)
            for e in by_group(2, "mixtral")] == [(2, 4, 2, 2, 16), (4, 2, 2, 2, 16)]
    for experiment in experiments:
        assert experiment.peft == "none"
        # Megatron: DP = GPUs / (TP x PP); experts come out of the DP ranks, so TP x EP x PP divides too.
        assert experiment.gpus % (experiment.tensor_parallel * experiment.pipeline_parallel) == 0
        assert experiment.gpus % (experiment.tensor_parallel * experiment.pipeline_parallel
                                  * (experiment.expert_parallel or 1)) == 0
    assert all(experiment.sequence_parallel and experiment.expert_parallel for experiment in by_group(2, "mixtral"))


def test_chapter_3_zero_matrix_and_its_deepspeed_configs_exist():
    single = by_group(3, "single-gpu")
    assert {(e.zero_stage, e.offload, e.pin_memory) for e in single} == {
        (0, False, False), (1, False, False), (2, False, False), (3, False, False),
        (1, True, False), (2, True, False), (3, True, False), (2, True, True)}
    assert {(e.zero_stage, e.offload) for e in by_group(3, "two-gpus")} == {
        (stage, offload) for stage in (1, 2, 3) for offload in (False, True)}
    assert all(e.gpus == 2 for e in by_group(3, "two-gpus"))
    assert [(e.gpus, e.samples_per_gpu) for e in by_group(3, "multi-gpu")] == [(2, 500), (4, 500), (8, 500)]
    assert [(e.nodes, e.samples_per_gpu) for e in by_group(3, "multi-node")] == [(2, 250), (4, 250), (8, 250)]
    assert get_experiment("zero/baseline").zero_stage is None
    for experiment in chapter_experiments(3):
        if experiment.deepspeed_config:
            assert (SLURM_DIR / "ds_configs" / experiment.deepspeed_config).is_file(), experiment.deepspeed_config


def test_chapter_4_strategies_gpt_and_weak_scaling():
    strategies = by_group(4, "strategies")
    assert {(e.fsdp, e.offload) for e in strategies} == {
        (s, o) for s in ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD") for o in (False, True)}
    assert all(e.nodes >= 2 for e in strategies if e.fsdp == "HYBRID_SHARD")
    gpt = by_group(4, "gpt")
    assert sorted((e.nodes, e.gpus) for e in gpt) == [(1, 1), (1, 2), (1, 4), (1, 8), (2, 2), (4, 4), (8, 8)]
    weak = by_group(4, "weak-scaling")
    assert [(e.gpus, e.gpt.layers, e.per_device_batch) for e in weak] == [(2, 3, 8), (4, 6, 4), (8, 12, 2), (16, 24, 1)]
    # Multi-node FSDP checks the interconnect first.
    assert all(e.nccl_check for e in chapter_experiments(4) if e.multi_node)


def test_content_hash_is_stable_across_processes_and_follows_every_field():
    experiment = get_experiment("zero/single-gpu/zero2-offload")
    other_process = subprocess.run(
        [sys.executable, "-c", "from workshop_lib.experiments import get_experiment as g; "
         "print(g('zero/single-gpu/zero2-offload').content_hash)"],
        capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert other_process.stdout.strip() == experiment.content_hash
    changed = dataclasses.replace(experiment, per_device_batch=8)
    assert changed.content_hash != experiment.content_hash
    assert len({e.content_hash for e in all_experiments()}) == len(all_experiments())


def test_selection_errors_name_the_problem():
    with pytest.raises(WorkshopError, match="unknown experiment 'zero/nope'.*zero/"):
        get_experiment("zero/nope")
    with pytest.raises(WorkshopError, match="no chapter 7"):
        chapter_experiments(7)
    chosen = select_experiments(["fsdp/baseline", "fsdp/baseline"], chapter=2)
    assert chosen[0].id == "fsdp/baseline" and len(chosen) == 1 + len(chapter_experiments(2))


def test_cli_lists_experiments_as_json_and_table(capsys):
    assert main(["experiments", "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [row["id"] for row in listed] == [e.id for e in all_experiments()]
    assert main(["experiments", "--chapter", "3", "--profile", "tiny"]) == 0
    table = capsys.readouterr().out
    assert "zero/multi-node/8-nodes" in table and "lora/" not in table
    assert f"chapter 3: {len(chapter_experiments(3))}" in table
    assert set(CHAPTERS) == {row.chapter for row in all_experiments()}, "every chapter lists rows, none lies outside"


def test_content_hashes_of_every_experiment_are_those_recorded():
    """A run folder is reused when its experiment's content hash matches, so a refactoring that renamed or
    reordered a field (of Experiment or GptShape) would silently re-run every experiment of every participant.
    tests/data/experiment_content_hashes.json was written from the experiments before issue 26's restructuring."""
    import json

    from workshop_lib.core.vocabulary import HF, RECIPES
    from workshop_lib.experiments import all_experiments, engine_scaling_experiments, large_gpu_experiments, with_recipe

    recorded = json.loads((TESTS / "data" / "experiment_content_hashes.json").read_text())
    now = {}
    for experiment in [*all_experiments(), *large_gpu_experiments(), *engine_scaling_experiments()]:
        for recipe in RECIPES if experiment.engine == HF else (experiment.recipe,):
            variant = with_recipe(experiment, recipe)
            now[variant.id] = variant.content_hash
    # Every recorded experiment keeps its hash; experiments added since (a new chapter's) are new entries.
    assert {experiment_id: now.get(experiment_id) for experiment_id in recorded} == recorded
