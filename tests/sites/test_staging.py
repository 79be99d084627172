"""The class's staged folder and KAUST's rules for the setup, on the Ibex stand-in of tests/ibex_site.py.

An instructor stages once (`workshop setup ibex --stage DIR`); a participant with WORKSHOP_SHARED_ROOT=DIR
makes only what must be theirs. Environments are built on a compute node (srun), caches stay off $HOME.
The whole class path against the local cluster (import jobs, participants' jobs) is in
tests/sites/test_ibex_rehearsal.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ibex_site import IbexSite, site_after_setup
from repo_paths import REPO

from workshop_lib.experiments import get_experiment
from workshop_lib.scripts import render_script
from workshop_lib.sites.profiles import PROFILES_DIR, ProfileError, available_profiles, load_profile, staged_profile
from workshop_lib.sites.requirements import profile_argument
from workshop_lib.sites.site_check import export_squad

ROOT = REPO
STAGE_LOCAL_STEPS = ["folders", "workshop-copy", "miniforge", "environment", "hub-download", "nemo-image",
                     "nemo-data"]


@pytest.fixture
def site(tmp_path):
    return IbexSite(tmp_path)


def workshop_setup(site, *arguments, extra_env=None):
    command = [sys.executable, "-m", "workshop_lib.cli", "setup", str(site.profile_path),
               "--miniforge-installer", f"file://{site.installer}", *arguments]
    env = {**site.environment(dict(os.environ)), **(extra_env or {})}
    env.pop("WORKSHOP_SHARED_ROOT", None) if "WORKSHOP_SHARED_ROOT" not in (extra_env or {}) else None
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def only(*steps):
    return [word for step in steps for word in ("--only", step)]


@pytest.mark.slow  # runs the setup's local steps once for the session (about 30 s on a loaded machine)
def test_the_environment_is_built_on_a_compute_node_with_the_profiles_allocation(tmp_path_factory):
    site, result = site_after_setup(tmp_path_factory)  # the local steps, run once for the tests that read them
    assert result.returncode == 0, result.stdout + result.stderr
    srun = [call["argv"] for call in site.calls("srun")]
    profile = load_profile(site.profile_path)
    options = ["--nodes=1", "--ntasks=1", *profile.python.build_allocation.split()]
    assert [argv[:len(options)] for argv in srun] == [options, options]
    assert srun[0][len(options):][:2] == ["bash", f"{profile.python.conda_root.replace('$USER', os.environ.get('USER') or 'root')}.installer.sh"]
    assert "env" in srun[1] and "create" in srun[1], srun
    # conda ran inside the allocation (the stand-in srun sets SLURM_JOB_ID), never on the "login node"
    assert all(call["job"] == "4242" for call in site.calls("conda") if call["argv"][:1] == ["env"])


def test_the_reservation_goes_with_the_allocation(site):
    result = workshop_setup(site, *only("folders", "miniforge"), extra_env={"WORKSHOP_RESERVATION": "ws-day"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--reservation=ws-day" in site.calls("srun")[0]["argv"]


def test_caches_of_pip_conda_and_the_rest_stay_off_home():
    profile = load_profile("ibex")
    script = render_script(get_experiment("zero/baseline"), profile)
    for variable in ("PIP_CACHE_DIR", "CONDA_PKGS_DIRS", "XDG_CACHE_HOME", "HF_HOME", "TMPDIR"):
        line = next(line for line in script.splitlines() if line.startswith(f"export {variable}="))
        assert '"$CACHE_ROOT/' in line, line
    assert profile.cache_root.startswith("/ibex/user/$USER/")


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_staging_then_a_participant_who_downloads_nothing(site, tmp_path):
    stage = tmp_path / "stage"
    staged = workshop_setup(site, "--stage", str(stage), *only(*STAGE_LOCAL_STEPS))
    assert staged.returncode == 0, staged.stdout + staged.stderr
    assert 'git clone "$WORKSHOP_SHARED_ROOT/workshop.bundle" workshop' in staged.stdout  # what to tell the class
    assert (stage / "workshop" / "pyproject.toml").is_file() and not (stage / "workshop" / "runs").exists()
    assert (stage / "miniforge3" / "envs" / "dist-ft-workshop" / "bin" / "workshop").is_file()
    assert (stage / "images" / "nemo_25.07.sif").is_file()
    env_create = next(call for call in site.calls("conda") if call["argv"][:2] == ["env", "create"])
    assert env_create["cwd"] == str(stage / "workshop"), "the class's environment is installed from the staged copy"

    # Not published yet (no imports, no manifest): the participant is told what to ask the instructor for.
    participant = {"WORKSHOP_SHARED_ROOT": str(stage)}
    before = site.calls()
    refused = workshop_setup(site, extra_env=participant)
    assert refused.returncode != 0
    assert f"The staged folder {stage} is not published" in refused.stderr
    assert f"--stage {stage}" in refused.stderr

    # Publish without the imports: the manifest is written, the participant's check names the missing import.
    published = workshop_setup(site, "--stage", str(stage), *only("publish"))
    assert published.returncode == 0, published.stdout + published.stderr
    manifest = json.loads((stage / "STAGED.json").read_text())
    assert "environment" in manifest["steps"] and manifest["bytes"]["images"] > 0
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert manifest["workshop_commit"] == (head or "unknown")
    # Participants clone that commit from the staged folder itself, without a public URL.
    clone = tmp_path / "participant" / "workshop"
    cloned = subprocess.run(["git", "clone", "-q", str(stage / "workshop.bundle"), str(clone)], capture_output=True,
                            text=True)
    assert cloned.returncode == 0, cloned.stderr
    assert subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip() == manifest["workshop_commit"]
    assert (clone / "notebooks").is_dir() and (clone / "slurm" / "profiles" / "ibex.yml").is_file()
    assert oct((stage / "images" / "nemo_25.07.sif").stat().st_mode & 0o777) == "0o644"
    missing_import = workshop_setup(site, extra_env=participant)
    assert missing_import.returncode != 0
    assert "lacks step nemo-import-llama-3.1-8b" in missing_import.stderr
    assert f"workshop setup {site.profile_path} --stage {stage} --only nemo-import-llama-3.1-8b" in missing_import.stderr

    # The instructor finishes the imports (their markers and checkpoints, as the import jobs leave them).
    for model, hub in (("llama-3.1-8b", "meta-llama/Llama-3.1-8B"), ("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1")):
        (stage / "cache" / "setup" / f"nemo-import-{model}.done").write_text("x\n")
    calls_before = len(site.calls())
    ready = workshop_setup(site, extra_env=participant)
    assert ready.returncode == 0, ready.stdout + ready.stderr
    new_calls = site.calls()[calls_before:]
    assert [call["program"] for call in new_calls if call["program"] in
            ("singularity", "conda", "hub-download", "srun", "curl")] == [], new_calls
    assert "[2/4] shared-folder: already done" in ready.stdout  # its check is its done-test: it passes now
    assert "[3/4] kernel: done in" in ready.stdout and "[4/4] nemo-data: done in" in ready.stdout
    user = os.environ.get("USER") or "root"
    own = Path(load_profile(site.profile_path).cache_root.replace("$USER", user))
    copied = own / "nemo_datasets" / "squad" / "training.jsonl"
    assert copied.is_file() and os.access(copied, os.W_OK), "NeMo writes its index files next to its data"
    assert len(before) <= calls_before
    print(f"\nparticipant setup with a staged folder: {ready.stdout.strip().splitlines()[-1]}")


def test_a_participants_jobs_read_the_staged_stores_and_check_the_staged_markers(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_SHARED_ROOT", "/ibex/project/c1234/dist-ft-workshop")
    profile = load_profile("ibex")
    nemo = render_script(get_experiment("lora/llama/1-gpu"), profile)
    assert 'export NEMO_MODELS_CACHE="/ibex/project/c1234/dist-ft-workshop/cache/nemo_cache/models"' in nemo
    assert "/ibex/project/c1234/dist-ft-workshop/images/nemo_25.07.sif" in nemo
    assert "/ibex/project/c1234/dist-ft-workshop/cache/setup/nemo-import-llama-3.1-8b.done" in nemo
    assert "/ibex/user/$USER/dist-ft-workshop/cache/setup/nemo-data.done" in nemo  # the participant's own copy
    assert "--stage /ibex/project/c1234/dist-ft-workshop --only nemo-import-llama-3.1-8b" in nemo
    hf = render_script(get_experiment("zero/baseline"), profile)
    assert 'export HF_HUB_CACHE="/ibex/project/c1234/dist-ft-workshop/cache/hf_cache/hub"' in hf
    assert 'source "/ibex/project/c1234/dist-ft-workshop/miniforge3/etc/profile.d/conda.sh"' in hf
    assert "/ibex/project/c1234/dist-ft-workshop/data/squad" in hf
    assert 'CACHE_ROOT="/ibex/user/$USER/dist-ft-workshop/cache"' in hf  # writable caches stay the participant's


def test_a_bad_shared_root_is_refused_naming_the_variable(monkeypatch):
    from workshop_lib.sites.profiles import ProfileError

    monkeypatch.setenv("WORKSHOP_SHARED_ROOT", "relative/folder")
    with pytest.raises(ProfileError, match=r"\$WORKSHOP_SHARED_ROOT is .relative/folder.*absolute path"):
        load_profile("ibex")
    monkeypatch.setenv("WORKSHOP_SHARED_ROOT", '/ibex/"$(reboot)"')
    with pytest.raises(ProfileError, match="no spaces, quotes"):
        load_profile("ibex")


def test_staging_while_reading_a_staged_folder_is_refused(site, tmp_path):
    result = workshop_setup(site, "--stage", str(tmp_path / "s"), "--dry-run",
                            extra_env={"WORKSHOP_SHARED_ROOT": str(tmp_path / "other")})
    assert result.returncode == 2 and "unset $WORKSHOP_SHARED_ROOT" in result.stderr


def test_the_staged_profile_puts_everything_under_the_folder():
    profile = staged_profile(load_profile("ibex"), "/ibex/project/c1/ws/")
    assert profile.cache_root == "/ibex/project/c1/ws/cache"
    assert profile.python.conda_root == "/ibex/project/c1/ws/miniforge3"
    assert profile.nemo.image == "/ibex/project/c1/ws/images/nemo_25.07.sif"


def test_exported_squad_is_read_back_by_the_training_loader(tmp_path):
    import torch

    from workshop_lib.train.data import load_squad
    from workshop_lib.train.runtime import Runtime

    rows = {split: [{"question": f"q{split}{i}?", "context": f"context {i} with answer{i}",
                     "answers": {"text": [f"answer{i}"], "answer_start": [8]}, "id": str(i)} for i in range(n)]
            for split, n in (("train", 7), ("validation", 3))}
    counts = export_squad(tmp_path / "squad", rows)
    assert counts == {"train": 7, "validation": 3}
    assert not list((tmp_path / "squad").glob("*.partial"))
    splits = load_squad(str(tmp_path / "squad"), Runtime(0, 0, 1, 1, torch.device("cpu")))
    assert [example.answers for example in splits.validation] == [("answer0",), ("answer1",), ("answer2",)]
    assert splits.train[6].question == "qtrain6?"


def test_the_wrapper_without_a_staged_environment_names_the_instructor_command(tmp_path):
    result = subprocess.run(["./workshop-setup", "ibex"], cwd=ROOT, capture_output=True, text=True, timeout=30,
                            env={**os.environ, "WORKSHOP_SHARED_ROOT": str(tmp_path / "nothing-here")})
    assert result.returncode == 2
    assert f"./workshop-setup ibex --stage {tmp_path / 'nothing-here'}" in result.stderr


def test_the_wrapper_bootstraps_under_srun_with_caches_off_home(site, tmp_path):
    env = {**site.environment(dict(os.environ)), "WORKSHOP_MINIFORGE_INSTALLER": f"file://{site.installer}"}
    env.pop("WORKSHOP_SHARED_ROOT", None)
    result = subprocess.run([str(ROOT / "workshop-setup"), str(site.profile_path), "--only", "folders"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    srun = [call for call in site.calls("srun")]
    assert len(srun) == 2 and "--cpus-per-task=8" in srun[0]["argv"] and "create" in srun[1]["argv"]
    assert "[bootstrap] on a compute node: srun" in result.stdout


def test_a_profile_copied_into_the_participants_own_clone_is_found_by_name(tmp_path, monkeypatch):
    # The library runs from another folder (with a class: the staged copy); the participant's clone is the cwd.
    clone = tmp_path / "workshop"
    (clone / "slurm" / "profiles").mkdir(parents=True)
    (clone / "notebooks").mkdir()
    (clone / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    data = yaml.safe_load((PROFILES_DIR / "ibex.yml").read_text())
    data.update(name="my-ibex")
    data["scheduler"]["reservation"] = "my-day"
    (clone / "slurm" / "profiles" / "my-ibex.yml").write_text(yaml.safe_dump(data))
    monkeypatch.chdir(clone / "notebooks")
    monkeypatch.delenv("WORKSHOP_ROOT", raising=False)
    profile = load_profile("my-ibex")
    assert profile.name == "my-ibex" and profile.scheduler.reservation == "my-day"
    assert {"my-ibex", "ibex", "tiny"} <= set(available_profiles())
    assert load_profile("tiny").source.parent == PROFILES_DIR  # the shipped ones still come from the library
    assert profile_argument(profile) == "my-ibex"  # what the setup and the jobs' messages print: the name finds it
    monkeypatch.chdir(tmp_path)  # outside the clone: only the library's profiles, and the error says where it looked
    with pytest.raises(ProfileError, match=rf"no my-ibex\.yml in {PROFILES_DIR}"):
        load_profile("my-ibex")
    assert profile_argument(profile) == str(clone / "slurm" / "profiles" / "my-ibex.yml")  # from here, only the path


def test_staging_refuses_a_reservation_that_has_not_started(site, tmp_path, monkeypatch, capsys):
    from workshop_lib.cli import main

    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "scontrol").write_text('#!/bin/bash\n[ "$*" = "--oneliner show reservation ws-day" ] || exit 1\n'
                                   'echo "ReservationName=ws-day StartTime=2026-12-01T08:00:00 EndTime=2026-12-01T17:00:00'
                                   ' Nodes=gpu[1-4] State=$FAKE_STATE"\n')
    (fake / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    monkeypatch.setenv("WORKSHOP_RESERVATION", "ws-day")
    monkeypatch.delenv("WORKSHOP_SHARED_ROOT", raising=False)
    stage = tmp_path / "stage"
    command = ["setup", str(site.profile_path), "--stage", str(stage), "--only", "folders"]
    monkeypatch.setenv("FAKE_STATE", "INACTIVE")
    assert main(command) == 2 and not stage.exists()
    error = capsys.readouterr().err
    assert ("--stage with the reservation ws-day (set by $WORKSHOP_RESERVATION), which starts at 2026-12-01T08:00:00"
            in error and "unset WORKSHOP_RESERVATION" in error)
    monkeypatch.setenv("FAKE_STATE", "ACTIVE")  # inside a reservation that has started, staging may run
    assert main(command) == 0 and (stage / "cache" / "setup").is_dir()
