"""book/ibex_setup.md is a tested checklist: every shell command on it passes `bash -n` and shellcheck,
runs (as a dry run, or against the local SLURM cluster) where it can here, and what the page says the
commands print or do is what the code prints and does."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from repo_paths import REPO

from workshop_lib.experiments import Experiment
from workshop_lib.sites.profiles import STAGED_BUNDLE, Scheduler, load_profile
from workshop_lib.sites.requirements import Requirement
from workshop_lib.sites.setup_plan import build_plan

ROOT = REPO
PAGE = ROOT / "book" / "ibex_setup.md"
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
SUBSTITUTIONS = CONFIG["parse"]["myst_substitutions"]


def _fenced(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def _page_with_substitutions() -> str:
    text = PAGE.read_text()
    for name, value in SUBSTITUTIONS.items():
        text = text.replace("{{ " + name + " }}", str(value))
    return text


BLOCKS = _fenced(_page_with_substitutions(), "bash")


def test_the_page_has_its_commands():
    assert len(BLOCKS) >= 7 and "{{" not in "".join(BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=[block.splitlines()[0][:40] for block in BLOCKS])
def test_every_command_passes_bash_n_and_shellcheck(block):
    subprocess.run(["bash", "-n"], input=block, text=True, check=True)
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed (CI installs it)")
    # Typed at a prompt, not run as a script: `cd DIR || exit` (SC2164) would close the participant's
    # terminal, and the site's conda.sh (SC1090, SC1091) is not there to follow.
    result = subprocess.run(["shellcheck", "--shell=bash", "--exclude=SC2164,SC1090,SC1091", "-"], input=block,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
    assert not re.search(r"<[a-z][^>]*>", block), "a placeholder inside a command a participant pastes"


def test_the_clone_command_is_set_once_in_the_book_configuration():
    url = SUBSTITUTIONS["clone_url"]
    assert re.fullmatch(r"https://[\w.-]+/[\w.-]+/[\w.-]+\.git", url)
    assert f"git clone {url} workshop" in SUBSTITUTIONS["clone_command"]
    assert "{{ clone_command }}" in PAGE.read_text()
    # A class clones its commit from the staged folder (what the staging's workshop-copy step writes there).
    staged = f'"$WORKSHOP_SHARED_ROOT/{STAGED_BUNDLE}"'
    assert f"git clone {staged} workshop" in PAGE.read_text()
    for page in [*(ROOT / "book").glob("*.md"), ROOT / "README.md"]:
        text = page.read_text()
        clones = re.findall(r"git clone (\S+)", text)
        assert all(clone in (url, staged) for clone in clones), f"{page.name} shows another clone source: {clones}"


def test_what_is_typed_on_the_laptop_names_the_kaust_username_not_the_laptops():
    ssh = [line for block in BLOCKS for line in block.splitlines() if line.startswith("ssh ")]
    assert ssh and all("$USER" not in line and "YOUR_KAUST_USERNAME@glogin.ibex.kaust.edu.sa" in line for line in ssh)
    assert "ssh -L PORT:NODE.ibex.kaust.edu.sa:PORT USERNAME@glogin" in PAGE.read_text()


def login_node_python(folder: Path) -> dict[str, str]:
    """The environment of a fresh login node: a `python3` with PyYAML and nothing of the workshop's own environment
    (no pandas, numpy or torch), first on PATH; the wrapper's dry run must work with it before conda exists."""
    (folder / "bin").mkdir()
    (folder / "lib").mkdir()
    python3 = folder / "bin" / "python3"
    python3.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')  # -S: no site-packages, the venv's included
    python3.chmod(0o755)
    (folder / "lib" / "yaml").symlink_to(Path(yaml.__file__).parent)
    env = {**os.environ, "USER": os.environ.get("USER") or "participant", "PYTHONPATH": str(folder / "lib"),
           "PATH": f"{folder / 'bin'}:/usr/bin:/bin"}
    for name in ("WORKSHOP_SHARED_ROOT", "WORKSHOP_RESERVATION", "VIRTUAL_ENV"):
        env.pop(name, None)
    bare = subprocess.run(["python3", "-c", "import yaml, pandas"], env=env, capture_output=True, text=True)
    assert "No module named 'pandas'" in bare.stderr, "the stand-in login-node python3 must lack pandas"
    return env


