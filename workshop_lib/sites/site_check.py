"""Checks and downloads `workshop setup` runs inside the site's Python environment (on a login node).

    python -m workshop_lib.site_check torch --lock requirements.lock
    python -m workshop_lib.site_check download --model bigscience/bloom-560m --dataset squad
    python -m workshop_lib.site_check export-squad STAGE/data/squad
    python -m workshop_lib.site_check manifest STAGE --step environment --step nemo-image ...

`torch` proves the environment holds the locked torch version built for CUDA 12 (the A100 nodes'
driver); `download` fills the Hugging Face caches once, so that jobs run with the hub switched off.
`export-squad` and `manifest` finish an instructor's staged folder (`workshop setup ibex --stage DIR`):
SQuAD as JSON lines that every participant's job reads in place (a read-only Hugging Face datasets cache
would need lock files written next to it), and STAGED.json, which says what the folder holds.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# The CUDA major version the site's driver runs (Ibex A100 nodes: a CUDA 12 driver, see book/ibex_setup.md).
CUDA_MAJOR = "12"


def locked_version(lock: Path, package: str) -> str:
    """The version `package==X` pins in a lock file (local labels such as +cpu are not part of it)."""
    for line in lock.read_text().splitlines():
        match = re.fullmatch(rf"\s*{re.escape(package)}==([^\s#;]+).*", line, flags=re.IGNORECASE)
        if match:
            return match.group(1).split("+")[0]
    raise SystemExit(f"{lock} pins no version of {package}: add `{package}==X` to it")


def check_torch(lock: Path, cuda_major: str | None = CUDA_MAJOR) -> str:
    """A line describing the installed torch; exits with a message when it is not the locked CUDA build."""
    import torch

    expected = locked_version(lock, "torch")
    installed = torch.__version__.split("+")[0]
    if installed != expected:
        raise SystemExit(f"torch {torch.__version__} is installed but {lock} pins {expected}: the environment was "
                         "not built from the lock. Re-run the setup step 'environment' (it updates the environment)")
    cuda = torch.version.cuda
    if cuda_major and not (cuda or "").startswith(cuda_major + "."):
        raise SystemExit(f"torch {torch.__version__} is built for CUDA {cuda or 'none (CPU only)'}, but the A100 "
                         f"nodes run a CUDA {cuda_major} driver: install the CUDA {cuda_major} build "
                         "(environment.yml names its index) and run the step 'environment' again")
    return f"torch {torch.__version__} (CUDA {cuda or 'none'}), as locked in {lock}"


def download(models: list[str], datasets: list[str]) -> None:
    """Fetch each model snapshot and data set into the caches that $HF_HOME / $HF_DATASETS_CACHE name."""
    from huggingface_hub import snapshot_download

    for model in models:
        print(f"downloading {model} ...", flush=True)
        path = snapshot_download(model, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt",
                                                         "tokenizer*"])
        print(f"  {model} -> {path}", flush=True)
    for name in datasets:
        import datasets as hf_datasets

        print(f"downloading data set {name} ...", flush=True)
        # The same call the training makes (workshop_lib/train/data.py), so the job finds this cache offline.
        loaded = hf_datasets.load_dataset(name)
        print(f"  {name}: {', '.join(f'{split} {len(rows)} rows' for split, rows in loaded.items())}", flush=True)


def export_squad(folder: Path, splits: dict | None = None) -> dict[str, int]:
    """Write SQuAD's splits as train.jsonl / validation.jsonl (question, context, answers) into `folder`.

    `splits` maps a split name to rows; by default the cached `squad` dataset (the one `download` fetched).
    Written under temporary names and renamed, so a cut-short export never looks complete.
    """
    import json

    if splits is None:
        import datasets as hf_datasets

        splits = hf_datasets.load_dataset("squad")
    folder.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split in ("train", "validation"):
        target, partial = folder / f"{split}.jsonl", folder / f"{split}.jsonl.partial"
        with partial.open("w", encoding="utf-8") as out:
            for row in splits[split]:
                out.write(json.dumps({"question": row["question"], "context": row["context"],
                                      "answers": {"text": list(row["answers"]["text"])}}) + "\n")
                counts[split] = counts.get(split, 0) + 1
        partial.replace(target)
    return counts


def write_manifest(folder: Path, steps: list[str], commit: str | None = None) -> Path:
    """STAGED.json: when and from what lock the folder was staged, its steps, and the bytes of each part."""
    import datetime
    import hashlib
    import json
    import subprocess

    parts = {}
    for child in sorted(folder.iterdir()):
        if child.name.startswith(".") or child.name.endswith(".partial"):
            continue
        used = subprocess.run(["du", "-sb", str(child)], capture_output=True, text=True)
        parts[child.name] = int(used.stdout.split()[0]) if used.returncode == 0 and used.stdout else None
    lock = Path(__file__).resolve().parents[2] / "requirements.lock"
    manifest = {
        "staged_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest() if lock.is_file() else None,
        "workshop_commit": commit,
        "steps": steps,
        "bytes": parts,
    }
    path = folder / "STAGED.json"
    partial = folder / "STAGED.json.partial"
    partial.write_text(json.dumps(manifest, indent=2) + "\n")
    partial.replace(path)
    total = sum(size for size in parts.values() if size)
    print(f"staged folder {folder}: {total / 2**30:.1f} GiB in " + ", ".join(
        f"{name} {size / 2**30:.1f} GiB" for name, size in parts.items() if size is not None))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workshop_lib.site_check")
    actions = parser.add_subparsers(dest="action", required=True)
    torch_check = actions.add_parser("torch", help="the installed torch is the locked version, built for CUDA 12")
    torch_check.add_argument("--lock", type=Path, required=True)
    torch_check.add_argument("--cuda-major", default=CUDA_MAJOR, help="'' to accept a CPU build (tests)")
    fetch = actions.add_parser("download", help="models and data sets into the Hugging Face caches")
    fetch.add_argument("--model", action="append", default=[])
    fetch.add_argument("--dataset", action="append", default=[])
    export = actions.add_parser("export-squad", help="SQuAD from the datasets cache as JSON lines into FOLDER")
    export.add_argument("folder", type=Path)
    manifest = actions.add_parser("manifest", help="write STAGED.json into a staged folder")
    manifest.add_argument("folder", type=Path)
    manifest.add_argument("--step", action="append", default=[])
    manifest.add_argument("--commit", default=None, help="the workshop commit the staged copy was taken from")
    args = parser.parse_args(argv)
    if args.action == "torch":
        print(check_torch(args.lock, args.cuda_major or None))
    elif args.action == "export-squad":
        counts = export_squad(args.folder)
        print(f"SQuAD as JSON lines in {args.folder}: " + ", ".join(f"{k} {v} rows" for k, v in counts.items()))
    elif args.action == "manifest":
        write_manifest(args.folder, args.step, args.commit)
    else:
        download(args.model, args.dataset)
    return 0


if __name__ == "__main__":
    sys.exit(main())
