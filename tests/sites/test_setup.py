"""`workshop setup`: dry run, idempotent steps with a progress line each, resuming after a failure, and
jobs that stop naming the step that was skipped. Runs against the Ibex stand-in of tests/ibex_site.py;
the import jobs (a real sbatch) are exercised by tests/sites/test_ibex_rehearsal.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from ibex_site import LOCAL_STEPS, IbexSite, run_setup, site_after_setup
from repo_paths import REPO

from workshop_lib.experiments import get_experiment
from workshop_lib.scripts import render_script
from workshop_lib.sites.profiles import load_profile
from workshop_lib.sites.setup_plan import build_plan

ROOT = REPO
setup = run_setup


@pytest.fixture
def site(tmp_path):
    return IbexSite(tmp_path)


@pytest.fixture
def set_up(tmp_path_factory):
    """(site, its first setup's output): the local steps already ran there (shared; read it, never change it)."""
    return site_after_setup(tmp_path_factory)


def test_dry_run_prints_every_step_and_changes_nothing(site):
    result = setup(site, "--dry-run", only=None)
    assert result.returncode == 0, result.stderr
    names = [line.split(":")[0].split("] ")[1] for line in result.stdout.splitlines() if line.startswith("[")]
    assert names == LOCAL_STEPS + ["nemo-import-llama-3.1-8b", "nemo-import-mixtral-8x7b"]
    assert "singularity pull \"$NEMO_IMAGE.partial\" docker://nvcr.io/nvidia/nemo:25.07" in result.stdout
    assert "sbatch --wait job.sbatch" in result.stdout and "needs: $HF_TOKEN" in result.stdout
    assert result.stdout.count("(would run)") == 8
    assert not (site.root / "ibex").exists() and site.calls() == []


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_steps_run_once_with_a_progress_line_each_and_are_skipped_after(set_up):
    site, first = set_up
    assert first.returncode == 0, first.stdout + first.stderr
    for number, step in enumerate(LOCAL_STEPS, 1):
        assert f"[{number}/6] {step}: " in first.stdout and f"[{number}/6] {step}: done in" in first.stdout
    profile = load_profile(site.profile_path)
    cache = profile.cache_root.replace("$USER", os.environ.get("USER") or "root")
    assert all(os.path.isfile(f"{cache}/setup/{step}.done") for step in LOCAL_STEPS)
    assert os.path.isfile(profile.nemo.image.replace("$USER", os.environ.get("USER") or "root"))
    # environment: the CUDA toolkit; nemo-image and nemo-data: the toolkit and singularity
    assert [call["argv"] for call in site.calls("module")] == [["load", "cuda/12.4.1"]] + \
        [["load", "cuda/12.4.1"], ["load", "singularity"]] * 2
    assert "torch 2.13.0" in first.stdout  # the environment step checked the locked torch
    calls = len(site.calls())
    second = setup(site)
    assert second.returncode == 0 and second.stdout.count("already done, skipped") == 6
    assert "0 step(s) ran, 6 already done" in second.stdout and len(site.calls()) == calls


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_a_failed_step_names_itself_and_the_next_run_resumes_there(site):
    failed = setup(site, extra_env={"IBEX_SHIM_FAIL": "pull"})
    assert failed.returncode == 2
    assert "[5/6] nemo-image failed (exit status 1)" in failed.stderr and "it resumes here" in failed.stderr
    profile = load_profile(site.profile_path)
    image = profile.nemo.image.replace("$USER", os.environ.get("USER") or "root")
    assert not os.path.exists(image)  # the half-pulled file kept its temporary name
    resumed = setup(site)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.count("already done, skipped") == 4 and "[5/6] nemo-image: done in" in resumed.stdout
    assert os.path.isfile(image)


def test_gated_models_need_the_token_before_anything_is_fetched(site):
    result = setup(site, extra_env={"HF_TOKEN": ""}, only=["folders", "hub-download"])
    assert result.returncode == 2
    assert "[2/2] hub-download: set HF_TOKEN first" in result.stderr and "read -rs HF_TOKEN" in result.stderr


def test_unknown_step_lists_the_steps(site):
    result = setup(site, only=["nemo-pull"])
    assert result.returncode == 2 and "no setup step 'nemo-pull'; the steps are: folders, miniforge" in result.stderr


@pytest.mark.parametrize("experiment_id, step", [("lora/llama/1-gpu", "nemo-image"),
                                                 ("zero/baseline", "miniforge")])
def test_a_job_whose_setup_step_was_skipped_stops_at_once_naming_it(site, tmp_path, experiment_id, step):
    script = tmp_path / "job.sbatch"
    script.write_text(render_script(get_experiment(experiment_id), load_profile(site.profile_path)))
    env = {**site.environment(dict(os.environ)), "SLURM_JOB_ID": "1", "SLURM_JOB_NAME": "x",
           "SLURM_JOB_NODELIST": "node1", "SLURM_CPUS_PER_TASK": "4"}
    result = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 45
    assert (f"the setup step '{step}' has not run. On a login node: workshop setup {site.profile_path} --only {step}"
            in result.stderr)
    assert site.calls("singularity") == [] and site.calls("conda") == []  # stopped before using either


def test_the_plan_of_the_shipped_ibex_profile_keeps_everything_under_ibex_user():
    plan = build_plan(load_profile("ibex"))
    assert "$HOME" not in plan.preamble and plan.preamble.count("/ibex/user/$USER/dist-ft-workshop") >= 3


def test_the_network_block_of_the_stand_in_refuses_and_records(site):
    code = ("import socket\n"
            "try:\n    socket.create_connection(('huggingface.co', 443), timeout=5)\nexcept OSError as error:\n"
            "    print('refused:', error)\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); c = socket.create_connection(s.getsockname())\n"
            "print('loopback ok')\n")
    result = subprocess.run([sys.executable, "-c", code], env=site.environment(dict(os.environ)),
                            capture_output=True, text=True, timeout=60)
    assert "refused: network blocked in this rehearsal: huggingface.co" in result.stdout
    assert "loopback ok" in result.stdout and [a["target"] for a in site.network_attempts()] == ["huggingface.co"]


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_submitting_before_the_setup_is_refused_naming_the_step(set_up):
    from workshop_lib.sites.requirements import SetupError, check_before_submit

    site, first = set_up
    profile = load_profile(site.profile_path)
    experiment = get_experiment("lora/llama/2-gpus")
    # Another user's cache root on the same site: nothing set up there yet.
    with pytest.raises(SetupError, match=r"lora/llama/2-gpus cannot run yet\. Missing: The NeMo container image .*"
                                         r"--only nemo-image.*--only nemo-data.*--only nemo-import-llama-3.1-8b"):
        check_before_submit(experiment, profile, environ={"USER": "participant"})
    assert first.returncode == 0  # this user's setup ran
    with pytest.raises(SetupError, match="--only nemo-import-llama-3.1-8b"):  # the import jobs have not run
        check_before_submit(experiment, profile)
    check_before_submit(get_experiment("zero/baseline"), profile)  # the conda side is complete
    check_before_submit(experiment, load_profile("tiny"))  # a profile without setup needs nothing


def test_every_file_a_job_checks_for_is_made_by_a_setup_step():
    from workshop_lib.experiments import all_experiments
    from workshop_lib.sites.requirements import import_requirements, job_requirements

    profile = load_profile("ibex")
    plan = build_plan(profile)
    made_by = {path: step.name for step in plan.steps for path in step.produces}
    needs = [need for experiment in all_experiments() for need in job_requirements(experiment, profile)]
    needs += import_requirements(profile)
    assert needs and all(made_by.get(need.path) == need.step for need in needs), \
        [need for need in needs if made_by.get(need.path) != need.step]


def test_setup_downloads_the_hub_checkpoints_the_jobs_load():
    """core's HUB_CHECKPOINTS (what setup downloads) and train's registry (what jobs load) name the same ones."""
    from workshop_lib.core.vocabulary import HUB_CHECKPOINTS
    from workshop_lib.sites.requirements import hub_models
    from workshop_lib.train.models import REGISTRY

    assert HUB_CHECKPOINTS == {name: spec.hub_name for name, spec in REGISTRY.items() if spec.hub_name}
    assert set(hub_models(load_profile("ibex"))) <= set(HUB_CHECKPOINTS.values())


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_planning_and_rendering_for_ibex_imports_no_torch():
    code = ("import sys\nfrom workshop_lib.sites.profiles import load_profile\nfrom workshop_lib.sites.setup_plan import build_plan\n"
            "from workshop_lib.scripts import render_script\nfrom workshop_lib.experiments import all_experiments\n"
            "build_plan(load_profile('ibex'))\n[render_script(e, 'ibex') for e in all_experiments()]\n"
            "print(sorted(name for name in ('torch', 'transformers', 'datasets') if name in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.stdout.strip() == "[]", result.stderr


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_the_reservation_is_named_before_any_step_and_a_bad_one_stops_the_setup(site):
    dry = setup(site, "--dry-run", only=None, extra_env={"WORKSHOP_RESERVATION": "ws-day1"})
    assert "# Batch jobs: jobs carry --reservation=ws-day1 (set by $WORKSHOP_RESERVATION)" in dry.stdout
    bad = setup(site, extra_env={"WORKSHOP_RESERVATION": "ws day1"})
    assert bad.returncode == 2 and "$WORKSHOP_RESERVATION is 'ws day1'" in bad.stderr
    assert "[1/" not in bad.stdout and site.calls() == []  # stopped before the first step
    good = setup(site, extra_env={"WORKSHOP_RESERVATION": "ws-day1"}, only=["folders"])
    assert good.returncode == 0 and good.stdout.startswith("Batch jobs: jobs carry --reservation=ws-day1")
