"""`workshop setup SITE`: prepare a cluster account once, on a login node (see workshop_lib/sites/setup_plan.py)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    setup = subparsers.add_parser(
        "setup", help="prepare a site once on a login node: conda, the locked environment, the NeMo image, "
                      "models and data (idempotent, resumable)")
    setup.add_argument("site", metavar="PROFILE", help="site profile name or YAML path (e.g. ibex)")
    setup.add_argument("--dry-run", action="store_true", help="print every step and its commands; run nothing")
    setup.add_argument("--only", action="append", metavar="STEP", default=None,
                       help="run only this step (repeatable); a job that stops for a skipped step names it")
    setup.add_argument("--from", dest="start", metavar="STEP", help="start at this step")
    setup.add_argument("--force", action="store_true", help="run the selected steps even if they are done")
    setup.add_argument("--list", action="store_true", help="list the steps and whether each is done")
    setup.add_argument("--stage", metavar="DIR", default=None,
                       help="instructors: stage everything once into DIR for the whole class (participants then "
                            "export WORKSHOP_SHARED_ROOT=DIR and download nothing large)")
    setup.add_argument("--miniforge-installer", metavar="URL", default=None,
                       help="where the Miniforge installer comes from (default: conda-forge's latest release)")
    setup.set_defaults(handler=_setup)


def _setup(args: argparse.Namespace) -> int:
    from workshop_lib.sites.profiles import load_profile
    from workshop_lib.sites.setup_plan import MINIFORGE_INSTALLER, build_plan
    from workshop_lib.sites.setup_run import describe, is_done, run, select

    profile = load_profile(args.site)
    stage = _stage_folder(args.stage) if args.stage else None
    if stage and not (args.dry_run or args.list):
        _refuse_a_reservation_not_started(profile)
    plan = build_plan(profile, miniforge_installer=args.miniforge_installer or MINIFORGE_INSTALLER, stage=stage)
    steps = select(plan, only=args.only, start=args.start)
    if args.list:
        for number, step in enumerate(steps, 1):
            print(f"[{number}/{len(steps)}] {step.name:28} {'done' if is_done(plan, step) else 'to do':6} {step.title}")
        return 0
    if args.dry_run:
        print(describe(plan, steps))
        return 0
    ran = run(plan, steps, force=args.force, echo=lambda line: print(line, flush=True))
    print(f"setup of {profile.name!r} complete: {len(ran)} step(s) ran, {len(steps) - len(ran)} already done")
    if stage:
        from workshop_lib.sites.profiles import STAGED_BUNDLE

        print(f"The class uses it with: export WORKSHOP_SHARED_ROOT={stage}\n"
              f'  then: git clone "$WORKSHOP_SHARED_ROOT/{STAGED_BUNDLE}" workshop && cd workshop && '
              f"./workshop-setup {args.site}")
    elif profile.python.conda_root and profile.python.conda_environment:
        # The wrapper ran the environment's `workshop` by its path: say how to have it on PATH from now on.
        print("The workshop's commands, in each new shell:\n"
              f'  source "{profile.python.conda_root}/etc/profile.d/conda.sh"\n'
              f"  conda activate {profile.python.conda_environment}")
    return 0


def _refuse_a_reservation_not_started(profile) -> None:
    """Staging runs before the day: its jobs (the environment build, the imports) would wait for the day's
    reservation to start."""
    from workshop_lib.sites.requirements import SetupError
    from workshop_lib.sites.reservation import find_reservation, start_if_not_started

    found = find_reservation(profile)
    start = start_if_not_started(found.name) if found else None
    if start:
        raise SetupError(f"--stage with the reservation {found.name} (set by {found.origin}), which starts at {start}: "
                         "the staging's jobs would wait until then. Stage before the day without it: unset "
                         "WORKSHOP_RESERVATION (or clear scheduler.reservation in the profile) and run this again")


def _stage_folder(folder: str) -> str:
    from pathlib import Path

    from workshop_lib.sites.requirements import SetupError

    path = Path(folder).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    if any(character in str(path) for character in '"`\\$\n'):
        raise SetupError(f"--stage {folder!r}: pick a folder whose path has no quotes, backslashes or $")
    if path.exists() and not path.is_dir():
        raise SetupError(f"--stage {folder!r} is a file, not a folder: give the folder to stage into")
    return str(path)
