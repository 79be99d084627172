"""The chapter pages' HTML: how a cell shows a block (IPython's display in a kernel, a print elsewhere, so
tests call the same functions), boxed notes, folded script and text blocks with the checker's verdict, a result
table with its provenance, and the note where a part has no reference measurement.

Imports only book.pages.cells (how a number is written) and, for type hints, the Finding and Table values.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Sequence

from workshop_lib.book.pages.cells import format_cell

if TYPE_CHECKING:
    from workshop_lib.book.tables import Table
    from workshop_lib.checks.findings import Finding


def display(obj) -> None:
    """IPython's display inside a kernel; a plain print of the text elsewhere (tests, scripts)."""
    try:
        from IPython import get_ipython
        from IPython.display import display as ipython_display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        ipython_display(obj)
    else:
        print(getattr(obj, "data", obj))


def as_html(text: str):
    """The text as IPython's HTML object (what `display` shows rendered in a kernel)."""
    from IPython.display import HTML

    return HTML(text)


def escape(text: str) -> str:
    return html.escape(str(text), quote=False)


def scrollable(table_html: str) -> str:
    """A wide table scrolls inside the page's text column instead of being cut off at its edge."""
    return f'<div class="workshop-scroll" style="overflow-x:auto;max-width:100%">{table_html}</div>'


def message(text: str, kind: str = "note") -> str:
    """A short boxed note (kind: note, warning, error) as HTML; returns the HTML."""
    colours = {"note": ("#e8f1fb", "#2b6cb0"), "warning": ("#fff7e0", "#b7791f"), "error": ("#fdecea", "#c53030")}
    background, border = colours.get(kind, colours["note"])
    block = (f'<div class="workshop-{kind}" style="background:{background};border-left:4px solid {border};'
             f'padding:0.5em 0.8em;margin:0.5em 0">{escape(text)}</div>')
    display(as_html(block))
    return block


def script_block(title: str, script: str, findings: Sequence[Finding] = (), open_: bool = False) -> str:
    """A folded <details> block with a job script and, under it, what the checker found."""
    summary = f"<summary><code>{escape(title)}</code>{_findings_badge(findings)}</summary>"
    body = f'<pre style="font-size:0.8em;overflow-x:auto">{escape(script)}</pre>'
    return f"<details{' open' if open_ else ''}>{summary}{body}{findings_html(findings)}</details>"


def _findings_badge(findings: Sequence[Finding]) -> str:
    errors = sum(finding.is_error for finding in findings)
    warnings = len(findings) - errors
    if not findings:
        return " &nbsp;✔ checks passed"
    return f" &nbsp;⚠ {errors} error(s), {warnings} warning(s)"


def findings_html(findings: Sequence[Finding], source: str = "") -> str:
    """The checker's findings as an HTML list (or one line saying there are none)."""
    if not findings:
        return "<p><em>Checker: no finding (experiment rules and script linter).</em></p>"
    items = "".join(f"<li><b>{finding.severity}</b> [{escape(finding.rule)}] {escape(finding.message)} "
                    f"<i>Fix:</i> {escape(finding.fix)}" + (f" (line {finding.line})" if finding.line else "")
                    + "</li>" for finding in findings)
    return f"<ul>{items}</ul>"


def text_block(title: str, text: str, open_: bool) -> str:
    """A folded block of plain text (a file, log lines): a script block without the checker's verdict."""
    return (f"<details{' open' if open_ else ''}><summary><code>{escape(title)}</code></summary>"
            f'<pre style="font-size:0.8em;overflow-x:auto">{escape(text)}</pre></details>')


def explanation_block(experiment_id: str, explanation: str) -> str:
    """An open block with why a run did not complete (no checker badge: it is not a script)."""
    return (f"<details open><summary><code>{escape(experiment_id)}</code>: why it did not complete</summary>"
            f'<pre style="font-size:0.8em;overflow-x:auto">{escape(explanation)}</pre></details>')


def reference_missing(text: str) -> str:
    block = f'<div class="workshop-reference-missing workshop-note">{escape(text)}</div>'
    display(as_html(block))
    return block


def table_html(table: Table, kind: str = "participant", caption: str = "", profile: str = "") -> str:
    """One table: a heading, whose measurement it is (``kind`` reference or participant, with ``caption``
    saying where it ran), the frame (numbers as numbers, empty cells blank) and its note."""
    frame = table.frame.map(format_cell)
    text = frame.to_html(index=False, border=0, na_rep="", classes="workshop-table")
    note = f"<p><small>{escape(table.note)}</small></p>" if table.note else ""
    provenance = f'<p class="workshop-provenance"><small>{escape(caption)}</small></p>' if caption else ""
    # Wide tables scroll inside the page's text column instead of running under the side bar.
    return (f'<div class="workshop-table-block workshop-{kind}" data-profile="{escape(profile)}">'
            f'<h4>{escape(table.title)}</h4>{provenance}{scrollable(text)}{note}</div>')
