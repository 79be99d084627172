"""`workshop experiments | render | check | submit | status`: experiments, their scripts, their runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workshop_lib.experiments import CHAPTERS as _CHAPTER_TITLES

CHAPTERS = tuple(_CHAPTER_TITLES)  # the --chapter choices: the chapter registry's numbers


def register(subparsers: argparse._SubParsersAction) -> None:
    listing = subparsers.add_parser("experiments", help="list the experiments of every chapter (or one)")
    listing.add_argument("--chapter", type=int, choices=CHAPTERS, help="only this chapter")
    listing.add_argument("--format", choices=["table", "json"], default="table")
    listing.add_argument("--profile", help="mark the experiments this profile does not run (e.g. tiny)")
    listing.set_defaults(handler=_experiments)

    render = subparsers.add_parser("render", help="print or write the job script of an experiment")
    render.add_argument("experiment_id", metavar="ID", nargs="?", help="experiment id, e.g. zero/single-gpu/zero2")
    render.add_argument("--profile", help="site profile: a name in slurm/profiles/ or a YAML path "
                        "(default $WORKSHOP_PROFILE or ibex)")
    render.add_argument("-o", "--output", type=Path, help="write the script here instead of printing it")
    render.add_argument("--import-model", metavar="MODEL",
                        help="render the NeMo checkpoint import job for MODEL (e.g. llama-3.1-8b) instead")
    render.add_argument("--stage", metavar="DIR", help="with --import-model: the job of an instructor's staging "
                        "into DIR (`workshop setup PROFILE --stage DIR` runs it)")
    render.set_defaults(handler=_render)

    check = subparsers.add_parser("check", help="lint sbatch scripts for the pitfalls SLURM and NeMo punish and the "
                                  "launch mistakes of hand-written torchrun/DeepSpeed/Accelerate/NeMo jobs; a folder "
                                  "also has its env_vars.sh compared with the names its Python reads and its job "
                                  "names checked for reuse")
    check.add_argument("scripts", nargs="+", type=_given_path, metavar="SCRIPT_OR_DIR")
    check.set_defaults(handler=_check)

    submit = subparsers.add_parser("submit", help="render experiments into runs/<id>/ and submit them")
    submit.add_argument("experiment_ids", nargs="*", metavar="ID")
    submit.add_argument("--chapter", type=int, choices=CHAPTERS, help="every experiment of this chapter")
    submit.add_argument("--profile", help="site profile (default $WORKSHOP_PROFILE or ibex)")
    submit.add_argument("--runs-dir", type=Path, help="root of the run directories (default $WORKSHOP_RUNS_DIR "
                        "or <repository>/runs)")
    submit.add_argument("--force", action="store_true", help="resubmit even when a completed run exists")
    submit.add_argument("--wait", action="store_true", help="wait until every job has ended")
    submit.add_argument("--timeout", type=float, help="with --wait: give up after this many seconds")
    submit.add_argument("--backend", choices=["slurm", "local"], help="job control backend (default: auto)")
    submit.set_defaults(handler=_submit)

    status = subparsers.add_parser("status", help="the state of each experiment's run")
    status.add_argument("experiment_ids", nargs="*", metavar="ID")
    status.add_argument("--chapter", type=int, choices=CHAPTERS)
    status.add_argument("--runs-dir", type=Path)
    status.set_defaults(handler=_status)
    _register_cancel(subparsers)


def _register_cancel(subparsers: argparse._SubParsersAction) -> None:
    cancel = subparsers.add_parser("cancel", help="cancel the queued or running jobs of experiments, a chapter, "
                                                  "or jobs by id")
    cancel.add_argument("experiment_ids", nargs="*", metavar="ID")
    cancel.add_argument("--chapter", type=int, choices=CHAPTERS, help="every experiment of this chapter")
    cancel.add_argument("--job", action="append", default=[], metavar="JOB_ID",
                        help="a job by its id (repeatable), e.g. one `workshop submit` reported")
    cancel.add_argument("--runs-dir", type=Path)
    cancel.set_defaults(handler=_cancel)


def _cancel(args: argparse.Namespace) -> int:
    from workshop_lib import jobs as cluster
    from workshop_lib.cli.cluster import JOB_ID
    from workshop_lib.core.errors import WorkshopError
    from workshop_lib.core.paths import existing_runs_root
    from workshop_lib.experiments import select_experiments
    from workshop_lib.runs import cancel_runs_report

    if not (args.experiment_ids or args.chapter or args.job):
        raise WorkshopError("nothing to cancel: give experiment ids, --chapter N or --job JOB_ID "
                            "(`workshop status` lists the runs and their jobs)")
    for job_id in args.job:
        if not JOB_ID.fullmatch(job_id):
            raise WorkshopError(f"--job {job_id!r} is not a job id: give SLURM's number (e.g. 1234) or the local "
                                "executor's local-N, as `workshop status` shows them")
    lines, unanswered = [], []
    if args.experiment_ids or args.chapter:
        report = cancel_runs_report(select_experiments(args.experiment_ids, args.chapter),
                                    existing_runs_root(args.runs_dir))
        lines, unanswered = report.lines, report.unanswered
    for job_id in args.job:
        job = cluster.job_from_id(job_id)
        info = job.info()
        if info.finished:
            raise WorkshopError(f"job {job_id} is not queued or running ({info.state}): nothing to cancel; check "
                                "the id (`workshop status`, `squeue --me`)")
        job.cancel()
        lines.append(f"cancelled job {job_id} (it was {info.state})")
    for line in lines:
        print(line)
    if unanswered:  # their jobs may still run: a script or a person checking the exit status must know
        print(f"workshop: error: {len(unanswered)} run(s) not cancelled because the scheduler did not answer: "
              f"{', '.join(unanswered)}; run the same `workshop cancel` again once it answers "
              "(`workshop cluster status` for the local cluster, `squeue --me` on a cluster)", file=sys.stderr)
        return 1
    return 0


def _experiments(args: argparse.Namespace) -> int:
    from workshop_lib.experiments import all_experiments, chapter_experiments, summary_row
    from workshop_lib.sites.profiles import load_profile

    experiments = chapter_experiments(args.chapter) if args.chapter else all_experiments()
    profile = load_profile(args.profile) if args.profile else None
    rows = []
    for experiment in experiments:
        row = summary_row(experiment)
        if profile is not None:
            row["runs_on_" + profile.name] = profile.supports(experiment)
        rows.append(row)
    if args.format == "json":
        print(json.dumps([{**row, "experiment": experiment.to_dict()} for row, experiment in zip(rows, experiments)],
                         indent=2))
        return 0
    _print_table(rows)
    counts = {}
    for experiment in experiments:
        counts[experiment.chapter] = counts.get(experiment.chapter, 0) + 1
    print("\n" + ", ".join(f"chapter {chapter}: {count}" for chapter, count in sorted(counts.items()))
          + f" ({len(experiments)} experiments)")
    return 0


def _render(args: argparse.Namespace) -> int:
    from workshop_lib.core.errors import WorkshopError
    from workshop_lib.experiments import get_experiment
    from workshop_lib.scripts import render_import_script, render_script

    if args.stage and not args.import_model:
        raise WorkshopError("--stage goes with --import-model (the staging's import jobs)")
    if args.import_model:
        from workshop_lib.sites.profiles import load_profile, staged_profile

        profile = load_profile(args.profile)
        text = render_import_script(args.import_model, staged_profile(profile, args.stage) if args.stage else profile)
    elif args.experiment_id:
        text = render_script(get_experiment(args.experiment_id), args.profile)
    else:
        raise WorkshopError("give an experiment id (`workshop experiments` lists them) or --import-model MODEL")
    if args.output:
        try:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(text)
        except OSError as error:
            what = "is a folder" if args.output.is_dir() else f"cannot be written ({error.strerror})"
            raise WorkshopError(f"-o {args.output} {what}: give the path of a file in a folder you can write, "
                                f"e.g. -o {Path(args.experiment_id or 'job').name}.sbatch") from error
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _given_path(text: str) -> Path:
    """A path from the command line; an empty one (`check ""`, an unset variable) is refused, not read as `.`."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: give a job script or a folder of them (an unset shell "
                                         "variable expands to nothing)")
    return Path(text)


