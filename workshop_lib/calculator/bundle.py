"""The calculator's files, laid out for the built book: the page, Pyodide from npm, the library's own modules.

Everything the page loads is served with the book (no CDN), so it works offline once loaded:

    _static/memory-calculator/
        calculator.html, calculator.js, calculator.css   the page (workshop_lib/calculator/static)
        pyodide/                                          Pyodide from npm (package.json pins it; `npm ci`)
        workshop_lib.zip                                  PAGE_MODULES, the files of this checkout as they are
        calculator-data.json                              measured runs and chapter presets (references.py)
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

from workshop_lib.errors import WorkshopError
from workshop_lib.paths import SOURCE_ROOT

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # workshop_lib/
STATIC_DIR = Path(__file__).resolve().parent / "static"
PYODIDE_DIR = SOURCE_ROOT / "node_modules" / "pyodide"
# What the browser needs of the npm package: the loader, the interpreter and its standard library.
PYODIDE_FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json",
                 "package.json")
# The library's modules the page imports (page.py and what it imports): standard library only, checked by
# tests/test_calculator.py. Shipped as they are: the page runs the same code as `workshop estimate`.
PAGE_MODULES = ("__init__.py", "errors.py", "paths.py", "sbatch_script.py", "experiments.py", "validate.py",
                "launch_check.py", "request_check.py",
                "estimate/__init__.py", "estimate/shapes.py", "estimate/memory.py", "estimate/flops.py",
                "estimate/report.py", "estimate/fit.py", "estimate/crosscheck.py",
                "calculator/__init__.py", "calculator/page.py")
BUNDLE_FOLDER = Path("_static") / "memory-calculator"
_ZIP_DATE = (2020, 1, 1, 0, 0, 0)  # fixed: the same sources give the same archive


def pyodide_version(pyodide_dir: Path = PYODIDE_DIR) -> str:
    """The vendored Pyodide's version; a WorkshopError saying how to install it when it is missing."""
    manifest = Path(pyodide_dir) / "package.json"
    if not manifest.is_file():
        raise WorkshopError(f"the memory calculator needs Pyodide from npm and {pyodide_dir} has none: run "
                            "`npm ci` in the repository (`make setup` does), then build the book again")
    return json.loads(manifest.read_text())["version"]


def write_modules_zip(target: Path) -> None:
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for relative in PAGE_MODULES:
            info = zipfile.ZipInfo(f"workshop_lib/{relative}", date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, (PACKAGE_ROOT / relative).read_bytes())


def write_bundle(target: Path, data: dict | None = None, pyodide_dir: Path = PYODIDE_DIR,
                 require_pyodide: bool = True) -> Path:
    """Write the calculator's files into `target` (the built book's _static/memory-calculator). Without
    Pyodide: a WorkshopError, or with ``require_pyodide=False`` everything else (the page then says what is
    missing and how to install it)."""
    try:
        pyodide_version(pyodide_dir)
        has_pyodide = True
    except WorkshopError:
        if require_pyodide:
            raise
        has_pyodide = False
    if data is None:
        from workshop_lib.calculator.references import page_data

        data = page_data()
    target = Path(target)
    (target / "pyodide").mkdir(parents=True, exist_ok=True)
    for name in PYODIDE_FILES if has_pyodide else ():
        shutil.copyfile(Path(pyodide_dir) / name, target / "pyodide" / name)
    for source in STATIC_DIR.iterdir():
        if source.is_file():
            shutil.copyfile(source, target / source.name)
    write_modules_zip(target / "workshop_lib.zip")
    (target / "calculator-data.json").write_text(json.dumps(data, sort_keys=True))
    return target
