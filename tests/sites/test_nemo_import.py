"""The NeMo checkpoint import cannot half-succeed: it converts into a temporary folder beside the final one,
checks the files NeMo writes last, then renames; a retry after a killed import starts over; the setup step
is recorded done only once the complete checkpoint is in place. A fake `nemo` on PATH stands in for NeMo."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from repo_paths import REPO

from workshop_lib.scripts import render_import_script
from workshop_lib.sites.nemo_checkpoint import BUSY_EXIT, COMPLETE_FILES, INCOMPLETE_EXIT, LOCK_SUFFIX, is_complete
from workshop_lib.sites.profiles import PROFILES_DIR, load_profile
from workshop_lib.sites.requirements import SetupError
from workshop_lib.sites.setup_plan import build_plan
from workshop_lib.sites.setup_run import is_done, run

ROOT = REPO
HUB_ID = "meta-llama/Llama-3.1-8B"

# `nemo llm import ... output_path=DIR`, as far as the job can tell. Like NeMo, it leaves an existing folder
# alone and exits 0 (the trap); FAKE_NEMO says how a fresh conversion ends.
FAKE_NEMO = """#!/bin/bash
echo "$*" >> "$FAKE_NEMO_LOG"
for word in "$@"; do case "$word" in output_path=*) out=${word#output_path=} ;; esac; done
if [ -e "$out" ]; then echo "$out exists: skipping the conversion"; exit 0; fi
mkdir -p "$out/weights" && : > "$out/weights/__0_0.distcp"
case "$FAKE_NEMO" in
    killed) exit 137 ;;  # the job was cancelled or ran out of memory half-way
    lying) exit 0 ;;  # ended without the rest of its files
    held) : > "$FAKE_NEMO_STARTED"; while [ ! -e "$FAKE_NEMO_RELEASE" ]; do sleep 0.05; done ;;  # a long conversion
