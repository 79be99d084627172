"""`workshop lab --batch` / `--ibex`: JupyterLab as a batch job, and the tunnel command to reach it."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    lab = subparsers.add_parser(
        "lab", help="JupyterLab as a batch job on a compute node, with the SSH tunnel command to reach it "
                    "(KAUST's way to run Jupyter on Ibex); `make lab` runs it on this machine instead")
    where = lab.add_mutually_exclusive_group(required=True)
    where.add_argument("--ibex", action="store_true", help="the same as --batch --profile ibex")
    where.add_argument("--batch", action="store_true", help="submit the Jupyter job with the profile's settings")
    lab.add_argument("--profile", default=None, help="site profile (default: $WORKSHOP_PROFILE, else ibex)")
    lab.add_argument("--print-only", action="store_true", help="print the job script; submit nothing")
    lab.add_argument("--wait", type=float, default=600, metavar="SECONDS",
                     help="how long to wait for the server to start (default 600; it may queue first)")
    lab.set_defaults(handler=_lab)


def _lab(args: argparse.Namespace) -> int:
    from workshop_lib import jobs as cluster
    from workshop_lib.core.errors import WorkshopError
    from workshop_lib.core.paths import repository_root, runs_root
    from workshop_lib.scripts.lab import connection, render_lab_script
    from workshop_lib.sites.profiles import load_profile

    if not 0 < args.wait < float("inf"):  # nan and inf too: the wait loop would never run, or never end
        raise WorkshopError(f"--wait {args.wait:g}: give a number of seconds above 0")
    profile = load_profile("ibex" if args.ibex else args.profile)
    text = render_lab_script(profile, _own_checkout(repository_root()))
    if args.print_only:
        print(text, end="")
        return 0
    folder = runs_root() / "jupyter"
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "jupyter-lab.sbatch"
    script.write_text(text)
    job = cluster.submit(script, workdir=folder)
    print(f"Submitted JupyterLab as job {job.job_id} (profile {profile.name!r}); its log: {folder}/jupyter-{job.job_id}.out")
    log = folder / f"jupyter-{job.job_id}.out"
    deadline = time.monotonic() + args.wait
    found = None
    while time.monotonic() < deadline:
        info = job.info()
        if info.finished:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
            raise WorkshopError(f"the Jupyter job {job.job_id} ended ({info.state}) before its server started; "
                                f"its log:\n{tail}")
        found = connection(log.read_text(errors="replace")) if log.exists() else None
        if found:
            break
        print(f"  job {job.job_id}: {info.state}{' (' + info.reason + ')' if info.reason else ''} ...",
              file=sys.stderr, flush=True)
        time.sleep(5)
    if found is None:
        print(f"The server has not started within {args.wait:.0f} s (the job may still be queued). Look again "
              f"later: grep -E 'TUNNEL|token=' {log}")
        return 0
    print(f"\nJupyterLab is up in job {job.job_id}.\n"
          f"1. On your laptop (VPN from outside KAUST), keep this running:\n     {found.tunnel}\n"
          f"2. Open in your browser:\n     {found.local_url}\n"
          f"3. Open notebooks/, a chapter, and the kernel of the workshop's environment.\n"
          f"Stop it with File > Shut Down in JupyterLab, or: scancel {job.job_id}")
    return 0


def _own_checkout(root: Path) -> Path:
    """The workshop folder JupyterLab opens, where the chapters write their runs: it must be the participant's own.
    From outside any clone (e.g. $HOME) the folder found is the library's, with a class the staged copy: shared,
    read-only, and not theirs."""
    import os

    from workshop_lib.core.errors import WorkshopError
    from workshop_lib.sites.requirements import is_staged_copy

    if is_staged_copy(root) or not os.access(root, os.W_OK):
        what = "the class's staged copy, shared and read-only" if is_staged_copy(root) else "a folder you cannot write"
        raise WorkshopError(f"JupyterLab would open {root}, {what}: the chapters could not write your runs there. "
                            "Start it from your own clone: cd into it (e.g. cd /ibex/user/$USER/workshop), then run "
                            "this command again; or set WORKSHOP_ROOT to your clone")
    return root
