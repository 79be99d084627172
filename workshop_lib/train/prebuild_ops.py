"""Build the DeepSpeed op that CPU runs load (the shared-memory all-reduce) once, at set-up.

DeepSpeed compiles it on first use (~50 s on two cores); a job that paid it would look slow for a reason that
has nothing to do with ZeRO. It goes to this environment's own folder, <environment>/torch_extensions, where the
jobs look for it too (`workshop_lib.train.extensions`): another clone's environment never rebuilds it or
waits for it. On a GPU machine this does nothing: there the CUDA ops are built on first use as usual
(DS_BUILD_OPS=0 at install time).
"""

from __future__ import annotations

import time

from workshop_lib.train.extensions import load_deepspeed_comm_op, use_environment_extensions_dir


def main() -> int:
    import torch

    if torch.cuda.is_available():
        print("GPU machine: DeepSpeed builds its CUDA ops on first use; nothing to prebuild")
        return 0
    folder = use_environment_extensions_dir()
    print(f"DeepSpeed's shared-memory op for CPU runs: building it into {folder} once "
          "(about 1 minute on 2 cores; later jobs load it in a second)", flush=True)
    started = time.monotonic()
    if load_deepspeed_comm_op() is None:
        print("DeepSpeed's shared-memory op is not available here; CPU runs use plain gloo")
        return 0
    print(f"DeepSpeed's shared-memory op ready ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
