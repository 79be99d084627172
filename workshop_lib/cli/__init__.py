"""The `workshop` command (pyproject's entry point `workshop_lib.cli:main`, or `python -m workshop_lib.cli`).

Owns: main.py (the parser and error handling), one module per area that adds its sub-commands (cluster,
experiments, results, estimate, setup, lab, class_pool), and demo.py (`make demo`: the workshop end to end on the
local default).
May import: everything below it (core to book); nothing imports it.
"""

from workshop_lib.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
