"""The class rehearsal's job: no training. Read the shared staged folder, sleep, write the files a run leaves.

    python -m workshop_lib.train.rehearsal --experiment lora/llama/2-gpus --output-dir train --sleep 3 \
        [--staged DIR]

Profile ``rehearsal`` (slurm/profiles/rehearsal.yml) renders every experiment's script with this command
in place of the training launch, so a class of notebooks can submit, wait and fill their tables in minutes
while the scheduler sees real jobs. What it writes is what the parsers read from a real run:
``<output-dir>/metrics.jsonl`` (steps and a summary, through the one metrics writer) and one nvidia-smi CSV
per node of the job (``gpu_memory_<node>.csv``); the job's footer comes from the script. Every number is
made up from the experiment's shape (step time falling with the GPUs, memory per GPU), so the tables fill
and scale plausibly; none is a measurement, and the tables are titled by the profile that wrote them.

``--staged DIR``: the folder an instructor staged for the whole class (images, models, data). The job reads
every file its ``manifest.json`` lists, checks sizes and SHA-256, and refuses to go on if the folder is
writable by the job's user (one participant could change what everyone reads) or a file is missing.
Pure Python: it imports neither torch nor the notebook side.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.vocabulary import GPT, HF, NEMO
from workshop_lib.experiments import Experiment, get_experiment
from workshop_lib.train.flags import FlagParser, check_positive, report_user_error
from workshop_lib.train.metrics import MetricsWriter

MANIFEST = "manifest.json"
STAGED_ERROR_EXIT = 2
GPU_NAME = "NVIDIA A100-SXM4-80GB (rehearsal)"
GPU_TOTAL_MIB = 81920


class StagedFolderError(Exception):
    """The staged folder cannot serve the class as it is; the message says why and what to do."""


def read_staged(folder: Path) -> tuple[int, int]:
    """(files, bytes) read from the staged folder after checking each file against its manifest."""
    manifest_path = folder / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except OSError as error:
        raise StagedFolderError(f"cannot read {manifest_path} ({error.strerror}): the instructor stages the folder "
                                "once, readable by every participant") from None
    except ValueError as error:
        raise StagedFolderError(f"{manifest_path} is not JSON ({error}): stage the folder again") from None
    if os.getuid() != 0 and os.access(folder, os.W_OK):  # root writes anywhere: the question is a participant's
        raise StagedFolderError(f"{folder} is writable by this job's user ({os.getuid()}): a participant could change "
                                "what the whole class reads; make it read-only (chmod -R a-w) and owned by the "
                                "instructor")
    total = 0
    for name, expected in sorted(manifest.get("files", {}).items()):
        path = folder / name
        digest = hashlib.sha256()
        try:
            with path.open("rb") as stream:
                for block in iter(lambda: stream.read(1 << 20), b""):
                    digest.update(block)
                    total += len(block)
        except OSError as error:
            raise StagedFolderError(f"cannot read {path} ({error.strerror}): stage the folder again") from None
        if digest.hexdigest() != expected.get("sha256"):
            raise StagedFolderError(f"{path} does not match {MANIFEST} (SHA-256 differs): stage the folder again")
    return len(manifest.get("files", {})), total


def engine_of(experiment: Experiment) -> str:
    """The metrics schema's engine name for what this experiment would have run."""
    if experiment.engine == NEMO:
        return "lora" if experiment.peft == "lora" else "parallel"
    if experiment.engine == GPT:
        return "gpt"
    if experiment.engine == HF and experiment.zero_stage is not None:
        return "deepspeed"
    return "fsdp" if experiment.fsdp else "hf"


def base_step_time(experiment: Experiment) -> float:
    """The made-up step time of the model on one GPU."""
    return 2.0 if "mixtral" in experiment.model else 1.0


def made_up_shape(experiment: Experiment) -> dict:
    """Plausible numbers from the experiment's shape: time per step falls with the GPUs (with a
    communication cost), memory per GPU falls where something is sharded."""
    gpus = experiment.gpus
    base_step_s = base_step_time(experiment)
    sharded = experiment.tensor_parallel * (experiment.expert_parallel or 1) * experiment.pipeline_parallel
    if experiment.zero_stage or experiment.fsdp:
        sharded = max(sharded, gpus)
    base_mib = 60000.0 if "mixtral" in experiment.model else 30000.0
    return {"step_time_s": base_step_s / gpus ** 0.85 + 0.05 * (gpus - 1),
            "peak_mib": base_mib / sharded ** 0.7 + 1500.0,
            "global_batch": experiment.global_batch or 8}


