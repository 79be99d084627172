"""The `workshop` command. Each area of the library adds its sub-commands from workshop_lib/cli/."""

from __future__ import annotations

import argparse
import importlib
import sys

from workshop_lib.core.errors import WorkshopError

# One module per area; each defines register(subparsers). Listed here so the order of --help is stable.
COMMAND_MODULES = [
    "cluster",  # cluster up/down/status, jobs
    "experiments",  # experiments, render, check, submit, status, cancel
    "results",  # collect, memory
    "estimate",  # estimate
    "setup",  # setup SITE (a login node's one-off preparation)
    "lab",  # lab --batch / --ibex (JupyterLab as a batch job, and its tunnel)
    "class_pool",  # class init / publish / pool (the class's pooled results)
    "class_day",  # class plan (a class day on a reservation), in the `class` group class_pool makes
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workshop",
        description="Distributed fine-tuning workshop: experiments, SLURM jobs, results.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"workshop_lib.cli.{name}")
        except ModuleNotFoundError as missing:
            if missing.name == f"workshop_lib.cli.{name}":
                continue  # that area is not built yet
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 1
    try:
        return int(args.handler(args) or 0)
    except WorkshopError as error:
        print(f"workshop: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("workshop: interrupted", file=sys.stderr)
        return 130
    except OSError as error:  # a path the command was given or writes to: name it, never a traceback
        where = f" {error.filename}" if error.filename else ""
        print(f"workshop: error: cannot use{where}: {error.strerror or error} - check the path you gave (a file "
              "where a file is expected, in a folder you can write) and the free disk space", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
