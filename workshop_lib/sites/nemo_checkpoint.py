"""A converted NeMo 2 checkpoint on disk: where `nemo llm import` puts it and how to tell it is complete.

NeMo 2.4.1 (`nemo.lightning.io.connector.ModelConnector.nemo_save`) writes a checkpoint folder as
`weights/` first — a torch distributed checkpoint whose `.metadata` is written when the save finishes,
then Megatron's `metadata.json` — and `context/` last (`io.json`, `model.yaml`: the model's config and
tokenizer). A folder with those three files was written to the end; one without them was cut short.
"""

from __future__ import annotations

import shlex
from pathlib import Path

# Written last in their folders (see above): all three present means the save ran to the end.
COMPLETE_FILES = ("weights/.metadata", "weights/metadata.json", "context/io.json")
# NeMo's models cache, as nemo.lightning.base resolves it; `nemo://<hub id>` in the recipes points here.
MODELS_DIR = "${NEMO_MODELS_CACHE:-${NEMO_HOME:-$HOME/.cache/nemo}/models}"
PARTIAL_SUFFIX = ".partial"
INCOMPLETE_EXIT = 47  # the import job's status when NeMo ended without a complete checkpoint
# One import per checkpoint at a time: a second one (the setup run again while the first job still runs) would
# delete the running job's partial folder. The lock is a folder beside the checkpoint holding its owner's job id.
LOCK_SUFFIX = ".import-lock"
BUSY_EXIT = 48  # the import job's status when another job holds the lock


def checkpoint_shell_path(hub_id: str) -> str:
    """The final folder of a model's checkpoint, as shell text (the models cache expands in the shell)."""
    return f'"{MODELS_DIR}"/{shlex.quote(hub_id)}'


def complete_test(folder: str) -> str:
    """A bash condition, true when the folder (shell text, e.g. "$CHECKPOINT") holds a complete checkpoint."""
    return " && ".join(f'[ -f {folder}/{name} ]' for name in COMPLETE_FILES)


def is_complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in COMPLETE_FILES)


def lock_owner_function() -> str:
    """Bash functions over the lock "$LOCK": `running_owner` prints the job id of a pending or running import that
    holds it (nothing when it is free or its job has ended, e.g. killed with the node); when SLURM cannot say
    (the controller does not answer), the owner is taken to be running: a lock is never broken on a guess."""
    return "\n".join([
        "running_owner() {",
        "    local owner state",
        '    owner=$(cat "$LOCK/job" 2>/dev/null) || return 0',
        '    [ -n "$owner" ] || return 0',
        '    if state=$(squeue -h -j "$owner" -t PD,R,CG,CF,S -o %T 2>&1); then',
        '        if [ -n "$state" ]; then echo "$owner"; fi',
        '    elif [[ $state != *"Invalid job id"* ]]; then',
        '        echo "$owner"',
        "    fi",
        "}",
    ])