def _check(args: argparse.Namespace) -> int:
    from workshop_lib.checks.env_vars import check_folder
    from workshop_lib.checks.lint import lint_file
    from workshop_lib.checks.script import NotAJobScript

    errors = warnings = notes = checked = 0
    for target in args.scripts:
        if target.is_dir():
            results, comparisons = check_folder(target)
        else:
            try:
                results, comparisons = [(target, lint_file(target, notes=True))], []
            except NotAJobScript as refused:
                print(f"error: {refused}")  # said, counted, and the other files still checked
                errors += 1
                continue
        for path, findings in results:
            checked += path.suffix != ".py"
            for finding in findings:
                print(finding.format(str(path)))
            errors += sum(finding.is_error for finding in findings)
            notes += sum(finding.is_note for finding in findings)
            warnings += sum(not finding.is_error and not finding.is_note for finding in findings)
        if target.is_dir():
            if not results:
                print(f"{target}: no job scripts (*.slurm, *.sbatch, *.sh with #SBATCH lines) in this folder")
            for comparison in comparisons:
                print("env: " + comparison.summary(target))
        elif all(finding.is_note for finding in results[0][1]):
            undecided = len(results[0][1])
            print(f"{target}: no findings" + (f" (and {undecided} undecided here, above)" if undecided else ""))
    print(f"{checked} script{'s' if checked != 1 else ''} checked: {errors} error{'s' if errors != 1 else ''}, "
          f"{warnings} warning{'s' if warnings != 1 else ''}" + (f", {notes} undecided here (note)" if notes else ""))
    return 1 if errors else 0


