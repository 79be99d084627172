"""The optimizer steps a run is held to, stated once: the smallest of the caps that are set.

The caps are an experiment's own ``max_steps``, the profile's ``training.max_steps`` (the tiny profile's short
runs) and, for a run already made, the cap it recorded or declared. The job scripts (``--max-steps``, NeMo's
``trainer.max_steps``), the disk check (how many checkpoints a run saves), the time plan and the chapters' step
columns all ask this function, so they cannot disagree on how long a run trains.
"""

from __future__ import annotations


def step_cap(*caps: int | None) -> int | None:
    """The smallest of ``caps`` that is set; None where none is (the run trains its full epochs)."""
    present = [int(cap) for cap in caps if cap is not None]
    return min(present) if present else None
