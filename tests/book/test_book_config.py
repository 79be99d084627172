"""The Jupyter Book configuration: the table of contents, jupytext pairing, and real builds.

The slow tests build copies of the book in a temporary folder, so they never touch `_build/` and never
execute the real chapters (those need the local SLURM cluster; `make test` executes them).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from repo_paths import REPO

ROOT = REPO
NOTEBOOK_SUFFIXES = (".md", ".py", ".ipynb", ".rst")


def toc_files() -> list[str]:
    """Every `file:` of _toc.yml, root first, in order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                files.append(entry["file"])
            walk(entry.get("sections"))
            walk(entry.get("chapters"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return files


def source_of(entry: str, root: Path = ROOT) -> Path | None:
    """The file a toc entry (given without suffix) stands for, or None."""
    matches = [root / f"{entry}{suffix}" for suffix in NOTEBOOK_SUFFIXES if (root / f"{entry}{suffix}").is_file()]
    return matches[0] if len(matches) == 1 else None


def jupyter_book() -> str:
    beside_python = Path(sys.executable).parent / "jupyter-book"
    found = str(beside_python) if beside_python.exists() else shutil.which("jupyter-book")
    if not found:
        pytest.skip("jupyter-book is not installed")
    return found


def sidebar_links(html: str) -> set[str]:
    """The page links of the book's left sidebar (the primary navigation), as paths without .html."""
    match = re.search(r'<nav class="bd-links bd-docs-nav".*?</nav>', html, re.S)
    assert match, "no sidebar navigation in the page"
    return {href.removesuffix(".html") for href in re.findall(r'href="([^"#]+\.html)', match.group(0))}


# ------------------------------------------------------------------------------------- fast tests


def test_every_toc_entry_resolves_to_exactly_one_file():
    entries = toc_files()
    assert len(entries) == len(set(entries)), f"an entry appears twice in _toc.yml: {entries}"
    unresolved = [entry for entry in entries if source_of(entry) is None]
    assert not unresolved, f"_toc.yml entries with no file (or with several candidates): {unresolved}"


def test_every_narrative_page_is_in_the_toc():
    # With only_build_toc_files a page missing from the toc is silently left out of the book.
    listed = set(toc_files())
    pages = {str(path.relative_to(ROOT).with_suffix("")) for path in (ROOT / "book").glob("*.md")}
    assert pages - listed == set(), f"pages in book/ that the toc does not list: {sorted(pages - listed)}"


def test_book_excludes_what_must_not_become_pages():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    excluded = set(config["exclude_patterns"])
    for needed in ("**/*.ipynb", ".venv", "runs", "_build", ".state", "tests", "benchmarks", "slurm",
                   "workshop_lib", "README.md"):
        assert needed in excluded, f"_config.yml exclude_patterns lacks {needed!r}"
    sphinx = config["sphinx"]["config"]
    assert sphinx["nb_execution_raise_on_error"] is True
    assert sphinx["nb_custom_formats"][".py"][1] == {"fmt": "py:percent"}
    assert config["execute"]["execute_notebooks"] == "cache"


def test_jupytext_pairs_chapters_and_nothing_else():
    from jupytext.config import load_jupytext_configuration_file

    config = load_jupytext_configuration_file(str(ROOT / "jupytext.toml"))
    assert config.default_formats("notebooks/01_data_parallel_lora.py"), "chapters must pair with .ipynb"
    # The pairing also holds when JupyterLab's root is above the checkout (Open OnDemand starts in $HOME).
    assert config.default_formats("ibex/user/someone/workshop/notebooks/04_fsdp.py")
    assert config.default_formats("workshop_lib/cli/main.py") is None
    assert config.default_formats("tests/book/test_book_config.py") is None


def test_chapter_notebooks_have_a_title_and_keep_the_pairing():
    import jupytext

    for entry in toc_files():
        path = source_of(entry)
        if path is None or path.suffix != ".py":
            continue
        notebook = jupytext.reads(path.read_text(), fmt="py:percent")
        titles = [cell for cell in notebook.cells
                  if cell.cell_type == "markdown" and cell.source.lstrip().startswith("# ")]
        assert titles, f"{path}: no markdown cell with a '# ' title, so the page has no title in the sidebar"
        # Formats in a notebook's own metadata override jupytext.toml; "py:percent" alone unpairs it.
        own_formats = notebook.metadata.get("jupytext", {}).get("formats")
        assert own_formats is None or "ipynb" in own_formats, (
            f"{path} pins jupytext formats {own_formats!r}, which stops JupyterLab pairing it with an .ipynb")


# ------------------------------------------------------------------------------------- slow tests


def copy_book(destination: Path, execute: str) -> None:
    """Copy what the book needs (config, toc, pages, chapters) and set its execution mode."""
    for name in ("_toc.yml", "jupytext.toml"):
        shutil.copy2(ROOT / name, destination / name)
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = execute
    (destination / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    for entry in toc_files():
        source = source_of(entry)
        target = destination / source.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


@pytest.mark.slow
def test_book_builds_every_page_and_the_sidebar_lists_them_all(tmp_path):
    copy_book(tmp_path, execute="off")
    result = subprocess.run([jupyter_book(), "build", str(tmp_path), "--keep-going"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    html = tmp_path / "_build" / "html"
    entries = toc_files()
    for entry in entries:
        page = html / f"{entry}.html"
        assert page.is_file(), f"{entry} was not built"
        links = sidebar_links(page.read_text())
        # Links are relative to the page: resolve them against its folder.
        resolved = {str((page.parent / link).resolve().relative_to(html.resolve())) for link in links}
        # Every page but the root (the book's home link) is listed; a page links to itself as "#".
        missing = [other for other in entries[1:] if other != entry and other not in resolved]
        assert not missing, f"the sidebar of {entry} does not list {missing}"


@pytest.mark.slow
def test_a_failing_cell_fails_the_build(tmp_path):
    # The real configuration, a one-page book and a chapter whose only code cell raises.
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    (tmp_path / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: broken\n")
    (tmp_path / "intro.md").write_text("# Intro\n\nA page.\n")
    (tmp_path / "broken.py").write_text(
        "# ---\n# jupyter:\n#   kernelspec:\n#     display_name: Python 3\n#     language: python\n"
        "#     name: python3\n# ---\n\n# %% [markdown]\n# # Broken chapter\n\n"
        "# %%\nraise RuntimeError('this cell fails on purpose')\n")
    result = subprocess.run([jupyter_book(), "build", str(tmp_path)],  # no -W: the setting alone must fail it
                            capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode != 0, "a notebook whose cell raises was built without error:\n" + output[-3000:]
    assert "broken.py" in output and "this cell fails on purpose" in output
