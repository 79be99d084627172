"""Sphinx hook (``_config.yml``: sphinx.extra_extensions): the HTML build ships the memory calculator's files.

Without Pyodide (no `npm ci` yet) the build warns, with the command that fixes it (``make book`` builds with -W,
so there it stops), and the page tells its reader the same instead of loading forever.
"""

from __future__ import annotations

from pathlib import Path

from workshop_lib.book.calculator.bundle import BUNDLE_FOLDER, PYODIDE_DIR, pyodide_version, write_bundle
from workshop_lib.core.errors import WorkshopError


def _write(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    try:
        pyodide_version(PYODIDE_DIR)
    except WorkshopError as error:
        from sphinx.util import logging

        logging.getLogger(__name__).warning(str(error))
    write_bundle(Path(app.outdir) / BUNDLE_FOLDER, require_pyodide=False)


def setup(app) -> dict:
    app.add_js_file("memory-calculator/embed.js")  # sizes embedded calculators to their content
    app.connect("build-finished", _write)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
