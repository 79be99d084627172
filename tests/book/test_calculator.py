"""The memory calculator's Python side: the estimator's numbers, the linters' messages, the measured runs, the bundle.

The page runs `workshop_lib.book.calculator.page` itself (Pyodide), so these tests are about that module and what
the build ships; tests/book/test_calculator_browser.py checks the page shows what this module computes.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import zipfile
from dataclasses import replace

import pytest
from repo_paths import REPO

from workshop_lib.book.calculator import bundle
from workshop_lib.book.calculator.measured_runs import chapter_presets, page_data, reference_runs
from workshop_lib.book.calculator.page import (
    FIELDS,
    Calculator,
    experiment_for_inputs,
    inputs_from_setup,
    read_inputs,
    setup_from_inputs,
)
from workshop_lib.checks.experiment_rules import validate_experiment
from workshop_lib.cli import main
from workshop_lib.core.errors import WorkshopError
from workshop_lib.estimate import GIB, TrainingSetup, check_setup, estimate_memory, model_shape
from workshop_lib.estimate.fit import MARGIN

ROOT = REPO


@pytest.fixture(scope="module")
def calculator():
    return Calculator(page_data())


def random_values(rng: random.Random) -> dict:
    """Form values a reader could set: every field, mostly sensible, sometimes not."""
    values = {}
    for field in FIELDS:
        if field.kind == "choice":
            values[field.name] = rng.choice(field.choices)[0]
        elif field.kind == "flag":
            values[field.name] = rng.random() < 0.5
    values.update(gpus_per_node=rng.choice([0, 1, 2, 3, 4, 8]), nodes=rng.choice([1, 1, 2, 4]),
                  tensor_parallel=rng.choice([1, 2, 3, 4, 8]), pipeline_parallel=rng.choice([1, 2, 4]),
                  expert_parallel=rng.choice([1, 2, 3, 4, 8]), micro_batches=rng.choice([1, 4, 8]),
                  lora_rank=rng.choice([0, 0, 8, 32]), batch=rng.choice([1, 2, 4]),
                  seq_len=rng.choice([256, 512, 2048]))
    return values


def test_the_page_shows_the_estimators_numbers_for_random_layouts(calculator):
    rng = random.Random(30)
    accepted = refused = 0
    for _ in range(400):
        values = random_values(rng)
        result = calculator.calculate(values)
        inputs = read_inputs(values)
        setup = setup_from_inputs(inputs)
        try:
            estimate = estimate_memory(inputs["model"], setup)
        except WorkshopError as error:
            refused += 1
            rule = getattr(error, "rule", "")  # a seed pitfall: shown once, as workshop validate's finding
            if rule and any(problem["rule"] == rule for problem in result["problems"]):
                assert not result["ok"] and "workshop estimate" not in {p["source"] for p in result["problems"]}
                continue
            assert not result["ok"] and result["problems"][0] == {
                "source": "workshop estimate", "rule": rule, "message": str(error), "fix": "", "severity": "error"}
            continue
        accepted += 1
        assert result["ok"]
        assert result["gpu"]["total_gib"] == f"{estimate.total / GIB:,.2f}"
        shown = {part["part"]: part["gib"] for part in result["gpu"]["parts"]}
        for name in ("parameters", "gradients", "optimizer_states", "activations", "logits", "temporaries"):
            if getattr(estimate, name) > 0:
                assert shown[name] == f"{getattr(estimate, name) / GIB:,.2f}"
        assert result["host"]["per_node_gib"] == f"{estimate.cpu_per_node / GIB:,.2f}"
        for verdict, (card, memory) in zip(result["fits"], (("A100-80GB", 80), ("H100-80GB", 80), ("H200", 140))):
            assert verdict["card"] == card and verdict["fits"] == (estimate.total / GIB <= memory * (1 - MARGIN))
        # workshop validate's findings come along, word for word.
        findings = validate_experiment(experiment_for_inputs(inputs))
        assert [problem["message"] for problem in result["problems"]] == [finding.message for finding in findings]
    assert accepted > 50 and refused > 50  # both paths really ran


def test_the_terminal_command_prints_the_same_estimate(calculator, capsys):
    rng = random.Random(7)
    checked = 0
    while checked < 15:
        result = calculator.calculate(random_values(rng))
        if not result["ok"] or not result["command"]:
            continue
        arguments = result["command"].split()[1:] + ["--json"]
        assert main(arguments) == 0
        printed = json.loads(capsys.readouterr().out)
        assert f"{printed['total'] / GIB:,.2f}" == result["gpu"]["total_gib"], result["command"]
        checked += 1


@pytest.mark.parametrize("values, message", [
    ({"gpus_per_node": 0}, "gpus=0 must be at least 1"),
    ({"engine": "megatron", "gpus_per_node": 3, "tensor_parallel": 3},
     "TP=3 does not divide llama-3.1-8b's 32 attention heads / 8 KV heads; use a divisor"),
    ({"engine": "megatron", "model": "mixtral-8x7b", "gpus_per_node": 6, "expert_parallel": 3},
     "EP=3 does not divide mixtral-8x7b's 8 experts; use a divisor"),
])
def test_bad_layouts_show_the_estimators_own_message(calculator, values, message):
    result = calculator.calculate(values)
    assert not result["ok"] and "gpu" not in result
    inputs = read_inputs(values)
    with pytest.raises(WorkshopError) as raised:
        check_setup(setup_from_inputs(inputs), model_shape(inputs["model"]))
    assert str(raised.value) == message == result["problems"][0]["message"]


def test_zero_gpus_also_brings_the_linters_rule():
    result = Calculator({}).calculate({"gpus_per_node": 0})
    rules = {problem["rule"]: problem for problem in result["problems"]}
    assert rules["no-resources"]["fix"] == "ask for at least one node and one GPU per node."


def test_an_unreadable_field_is_named_with_a_fix():
    result = Calculator({}).calculate({"gpus_per_node": "two"})
    assert result["problems"][0]["message"] == "GPUs per node: 'two' is not a whole number; type a number such as 1"
    assert "is not offered" in Calculator({}).calculate({"model": "gpt-5"})["problems"][0]["message"]


def test_form_values_and_setups_round_trip():
    rng = random.Random(3)
    for _ in range(200):
        inputs = read_inputs(random_values(rng))
        back = inputs_from_setup(inputs["model"], setup_from_inputs(inputs))
        engine = inputs["engine"]
        for field in FIELDS:
            if field.applies_to(engine):
                assert back[field.name] == inputs[field.name], field.name


def test_every_measured_run_is_found_as_itself(calculator):
    runs = reference_runs()
    assert len(runs) >= 30 and {run["inputs"]["model"] for run in runs} == {"bloom-560m", "llama-3.1-8b",
                                                                           "mixtral-8x7b", "gpt"}
    for run in runs:
        result = calculator.calculate(run["inputs"])
        assert result["ok"], (run["id"], result["problems"])
        reference = result["reference"]
        assert reference["exact"] and (reference["id"] == run["id"] or run["label"] in reference["also"]
                                       or reference["inputs"] == run["inputs"])
        assert reference["measured"], run["id"]


def test_the_closest_run_names_what_differs(calculator):
    inputs = next(run["inputs"] for run in reference_runs() if run["id"] == "zero/two-gpus/zero2")
    result = calculator.calculate({**inputs, "zero_stage": "3", "gpus_per_node": 8})
    reference = result["reference"]
    assert not reference["exact"] and reference["differences"]
    assert all(re.match(r"^[A-Z].*: .* here, .* in the run$", text) for text in reference["differences"])


def test_chapter_presets_are_the_chapters_runs():
    from workshop_lib.experiments import chapter_experiments

    presets = chapter_presets()
    for chapter in (1, 2, 3, 4):
        ids = [run["id"] for run in presets[str(chapter)]["experiments"]]
        assert ids and set(ids) <= {e.id for e in chapter_experiments(chapter)} | {"model-parallel/llama/tp2"}
        for run in presets[str(chapter)]["experiments"]:
            assert Calculator({}).calculate(run["inputs"])["ok"], run["id"]
    zero2 = next(run for run in presets["3"]["experiments"] if run["id"] == "zero/two-gpus/zero2")
    assert setup_from_inputs(read_inputs(zero2["inputs"])) == replace(
        TrainingSetup(gpus=2, precision="fp16", zero_stage=2, batch=4, seq_len=512), engine="deepspeed")


@pytest.mark.parametrize("stem, chapter", [("01_data_parallel_lora", 1), ("02_model_parallel", 2),
                                           ("03_deepspeed_zero", 3), ("04_fsdp", 4)])
def test_each_chapter_embeds_the_calculator_on_its_own_runs(stem, chapter):
    text = (ROOT / "notebooks" / f"{stem}.py").read_text()
    found = re.findall(r'src="\.\./_static/memory-calculator/calculator\.html\?chapter=(\d)&amp;experiment=([^"]+)"', text)
    assert found, f"{stem} does not embed the memory calculator"
    presets = chapter_presets()[str(chapter)]["experiments"]
    for number, experiment in found:
        assert int(number) == chapter and experiment in {run["id"] for run in presets}


def test_the_page_imports_only_what_the_book_ships():
    """Pyodide has the standard library and the files of bundle.PAGE_MODULES, nothing else."""
    script = ("import sys, json; before = set(sys.modules); import workshop_lib.book.calculator.page; "
              "print(json.dumps(sorted(set(sys.modules) - before)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                       cwd=ROOT).stdout)
    ours = {name for name in loaded if name.startswith("workshop_lib")}
    shipped = {"workshop_lib." + path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
               for path in bundle.PAGE_MODULES} | {"workshop_lib"}
    assert ours <= shipped, ours - shipped
    others = {name.split(".")[0] for name in loaded} - {"workshop_lib"}
    assert others <= set(sys.stdlib_module_names) | {"__future__"}, others - set(sys.stdlib_module_names)


def test_the_bundle_ships_pyodide_the_modules_as_they_are_and_the_data(tmp_path):
    target = bundle.write_bundle(tmp_path / "calc", data={"references": [], "chapters": {}})
    for name in ("calculator.html", "calculator.js", "calculator.css", "calculator-data.json",
                 *(f"pyodide/{name}" for name in bundle.PYODIDE_FILES)):
        assert (target / name).is_file(), name
    with zipfile.ZipFile(target / "workshop_lib.zip") as archive:
        for relative in bundle.PAGE_MODULES:
            assert archive.read(f"workshop_lib/{relative}") == (bundle.PACKAGE_ROOT / relative).read_bytes()
    lock = json.loads((ROOT / "package-lock.json").read_text())
    assert bundle.pyodide_version() == lock["packages"]["node_modules/pyodide"]["version"]


def test_a_missing_pyodide_says_how_to_install_it(tmp_path):
    with pytest.raises(WorkshopError, match=r"run `npm ci` in the repository \(`make setup` does\)"):
        bundle.write_bundle(tmp_path / "calc", data={}, pyodide_dir=tmp_path / "nowhere")


def test_without_pyodide_the_build_still_ships_the_page_that_says_what_is_missing(tmp_path):
    target = bundle.write_bundle(tmp_path / "calc", data={}, pyodide_dir=tmp_path / "nowhere", require_pyodide=False)
    assert (target / "calculator.html").is_file() and (target / "workshop_lib.zip").is_file()
    assert not any((target / "pyodide").iterdir())
    assert "run `npm ci`" in (target / "calculator.js").read_text()


def test_nemos_run_is_shown_as_it_ran_with_the_estimators_error_per_engine(calculator):
    """NeMo trained one SQuAD record per micro-batch, not the recipe's 2,048 tokens: the chapter's 2,048-token
    layout is never "this configuration" of NeMo's run, and each engine's measured error is stated."""
    runs = reference_runs()
    nemo = next(run for run in runs if run["engine"] == "nemo")
    assert nemo["setup"]["seq_len"] < 2048
    preset = next(row for row in chapter_presets()["1"]["experiments"] if row["id"] == nemo["id"])
    reference = calculator.calculate(preset["inputs"])["reference"]
    # Only the packed run trained 2,048-token micro-batches: the only NeMo run that may be "this configuration"
    assert not (reference["exact"] and reference["ran_with"].startswith("NeMo")) or reference["id"].endswith("-packed")
    for engine in {run["engine"] for run in runs}:
        example = next(run for run in runs if run["engine"] == engine)
        text = calculator.calculate(example["inputs"])["reference"]["engine_error"]
        assert re.match(r"^The estimator's error on the \d+ runs? measured with .+ %", text), (engine, text)
    fsdp = next(run for run in runs if run["engine"] == "hf-fsdp")
    assert "FSDP" in calculator.calculate(fsdp["inputs"])["reference"]["engine_error"]


PITFALLS = [  # (form values, the seed pitfall's rule): setups the estimator refuses and the checks report
    (dict(engine="deepspeed", zero_stage="0", offload="optimizer"), "offload-with-zero0"),
    (dict(engine="fsdp", fsdp="HYBRID_SHARD", nodes=1), "hybrid-shard-single-node"),
    (dict(engine="megatron", model="mixtral-8x7b", tensor_parallel=2, expert_parallel=8, gpus_per_node=4),
     "parallel-sizes-mismatch"),
    (dict(engine="megatron", tensor_parallel=3, gpus_per_node=4), "parallel-sizes-mismatch"),
]


@pytest.mark.parametrize("values, rule", PITFALLS)
def test_the_calculator_says_one_thing_once_for_one_pitfall(calculator, values, rule):
    """The estimator and the checks take a seed pitfall's words from one place (estimate.pitfall_text): the
    estimator's refusal reads as `workshop validate`'s finding, and the page shows that message once."""
    result = calculator.calculate({**{field.name: field.default for field in FIELDS}, **values})
    assert not result["ok"]
    assert [problem["rule"] for problem in result["problems"]] == [rule], result["problems"]
    (finding,) = [f for f in validate_experiment(experiment_for_inputs(result["inputs"])) if f.rule == rule]
    with pytest.raises(WorkshopError) as refusal:
        check_setup(setup_from_inputs(result["inputs"]))
    assert str(refusal.value) == f"{finding.message} Fix: {finding.fix}" and refusal.value.rule == rule
