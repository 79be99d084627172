"""Sphinx hook (``_config.yml``: sphinx.extra_extensions): the HTML build ships the memory calculator's files."""

from __future__ import annotations

from pathlib import Path

from ..errors import WorkshopError
from .bundle import BUNDLE_FOLDER, write_bundle


def _write(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    try:
        write_bundle(Path(app.outdir) / BUNDLE_FOLDER)
    except WorkshopError as error:
        from sphinx.errors import ExtensionError

        raise ExtensionError(str(error)) from None


def setup(app) -> dict:
    app.add_js_file("memory-calculator/embed.js")  # sizes embedded calculators to their content
    app.connect("build-finished", _write)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
