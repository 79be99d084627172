"""JupyterLab as a batch job (`workshop lab --batch` / `--ibex`), KAUST's documented way to run Jupyter on
Ibex; and jobs submitted from a kernel that itself runs inside a job (that route, or Open OnDemand)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from repo_paths import REPO

from workshop_lib import jobs as cluster
from workshop_lib.scripts.lab import connection, render_lab_script
from workshop_lib.sites.profiles import load_profile

ROOT = REPO


def test_the_ibex_lab_job_follows_kaust_and_asks_for_no_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKSHOP_RESERVATION", "ws-day")
    text = render_lab_script(load_profile("ibex"), Path("/ibex/user/u/dist-ft-workshop/workshop"))
    assert text.startswith("#!/bin/bash -l\n")  # a login shell: conda activate works in batch jobs on Ibex
    assert "#SBATCH --reservation=ws-day" in text and "#SBATCH --time=04:00:00" in text
    assert "gpu" not in "".join(line for line in text.splitlines() if line.startswith("#SBATCH"))
    assert "--constraint" not in text
    assert 'address="${node}.ibex.kaust.edu.sa"' in text
    assert 'echo "TUNNEL: ssh -L ${port}:${address}:${port} ${USER:-$(id -un)}@glogin.ibex.kaust.edu.sa"' in text
    assert "conda activate dist-ft-workshop" in text
    if shutil.which("shellcheck"):
        script = tmp_path / "lab.sbatch"
        script.write_text(text)
        result = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


def test_connection_waits_for_both_the_tunnel_and_the_token():
    tunnel = "TUNNEL: ssh -L 41234:gpu201-02.ibex.kaust.edu.sa:41234 someone@glogin.ibex.kaust.edu.sa\n"
    url = "    http://gpu201-02.ibex.kaust.edu.sa:41234/lab?token=0f3a9c\n"
    assert connection(tunnel) is None and connection(url) is None
    found = connection(tunnel + "[I ServerApp] Jupyter Server is running at:\n" + url)
    assert found.local_url == "http://127.0.0.1:41234/lab?token=0f3a9c"
    assert found.tunnel.startswith("ssh -L 41234:gpu201-02.ibex.kaust.edu.sa:41234 ")


def test_bad_arguments_end_with_a_message():
    result = subprocess.run([sys.executable, "-m", "workshop_lib.cli", "lab", "--batch", "--wait", "0"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "--wait 0: give a number of seconds above 0" in result.stderr
    result = subprocess.run([sys.executable, "-m", "workshop_lib.cli", "lab"], capture_output=True, text=True)
    assert result.returncode == 2 and "one of the arguments --ibex --batch is required" in result.stderr


@pytest.mark.cluster
@pytest.mark.slow
def test_the_lab_job_starts_a_server_reachable_with_the_printed_url(local_cluster, tmp_path):
    env = {**os.environ, "WORKSHOP_RUNS_DIR": str(tmp_path / "runs"), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    result = subprocess.run([sys.executable, "-m", "workshop_lib.cli", "lab", "--batch", "--profile", "tiny",
                             "--wait", "240"], capture_output=True, text=True, timeout=300, env=env)
    job_id = re.search(r"as job (\S+)", result.stdout)
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        print("\n" + result.stdout)
        url = re.search(r"(http://127\.0\.0\.1:(\d+)/lab\?token=(\w+))", result.stdout)
        assert url and "ssh -L" in result.stdout and f"scancel {job_id.group(1)}" in result.stdout
        port, token = url.group(2), url.group(3)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=30) as answer:
            status = json.loads(answer.read())
        assert "started" in status, status
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/kernelspecs?token={token}", timeout=30) as answer:
            assert "python3" in json.loads(answer.read())["kernelspecs"]
    finally:
        if job_id:
            cluster.job_from_id(job_id.group(1)).cancel()


@pytest.mark.cluster
@pytest.mark.slow
def test_a_job_submitted_from_inside_a_job_does_not_inherit_its_slurm_variables(local_cluster, tmp_path,
                                                                                monkeypatch):
    """A kernel in the Jupyter job has SLURM_MEM_PER_CPU etc. in its environment; the chapter's job asks
    for --mem; srun in it would stop with 'mutually exclusive' if the variables went along."""
    script = tmp_path / "inner.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --mem=100M\n#SBATCH --time=00:01:00\n#SBATCH --output=inner-%j.out\n"
                      "srun --ntasks=1 true && echo INNER-OK\n")
    inherited = {"SLURM_MEM_PER_CPU": "1024", "SLURM_JOB_ID": "999", "SLURM_CPUS_PER_TASK": "4"}
    # Without the scrub: sbatch hands the lab job's variables on and the inner srun refuses to start.
    raw = subprocess.run(["sbatch", "--parsable", f"--chdir={tmp_path}", str(script)], capture_output=True,
                         text=True, env={**os.environ, **inherited}, check=True)
    for name, value in inherited.items():
        monkeypatch.setenv(name, value)
    job = cluster.submit(script, workdir=tmp_path)
    raw_job = cluster.job_from_id(raw.stdout.strip().split(";")[0])
    infos = cluster.wait_for([raw_job, job], timeout=120, progress=False)
    raw_log = next(tmp_path.glob(f"inner-{raw_job.job_id}.out")).read_text()
    assert "INNER-OK" not in raw_log and "mutually exclusive" in raw_log, raw_log  # what the scrub prevents
    assert infos[1].state == "COMPLETED", infos[1]
    assert "INNER-OK" in Path(job.stdout_path).read_text()


def test_the_lab_opens_the_participants_own_clone_never_the_staged_copy(tmp_path, monkeypatch, capsys):
    from workshop_lib.cli import main
    from workshop_lib.sites.requirements import MANIFEST

    # With a class's staged environment the library is the staged copy; from $HOME that is the folder found.
    staged = tmp_path / "stage" / "workshop"
    staged.mkdir(parents=True)
    (staged / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (staged.parent / MANIFEST).write_text("{}\n")
    monkeypatch.setattr("workshop_lib.core.paths.SOURCE_ROOT", staged)
    monkeypatch.delenv("WORKSHOP_ROOT", raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.chdir(home)
    assert main(["lab", "--ibex", "--print-only"]) == 2
    error = capsys.readouterr().err
    assert f"JupyterLab would open {staged}, the class's staged copy" in error and "cd into it" in error
    own = tmp_path / "workshop"
    (own / "notebooks").mkdir(parents=True)
    (own / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    monkeypatch.chdir(own / "notebooks")
    assert main(["lab", "--ibex", "--print-only"]) == 0
    assert f"--ServerApp.root_dir={own}" in capsys.readouterr().out
