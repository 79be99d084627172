"""`workshop class init | publish | pool`: the class pool from a shell (workshop_lib.results.class_pool).

    workshop class init FOLDER --group GROUP     the instructor, once: the class folder, mode 3770
    workshop class publish --chapter N           a participant: their completed runs of chapter N, to the class
    workshop class pool --chapter N              anyone: the chapter's tables filled by the class; skipped files named

Other `workshop class` verbs (the class plan) register through `class_verbs(subparsers)`, so the group is made once.
"""

from __future__ import annotations

import argparse
import sys

from workshop_lib.core.errors import WorkshopError
from workshop_lib.experiments import CHAPTERS as _CHAPTER_TITLES

CHAPTERS = tuple(_CHAPTER_TITLES)  # the --chapter choices: the chapter registry's numbers


def class_verbs(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """The verbs of `workshop class`: the group is made by whichever module registers first, and found by the
    others (its one sub-parsers action), so each area adds its own verbs."""
    parser = subparsers.choices.get("class")
    if parser is None:
        parser = subparsers.add_parser("class", help="the class: its plan and its pooled results",
                                       description="What a class of participants shares on the workshop day.")
        parser.add_subparsers(dest="class_command", metavar="COMMAND")
        parser.set_defaults(handler=_no_command)
    return next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))


def _no_command(args: argparse.Namespace) -> int:
    raise WorkshopError("`workshop class` needs a command (`workshop class --help` lists them), e.g. "
                        "`workshop class pool --chapter 1`")


def register(subparsers: argparse._SubParsersAction) -> None:
    verbs = class_verbs(subparsers)
    init = verbs.add_parser("init", help="make the class folder (the instructor, once)",
                            description="Make the class folder every participant publishes into: the class's group, "
                            "mode 3770 (members add their own folder; the sticky bit keeps anyone from renaming or "
                            "deleting another's). Default: class/ in the staged folder.")
    init.add_argument("folder", nargs="?", default=None,
                      help="the folder (default: $WORKSHOP_CLASS_DIR, else class/ in the profile's staged folder)")
    init.add_argument("--group", default=None, help="the class's Unix group (default: the folder's group as made)")
    init.add_argument("--profile", default=None, help="the site profile whose staged folder holds it")
    init.set_defaults(handler=run_init)

    for name, text in (("publish", "publish your completed runs of a chapter to the class folder"),
                       ("pool", "print a chapter's tables filled by the whole class")):
        verb = verbs.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        verb.add_argument("--chapter", type=int, choices=CHAPTERS, required=True)
        verb.add_argument("--profile", default=None, help="the profile the runs ran on (default: $WORKSHOP_PROFILE, "
                          "else ibex)")
        if name == "publish":
            verb.add_argument("--runs-dir", default=None, metavar="DIR",
                              help="your runs folder (default: $WORKSHOP_RUNS_DIR or <repository>/runs)")
        else:
            verb.add_argument("--format", choices=("md", "csv", "json"), default="md", help="output format")
        verb.set_defaults(handler=run_publish if name == "publish" else run_pool)


def _folder(profile_name: str | None):
    from workshop_lib.sites.class_folder import CLASS_DIR_VARIABLE, class_folder_of
    from workshop_lib.sites.profiles import load_profile

    profile = load_profile(profile_name)
    found = class_folder_of(profile)
    if found is None:
        raise WorkshopError(f"no class folder is set: export {CLASS_DIR_VARIABLE}=FOLDER (the folder the instructor "
                            "announced), or WORKSHOP_SHARED_ROOT=STAGED (its class/ is used)")
    return profile, found


def run_init(args: argparse.Namespace) -> int:
    from pathlib import Path

    from workshop_lib.results.class_pool import CLASS_FOLDER_MODE, prepare_class_folder

    folder = Path(args.folder) if args.folder else _folder(args.profile)[1].path
    prepare_class_folder(folder, args.group)
    print(f"class folder {folder}: mode {CLASS_FOLDER_MODE:o}; participants publish with `workshop class publish "
          f"--chapter N` (tell them: export WORKSHOP_CLASS_DIR={folder}, unless it is class/ in the staged folder)")
    return 0


def run_publish(args: argparse.Namespace) -> int:
    from workshop_lib.book.chapter.class_runs import publish_own
    from workshop_lib.book.chapter.selection import select

    profile, found = _folder(args.profile)
    path, count = publish_own(select(args.chapter, profile), found.path, args.runs_dir)
    if path is None:
        print(f"workshop class publish: nothing published: no completed run of chapter {args.chapter} on profile "
              f"{profile.name} in your runs folder yet; run the chapter first (or give --runs-dir, --profile)",
              file=sys.stderr)
        return 0
    print(f"published {count} completed run(s) of chapter {args.chapter} on profile {profile.name} to {path}")
    return 0


def run_pool(args: argparse.Namespace) -> int:
    from workshop_lib.book.chapter.class_runs import class_results, whole_chapter
    from workshop_lib.book.chapter.selection import select
    from workshop_lib.book.chapter.your_runs import for_profile
    from workshop_lib.book.tables import render_tables, tables_from_results
    from workshop_lib.results.class_pool import read_pool

    profile, found = _folder(args.profile)
    chapter = whole_chapter(select(args.chapter, profile))
    pool = read_pool(found.path, args.chapter, profile.name, chapter.runnable)
    for line in pool.problems:  # one line per skipped file: its owner can fix it
        print(f"workshop class pool: skipped: {line}", file=sys.stderr)
    pooled = class_results(pool, chapter.runnable)
    tables = [for_profile(table, profile) for table in tables_from_results(args.chapter, pooled.results)
              if not table.frame.empty and len(table.frame.columns) > 1]
    print(render_tables(tables, args.format))
    print(f"workshop class pool: {len(pool.runs)} run(s) from {len({run.user for run in pool.runs})} participant(s) "
          f"in {found.path}", file=sys.stderr)
    return 0
