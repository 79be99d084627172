"""The wheels NeMo 2.4.1 needs on the lent GPU machine, from the NeMo lock and the image's own packages.

    python3 benchmarks/nemo_gpu/wheel_list.py > benchmarks/nemo_gpu/wheels.txt

Rule: every pin of workshop_lib/nemo_check/nemo.lock.txt whose package the GPU image lacks
(image_packages.txt, the device tool's list of the 'cuda' image), plus the packages whose image version is too
new for NeMo 2.4.1 and must shadow it, minus those replaced by import stubs (import_stubs.py) or optional in
Megatron. NumPy is not carried: the image's torch and pandas are built against NumPy 2, so NeMo's NumPy-1 call
is patched at start-up instead (workshop_lib/train/nemo_compat.py).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCK = HERE.parent.parent / "workshop_lib" / "nemo_check" / "nemo.lock.txt"
# Imported along NeMo's path but never called on the training path: stubbed (import_stubs.py), 49 MiB saved.
STUBBED = {"pulp", "boto3", "botocore", "jieba"}
OPTIONAL = {"zarr", "numcodecs"}  # Megatron's zarr checkpoint backend; NeMo saves torch_dist
# The image has newer majors that NeMo 2.4.1 does not run with (transformers 5, lightning 2.5+, peft 0.21).
SHADOW = {"transformers", "tokenizers", "huggingface-hub", "lightning", "peft"}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_pins(lock: Path = LOCK, image: Path = HERE / "image_packages.txt") -> list[str]:
    in_image = {normalise(line.strip()) for line in image.read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    pins = []
    for line in lock.read_text().splitlines():
        if "==" not in line or line.startswith("#"):
            continue
        name = normalise(line.split("==")[0])
        if name in STUBBED or name in OPTIONAL:
            continue
        if name not in in_image or name in SHADOW:
            pins.append(line.strip())
    return pins


if __name__ == "__main__":
    sys.stdout.write("\n".join(wheel_pins()) + "\n")
