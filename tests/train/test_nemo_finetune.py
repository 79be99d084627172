"""The drop-in for `nemo llm finetune` on a machine with NeMo but without the models: its command line, the
SQuAD files it prepares in NeMo's own format, and the job script that calls it. (It trained on a GPU:
tests/parse/test_nemo_real_run.py reads that run; NeMo itself is not installed where these tests run.)"""

from __future__ import annotations

import json
import subprocess

import pytest

from workshop_lib.experiments import chapter_experiments
from workshop_lib.scripts import render_script, run_engine
from workshop_lib.sites.profiles import load_profile
from workshop_lib.train import nemo_finetune


def test_the_command_line_is_the_clis_own_words():
    words = ["--factory", "llama31_8b(peft_scheme=None)", "trainer.devices=2", "data.global_batch_size=8", "--yes"]
    factory, overrides = nemo_finetune.split_command(words)
    assert factory == "llama31_8b(peft_scheme=None)" and overrides == ["trainer.devices=2", "data.global_batch_size=8"]
    assert nemo_finetune.factory_base(factory) == "llama31_8b"
    with pytest.raises(nemo_finetune.CommandError, match="no --factory"):
        nemo_finetune.split_command(["trainer.devices=1"])
    with pytest.raises(nemo_finetune.CommandError, match="not a key=value override"):
        nemo_finetune.split_command(["--factory", "llama31_8b", "devices"])
    with pytest.raises(nemo_finetune.CommandError, match="--dryrun"):
        nemo_finetune.split_command(["--factory", "llama31_8b", "--dryrun"])


def test_bad_command_exits_with_a_message(capsys):
    assert nemo_finetune.main(["trainer.devices=1"]) == 2
    assert "no --factory given" in capsys.readouterr().err


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_squad_is_prepared_in_nemos_format_and_real_files_are_kept(tmp_path):
    folder = nemo_finetune.prepare_squad(tmp_path)
    for split in ("training", "validation", "test"):
        records = [json.loads(line) for line in (folder / f"{split}.jsonl").read_text().splitlines()]
        assert records and all(r["input"].startswith("Context: ") and r["input"].endswith(" Answer:") for r in records)
        # the answer is a span of the context, as in SQuAD
        assert all(r["output"] in r["input"].split(" Question: ")[0] for r in records[:200])
        assert ("original_answers" in records[0]) == (split == "test")
    assert (folder / nemo_finetune.GENERATED_MARKER).exists()
    real = tmp_path / "real"
    (real / "squad").mkdir(parents=True)
    (real / "squad" / "training.jsonl").write_text('{"input": "Context: c Question: q Answer:", "output": "a"}\n')
    assert nemo_finetune.prepare_squad(real) == real / "squad"
    assert not (real / "squad" / "validation.jsonl").exists()  # a real prepared SQuAD is used as it is


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_the_tokenizer_is_made_once_and_loads(tmp_path):
    squad = nemo_finetune.prepare_squad(tmp_path / "datasets")
    folder = nemo_finetune.prepare_tokenizer(tmp_path, squad)
    assert (folder / "tokenizer.json").exists()
    assert nemo_finetune.prepare_tokenizer(tmp_path, squad) == folder
    mean = nemo_finetune.mean_sample_tokens(squad, folder, limit=300)
    assert 60 < mean < 600  # SQuAD-like records, as NeMo tokenizes them (prompt + answer + EOS)


def test_the_workstation_profile_runs_nemo_without_a_container():
    experiment = next(e for e in chapter_experiments(1) if e.id == "lora/llama/1-gpu")
    profile = load_profile("gpu-workstation-nemo")
    script = render_script(experiment, profile)
    assert "singularity" not in script and "NEMO_IMAGE" not in script
    assert "python3 -m workshop_lib.train.nemo_finetune --factory llama31_8b" in script
    assert "trainer.max_steps=60" in script  # the profile's cap, as the Hugging Face jobs get it
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert run_engine(experiment, profile) == "nemo"
    assert run_engine(experiment, load_profile("gpu-workstation")) == "stand-in"
    ibex = render_script(experiment, load_profile("ibex"))
    assert 'singularity exec --nv' in ibex and "nemo llm finetune --factory llama31_8b" in ibex
    assert "trainer.max_steps=250" in ibex  # no cap on Ibex


def test_a_nemo_command_with_shell_text_stays_words(tmp_path):
    from workshop_lib.core.paths import SLURM_DIR

    text = (SLURM_DIR / "profiles" / "gpu-workstation-nemo.yml").read_text()
    hostile = tmp_path / "hostile.yml"
    hostile.write_text(text.replace("command: python3 -m workshop_lib.train.nemo_finetune",
                                    "command: nemo llm finetune; touch pwned $(touch pwned2)"))
    experiment = next(e for e in chapter_experiments(1) if e.id == "lora/llama/1-gpu")
    script = render_script(experiment, load_profile(hostile))
    # every word is quoted: the separator and the substitution reach nemo as arguments, never the shell
    assert "nemo llm 'finetune;' touch pwned '$(touch' 'pwned2)' --factory llama31_8b" in script
