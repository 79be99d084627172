"""Precision and recall of `workshop check` on participant-style job scripts (issue 38).

The corpus (benchmarks/lint_corpus/) holds correct scripts adapted from the workshop's jobs (NeMo, DeepSpeed with
the HF Trainer and with its own launcher, FSDP with torchrun, Accelerate, arrays, runs side by side). Each defect
below is one edit of one correct script, of the classes issue 38 lists, with the rule that must report it. A defect
counts as caught when that rule reports it (as an error or a warning); caught "for another reason" when only other
rules speak; a correct script counts as a false alarm when it gets an error.

The script imports `workshop_lib` from wherever PYTHONPATH points, so the same corpus measures any checkout:

    PYTHONPATH=. python benchmarks/lint_corpus.py            # this checkout
    PYTHONPATH=/path/to/main python benchmarks/lint_corpus.py --json
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "lint_corpus"
SAMPLES = Path(__file__).resolve().parents[1] / "tests" / "lint_samples"


@dataclass(frozen=True)
class Defect:
    name: str
    base: str  # the correct script it is made from
    old: str  # text replaced (must occur once)
    new: str
    rule: str  # the rule that must report it
    kind: str  # the class of issue 38 it belongs to


DEFECTS = [
    # option conflicts and overrides
    Defect("mem-and-mem-per-gpu", "nemo_lora_4gpu", "#SBATCH --mem-per-gpu=64G",
           "#SBATCH --mem=256G\n#SBATCH --mem-per-gpu=64G", "exclusive-options", "options"),
    Defect("gpus-total-on-one-node", "fsdp_two_nodes", "#SBATCH --nodes=2", "#SBATCH --nodes=1\n#SBATCH --gpus=8",
           "counts-contradict", "options"),
    Defect("typed-gpu-vs-constraint", "nemo_typed_gres", "#SBATCH --gres=gpu:a100:8",
           "#SBATCH --gres=gpu:a100:8\n#SBATCH --constraint=v100", "gpu-type-contradicts-constraint", "options"),
    Defect("gpus-per-task-no-tasks", "ddp_srun_tasks", "#SBATCH --nodes=1\n#SBATCH --ntasks=4\n", "",
           "gpus-per-task-without-tasks", "options"),
    Defect("gpus-per-node-twice", "accelerate_fsdp", "#SBATCH --time=01:00:00",
           "#SBATCH --time=01:00:00\n#SBATCH --gpus-per-node=2", "option-given-twice", "options"),
    # GPU request forms and the variables each sets
    Defect("gpus-per-node-variable-under-gres", "ds_zero2_hf_2gpu", '--nproc_per_node="$SLURM_GPUS_ON_NODE"',
           '--nproc_per_node="$SLURM_GPUS_PER_NODE"', "slurm-variable-unset", "variables"),
    Defect("cpus-per-task-variable-unset", "ds_zero2_hf_2gpu", "#SBATCH --cpus-per-task=12\n", "",
           "slurm-variable-unset", "variables"),
    Defect("gpu-ids-as-count", "ds_zero2_hf_2gpu", '--nproc_per_node="$SLURM_GPUS_ON_NODE"',
           '--nproc_per_node="$SLURM_JOB_GPUS"', "gpu-list-as-count", "variables"),
    # #SBATCH parsing
    Defect("home-in-output", "nemo_lora_4gpu", "#SBATCH --output=slurm-%x-%j.out",
           "#SBATCH --output=$HOME/logs/%x-%j.out", "variable-in-directive", "directives"),
    Defect("indented-directive", "nemo_tp_8gpu", "#SBATCH --constraint=a100", "    #SBATCH --constraint=a100",
           "directive-look-alike", "directives"),
    Defect("job-name-with-space", "ds_native_4gpu", "#SBATCH --job-name=zero3-gpt", "#SBATCH --job-name=zero3 gpt",
           "invalid-directive", "directives"),
    Defect("blank-line-before-shebang", "bloom_user_logs", "#!/bin/bash", "\n#!/bin/bash", "missing-shebang",
           "directives"),
    Defect("directive-after-module-load", "accelerate_fsdp", "#SBATCH --cpus-per-task=16",
           "module load dl-workshops\n#SBATCH --cpus-per-task=16", "directive-after-command", "directives"),
    Defect("per-job-log-folder", "bloom_user_logs", "#SBATCH --output=%x-%u-%j.out", "#SBATCH --output=logs/%j/run.out",
           "output-folder-missing", "directives"),
    # job steps
    Defect("srun-export-list", "fsdp_two_nodes", "srun --ntasks-per-node=1 torchrun",
           "srun --ntasks-per-node=1 --export=HEAD_NODE,MASTER_PORT torchrun", "srun-export-drops-environment",
           "steps"),
    Defect("job-export-none", "nemo_lora_4gpu", "#SBATCH --time=01:00:00",
           "#SBATCH --time=01:00:00\n#SBATCH --export=NONE", "srun-export-drops-environment", "steps"),
    Defect("one-launcher-for-two-nodes", "fsdp_two_nodes", "srun --ntasks-per-node=1 torchrun", "srun --ntasks=1 torchrun",
           "launcher-missing-on-nodes", "steps"),
    Defect("no-wait", "two_loras_side_by_side", "done\nwait", "done", "background-step-not-waited", "steps"),
    Defect("no-exact", "two_loras_side_by_side", "srun --exact --ntasks=1 --cpus-per-task=8", "srun --ntasks=1",
           "parallel-steps-serialize", "steps"),
    Defect("step-gpu-narrower-than-workers", "two_loras_side_by_side", "--gres=gpu:2", "--gres=gpu:1",
           "workers-gpus-mismatch", "steps"),
    Defect("side-by-side-without-devices", "two_runs_by_devices", "CUDA_VISIBLE_DEVICES=2,3 torchrun",
           "torchrun", "workers-gpus-mismatch", "steps"),
    # job arrays
    Defect("array-one-log", "lr_sweep_array", "#SBATCH --output=sweep-%A_%a.out", "#SBATCH --output=sweep-%A.out",
           "array-shared-output", "arrays"),
    Defect("array-one-folder", "lr_sweep_array", '--output_dir "$RUN_DIR"', "--output_dir sweep/runs",
           "array-shared-folder", "arrays"),
    Defect("array-fixed-port", "lr_sweep_array", "torchrun --nproc_per_node=2",
           "torchrun --nproc_per_node=2 --master_port=29600", "array-shared-port", "arrays"),
    Defect("array-from-one", "lr_sweep_array", "#SBATCH --array=0-3", "#SBATCH --array=1-4",
           "array-index-out-of-range", "arrays"),
    # step vs job GPU binding
    Defect("bound-task-local-rank", "ddp_srun_tasks", "LOCAL_RANK=0", "LOCAL_RANK=$SLURM_LOCALID",
           "local-rank-vs-bound-gpu", "steps"),
    Defect("tilde-in-output", "bloom_user_logs", "#SBATCH --output=%x-%u-%j.out", "#SBATCH --output=~/logs/%x-%j.out",
           "variable-in-directive", "directives"),
    # launcher arithmetic
    Defect("num-gpus-of-8-gpu-nodes", "ds_multinode", "--num_gpus 4", "--num_gpus 8", "workers-gpus-mismatch",
           "arithmetic"),
    Defect("ds-batch-of-4-gpus-on-2", "ds_zero2_hf_2gpu", "ds_zero2_auto.json", "ds_zero2_fixed32.json",
           "deepspeed-batch-size-mismatch", "arithmetic"),
    Defect("ds-native-on-two-gpus", "ds_native_4gpu", "--num_gpus=4", "--num_gpus=2", "deepspeed-batch-size-mismatch",
           "arithmetic"),
    Defect("accelerate-config-for-8", "accelerate_fsdp", "accelerate_fsdp_4.yaml", "accelerate_fsdp_8.yaml",
           "workers-gpus-mismatch", "arithmetic"),
    Defect("nemo-global-batch", "nemo_tp_8gpu", "data.global_batch_size=16", "data.global_batch_size=9",
           "nemo-global-batch-mismatch", "arithmetic"),
    Defect("deepspeed-num-nodes", "ds_multinode", "--num_nodes 2", "--num_nodes 1", "launcher-nodes-mismatch",
           "arithmetic"),
    Defect("nemo-devices-after-gpu-change", "nemo_lora_4gpu", "#SBATCH --gpus-per-node=4", "#SBATCH --gpus-per-node=2",
           "tasks-gpus-devices-mismatch", "arithmetic"),
]


def _lint(path: Path) -> list:
    from workshop_lib.checks.lint import lint_file

    return lint_file(path)


def measure(corpus: Path = CORPUS) -> dict:
    """Findings on every correct script and every defect, and the totals."""
    goods = sorted(corpus.glob("*.sbatch"))
    report: dict = {"correct": {}, "defects": {}}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "corpus"
        shutil.copytree(corpus, folder)  # the configs and logs/ sit next to each script, as at submission
        for path in goods:
            findings = _lint(folder / path.name)
            report["correct"][path.stem] = sorted({(f.rule, f.severity) for f in findings})
        for defect in DEFECTS:
            text = (corpus / f"{defect.base}.sbatch").read_text()
            assert text.count(defect.old) == 1, f"{defect.name}: {defect.old!r} is not once in {defect.base}"
            path = folder / f"defect-{defect.name}.sbatch"
            path.write_text(text.replace(defect.old, defect.new))
            rules = sorted({f.rule for f in _lint(path)})
            outcome = "caught" if defect.rule in rules else ("other reason" if rules else "missed")
            report["defects"][defect.name] = {"kind": defect.kind, "expected": defect.rule, "found": rules,
                                              "outcome": outcome}
    false_alarms = [name for name, found in report["correct"].items() if any(s == "error" for _, s in found)]
    outcomes = [entry["outcome"] for entry in report["defects"].values()]
    flagged = len(DEFECTS) - outcomes.count("missed")
    report["totals"] = {
        "correct scripts": len(goods), "errors on correct scripts": len(false_alarms),
        "warnings on correct scripts": sum(1 for found in report["correct"].values()
                                           if found and all(s == "warning" for _, s in found)),
        "defects": len(DEFECTS), "caught for the right reason": outcomes.count("caught"),
        "caught for another reason": outcomes.count("other reason"), "missed": outcomes.count("missed"),
        "recall": round(outcomes.count("caught") / len(DEFECTS), 3),
        "precision (flagged scripts that are defective)": round(flagged / max(1, flagged + len(false_alarms)), 3),
    }
    return report


def measure_samples(samples: Path = SAMPLES) -> dict:
    """The same counts over the test samples: `<rule>/bad*.sbatch` must draw <rule>, `good*.sbatch` no error."""
    bad = sorted(samples.glob("*/bad*.sbatch"))
    good = sorted(samples.glob("*/good*.sbatch"))
    caught = [path for path in bad if path.parent.name in {f.rule for f in _lint(path)}]
    alarms = [path for path in good if any(f.is_error for f in _lint(path))]
    return {"bad samples": len(bad), "caught for the right reason": len(caught), "good samples": len(good),
            "errors on good samples": len(alarms),
            "missed": sorted(f"{p.parent.name}/{p.name}" for p in set(bad) - set(caught)),
            "false alarms": sorted(f"{p.parent.name}/{p.name}" for p in alarms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the whole report as JSON")
    report = measure()
    report["samples"] = measure_samples()
    if parser.parse_args().json:
        print(json.dumps(report, indent=1))
        return
    for name, entry in report["defects"].items():
        print(f"{entry['outcome']:>13}  {entry['kind']:<10} {name:<38} expected {entry['expected']}"
              + ("" if entry["outcome"] == "caught" else f"  found {entry['found']}"))
    for name, found in report["correct"].items():
        if found:
            print(f"{'correct':>13}  {name}: {found}")
    print(json.dumps(report["totals"], indent=1))
    samples = report["samples"]
    print(f"tests/lint_samples: {samples['caught for the right reason']} of {samples['bad samples']} bad samples "
          f"caught for the right reason, {samples['errors on good samples']} of {samples['good samples']} good "
          "samples with an error")


if __name__ == "__main__":
    main()