esac
: > "$out/weights/.metadata"; echo '{}' > "$out/weights/metadata.json"
mkdir -p "$out/context" && echo '{}' > "$out/context/io.json"
"""
SHIMS = {
    "nemo": FAKE_NEMO,
    "module": "#!/bin/bash\nexit 0\n",
    # srun and singularity drop their own options and run the command on this machine.
    "srun": '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n',
    "singularity": '#!/bin/bash\nshift\nwhile [[ "$1" == --* ]]; do [ "$1" = --bind ] && shift; shift; done\n'
                   'shift\nexec "$@"\n',
    # sbatch --wait: run the job here and return its status, as sbatch does when the job ends.
    "sbatch": '#!/bin/bash\nshift\nSLURM_JOB_ID=1 SLURM_CPUS_PER_TASK=8 exec bash "$@" > slurm-1.out 2>&1\n',
    "workshop": f'#!/bin/bash\nPYTHONPATH={ROOT} exec {sys.executable} -m workshop_lib.cli "$@"\n',
    # squeue -j ID: jobs in $FAKE_SQUEUE_RUNNING run; any other has ended, and SLURM no longer knows it.
    "squeue": '#!/bin/bash\nwhile [ $# -gt 0 ]; do [ "$1" = -j ] && id=$2; shift; done\n'
              '[ -n "$FAKE_SQUEUE_DOWN" ] && { echo "squeue: error: Unable to contact slurm controller" >&2; exit 1; }\n'
              'for job in $FAKE_SQUEUE_RUNNING; do [ "$job" = "$id" ] && { echo RUNNING; exit 0; }; done\n'
              'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1\n',
}


class Site:
    def __init__(self, root: Path):
        data = yaml.safe_load((PROFILES_DIR / "ibex.yml").read_text())
        data["name"] = "import-site"
        data["cache_root"] = f"{root}/cache"
        data["python"]["conda_root"] = None  # the `workshop` on PATH renders the job
        data["nemo"].update(image=f"{root}/nemo.sif", binds=[str(root)])
        self.profile_path = root / "import-site.yml"
        self.profile_path.write_text(yaml.safe_dump(data))
        self.profile = load_profile(self.profile_path)
        (root / "nemo.sif").write_text("image\n")
        (root / "cache" / "setup").mkdir(parents=True)
        (root / "cache" / "setup" / "hub-download.done").write_text("done\n")
        bin_dir = root / "bin"
        bin_dir.mkdir()
        for name, text in SHIMS.items():
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        self.root, self.log = root, root / "nemo_calls.txt"
        self.checkpoint = root / "cache" / "nemo_cache" / "models" / HUB_ID
        self.partial = self.checkpoint.with_name(self.checkpoint.name + ".partial")
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_NEMO_LOG": str(self.log),
                    "USER": os.environ.get("USER") or "participant"}
        self.env.pop("NEMO_MODELS_CACHE", None)
        self.env.pop("WORKSHOP_RESERVATION", None)

    def run_job(self, how: str, job_id: str = "1", **env) -> subprocess.CompletedProcess:
        return finish(self.start_job(how, job_id, **env))

    def start_job(self, how: str, job_id: str = "1", **env) -> subprocess.Popen:
        script = self.root / f"job-{job_id}.sbatch"
        script.write_text(render_import_script("llama-3.1-8b", self.profile))
        env = {**self.env, "FAKE_NEMO": how, "SLURM_JOB_ID": job_id, "SLURM_CPUS_PER_TASK": "8", **env}
        return subprocess.Popen(["bash", str(script)], cwd=self.root, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def nemo_calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


def finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = process.communicate(timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.fixture
def site(tmp_path):
    return Site(tmp_path)


def test_the_import_script_is_valid_bash_and_writes_beside_the_final_folder():
    text = render_import_script("mixtral-8x7b", "ibex")
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    assert 'CHECKPOINT="${NEMO_MODELS_CACHE:-${NEMO_HOME:-$HOME/.cache/nemo}/models}"/mistralai/Mixtral-8x7B-v0.1' \
        in text
    assert 'output_path="$PARTIAL" -y' in text and 'mv -T "$PARTIAL" "$CHECKPOINT"' in text
    assert text.index('rm -rf "$PARTIAL"') < text.index("nemo llm import") < text.index('mv -T "$PARTIAL"')


def test_a_killed_import_leaves_no_final_folder_and_the_retry_starts_over(site):
    killed = site.run_job("killed")
    assert killed.returncode == 137 and not site.checkpoint.exists()
    assert site.partial.is_dir() and not is_complete(site.partial)  # what a cancelled job leaves behind
    assert "without a complete checkpoint" in killed.stderr and "--only nemo-import-llama-3.1-8b" in killed.stderr
    retry = site.run_job("complete")
    assert retry.returncode == 0, retry.stderr
    assert is_complete(site.checkpoint) and not site.partial.exists()
    assert "skipping" not in retry.stdout  # the partial folder was removed, so NeMo converted again
    assert len(site.nemo_calls()) == 2 and all(f"output_path={site.partial}" in call for call in site.nemo_calls())


def test_an_import_that_exits_0_without_its_last_files_fails_the_job(site):
    result = site.run_job("lying")
    assert result.returncode == INCOMPLETE_EXIT and not site.checkpoint.exists()
    assert "(exit status 0) without a complete checkpoint" in result.stderr


def test_an_incomplete_final_folder_is_replaced_and_a_complete_one_kept(site):
    (site.checkpoint / "weights").mkdir(parents=True)  # left by an import straight into place
    replaced = site.run_job("complete")
    assert replaced.returncode == 0 and "Removing the incomplete" in replaced.stdout
    assert is_complete(site.checkpoint)
    again = site.run_job("killed")  # would fail if it ran: a complete checkpoint is not converted twice
    assert again.returncode == 0 and "complete already" in again.stdout and len(site.nemo_calls()) == 1


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_the_setup_step_is_done_only_when_the_complete_checkpoint_is_in_place(site):
    plan = build_plan(site.profile)
    [step] = [step for step in plan.steps if step.name == "nemo-import-llama-3.1-8b"]
    marker = site.root / "cache" / "setup" / f"{step.name}.done"
    with pytest.raises(SetupError, match=r"nemo-import-llama-3\.1-8b failed \(exit status 137\)"):
        run(plan, [step], echo=lambda line: None, env={**site.env, "FAKE_NEMO": "killed"})
    assert not marker.exists() and not is_done(plan, step)
    with pytest.raises(SetupError, match=f"exit status {INCOMPLETE_EXIT}"):
        run(plan, [step], echo=lambda line: None, env={**site.env, "FAKE_NEMO": "lying"})
    assert not marker.exists() and not is_done(plan, step)
    assert run(plan, [step], echo=lambda line: None, env={**site.env, "FAKE_NEMO": "complete"}) == [step.name]
    assert marker.exists() and is_complete(site.checkpoint) and is_done(plan, step)
    # A checkpoint removed later (quota clean-up) makes the step due again, marker or not.
    (site.checkpoint / COMPLETE_FILES[-1]).unlink()
    assert not is_done(plan, step)


def test_the_setup_step_refuses_a_job_that_succeeded_without_the_checkpoint(site, capfd):
    plan = build_plan(site.profile)
    [step] = [step for step in plan.steps if step.name == "nemo-import-llama-3.1-8b"]
    (site.root / "bin" / "sbatch").write_text("#!/bin/bash\nexit 0\n")  # a job that did nothing, successfully
    with pytest.raises(SetupError, match="exit status 1"):
        run(plan, [step], echo=print, env=site.env)
    assert "The import job ended without a complete checkpoint in " in capfd.readouterr().err
    assert not (site.root / "cache" / "setup" / f"{step.name}.done").exists()


def test_an_import_started_beside_a_running_one_stops_and_leaves_its_partial_folder(site):
    started, release = site.root / "started", site.root / "release"
    first = site.start_job("held", "1", FAKE_NEMO_STARTED=str(started), FAKE_NEMO_RELEASE=str(release))
    try:
        deadline = time.monotonic() + 60
        while not started.exists():  # the first job is converting into its partial folder
            assert first.poll() is None and time.monotonic() < deadline, "the first import did not start"
            time.sleep(0.05)
        second = site.run_job("complete", "2", FAKE_SQUEUE_RUNNING="1")
        assert second.returncode == BUSY_EXIT, second.stdout + second.stderr
        assert f"Another import of {site.checkpoint} is running as job 1" in second.stderr
        assert "--only nemo-import-llama-3.1-8b" in second.stderr
        assert site.partial.is_dir() and len(site.nemo_calls()) == 1  # untouched; the second never converted
        # The setup run again says so on the login node and submits nothing.
        plan = build_plan(site.profile)
        [step] = [step for step in plan.steps if step.name == "nemo-import-llama-3.1-8b"]
        (site.root / "bin" / "sbatch").write_text("#!/bin/bash\necho submitted >> sbatch_calls.txt\n")
        with pytest.raises(SetupError, match="exit status 1"):
            run(plan, [step], echo=lambda line: None, env={**site.env, "FAKE_SQUEUE_RUNNING": "1"})
        assert not (Path(plan.profile.cache_root) / "setup" / step.name / "sbatch_calls.txt").exists()
    finally:
        release.touch()
    done = finish(first)
    assert done.returncode == 0, done.stderr
    assert is_complete(site.checkpoint) and not site.partial.exists()
    assert not site.checkpoint.with_name(site.checkpoint.name + LOCK_SUFFIX).exists()


def test_a_lock_left_by_an_ended_job_is_taken_over_one_whose_job_slurm_cannot_see_is_not(site):
    lock = site.checkpoint.with_name(site.checkpoint.name + LOCK_SUFFIX)
    lock.mkdir(parents=True)
    (lock / "job").write_text("5\n")  # its job was killed with its node: nothing released the lock
    unsure = site.run_job("complete", "6", FAKE_SQUEUE_DOWN="1")
    assert unsure.returncode == BUSY_EXIT and "running as job 5" in unsure.stderr  # never broken on a guess
    taken = site.run_job("complete", "6")
    assert taken.returncode == 0, taken.stderr
    assert "the import job that held it has ended" in taken.stdout and is_complete(site.checkpoint)
    assert not lock.exists()
