"""`make demo`: the workshop end to end on this machine (tiny profile, local SLURM cluster).

Steps: start the cluster, check it with a sample job, execute every chapter notebook with papermill,
build the book, stop the cluster. Prints how long each step took and where to open the book.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Timer:
    def __init__(self):
        self.steps: list[tuple[str, float]] = []

    def run(self, label: str, action):
        print(f"\n==> {label}", flush=True)
        started = time.monotonic()
        result = action()
        self.steps.append((label, time.monotonic() - started))
        print(f"    done in {self.steps[-1][1]:.1f} s", flush=True)
        return result

    def report(self) -> str:
        width = max(len(label) for label, _ in self.steps)
        lines = [f"  {label:<{width}}  {seconds:7.1f} s" for label, seconds in self.steps]
        total = sum(seconds for _, seconds in self.steps)
        return "\n".join(["time per step:", *lines, f"  {'total':<{width}}  {total:7.1f} s"])


def sample_job() -> None:
    """Submit one small job through workshop_lib and read its final state back."""
    from . import cluster

    folder = Path(tempfile.mkdtemp(prefix="workshop-sample-"))
    script = folder / "sample.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --job-name=sample\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n"
                      f"#SBATCH --output={folder}/sample-%j.out\n#SBATCH --time=00:05:00\n"
                      'echo "sample job $SLURM_JOB_ID on $(hostname) ($SLURM_JOB_NODELIST)"\n')
    job = cluster.submit(script)
    [info] = cluster.wait_for([job], timeout=120)
    job.raise_for_state()
    print(f"    {info.describe()}\n    log: {job.log_tail(3)}")


def chapter_notebooks() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))


def execute_chapter(path: Path, profile: str, output_dir: Path) -> None:
    import jupytext
    import papermill

    output_dir.mkdir(parents=True, exist_ok=True)
    papermill.execute_notebook(jupytext.read(path), str(output_dir / f"{path.stem}.ipynb"),
                               parameters={"profile": profile}, kernel_name="python3", language="python",
                               cwd=str(ROOT), progress_bar=False)


def build_book() -> None:
    command = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(ROOT), "-W", "--keep-going"]
    subprocess.run(command, check=True, cwd=ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--keep-cluster", action="store_true", help="leave the local cluster running")
    args = parser.parse_args(argv)

    from .local_cluster import LocalCluster

    timer = Timer()
    use_cluster = os.geteuid() == 0 and os.environ.get("WORKSHOP_BACKEND", "auto") != "local"
    local = LocalCluster()
    if use_cluster:
        timer.run("start the local SLURM cluster", lambda: print(local.up(nodes=2).describe()))
    else:
        print("not root: jobs run with the local executor (no SLURM). `sudo make demo` uses a real local cluster.")
        os.environ["WORKSHOP_BACKEND"] = "local"
    try:
        timer.run("sample job", sample_job)
        for notebook in chapter_notebooks():
            timer.run(f"chapter {notebook.stem}", lambda nb=notebook: execute_chapter(
                nb, args.profile, ROOT / "_build" / "executed"))
        if (ROOT / "_config.yml").exists():
            timer.run("build the book", build_book)
    finally:
        if use_cluster and not args.keep_cluster:
            timer.run("stop the local SLURM cluster", local.down)
    print("\n" + timer.report())
    index = ROOT / "_build" / "html" / "index.html"
    if index.exists():
        print(f"\nopen the book: {index}  (or: python -m http.server -d _build/html 8000)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
