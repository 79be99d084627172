"""Job scripts: an experiment on a site profile rendered from slurm/templates into the bash a scheduler runs.

Owns: render.py (template choice, context, rendering, writing), directives.py (the #SBATCH lines), commands.py
(the launch and each engine's arguments), lab.py (the JupyterLab job).
May import: core, experiments, estimate, sites, checks (an experiment is checked before it is rendered).
"""

from workshop_lib.scripts.commands import (
    NO_CHECKPOINTS,
    bandwidth_context,
    nemo_context,
    nemo_factory,
    nemo_overrides,
    torchrun_launch,
    training_arguments,
)
from workshop_lib.scripts.directives import Directive, directives, site_directives_without_gpu_type
from workshop_lib.scripts.render import (
    REHEARSAL,
    STAND_IN,
    TEMPLATES_DIR,
    cache_exports,
    rehearsal_context,
    render_import_script,
    render_script,
    render_template,
    run_engine,
    site_context,
    template_for,
    write_script,
)

__all__ = [
    "Directive", "NO_CHECKPOINTS", "REHEARSAL", "STAND_IN", "TEMPLATES_DIR", "bandwidth_context", "cache_exports",
    "directives", "nemo_context", "nemo_factory", "nemo_overrides", "rehearsal_context", "render_import_script",
    "render_script", "render_template", "run_engine", "site_context", "site_directives_without_gpu_type",
    "template_for", "torchrun_launch", "training_arguments", "write_script",
]
