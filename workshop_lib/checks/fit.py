"""The fit rule: refuse an experiment whose predicted per-GPU memory exceeds the profile's GPUs.

Called by ``checks.experiment_rules`` and by the linter (``checks.requests``); the estimate and the layout
search live in ``workshop_lib.estimate.fit``. A profile without ``gpu_memory_gib`` (the CPU stand-in) is not
checked.
"""

from __future__ import annotations

from workshop_lib.checks.findings import ERROR, Finding
from workshop_lib.core.vocabulary import NEMO
from workshop_lib.estimate.fit import check_fit


def fit_findings(experiment, profile) -> list:
    """[] when the experiment fits (or the profile names no GPU memory), else one error Finding."""
    gpu_memory = getattr(profile, "gpu_memory_gib", None)
    if gpu_memory is None or experiment.engine != NEMO:
        return []
    verdict = check_fit(experiment, gpu_memory, stand_in=not profile.nemo.enabled)
    if verdict.fits:
        return []
    fix = (f"use a layout that fits, e.g. {verdict.suggestion}" if verdict.suggestion
           else "use GPUs with more memory or a smaller model")
    return [Finding("does-not-fit", ERROR, verdict.message() + ".", fix + ".")]
