"""The interactive layer: an experiment builder and a job monitor (ipywidgets in JupyterLab).

Under papermill, in the static book and in plain Python both fall back to HTML tables and text:
``live_widgets`` decides (override with ``interactive=True/False`` or $WORKSHOP_WIDGETS=1/0).
ipywidgets is imported only when a live view is made, so nothing here needs it otherwise.
Owns: form (the builder's controls and how a form names its experiment, as data), builder (an experiment from
that form, checked as it is typed), monitor (a notebook's runs, fed by the jobs watcher), frontend (live or static), screenshot (a headless browser's picture of a widget, for the book's tests).
May import: every package below book, and book's html and your_runs helpers; never book.chapter.facade.
"""

from workshop_lib.widgets.builder import ExperimentBuilder
from workshop_lib.widgets.form import CONTROL_NAMES, CONTROLS, custom_id
from workshop_lib.widgets.frontend import WIDGETS_VARIABLE, live_widgets
from workshop_lib.widgets.monitor import JobMonitor, MonitorRow

__all__ = ["CONTROLS", "CONTROL_NAMES", "ExperimentBuilder", "JobMonitor", "MonitorRow", "WIDGETS_VARIABLE",
           "custom_id", "live_widgets"]
