"""Build the DeepSpeed op that CPU runs load (the shared-memory all-reduce) once, at set-up.

DeepSpeed compiles it on first use into ~/.cache/torch_extensions (~50 s on two cores); a job that
paid it would look slow for a reason that has nothing to do with ZeRO. On a GPU machine this does nothing:
there the CUDA ops are built on first use as usual (DS_BUILD_OPS=0 at install time).
"""

from __future__ import annotations

import time


def main() -> int:
    import torch

    if torch.cuda.is_available():
        print("GPU machine: DeepSpeed builds its CUDA ops on first use; nothing to prebuild")
        return 0
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not builder.is_compatible(verbose=False):
        print("DeepSpeed's shared-memory op is not available here; CPU runs use plain gloo")
        return 0
    started = time.monotonic()
    builder.load(verbose=False)
    print(f"DeepSpeed {builder.absolute_name()} ready ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
