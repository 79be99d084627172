"""Rendered job scripts: valid shell, clean for shellcheck and the linter, accepted by SLURM."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess

import pytest
import yaml

from workshop_lib.checks.lint import lint_script
from workshop_lib.cli import main
from workshop_lib.core.errors import WorkshopError
from workshop_lib.experiments import all_experiments, get_experiment
from workshop_lib.scripts import render_import_script, render_script
from workshop_lib.sites.profiles import PROFILES_DIR, load_profile

PROFILES = {name: load_profile(name) for name in ("ibex", "tiny")}
CASES = [pytest.param(name, experiment, id=f"{name}:{experiment.id}")
         for name, profile in PROFILES.items() for experiment in all_experiments() if profile.supports(experiment)]
SHAPE_OPTIONS = ("nodes", "ntasks-per-node", "gpus-per-node", "cpus-per-task", "mem", "constraint")


def directives(text: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([a-z-]+)=(\S+)", text, re.MULTILINE))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """Every supported (profile, experiment) script, written once for the whole module."""
    folder = tmp_path_factory.mktemp("rendered")
    paths = {}
    for name, profile in PROFILES.items():
        for experiment in all_experiments():
            if profile.supports(experiment):
                path = folder / f"{name}-{experiment.job_name}.sbatch"
                path.write_text(render_script(experiment, profile))
                paths[(name, experiment.id)] = path
    return paths


@pytest.mark.parametrize("profile_name, experiment", CASES)
def test_render_passes_bash_shellcheck_and_linter(rendered, profile_name, experiment):
    path = rendered[(profile_name, experiment.id)]
    subprocess.run(["bash", "-n", str(path)], check=True)
    if shutil.which("shellcheck"):
        result = subprocess.run(["shellcheck", "--severity=error", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout
    assert [finding for finding in lint_script(path.read_text()) if finding.is_error] == []


@pytest.fixture(scope="module")
def ibex_sized_cluster(tmp_path_factory):
    """A second local cluster with 8 A100-like nodes, only for `sbatch --test-only` (no jobs run on it).

    It has its own state folder and ports, so it runs beside the session's 2-node cluster.
    """
    import os

    from workshop_lib.jobs.local_cluster import LocalCluster, Ports

    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster needs root")
    base = Ports.from_environment().base + 200
    cluster = LocalCluster(state_dir=tmp_path_factory.mktemp("ibex-sized"), ports=Ports(base))
    cluster.up(nodes=8, accounting=False)
    yield cluster
    cluster.down()


@pytest.mark.cluster
@pytest.mark.parametrize("profile_name, experiment", CASES)
def test_render_is_accepted_by_sbatch_test_only(ibex_sized_cluster, rendered, profile_name, experiment, monkeypatch):
    from workshop_lib.jobs.job import test_only

    monkeypatch.setenv("SLURM_CONF", str(ibex_sized_cluster.conf))
    path = rendered[(profile_name, experiment.id)]
    # The ibex profile names no partition: on the local cluster, its default partition answers.
    assert "to start at" in test_only(path)


def test_tiny_and_ibex_scripts_share_the_request_shape():
    for experiment in all_experiments():
        if not PROFILES["tiny"].supports(experiment):
            continue
        ibex = directives(render_script(experiment, PROFILES["ibex"]))
        tiny = directives(render_script(experiment, PROFILES["tiny"]))
        assert {key: ibex.get(key) for key in SHAPE_OPTIONS} == {key: tiny.get(key) for key in SHAPE_OPTIONS}
        assert ibex["output"] == tiny["output"] == "slurm-%j.out"


def test_nemo_script_uses_the_container_and_every_override():
    text = render_script(get_experiment("model-parallel/mixtral/tp4-pp2-ep2-sp"), "ibex")
    # The recipe's own full fine-tune, not the LoRA recipe with its adapter dropped (peft=none).
    assert 'srun --cpus-per-task="$SLURM_CPUS_PER_TASK" singularity exec --nv' in text
    assert "nemo llm finetune --factory 'mixtral_8x7b(peft_scheme=None)'" in text and "peft=none" not in text
    for override in ("trainer.num_nodes=2", "trainer.devices=8", "trainer.max_steps=250", "data.global_batch_size=8",
                     "optim.lr_scheduler.warmup_steps=50", "trainer.limit_val_batches=10",
                     "trainer.strategy.tensor_model_parallel_size=4",
                     "trainer.strategy.pipeline_model_parallel_size=2",
                     "trainer.strategy.virtual_pipeline_model_parallel_size=None",
                     "trainer.strategy.expert_model_parallel_size=2",
                     "trainer.strategy.sequence_parallel=True", "log.ckpt=None", "trainer.enable_checkpointing=False"):
        assert override in text
    assert "--yes || TRAIN_STATUS" in text and " -y " not in text
    assert directives(text)["ntasks-per-node"] == "8" and "--ntasks=" not in text
    assert "export HF_HOME=" in text and "module load singularity" in text


def test_tiny_realises_nemo_rows_with_the_stand_in_engines():
    lora = render_script(get_experiment("lora/llama/2-gpus"), "tiny")
    assert "-m workshop_lib.train.lora" in lora and "--model tiny-llama" in lora and "nemo llm" not in lora
    assert "--lora-rank 8" in lora and "--lora-targets linear_qkv,linear_proj,linear_fc1,linear_fc2" in lora
    # NeMo's resolved recipe, its 2048 tokens capped by the profile's training.max_length on CPUs; one thread each.
    assert "--micro-batch 1" in lora and "--max-length 512" in lora and "export OMP_NUM_THREADS=1" in lora
    at_shape = render_script(get_experiment("lora/llama/2-gpus"), "gpu-workstation")  # the GPUs' stand-in rows
    assert "--max-length 2048" in at_shape and "OMP_NUM_THREADS" not in at_shape
    one_node = dataclasses.replace(get_experiment("model-parallel/mixtral/tp2-pp4-ep2-sp"), nodes=1,
                                   gpus_per_node=4, pipeline_parallel=1)
    parallel = render_script(one_node, "tiny")
    assert "-m workshop_lib.train.parallel" in parallel and "--learning-rate 5e-06" in parallel
    assert re.search(r"--tp 2 \\\n\s+--ep 2 \\\n\s+--sp", parallel)


def test_monitors_follow_the_profile_and_the_experiment():
    offload = get_experiment("zero/single-gpu/zero3-offload")
    ibex, tiny = render_script(offload, "ibex"), render_script(offload, "tiny")
    assert ('nvidia-smi ${CUDA_VISIBLE_DEVICES:+-i "$CUDA_VISIBLE_DEVICES"} '
            "--query-gpu=timestamp,index,name,utilization.gpu,memory.used,memory.total --format=csv,nounits") in ibex
    assert "nvidia-smi" not in tiny.replace("no nvidia-smi", "") and "no GPU memory monitor" in tiny
    assert "--log cpu_memory.txt" in ibex and "--log cpu_memory.txt" in tiny
    assert "psrecord" not in render_script(get_experiment("fsdp/multi-gpu/2-gpus"), "ibex")
    assert "--deepspeed" in ibex and "zero3_offload.json" in ibex


def _here_document(text: str, name: str) -> str:
    return text.split(f"<<'{name}' || true\n", 1)[1].split(f"\n{name}\n", 1)[0]


def test_multi_node_script_rendezvous_and_per_node_monitors():
    text = render_script(get_experiment("fsdp/strategies/hybrid-shard-offload"), "ibex")
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in text and "getent ahostsv4" in text
    assert 'srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_PER_TASK" bash -c "$NODE_TASK"' \
        in text
    per_node = _here_document(text, "NODE_TASK")
    assert '--node_rank="$SLURM_NODEID"' in per_node and "nvidia-smi" not in per_node  # one monitor block for all
    monitor = _here_document(text, "GPU_MONITOR_TASK")
    assert '> "gpu_memory_${node}.csv"' in monitor and text.index("GPU_MONITOR_PID=$!") < text.index("NODE_TASK")
    subprocess.run(["bash", "-n"], input=per_node, text=True, check=True)
    subprocess.run(["bash", "-n"], input=monitor, text=True, check=True)
    tiny = render_script(get_experiment("fsdp/strategies/hybrid-shard-offload"), "tiny")
    assert "MASTER_ADDR=127.0.0.1" in tiny and "all_reduce_perf" not in tiny


def test_bandwidth_check_is_launched_like_the_training():
    text = render_script(get_experiment("fsdp/multi-node/2-nodes"), "ibex")
    check, training = _here_document(text, "BANDWIDTH_TASK"), _here_document(text, "NODE_TASK")
    launcher = check.split(" \\\n", 1)[0]
    assert launcher.startswith("torchrun --nnodes=") and launcher in training  # same torchrun, same rendezvous
    assert "-m workshop_lib.train.bandwidth" in check and "--size-mb 1024" in check
    assert text.index("BANDWIDTH_TASK") < text.index("NODE_TASK") and "exit 46" in text
    assert "module load nccl" not in text and "all_reduce_perf" not in text  # no CUDA 11.8 NCCL module left loaded
    assert "minimum 5)" in text and "-v minimum=5 " in text


def test_nccl_tests_option_spans_the_nodes_and_keeps_its_modules_to_itself(tmp_path):
    data = yaml.safe_load((PROFILES_DIR / "ibex.yml").read_text())
    data["bandwidth_check"].update(tool="nccl-tests", nccl_tests_modules=["nccl-tests/2.13.9"])
    path = tmp_path / "site.yml"
    path.write_text(yaml.safe_dump(data))
    text = render_script(get_experiment("fsdp/strategies/full-shard"), load_profile(path))
    block = text.split("(\n", 1)[1].split("\n)", 1)[0]
    assert "module load nccl-tests/2.13.9" in block  # loaded in a subshell: gone before the training
    # Ibex has no SLURM pmix integration (KAUST's docs): the site's mpirun places one rank per GPU per node.
    assert "mpirun -n $((SLURM_NNODES * 2)) --map-by ppr:2:node --oversubscribe --bind-to none all_reduce_perf" in block
    assert "-g 1" in block
    assert not [line for line in text.splitlines() if "pmix" in line and not line.lstrip().startswith("#")]
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_srun_steps_and_directives_give_every_process_its_cores():
    for experiment_id, cores in (("zero/multi-gpu/8-gpus", 32), ("fsdp/strategies/full-shard", 8),
                                 ("lora/llama/8-gpus", 4), ("zero/baseline", 4)):
        text = render_script(get_experiment(experiment_id), "ibex")
        assert directives(text)["cpus-per-task"] == str(cores), experiment_id
        for line in text.splitlines():
            if line.startswith("srun ") and "--mpi" not in line and "--overlap" not in line:  # the monitor: 1 core
                assert '--cpus-per-task="$SLURM_CPUS_PER_TASK"' in line, line


def test_weak_scaling_reaches_the_trainer_as_flags():
    for gpus, layers, batch in ((2, 3, 8), (4, 6, 4)):
        text = render_script(get_experiment(f"fsdp/weak-scaling/{gpus}-gpus"), "tiny")
        assert f"--layers {layers}" in text and f"--per-device-batch {batch}" in text
        assert "--hidden 64" in text  # the tiny profile narrows the model, not its depth


def test_only_jobs_that_leave_memory_logs_ask_for_a_memory_summary():
    # A tiny job without a monitor once logged "no memory log here" and "Memory summary failed" after exit 0.
    summary = 'workshop memory "$RUN_DIR"'
    assert summary not in render_script(get_experiment("lora/llama/1-gpu"), "tiny")  # no monitor at all
    assert summary not in render_script(get_experiment("fsdp/multi-gpu/2-gpus"), "tiny")
    assert summary in render_script(get_experiment("zero/single-gpu/zero3-offload"), "tiny")  # psrecord
    assert summary in render_script(get_experiment("fsdp/strategies/hybrid-shard-offload"), "tiny")  # per node
    assert summary in render_script(get_experiment("lora/llama/1-gpu"), "ibex")  # nvidia-smi
    assert summary in render_script(get_experiment("fsdp/multi-gpu/2-gpus"), "rehearsal")  # its own GPU files


def test_footer_returns_the_training_status():
    text = render_script(get_experiment("fsdp/baseline"), "tiny")
    assert text.rstrip().endswith('exit "$TRAIN_STATUS"')
    assert "Job finished" in text and "Total time" in text


def test_unsupported_experiment_and_import_script_errors():
    with pytest.raises(WorkshopError, match="16 GPUs"):
        render_script(get_experiment("fsdp/weak-scaling/16-gpus"), "tiny")
    with pytest.raises(WorkshopError, match="does not run NeMo"):
        render_import_script("llama-3.1-8b", "tiny")


def test_import_script_reads_the_downloaded_checkpoint_offline():
    text = render_import_script("mixtral-8x7b", "ibex")
    assert 'nemo llm import model=mixtral_8x7b source=hf://mistralai/Mixtral-8x7B-v0.1 output_path="$PARTIAL" -y' in text
    assert "export HF_HUB_OFFLINE=1" in text and "HF_TOKEN" not in text  # the token stays on the login node
    assert "--only hub-download" in text and "--only nemo-image" in text
    assert lint_script(text) == []


def test_import_script_online_takes_the_token_from_the_environment(tmp_path):
    data = yaml.safe_load((PROFILES_DIR / "ibex.yml").read_text())
    data["offline"] = False
    path = tmp_path / "online.yml"
    path.write_text(yaml.safe_dump(data))
    text = render_import_script("mixtral-8x7b", load_profile(path))
    assert '${HF_TOKEN:?' in text and "hf_" not in text.lower().replace("hf_home", "").replace("hf_token", "") \
        .replace("hf_cache", "").replace("hf_datasets", "").replace("hf_hub_offline", "")
    assert "HF_HUB_OFFLINE" not in text


def test_render_command_prints_and_writes(tmp_path, capsys):
    assert main(["render", "zero/two-gpus/zero2", "--profile", "tiny"]) == 0
    assert "#SBATCH --gpus-per-node=2" in capsys.readouterr().out
    target = tmp_path / "out" / "job.sbatch"
    assert main(["render", "zero/two-gpus/zero2", "--profile", "tiny", "-o", str(target)]) == 0
    assert target.read_text() == render_script(get_experiment("zero/two-gpus/zero2"), "tiny")
    assert main(["render", "zero/nope"]) == 2
