"""GPU datasheet peaks, in one place: what MFU divides by and what the A100 time estimates scale with.

Dense (no 2:4 sparsity) bf16/fp16 tensor-core peaks and memory bandwidth from NVIDIA's datasheets: A100 80GB
SXM 312 TFLOP/s and 2.039 TB/s; H100 SXM 989 TFLOP/s and 3.35 TB/s; H200 SXM 989 TFLOP/s and 4.8 TB/s. MFU
(model FLOPs utilisation, PaLM's definition) divides by these peaks, not by a matmul rate measured on the day.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Card:
    """A GPU's datasheet peaks: dense bf16/fp16 tensor math and memory bandwidth."""

    name: str
    dense_tflops: float
    bandwidth_tb_s: float
    source: str


CARDS = {
    "A100": Card("A100 80GB SXM", 312.0, 2.039, "NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4)"),
    "H100": Card("H100 SXM", 989.0, 3.35, "NVIDIA H100 datasheet (H100 SXM column, without sparsity)"),
    "H200": Card("H200 SXM", 989.0, 4.8, "NVIDIA H200 datasheet (H200 SXM column, without sparsity)"),
}


def card_of(gpu_name: str | None) -> Card | None:
    """The datasheet card for a GPU name as nvidia-smi prints it ("NVIDIA H100 80GB HBM3"), else None. An
    H100 PCIe card (756 TFLOP/s, 2.0 TB/s) is not the SXM one: a name saying PCIe is not matched."""
    name = (gpu_name or "").upper()
    if "PCIE" in name:
        return None
    return next((card for key, card in CARDS.items() if key in name), None)


__all__ = ["CARDS", "Card", "card_of"]