def write_metrics(experiment: Experiment, output_dir: Path, steps: int, seconds: float) -> None:
    shape = made_up_shape(experiment)
    writer = MetricsWriter(output_dir, enabled=True)
    step_time = shape["step_time_s"]
    for step in range(1, steps + 1):
        loss = 2.5 * 0.9 ** step
        writer.step(step, loss, 1e-4, step_time, shape["global_batch"], step / steps)
    world = experiment.gpus
    writer.summary(engine=engine_of(experiment), settings={"rehearsal": True, "max_steps": steps},
                   model=f"rehearsal-{experiment.model}", world_size=world, nodes=experiment.nodes,
                   precision=experiment.precision or "bf16", device="cuda", samples=shape["global_batch"] * steps,
                   train_runtime_s=max(seconds, step_time * steps),
                   samples_per_s=shape["global_batch"] / step_time, mean_step_time_s=step_time,
                   final_loss=2.5 * 0.9 ** steps, eval_loss=None, eval_em=None, eval_f1=None,
                   trainable_params=1_000_000, total_params=100_000_000,
                   local_params_per_rank=[100_000_000] * world, peak_memory_mib_per_rank=[shape["peak_mib"]] * world,
                   peak_memory_kind="cuda_max_allocated", model_state_bytes_per_rank=[None] * world,
                   model_state_parts_per_rank=[None] * world, step_peak_bytes_per_rank=[None] * world,
                   training_peak_bytes_per_rank=[None] * world)


def node_names(nodelist: str | None) -> list[str]:
    """SLURM's compact node list ('node[1-2,4],gpu7') as names; this host's name outside a job."""
    if not nodelist:
        return [os.uname().nodename.split(".")[0]]
    names = []
    for prefix, ranges, single in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", nodelist):
        if single:
            names.append(single)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            width = len(first)
            names += [f"{prefix}{index:0{width}d}" for index in range(int(first), int(last or first) + 1)]
    return names


def write_gpu_monitors(experiment: Experiment, run_dir: Path, started: datetime, seconds: float) -> None:
    """One nvidia-smi CSV (--format=csv,nounits) per node, as the GPU monitor block writes them."""
    shape = made_up_shape(experiment)
    samples = max(3, int(seconds) + 2)
    for node in node_names(os.environ.get("SLURM_JOB_NODELIST"))[:experiment.nodes]:
        lines = ["timestamp, index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB]"]
        for sample in range(samples):
            stamp = (started + timedelta(seconds=sample)).strftime("%Y/%m/%d %H:%M:%S.000")
            busy = 0 < sample < samples - 1
            for gpu in range(experiment.gpus_per_node):
                used = round(shape["peak_mib"] * (0.8 + 0.2 * (sample % 2))) if busy else 1
                lines.append(f"{stamp}, {gpu}, {GPU_NAME}, {90 if busy else 0}, {used}, {GPU_TOTAL_MIB}")
        (run_dir / f"gpu_memory_{node}.csv").write_text("\n".join(lines) + "\n")


def parse_args(argv: list[str] | None = None):
    parser = FlagParser("workshop_lib.train.rehearsal", __doc__.splitlines()[0])
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--sleep", type=float, default=3.0, help="seconds the job 'trains' on one GPU")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--staged", type=Path)
    args = parser.parse_args(argv)
    check_positive(steps=args.steps)
    if args.sleep < 0:
        raise WorkshopError(f"--sleep must be 0 or more seconds, got {args.sleep}")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        experiment = get_experiment(args.experiment)
    except WorkshopError as error:
        return report_user_error(error)
    started = datetime.now()
    print(f"Rehearsal of {experiment.id}: nothing trains; made-up numbers follow", flush=True)
    if args.staged is not None:
        try:
            files, size = read_staged(args.staged)
        except StagedFolderError as error:
            print(f"Staged folder: {error}", file=sys.stderr, flush=True)
            return STAGED_ERROR_EXIT
        print(f"Staged folder {args.staged}: {files} file(s), {size} bytes read and checked, read-only", flush=True)
    # The job "trains" `--sleep` seconds on one GPU, less on more: the total job times scale like the steps.
    time.sleep(args.sleep * made_up_shape(experiment)["step_time_s"] / base_step_time(experiment))
    seconds = (datetime.now() - started).total_seconds()
    write_metrics(experiment, args.output_dir, args.steps, seconds)
    write_gpu_monitors(experiment, Path.cwd(), started, seconds)
    print(f"Rehearsal of {experiment.id} wrote {args.output_dir / 'metrics.jsonl'} and its GPU monitors", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