def test_the_dry_run_on_the_page_runs_and_lists_the_steps_of_the_table(tmp_path):
    result = subprocess.run(["./workshop-setup", "ibex", "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env=login_node_python(tmp_path))
    assert result.returncode == 0, result.stderr
    printed = re.findall(r"^\[\d+/\d+\] ([\w.-]+): ", result.stdout, flags=re.MULTILINE)
    table = re.findall(r"^\| `([\w.-]+)` \|", PAGE.read_text(), flags=re.MULTILINE)
    planned = [step.name for step in build_plan(load_profile("ibex")).steps]
    assert printed == table == planned


def test_the_sample_output_follows_what_setup_prints():
    sample = _fenced(PAGE.read_text(), "text")[0].splitlines()
    steps = build_plan(load_profile("ibex")).steps
    titles = {step.name: step.title for step in steps}
    for line in sample[:-1]:
        number, total, name, rest = re.fullmatch(r"\[(\d+)/(\d+)\] ([\w.-]+): (.*)", line).groups()
        assert int(total) == len(steps) and steps[int(number) - 1].name == name
        assert rest in (f"{titles[name]} ...", "already done, skipped") or re.fullmatch(r"done in \d+\.\d s", rest)
    ran, done = map(int, re.fullmatch(r"setup of 'ibex' complete: (\d+) step\(s\) ran, (\d+) already done",
                                      sample[-1]).groups())
    assert ran + done == len(steps)


def test_what_the_page_says_about_jobs_is_what_the_scripts_do():
    text = " ".join(PAGE.read_text().split())
    ibex = load_profile("ibex")
    message = Requirement("...", "nemo-image", "The NeMo container image").message
    assert message in text and "exit status 45" in text
    assert f"below {ibex.bandwidth_check.min_bus_bandwidth_gbps:g} GB/s" in text
    assert f"`NCCL_IB_HCA={ibex.bandwidth_check.environment['NCCL_IB_HCA']}`" in text
    assert f"{Experiment.__dataclass_fields__['cpus_per_task'].default} cores per training process" in text
    documented, to_confirm = text.split("### What KAUST documents", 1)[1].split("### To confirm before the day")
    for module in ibex.nemo.modules + ibex.python.modules:
        assert f"`{module}`" in documented and module not in to_confirm
    # What KAUST's pages state is cited there, not left to confirm.
    for fact in ("glogin.ibex.kaust.edu.sa", "mlx5", "singularity pull", "a100,4gpus", "a100,8gpus"):
        assert fact in documented and fact not in to_confirm, fact
    assert "soft_env/job_schd/slurm/interactive_jobs/jupyter.rst" in documented
    assert "nemo_25.07.sif" in ibex.nemo.image and "NeMo 25.07" in text


def test_the_instructor_checklist_names_what_staging_needs():
    checklist = " ".join(PAGE.read_text().split("## 0. Before the day", 1)[1].split("## 1.", 1)[0].split())
    for hub_id in load_profile("ibex").nemo.hub_ids.values():  # the gated models whose licences the token needs
        assert f"`{hub_id}`" in checklist
    for need in ("/ibex/project/c####", "project's group", "tmux new -s staging",
                 "unset WORKSHOP_RESERVATION", "second account's check", "--reservation` alone, no `--account`"):
        assert need in checklist, need
    assert "`account:` under `scheduler:`" in " ".join(PAGE.read_text().split())  # what to do if one is needed
    assert "account" in Scheduler.__dataclass_fields__


def test_the_torch_the_page_promises_is_the_one_environment_yml_installs():
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(item["pip"] for item in environment["dependencies"] if isinstance(item, dict))
    pin = next(line for line in pip if line.startswith("torch=="))
    version, label = pin.removeprefix("torch==").split("+")
    cuda = f"{label[2:4]}.{label[4:]}"
    text = PAGE.read_text()
    assert f"`{version}+{label} {cuda} True`" in text and f"torch {version}+{label} (CUDA {cuda})" in text
    assert f"https://download.pytorch.org/whl/{label}" in text


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_the_check_on_the_gpu_node_runs_here_with_the_cpu_build():
    line = next(line for block in BLOCKS for line in block.splitlines() if line.startswith("python -c"))
    result = subprocess.run(["bash", "-c", line.replace("python", sys.executable, 1)], capture_output=True,
                            text=True, timeout=120)
    version, cuda, available = result.stdout.split()
    assert version.startswith("2.13.0") and available in ("True", "False")


@pytest.mark.cluster
def test_the_slurm_commands_are_accepted_by_the_local_cluster(local_cluster):
    env = {**os.environ, "SLURM_CONF": str(local_cluster.conf)}
    show = next(line for block in BLOCKS for line in block.splitlines() if line.startswith("scontrol show reservation"))
    name = show.split()[-1]
    exported = next(line for block in BLOCKS for line in block.splitlines()
                    if line.startswith("export WORKSHOP_RESERVATION="))
    assert exported == f"export WORKSHOP_RESERVATION={name}", "one example name on the whole page"
    # The instructor's reservation: one node, for the seconds this test runs.
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    subprocess.run(["scontrol", "create", "reservation", f"ReservationName={name}", "StartTime=now", "Duration=10",
                    f"Users={user}", "NodeCnt=1"], env=env, check=True, capture_output=True, timeout=60)
    try:
        shown = subprocess.run(show.split(), env=env, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and f"ReservationName={name}" in shown.stdout, shown.stdout + shown.stderr
        srun = next(line for block in BLOCKS for line in block.splitlines() if line.startswith("srun "))
        assert srun.endswith(" --pty bash")
        test_only = srun.replace("srun ", "srun --test-only ", 1).removesuffix(" --pty bash") + " true"
        for reservation in (name, ""):  # the day's reservation exported, and none (on your own)
            result = subprocess.run(["bash", "-c", test_only], env={**env, "WORKSHOP_RESERVATION": reservation},
                                    capture_output=True, text=True, timeout=60)
            assert result.returncode == 0 and "to start at" in result.stderr, (reservation, result.stderr)
        # The exported name reaches srun: one SLURM does not know is refused.
        wrong = subprocess.run(["bash", "-c", test_only], env={**env, "WORKSHOP_RESERVATION": "no-such-reservation"},
                               capture_output=True, text=True, timeout=60)
        assert wrong.returncode != 0 and "reservation is invalid" in wrong.stderr, wrong.stderr
    finally:
        subprocess.run(["scontrol", "delete", f"ReservationName={name}"], env=env, capture_output=True, timeout=60)


def test_the_bootstrap_wrapper_is_clean_shell():
    subprocess.run(["bash", "-n", str(ROOT / "workshop-setup")], check=True)
    if shutil.which("shellcheck"):
        result = subprocess.run(["shellcheck", str(ROOT / "workshop-setup")], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


def test_the_bootstrap_wrapper_refuses_an_unknown_profile_naming_the_known_ones():
    result = subprocess.run(["./workshop-setup", "nowhere"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "no profile slurm/profiles/nowhere.yml" in result.stderr
    assert "ibex.yml" in result.stderr


def test_the_batch_job_is_the_jupyter_route_the_intro_and_the_page_give():
    intro = " ".join((ROOT / "book" / "intro.md").read_text().split())
    assert "(`workshop lab --ibex`), the route KAUST documents" in intro and "Open OnDemand" not in intro
    jupyter = PAGE.read_text().split("## 6. JupyterLab", 1)[1].split("\n## ", 1)[0]
    assert jupyter.index("workshop lab --ibex") < jupyter.index("**Open OnDemand** is not in KAUST's documentation")
