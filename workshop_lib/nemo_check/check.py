"""Check the chapters' `nemo llm finetune` commands with NeMo itself, as the job scripts render them.

    python -m workshop_lib.nemo_check.check [--out book/reference/nemo] [ids ...]
    make nemo-check

Renders each chapter 1-2 experiment for a NeMo profile (ibex), takes the command out of the job script,
and resolves all of them in one process of the NeMo environment (``resolve.py``). The results — accepted
or refused and why, NeMo's Resolved Arguments table, the whole resolved configuration — go to OUT: the
book shows them as "what NeMo will run", and the stand-in engines take the recipe's micro-batch,
sequence length, LoRA and learning rate from ``resolved.json`` (read by ``core.reference``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from workshop_lib.checks.nemo_command import NemoCommand, command_from_script
from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.reference import RESOLVED_DIR, RESOLVED_FILE

HERE = Path(__file__).resolve().parent  # this package's own files (resolve.py)


def nemo_experiments():
    from workshop_lib.core.vocabulary import NEMO
    from workshop_lib.experiments import all_experiments, large_gpu_experiments, nemo_lesson_experiments

    return [e for e in all_experiments() + large_gpu_experiments() + nemo_lesson_experiments() if e.engine == NEMO]


def commands_for(experiments, profile: str = "ibex") -> list[dict]:
    """Each experiment's command as its job script renders it (validation rules other than the fit
    check apply here too: a script that cannot be rendered is not checked)."""
    from workshop_lib.checks.findings import ValidationError
    from workshop_lib.scripts import nemo_context, render_script
    from workshop_lib.sites.profiles import load_profile

    site = load_profile(profile)
    commands = []
    for experiment in experiments:
        refused = None
        try:
            command = command_from_script(render_script(experiment, site))
        except ValidationError as error:
            # Refused before NeMo sees it (e.g. by the fit check): NeMo still says whether it parses.
            refused = str(error)
            context = nemo_context(experiment, site)
            command = NemoCommand(context["factory"], tuple(context["overrides"]), ("--yes",))
        commands.append({"id": experiment.id, "factory": command.factory, "overrides": list(command.overrides),
                         "flags": list(command.flags), "refused_by_workshop": refused})
    return commands


def nemo_environment_variables(scratch: Path) -> dict:
    """NeMo and Hugging Face write caches under their homes: keep them in a scratch folder."""
    return {**os.environ, "NEMO_HOME": str(scratch / "nemo"), "HF_HOME": str(scratch / "hf"),
            "NEMORUN_HOME": str(scratch / "nemorun"), "HF_HUB_OFFLINE": "1", "COLUMNS": "120"}


def resolve_commands(commands: list[dict], out_dir: Path, python: Path | None = None) -> list[dict]:
    """Resolve the commands with NeMo in one process; records as ``resolve.py`` writes them."""
    from workshop_lib.nemo_check.environment import environment_python

    python = python or environment_python()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nemo-check-") as scratch:
        listing = Path(scratch) / "commands.json"
        listing.write_text(json.dumps(commands))
        completed = subprocess.run([str(python), str(HERE / "resolve.py"), str(listing), str(out_dir)],
                                   env=nemo_environment_variables(Path(scratch)), capture_output=True, text=True)
    if completed.returncode != 0 or not (out_dir / "results.json").exists():
        raise WorkshopError(f"the NeMo resolver failed (exit {completed.returncode}):\n{completed.stderr[-3000:]}")
    records = json.loads((out_dir / "results.json").read_text())
    (out_dir / "results.json").unlink()
    return records


def run_cli(arguments: list[str], python: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real `nemo llm finetune ARGS` of the NeMo environment (e.g. with --dryrun)."""
    from workshop_lib.nemo_check.environment import environment_python

    python = python or environment_python()
    with tempfile.TemporaryDirectory(prefix="nemo-cli-") as scratch:
        return subprocess.run([str(python.parent / "nemo"), "llm", "finetune", *arguments],
                              env=nemo_environment_variables(Path(scratch)), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ids", nargs="*", help="experiment ids (default: every NeMo experiment)")
    parser.add_argument("--out", type=Path, default=RESOLVED_DIR)
    parser.add_argument("--profile", default="ibex")
    args = parser.parse_args(argv)
    experiments = [e for e in nemo_experiments() if not args.ids or e.id in args.ids]
    records = resolve_commands(commands_for(experiments, args.profile), args.out)
    (args.out / RESOLVED_FILE).write_text(json.dumps(records, indent=1) + "\n")
    for record in records:
        verdict = "accepted" if record["accepted"] else "REFUSED: " + "; ".join(record["errors"])
        print(f"{record['id']:42} {verdict}")
    return 0 if all(record["accepted"] for record in records) else 1


if __name__ == "__main__":
    sys.exit(main())
