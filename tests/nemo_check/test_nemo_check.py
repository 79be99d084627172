"""NeMo checks the chapters' commands: NeMo 2.4.1 (the 25.07 container's) resolves every rendered
`nemo llm finetune` command, refuses broken ones, and its real CLI agrees.

The slow tests build the NeMo environment once (cached under ~/.cache/workshop/nemo-venv, ~3 min cold).
"""

from __future__ import annotations

import dataclasses

import pytest

from workshop_lib.checks.nemo_command import command_from_script, nemo_overrides
from workshop_lib.core.reference import load_resolved
from workshop_lib.estimate import TrainingSetup
from workshop_lib.experiments import get_experiment
from workshop_lib.nemo_check.check import commands_for, nemo_experiments, resolve_commands, run_cli
from workshop_lib.scripts import render_script


def test_command_is_read_from_the_rendered_script():
    experiment = get_experiment("model-parallel/mixtral/tp2-pp4-ep2-sp")
    command = command_from_script(render_script(experiment, "ibex"))
    assert command.factory == "mixtral_8x7b(peft_scheme=None)"
    assert "trainer.strategy.pipeline_model_parallel_size=4" in command.overrides
    assert command.flags == ("--yes",)
    assert all("=" in override for override in command.overrides)


def test_one_reading_of_the_words_serves_the_linter_and_nemo_check():
    """The same shell words, each with its line: the linter's overrides (also inside a quoted list of
    arguments) and nemo_check's factory, overrides and flags."""
    script = ('#!/bin/bash\nARGS="trainer.num_nodes=2 peft=none"\n'
              "srun nemo llm finetune --factory 'llama31_8b(peft_scheme=None)' $ARGS \\\n"
              '    trainer.devices=4 \\\n    trainer.strategy.tensor_model_parallel_size="2" --yes || exit 1\n')
    overrides = nemo_overrides(script)
    assert [(overrides.value(key), overrides.line(key)) for key in (
        "trainer.num_nodes", "peft", "trainer.devices", "trainer.strategy.tensor_model_parallel_size")] == [
        ("2", 2), ("none", 2), ("4", 4), ("2", 5)]
    command = command_from_script(script)
    assert command.factory == "llama31_8b(peft_scheme=None)" and command.flags == ("--yes",)
    assert command.overrides == ("$ARGS", "trainer.devices=4", "trainer.strategy.tensor_model_parallel_size=2")


def test_stored_resolutions_cover_every_nemo_experiment_and_match_the_layouts():
    """book/reference/nemo/resolved.json is what the stand-ins and the book read: it must be current."""
    stored = load_resolved()
    for experiment in nemo_experiments():
        record = stored[experiment.id]
        assert record["accepted"], record["errors"]
        command = commands_for([experiment])[0]
        assert (record["factory"], record["overrides"]) == (command["factory"], command["overrides"]), \
            f"{experiment.id}: rendered command changed; run `make nemo-check`"
        layout = record["layout"]
        setup = TrainingSetup(gpus=experiment.gpus, nodes=experiment.nodes, tensor_parallel=experiment.tensor_parallel,
                              pipeline_parallel=experiment.pipeline_parallel,
                              expert_parallel=experiment.expert_parallel or 1, engine="megatron")
        # NeMo's data parallelism and the estimator's agree, for attention and for experts.
        assert (layout["dp"], layout["expert_dp"]) == (setup.data_parallel, setup.expert_data_parallel)
        assert layout["global_batch"] == layout["dp"] * layout["micro_batch"] * layout["micro_batches_per_step"]


def test_resolved_file_is_read_once_per_version(tmp_path):
    """Every rendered script asks for the resolved records: one reading serves them until the file changes."""
    import json
    import os

    path = tmp_path / "resolved.json"
    path.write_text(json.dumps([{"id": "a", "accepted": True}]))
    first = load_resolved(tmp_path)
    assert load_resolved(tmp_path) is first and first["a"]["accepted"] is True
    path.write_text(json.dumps([{"id": "a", "accepted": False}]))  # same size: seen by its new time
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert load_resolved(tmp_path)["a"]["accepted"] is False
    path.write_text(json.dumps([{"id": "b", "accepted": True}, {"id": "c", "accepted": True}]))
    assert sorted(load_resolved(tmp_path)) == ["b", "c"]
    assert load_resolved() is load_resolved(), "the stored file (book/reference/nemo) is read once too"


@pytest.fixture(scope="module")
def resolved_now(tmp_path_factory, progress_line):
    import time

    out = tmp_path_factory.mktemp("resolved")
    started = time.monotonic()
    progress_line("NeMo resolves every chapter 1-2 command (its environment is built first if missing: "
                  "~/.cache/workshop/nemo-venv, 2.4 GB and about 3 minutes, once)")
    records = {record["id"]: record for record in resolve_commands(commands_for(nemo_experiments()), out)}
    progress_line(f"NeMo resolved {len(records)} commands in {time.monotonic() - started:.0f} s")
    return records, out


