"""The Ibex path rehearsed on the local SLURM cluster, as a class meets it: the instructor stages everything
once (`workshop setup --stage DIR`, its environment built under a real srun and its `nemo llm import` jobs
on the cluster), a participant's setup uses the staged folder, then Ibex job scripts of every chapter run
from the participant's profile, with shims for what only Ibex has (tests/ibex_site.py) and the network
blocked.

It passes only if every job reaches training without touching the network, every module, image, conda
environment and setup record a job asked for was produced by the staging, and neither the participant's
setup nor their jobs download anything or write into the staged folder.

The subset keeps CI short (about two minutes on 2 cores): one job per template and chapter shape —
chapter 1 LoRA through the NeMo container, chapter 2 tensor parallel through it, chapter 3 the HF
baseline in the conda environment, chapter 4 multi-node FSDP with the inter-node all-reduce check.
The setup's two `nemo llm import` jobs run on the cluster too (`sbatch --wait`). The other rows of each
chapter render through the same templates (tests/scripts/test_scripts.py checks every one with shellcheck and
`sbatch --test-only`; tests/sites/test_profile_quoting.py runs every one against shims).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from ibex_site import SITE_MODULES, IbexSite

from workshop_lib import jobs as cluster
from workshop_lib.experiments import get_experiment
from workshop_lib.results.parse.nccl import parse_nccl_allreduce
from workshop_lib.scripts import render_script, template_for
from workshop_lib.sites.profiles import load_profile

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REHEARSED = ["lora/llama/1-gpu", "model-parallel/llama/tp2-dp2", "zero/baseline", "fsdp/multi-node/2-nodes"]


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in sorted(folder.rglob("*")) if path.is_file() and not path.is_symlink()}


@pytest.fixture(scope="module")
def rehearsal(local_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("ibex")
    site = IbexSite(root, real_srun=True)
    stage = root / "stage"
    saved = dict(os.environ)
    os.environ.update(site.environment(dict(os.environ)))  # sbatch hands this environment to the jobs
    os.environ.pop("WORKSHOP_SHARED_ROOT", None)
    command = [sys.executable, "-m", "workshop_lib.cli", "setup", str(site.profile_path),
               "--miniforge-installer", f"file://{site.installer}"]
    try:
        setup = subprocess.run([*command, "--stage", str(stage)], capture_output=True, text=True, timeout=600)
        assert setup.returncode == 0, setup.stdout + setup.stderr
        staged = _snapshot(stage)
        calls_staged = len(site.calls())
        os.environ["WORKSHOP_SHARED_ROOT"] = str(stage)
        started = time.monotonic()
        participant = subprocess.run(command, capture_output=True, text=True, timeout=600)
        participant_s = time.monotonic() - started
        assert participant.returncode == 0, participant.stdout + participant.stderr
        profile = load_profile(site.profile_path)
        assert profile.shared_root == str(stage)
        own = Path(profile.cache_root.replace("$USER", os.environ.get("USER") or "root")).parent
        written = sum(path.stat().st_size for path in own.rglob("*") if path.is_file())
        jobs = {}
        for experiment_id in REHEARSED:
            experiment = get_experiment(experiment_id)
            run_dir = root / "runs" / experiment_id
            run_dir.mkdir(parents=True)
            script = run_dir / "job.sbatch"
            script.write_text(render_script(experiment, profile))
            jobs[experiment_id] = cluster.submit(script)
        infos = dict(zip(jobs, cluster.wait_for(jobs.values(), timeout=480, progress=False)))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return SimpleNamespace(site=site, profile=profile, setup_output=setup.stdout, jobs=jobs, infos=infos,
                           stage=stage, staged=staged, participant=participant, participant_s=participant_s,
                           participant_calls=site.calls()[calls_staged:], participant_bytes=written)


def test_staging_ran_every_step_its_environment_under_srun_and_its_import_jobs_on_the_cluster(rehearsal):
    site, setup_output = rehearsal.site, rehearsal.setup_output
    print("\n" + setup_output)
    assert "10 step(s) ran, 0 already done" in setup_output
    imports = [call for call in site.calls("singularity") if "import" in call["argv"]]
    assert len({call["job"] for call in imports} - {None}) == 2, "each nemo llm import step ran as a batch job"
    created = [call for call in site.calls("conda") if call["argv"][:2] == ["env", "create"]]
    assert len(created) == 1 and created[0]["job"] not in (None, ""), "conda env create ran inside an allocation"
    assert "(on a compute node: srun --nodes=1 --ntasks=1 --time=01:00:00" in setup_output
    assert (rehearsal.stage / "STAGED.json").is_file()


def test_the_participant_downloads_nothing_and_writes_nothing_into_the_staged_folder(rehearsal):
    programs = [call["program"] for call in rehearsal.participant_calls]
    assert not {"hub-download", "srun"} & set(programs), programs
    assert not [call for call in rehearsal.participant_calls
                if call["program"] in ("conda", "singularity") and call["argv"][:1] in (["env"], ["pull"])]
    assert _snapshot(rehearsal.stage) == rehearsal.staged, "the staged folder changed under the class"
    print(f"\nparticipant setup with the staged folder: {rehearsal.participant_s:.1f} s, "
          f"{rehearsal.participant_bytes / 1e3:.1f} kB written to their own storage, 0 downloads; "
          f"{rehearsal.participant.stdout.strip().splitlines()[-1]}")
    # shared-folder is its own check: it passes at once, so it counts as done
    assert "3 step(s) ran, 1 already done" in rehearsal.participant.stdout


def test_every_job_reaches_training_offline_with_what_setup_made(rehearsal):
    site, profile, jobs, infos = rehearsal.site, rehearsal.profile, rehearsal.jobs, rehearsal.infos
    pulled = {call["argv"][1].removesuffix(".partial") for call in site.calls("singularity") if call["argv"][0] == "pull"}
    created = {call["argv"][call["argv"].index("-n") + 1] for call in site.calls("conda") if call["argv"][:1] == ["env"]}
    rows = []
    for experiment_id, job in jobs.items():
        info = infos[experiment_id]
        run_dir = Path(job.stdout_path).parent
        calls = [call for call in site.calls() if call.get("job") == job.job_id]
        modules = sorted({word for call in calls if call["program"] == "module" for word in call["argv"][1:]})
        images = {call["image"] for call in calls if call["program"] == "singularity"}
        activated = {call["argv"][1] for call in calls if call["program"] == "conda" and call["argv"][0] == "activate"}
        network = [attempt for attempt in site.network_attempts() if attempt["job"] == job.job_id]
        metrics = sorted(run_dir.rglob("metrics.jsonl"))
        rows.append((job.job_id, experiment_id, template_for(get_experiment(experiment_id), profile), info.state,
                     info.exit_code, f"{info.elapsed_s or 0:.0f} s", "yes" if metrics else "NO", len(network),
                     ",".join(modules) or "-", "image" if images else ("conda:" + ",".join(activated) or "-")))
        log = Path(job.stdout_path).read_text() if job.stdout_path and Path(job.stdout_path).exists() else ""
        assert info.state == "COMPLETED" and info.exit_code == 0, f"{experiment_id}: {info}\n{log[-3000:]}"
        assert metrics, f"{experiment_id} never reached training:\n{log[-3000:]}"
        assert network == [], f"{experiment_id} tried the network: {network}"
        assert set(modules) <= set(SITE_MODULES) and set(modules) <= set(profile.nemo.modules + profile.python.modules)
        assert images <= pulled and activated <= created
        assert images or activated, f"{experiment_id} used neither the container nor the conda environment"
        assert "HF_HUB_OFFLINE=1" in (run_dir / "job.sbatch").read_text()
    header = ("job", "experiment", "template", "state", "exit", "elapsed", "trained", "network", "modules", "ran in")
    table = [header, *rows]
    widths = [max(len(str(row[column])) for row in table) for column in range(len(header))]
    print("\nIbex rehearsal on the local cluster (tiny engines behind the shims, network blocked):")
    for row in table:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)))


def test_the_bandwidth_check_spans_both_nodes_before_training(rehearsal):
    jobs = rehearsal.jobs
    run_dir = Path(jobs["fsdp/multi-node/2-nodes"].stdout_path).parent
    result = parse_nccl_allreduce((run_dir / "nccl_allreduce.txt").read_text())
    assert sorted(result.hosts) == ["node1", "node2"] and result.out_of_bounds == 0 and result.skipped_lines == 0
    assert result.avg_bus_bandwidth_gbps > 0
    log = Path(jobs["fsdp/multi-node/2-nodes"].stdout_path).read_text()
    assert "All-reduce bus bandwidth:" in log and log.index("All-reduce bus bandwidth:") < log.index("Job finished")