def _submit(args: argparse.Namespace) -> int:
    from workshop_lib.experiments import select_experiments
    from workshop_lib.jobs.states import COMPLETED
    from workshop_lib.runs import submit_experiments, wait_for_runs
    from workshop_lib.sites.profiles import load_profile

    experiments = select_experiments(args.experiment_ids, args.chapter)
    profile = load_profile(args.profile)
    runs = submit_experiments(experiments, profile, root=args.runs_dir, force=args.force, backend=args.backend)
    for run in runs:
        print(f"{run.experiment.id:45s} {run.note}")
    submitted = sum(run.submitted_now for run in runs)
    print(f"{submitted} submitted, {len(runs) - submitted} reused, active or skipped (profile {profile.name})")
    if not args.wait:
        return 0
    infos = wait_for_runs(runs, timeout=args.timeout, progress=True)
    recorded = [run for run in runs if run.record is not None]
    for run, info in zip(recorded, infos):
        print(f"{run.experiment.id:45s} {info.state}")
    _print_explanations(recorded, infos)
    return 0 if all(info.state == COMPLETED for info in infos) else 1


def _print_explanations(runs, infos) -> None:
    """Why each ended run did not complete (the same text the notebook shows)."""
    from workshop_lib.jobs.states import COMPLETED
    from workshop_lib.runs import explain_runs

    ended = [(run, info) for run, info in zip(runs, infos) if info.finished and info.state != COMPLETED]
    for (run, _), explanation in zip(ended, explain_runs(ended)):
        print(f"\n{run.experiment.id}:\n" + explanation.text())


def _status(args: argparse.Namespace) -> int:
    from workshop_lib.core.paths import existing_runs_root
    from workshop_lib.experiments import select_experiments
    from workshop_lib.runs import run_status

    experiments = select_experiments(args.experiment_ids, args.chapter) if (args.experiment_ids or args.chapter) \
        else None
    statuses = run_status(experiments, root=existing_runs_root(args.runs_dir))
    rows = [{"id": status.experiment_id, "state": status.state + ("" if status.current or not status.job_id
                                                                    else " (older version)"),
             "job": status.job_id, "profile": status.profile} for status in statuses]
    _print_table(rows)
    for status in statuses:
        if status.explanation:
            print(f"\n{status.experiment_id}:\n{status.explanation}")
    return 0


def _print_table(rows: list[dict]) -> None:
    if not rows:
        print("(nothing)")
        return
    columns = list(rows[0])
    widths = {column: max(len(column), *(len(str(row[column])) for row in rows)) for column in columns}
    print("  ".join(column.ljust(widths[column]) for column in columns))
    print("  ".join("-" * widths[column] for column in columns))
    for row in rows:
        print("  ".join(str(row[column]).ljust(widths[column]) for column in columns))