@pytest.mark.slow
def test_nemo_accepts_every_chapter_command_as_stored(resolved_now):
    records, out = resolved_now
    stored = load_resolved()
    for experiment in nemo_experiments():
        record = records[experiment.id]
        assert record["accepted"], f"{experiment.id}: {record['errors']}"
        assert record["resolved"] == stored[experiment.id]["resolved"], f"{experiment.id}: run `make nemo-check`"
        assert record["layout"] == stored[experiment.id]["layout"]
        table = (out / record["dryrun"]).read_text()
        assert "Resolved Arguments" in table and "SquadDataModule(" in table and "seq_length=2048" in table
        assert "micro_batch_size=1" in table  # a longer SquadDataModule (packed) is printed over several lines
        resolved = record["resolved"]
        if experiment.peft == "none":  # the recipe's own full fine-tune
            assert resolved["peft"] is None and resolved["learning_rate"] == 5e-6
            assert resolved["distributed_optimizer"] is True
        else:
            assert resolved["peft"]["dim"] == experiment.lora_rank and resolved["learning_rate"] == 1e-4
        assert record["layout"]["tp"] == experiment.tensor_parallel
        assert record["layout"]["pp"] == experiment.pipeline_parallel
        assert record["layout"]["vpp"] is None
        assert record["layout"]["world_size"] == experiment.gpus


BROKEN = {
    # a typo under trainer.strategy.* passes NeMo's CLI silently (MegatronStrategy takes **kwargs)
    "strategy-typo": ("model-parallel/llama/tp4", {"trainer.strategy.tensor_model_parallel_size=4":
                                                   "trainer.strategy.tensor_model_paralel_size=4"},
                      "MegatronStrategy has no parameter 'tensor_model_paralel_size'"),
    "tp-does-not-divide": ("model-parallel/llama/tp4", {"trainer.strategy.tensor_model_parallel_size=4":
                                                        "trainer.strategy.tensor_model_parallel_size=3"},
                           "not divisible by TP x PP x CP = 3 x 1 x 1"),
    "experts-do-not-divide": ("lora/mixtral/4-gpus", {"trainer.strategy.expert_model_parallel_size=4":
                                                      "trainer.strategy.expert_model_parallel_size=3"},
                              "8 experts are not divisible by expert_model_parallel_size 3"),
    "tp-with-ep-without-sp": ("model-parallel/mixtral/tp2-pp4-ep2-sp", {"trainer.strategy.sequence_parallel=True":
                                                                        "trainer.strategy.sequence_parallel=False"},
                              "sequence parallelism must be used"),
    "unknown-key": ("lora/llama/1-gpu", {"trainer.max_steps=250": "trainer.max_step=250"},
                    "No parameter named 'max_step'"),
}


@pytest.mark.slow
def test_nemo_refuses_planted_faults(tmp_path):
    commands = []
    for name, (experiment_id, swaps, _) in BROKEN.items():
        command = commands_for([get_experiment(experiment_id)])[0]
        overrides = [swaps.get(override, override) for override in command["overrides"]]
        assert overrides != command["overrides"], name
        commands.append({**command, "id": name, "overrides": overrides})
    records = {record["id"]: record for record in resolve_commands(commands, tmp_path)}
    for name, (_, _, expected) in BROKEN.items():
        assert not records[name]["accepted"], name
        assert any(expected in error for error in records[name]["errors"]), (name, records[name]["errors"])


@pytest.mark.slow
def test_the_real_cli_dry_runs_a_rendered_command_and_refuses_a_wrong_key():
    command = command_from_script(render_script(get_experiment("lora/llama/2-gpus"), "ibex"))
    dry = run_cli([*command.arguments, "--dryrun"])
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    assert "Resolved Arguments" in dry.stdout and "global_batch_size=8" in dry.stdout
    assert "LoRA(dim=8, alpha=16)" in dry.stdout and "devices='2'" in dry.stdout
    wrong = [override.replace("trainer.max_steps", "trainer.max_step") for override in command.overrides]
    refused = run_cli(["--factory", command.factory, *wrong, "--yes", "--dryrun"])
    assert refused.returncode != 0 and "max_step" in refused.stdout + refused.stderr


def test_a_full_fine_tune_uses_the_recipe_not_peft_none():
    experiment = get_experiment("model-parallel/llama/tp4")
    command = command_from_script(render_script(experiment, "ibex"))
    assert command.factory == "llama31_8b(peft_scheme=None)" and "peft=none" not in command.overrides
    lora = dataclasses.replace(experiment, peft="lora", tensor_parallel=1)
    assert command_from_script(render_script(lora, "ibex")).factory == "llama31_8b"


def test_full_fine_tunes_write_no_checkpoints_and_lora_keeps_its_adapters():
    """Chapter 2's recipes would save weights and optimizer state every 50 steps (terabytes per participant);
    NeMo's own resolution (resolved.json) shows the rendered overrides switch that off, and only there."""
    stored = load_resolved()
    for experiment in nemo_experiments():
        overrides = commands_for([experiment])[0]["overrides"]
        checkpoints = stored[experiment.id]["resolved"]["checkpoints"]
        if experiment.peft == "none":
            assert overrides[-2:] == ["log.ckpt=None", "trainer.enable_checkpointing=False"], experiment.id
            assert checkpoints == {"enable_checkpointing": False, "model_checkpoint": None}, experiment.id
        else:  # LoRA: the recipe's checkpoints hold the adapter only (NeMo's PEFT wraps the checkpoint IO)
            assert not any(override.startswith(("log.ckpt", "trainer.enable_checkpointing")) for override in overrides)
            assert checkpoints["model_checkpoint"]["every_n_train_steps"] == 50, experiment.id
