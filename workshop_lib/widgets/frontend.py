"""Is there a live widget frontend? And showing HTML with a plain-text twin where there is none.

Widgets need a frontend that renders them and talks back to the kernel: JupyterLab (Open OnDemand),
Jupyter Notebook, VS Code. Papermill, Jupyter Book's execution and plain Python have none: a widget shown
there becomes a dead ``Loading widget...`` line in the executed notebook and the static page. So the
builder and the monitor ask ``live_widgets`` and otherwise show HTML tables (with a text twin for logs).
"""

from __future__ import annotations

import html
import os

from workshop_lib.jobs.states import (
    CANCELLED,
    COMPLETED,
    COMPLETING,
    CONFIGURING,
    FAILED,
    NODE_FAIL,
    OUT_OF_MEMORY,
    PENDING,
    RUNNING,
    TIMEOUT,
)

WIDGETS_VARIABLE = "WORKSHOP_WIDGETS"  # 1: always live widgets, 0: always the static fallback
_SERVER_VARIABLES = (
    "JPY_SESSION_NAME",  # jupyter_server sets it in every kernel it starts (JupyterLab, Notebook 7, OOD)
    "VSCODE_PID",  # VS Code's Jupyter extension renders widgets too
)


def in_kernel() -> bool:
    """True inside a Jupyter kernel (ipykernel), whoever started it."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and shell.__class__.__name__ == "ZMQInteractiveShell"


def live_widgets(interactive: bool | None = None) -> bool:
    """Whether to show live ipywidgets: ``interactive`` if given, else $WORKSHOP_WIDGETS, else detected.

    Detected: a kernel started by a Jupyter server (or VS Code) with ipywidgets importable. Kernels started
    by papermill / nbclient / Jupyter Book carry none of the server's variables, so they get the fallback.
    """
    if interactive is not None:
        return bool(interactive)
    chosen = os.environ.get(WIDGETS_VARIABLE, "").strip().lower()
    if chosen in ("1", "true", "yes", "on"):
        return True
    if chosen in ("0", "false", "no", "off"):
        return False
    if not in_kernel() or not any(os.environ.get(name) for name in _SERVER_VARIABLES):
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


class StaticView:
    """What the fallback displays: HTML for notebooks and pages, text for logs and terminals."""

    def __init__(self, html_text: str, plain_text: str):
        self.html = html_text
        self.text = plain_text

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self.text


def escape(text) -> str:
    return html.escape(str(text), quote=False)


def pre(text: str, max_height: str | None = None) -> str:
    """Preformatted text in a scrollable box."""
    height = f"max-height:{max_height};overflow:auto;" if max_height else "overflow-x:auto;"
    return (f'<pre style="{height}font-size:12px;line-height:1.35;margin:0;padding:6px 8px;white-space:pre-wrap;word-break:normal;overflow-wrap:break-word;'
            f'background:#f7f7f9;border:1px solid #e1e1e8;border-radius:3px">{escape(text)}</pre>')


def table(rows: list[dict], css_class: str) -> str:
    """A small HTML table from a list of dicts (the first row's keys are the columns); cells escaped,
    except values wrapped in ``Raw``."""
    if not rows:
        return ""
    columns = list(rows[0])
    head = "".join(f'<th style="text-align:left;padding:2px 8px">{escape(column)}</th>' for column in columns)
    body = "".join(
        "<tr>" + "".join(f'<td style="text-align:left;vertical-align:top;padding:2px 8px">'
                         f'{value.html if isinstance(value, Raw) else escape(value)}</td>'
                         for value in row.values()) + "</tr>"
        for row in rows)
    return (f'<table class="{css_class}" style="border-collapse:collapse;font-size:13px">'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


class Raw:
    """A table cell that is already HTML."""

    def __init__(self, html_text: str):
        self.html = html_text


STATE_COLOURS = {COMPLETED: "#2f855a", RUNNING: "#2b6cb0", PENDING: "#b7791f", CONFIGURING: "#b7791f",
                 COMPLETING: "#2b6cb0", FAILED: "#c53030", CANCELLED: "#c53030", TIMEOUT: "#c53030",
                 OUT_OF_MEMORY: "#c53030", NODE_FAIL: "#c53030"}


def state_badge(state: str) -> str:
    colour = STATE_COLOURS.get(state, "#4a5568")
    return (f'<span style="color:white;background:{colour};border-radius:3px;padding:0 5px;'
            f'font-size:12px;font-weight:600">{escape(state)}</span>')
