"""JupyterLab as a batch job (`workshop lab --batch`, `workshop lab --ibex`): the script, and how to reach it.

KAUST documents Jupyter on Ibex as a job on a compute node reached from a laptop by an SSH tunnel via the
login node (kaust-rccl/ksl-docs docs/source/soft_env/job_schd/slurm/interactive_jobs/jupyter.rst:118-204).
The job prints its tunnel line; Jupyter prints its URL with the token; `connection` reads both back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from workshop_lib.scripts import Directive, cache_exports, render_template, site_directives_without_gpu_type
from workshop_lib.sites.profiles import Profile

LAB_JOB_NAME = "workshop-lab"
_URL = re.compile(r"https?://(?P<host>[^\s/:]+):(?P<port>\d+)/lab\?token=(?P<token>[0-9a-f]+)")
_TUNNEL = re.compile(r"^TUNNEL: (?P<command>ssh -L .+)$", re.MULTILINE)


@dataclass(frozen=True)
class LabConnection:
    port: int
    token: str
    tunnel: str  # the command a participant runs on their laptop

    @property
    def local_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/lab?token={self.token}"


def render_lab_script(profile: Profile, checkout: Path) -> str:
    """The Jupyter job script for this profile: CPU cores only, the reservation, the environment."""
    jupyter, python = profile.jupyter, profile.python
    directives = [
        Directive("job-name", LAB_JOB_NAME, "the name squeue shows"),
        Directive("nodes", "1", "one node"),
        Directive("ntasks", "1", "one Jupyter server"),
        Directive("cpus-per-task", str(jupyter.cpus), "the notebooks render, submit and tabulate: no GPU"),
        Directive("mem", jupyter.memory, "host memory"),
        *site_directives_without_gpu_type(profile, jupyter.time),
        Directive("output", "jupyter-%j.out", "the tunnel line and Jupyter's URL land here"),
    ]
    context = {
        "origin": f'Site profile "{profile.name}", rendered by `workshop lab --batch`.',
        "directives": directives,
        "site": {"modules": python.modules, "conda_root": python.conda_root,
                 "conda_environment": python.conda_environment},
        "profile": profile,
        "cache_exports": cache_exports(profile),
        "node_domain": jupyter.node_domain,
        "login_host": jupyter.login_host or "localhost",
        "checkout": str(checkout),
    }
    return render_template("jupyter_lab.sbatch.j2", context)


def connection(log_text: str) -> LabConnection | None:
    """The tunnel and the URL once the server has printed them, else None."""
    tunnel, url = _TUNNEL.search(log_text), _URL.search(log_text)
    if not tunnel or not url:
        return None
    return LabConnection(int(url.group("port")), url.group("token"), tunnel.group("command"))
