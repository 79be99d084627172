"""The calculator's files, laid out for the built book: the page, Pyodide from npm, the library's own modules.

Everything the page loads is served with the book (no CDN), so it works offline once loaded:

    _static/memory-calculator/
        calculator.html, calculator.js, calculator.css   the page (workshop_lib/book/calculator/static)
        pyodide/                                          Pyodide from npm (package.json pins it; `npm ci`)
        workshop_lib.zip                                  PAGE_MODULES, the files of this checkout as they are
        calculator-data.json                              measured runs and chapter presets (references.py)
"""

from __future__ import annotations

import ast
import json
import shutil
import zipfile
from pathlib import Path

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.paths import SOURCE_ROOT

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # workshop_lib/
STATIC_DIR = Path(__file__).resolve().parent / "static"
PYODIDE_DIR = SOURCE_ROOT / "node_modules" / "pyodide"
# What the browser needs of the npm package: the loader, the interpreter and its standard library.
PYODIDE_FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json",
                 "package.json")


def page_modules(start: str = "book/calculator/page.py") -> tuple[str, ...]:
    """The library's files the page imports when it loads (module-level imports followed from page.py, with the
    package __init__s they run): shipped as they are, so the page runs the same code as `workshop estimate`.
    tests/test_calculator.py checks they are standard library only and that Python loads no other."""
    # Importing the page runs the __init__ of every package above it (workshop_lib.book, .book.calculator).
    found, todo = {"__init__.py"}, [start, *(str(folder / "__init__.py") for folder in Path(start).parents[:-1])]
    while todo:
        relative = todo.pop()
        if relative in found:
            continue
        found.add(relative)
        module = ("workshop_lib/" + relative).removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for node in ast.parse((PACKAGE_ROOT / relative).read_text()).body:
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if isinstance(node, ast.ImportFrom) and node.level:
                raise WorkshopError(f"{relative}: the calculator's modules import absolutely ({module})")
            for name in names:
                parts = name.split(".")
                if parts[0] != "workshop_lib":
                    continue
                if isinstance(node, ast.ImportFrom):  # `from package import module` runs that module too
                    parts_of = [parts + [alias.name] for alias in node.names]
                else:
                    parts_of = [parts]
                for chain in parts_of:
                    for depth in range(2, len(chain) + 1):
                        path = Path(*chain[1:depth])
                        for candidate in (path / "__init__.py", path.with_suffix(".py")):
                            if (PACKAGE_ROOT / candidate).is_file():
                                todo.append(candidate.as_posix())
                                break
    return tuple(sorted(found))


PAGE_MODULES = page_modules()
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
        from workshop_lib.book.calculator.measured_runs import page_data

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
