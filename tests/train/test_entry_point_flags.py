"""A bad flag or value to any entry point ends with status 2 and one line ``error: ...``, no traceback.

Job scripts run these modules (``python -m workshop_lib.train.<name>``, under torchrun or not); a typo
there must say which flag is wrong and how to fix it, once, not a traceback on every rank.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = pytest.mark.train

OUT = ["--output-dir", "unused"]  # required by most: the complaint must then be about the bad flag
BAD_FLAG = {"hf": OUT, "lora": OUT, "parallel": OUT, "gpt": OUT, "bandwidth": [],
            "nemo_finetune": ["--factory", "llama31_8b"], "rehearsal": [*OUT, "--experiment", "lora/llama/1-gpu"]}
BAD_VALUES = [
    ("hf", [*OUT, "--recipe", "seed+turbo"], "--recipe 'seed+turbo': unknown feature(s) turbo; choose from"),
    ("hf", [*OUT, "--per-device-batch", "0"], "--per-device-batch must be at least 1, got 0"),
    ("hf", [*OUT, "--deepspeed", "missing.json"], "--deepspeed missing.json: no such file"),
    ("lora", [*OUT, "--lora-rank", "abc"], "argument --lora-rank: invalid int value: 'abc'"),
    ("parallel", [*OUT, "--tp", "0"], "--tp must be at least 1, got 0"),
    ("gpt", [*OUT, "--precision", "fp8"], "argument --precision: invalid choice: 'fp8'"),
    ("bandwidth", ["--size-mb", "0"], "--size-mb must be at least 1, got 0"),
    ("rehearsal", [*OUT, "--experiment", "lora/nope"], "unknown experiment 'lora/nope'; known ids include"),
    ("nemo_finetune", ["--factory", "llama31_8b", "trainer.devices"], "'trainer.devices' is not a key=value override"),
]


def _run(module: str, args: list[str]) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", f"workshop_lib.train.{module}", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def _assert_one_error_line(done: subprocess.CompletedProcess, expected: str) -> str:
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output, output
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and expected in errors[0], output
    return errors[0]


@pytest.mark.parametrize("module", sorted(BAD_FLAG))
def test_an_unknown_flag_names_itself_and_where_the_flags_are_listed(module):
    line = _assert_one_error_line(_run(module, [*BAD_FLAG[module], "--turbo"]), "--turbo")
    if module != "nemo_finetune":  # its words are NeMo-Run's: it says what the job's line looks like instead
        assert f"`python -m workshop_lib.train.{module} --help` lists the flags" in line
    else:
        assert "give --factory NAME and key=value overrides" in line


@pytest.mark.parametrize("module, args, expected", BAD_VALUES, ids=[f"{m}:{a[-1]}" for m, a, _ in BAD_VALUES])
def test_a_bad_value_says_what_is_wrong_in_one_line(module, args, expected):
    _assert_one_error_line(_run(module, args), expected)
