"""An experiment builder: pick a chapter's knobs, see the checker's verdict, the job script and the
memory estimate change as you go, then submit and watch the job.

    builder = ExperimentBuilder(chapter=3, profile="tiny")
    builder                                   # JupyterLab: the controls; papermill / book: HTML tables
    builder.set(gpus=2, zero_stage=3, offload=True)
    builder.experiment                        # an Experiment with id custom/ch3/...
    builder.validation_messages               # the validator's and the linter's findings, as text
    builder.script_text, builder.estimate     # the rendered script, the MemoryEstimate (None if invalid)
    run = builder.submit()                    # runs.submit_experiment into runs/custom/..., then monitored

The state is a plain dict of control values; the widgets are a view of it, made only when a live
frontend shows them, so the Python API works (and is tested) without a frontend.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from workshop_lib.book.chapter.your_runs import resolve_runs_dir, submitting_enabled
from workshop_lib.checks.experiment_rules import validate_experiment
from workshop_lib.checks.findings import Finding, ValidationError
from workshop_lib.checks.lint import lint_script
from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.vocabulary import GPT, HF, GptShape
from workshop_lib.estimate import estimate_memory, format_estimate, setup_from_experiment
from workshop_lib.experiments import (
    CHAPTERS,
    Experiment,
    chapter_experiments,
    chapter_spec,
    get_experiment,
)
from workshop_lib.runs import Run, submit_experiment
from workshop_lib.scripts import render_script
from workshop_lib.sites.profiles import Profile, available_profiles, default_profile_name, load_profile
from workshop_lib.widgets import frontend
from workshop_lib.widgets.form import (
    _BY_NAME,
    _CHECKBOXES,
    CONTROL_NAMES,
    CONTROLS,
    MODELS,
    OFF,
    SIZES,
    START_ROWS,
    _chapter,
    _decode,
    _encode,
    _estimate_model,
    _show,
    custom_id,
    custom_title,
)
from workshop_lib.widgets.monitor import JobMonitor

BUILDER_CLASS = "workshop-experiment-builder"


class ExperimentBuilder:
    """Build a custom Experiment from a chapter's knobs; validate, render, estimate and submit it."""

    def __init__(self, chapter: int = 3, start: str | None = None, profile: str | Profile | None = None,
                 runs_dir: Path | str | None = None, backend: str | None = None,
                 interactive: bool | None = None, **values):
        self.runs_dir = resolve_runs_dir(runs_dir)
        self.backend = backend
        self.interactive = frontend.live_widgets(interactive)
        self._profiles: dict[str, Profile] = {}
        profile_name = self._remember_profile(profile or default_profile_name())
        self.values: dict = {"profile": profile_name}
        self.findings: list[Finding] = []
        self.script_text = ""
        self.estimate = None
        self.estimate_text = ""
        self.run: Run | None = None
        self.submit_note = ""
        self.monitor = JobMonitor(runs_dir=self.runs_dir, log_lines=8, interactive=self.interactive)
        self._controls: dict = {}
        self._views: dict = {}
        self._widget = None
        self._syncing = False
        self._load_row(get_experiment(start) if start else get_experiment(START_ROWS[_chapter(chapter)]))
        if values:
            self.set(**values)
        else:
            self._update()

    # ---- the Python API ----------------------------------------------------------------------------
    def set(self, **changes) -> "ExperimentBuilder":
        """Change controls by name (``gpus`` = all GPUs of the job is accepted too); returns the builder.

        ``chapter`` and ``start`` reset every knob to a matrix row first, so they apply before the rest.
        """
        unknown = sorted(set(changes) - set(CONTROL_NAMES) - {"gpus"})
        if unknown:
            raise WorkshopError(f"unknown control(s) {', '.join(unknown)}: the builder has "
                                f"{', '.join(CONTROL_NAMES)} (and gpus = nodes x GPUs per node)")
        if "chapter" in changes and "start" not in changes:
            self._load_row(get_experiment(START_ROWS[_chapter(changes.pop("chapter"))]))
        elif "start" in changes:
            row = get_experiment(changes.pop("start"))
            if "chapter" in changes and _chapter(changes.pop("chapter")) != row.chapter:
                raise WorkshopError(f"{row.id} belongs to chapter {row.chapter}, not the chapter asked for")
            self._load_row(row)
        if "profile" in changes:
            self.values["profile"] = self._remember_profile(changes.pop("profile"))
        gpus = changes.pop("gpus", None)
        for name, value in changes.items():
            self._set_value(name, value)
        if gpus is not None:
            nodes = self.values["nodes"]
            if gpus % nodes:
                raise WorkshopError(f"gpus={gpus} cannot be spread evenly over {nodes} node(s): give a multiple "
                                    f"of {nodes}, or set nodes and gpus_per_node")
            self._set_value("gpus_per_node", gpus // nodes)
        self._update()
        return self

    @property
    def chapter(self) -> int:
        return self.values["chapter"]

    @property
    def profile(self) -> Profile:
        return self._profiles[self.values["profile"]]

    @property
    def experiment(self) -> Experiment:
        """The Experiment the controls describe: the start row with the controls' values, id custom/..."""
        values, row = self.values, get_experiment(self.values["start"])
        knobs = chapter_spec(self.chapter).knobs
        changes: dict = {"nodes": values["nodes"], "gpus_per_node": values["gpus_per_node"]}
        changes.update({knob: values[knob] for knob in knobs})
        # What follows from the knobs: LoRA's rank, FSDP's engine and bandwidth check, offload's CPU monitor.
        if "peft" in knobs:
            changes.update(lora_rank=(row.lora_rank or 32) if values["peft"] == "lora" else None)
        if "fsdp" in knobs:
            changes.update(nccl_check=values["nodes"] > 1, engine=GPT if values["model"] == "gpt" else HF,
                           gpt=(row.gpt or GptShape()) if values["model"] == "gpt" else None)
        if "offload" in knobs:
            changes.update(monitor_cpu_memory=row.monitor_cpu_memory or values["offload"])
        changes["model"] = values["model"]
        draft = replace(row, **changes)
        return replace(draft, id=custom_id(draft), group="custom", title=custom_title(draft))

    @property
    def errors(self) -> list[Finding]:
        return [finding for finding in self.findings if finding.is_error]

    @property
    def valid(self) -> bool:
        return not self.errors

    @property
    def validation_messages(self) -> list[str]:
        """Each finding of the experiment rules and the script linter, as the validator words it."""
        return [finding.format() for finding in self.findings]

    @property
    def can_submit(self) -> bool:
        return self.valid and submitting_enabled()

    def submit(self) -> Run:
        """Submit the experiment (``runs.submit_experiment``: a completed equal run is reused) and watch it."""
        experiment = self.experiment
        if self.errors:
            raise ValidationError(f"experiment {experiment.id}", self.errors)
        if not submitting_enabled():
            raise WorkshopError("submitting is off here ($WORKSHOP_SUBMIT=0): this builder only shows the script")
        self.run = submit_experiment(experiment, self.profile, root=self.runs_dir, backend=self.backend)
        self.submit_note = f"{experiment.id}: {self.run.note} (run folder {self.run.directory})"
        self.monitor.add(self.run)
        self.monitor.refresh()
        if self._widget is not None:
            self._render()
            self.select_tab("job")
            self.monitor.start()
        return self.run

    def select_tab(self, name: str) -> "ExperimentBuilder":
        """Show one tab of the live view: script, estimate or job."""
        tabs = ("script", "estimate", "job")
        if name not in tabs:
            raise WorkshopError(f"no tab {name!r}: choose one of {', '.join(tabs)}")
        if self._widget is not None:
            self._views["tabs"].selected_index = tabs.index(name)
        return self

    # ---- state -------------------------------------------------------------------------------------
    def _remember_profile(self, profile: str | Profile) -> str:
        loaded = load_profile(profile)
        self._profiles[loaded.name] = loaded
        return loaded.name

    def _load_row(self, row: Experiment) -> None:
        """Every control from a matrix row."""
        self.values.update(
            chapter=row.chapter, start=row.id, model=row.model, nodes=row.nodes, gpus_per_node=row.gpus_per_node,
            peft=row.peft, tensor_parallel=row.tensor_parallel, expert_parallel=row.expert_parallel,
            sequence_parallel=row.sequence_parallel, zero_stage=row.zero_stage, fsdp=row.fsdp,
            offload=row.offload, pin_memory=row.pin_memory, per_device_batch=row.per_device_batch or 1)

    def _set_value(self, name: str, value) -> None:
        control = _BY_NAME[name]
        if self.chapter not in control.chapters:
            where = ", ".join(f"{chapter} ({CHAPTERS[chapter]})" for chapter in control.chapters)
            raise WorkshopError(f"{name} does not apply to chapter {self.chapter} ({CHAPTERS[self.chapter]}); "
                                f"it is a knob of chapter {where}")
        value = None if value == OFF else value
        choices = self.choices(name)
        if choices is not None and value not in [choice for _, choice in choices]:
            allowed = ", ".join(str(choice) for _, choice in choices)
            raise WorkshopError(f"{name}={value!r} is not offered: choose one of {allowed}")
        if name == "per_device_batch" and (not isinstance(value, int) or value < 1):
            raise WorkshopError(f"per_device_batch={value!r}: give a whole number of sequences >= 1")
        self.values[name] = value

    def choices(self, name: str) -> list[tuple[str, object]] | None:
        """(label, value) pairs a control offers now; None for free values (the batch)."""
        if name == "chapter":
            return [(f"{number}. {title}", number) for number, title in CHAPTERS.items()]
        if name == "start":
            return [(row.id, row.id) for row in chapter_experiments(self.chapter)]
        if name == "model":
            return [(model, model) for model in MODELS[self.chapter]]
        if name in ("nodes", "gpus_per_node", "tensor_parallel"):
            return [(str(size), size) for size in SIZES]
        if name == "expert_parallel":
            return [(OFF, None)] + [(str(size), size) for size in SIZES]
        if name == "peft":
            return [("LoRA", "lora"), ("none (full fine-tune)", "none")]
        if name == "zero_stage":
            return [("off (no DeepSpeed)", None)] + [(f"stage {stage}", stage) for stage in (0, 1, 2, 3)]
        if name == "fsdp":
            return [("off (no FSDP)", None)] + [(strategy, strategy) for strategy in
                                               ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD")]
        if name in _CHECKBOXES:
            return [("off", False), ("on", True)]
        if name == "profile":
            names = sorted(set(available_profiles()) | set(self._profiles))
            return [(profile, profile) for profile in names]
        return None

    def _update(self) -> None:
        """Validate, render and estimate the current experiment; refresh the view if there is one."""
        experiment, profile = self.experiment, self.profile
        findings = validate_experiment(experiment, profile)
        self.script_text = ""
        if not any(finding.is_error for finding in findings):
            self.script_text = render_script(experiment, profile)
            findings += lint_script(self.script_text)
        self.findings = findings
        try:
            self.estimate = estimate_memory(_estimate_model(experiment), setup_from_experiment(experiment))
            self.estimate_text = format_estimate(self.estimate)
        except WorkshopError as error:  # the estimator refuses setups it cannot model: say why
            self.estimate = None
            self.estimate_text = f"No estimate for this setup: {error}"
        if self._widget is not None:
            self._render()

    # ---- HTML pieces (shared by the widget and the static fallback) -----------------------------------
    def findings_html(self) -> str:
        if not self.findings:
            return ('<div style="color:#2f855a;font-weight:600">✔ No finding: the experiment rules and the '
                    "script linter pass.</div>")
        items = []
        for finding in self.findings:
            colour = "#c53030" if finding.is_error else "#b7791f"
            where = f" (script line {finding.line})" if finding.line else ""
            items.append(f'<li style="margin-bottom:4px"><span style="color:{colour};font-weight:600">'
                         f"{finding.severity}</span> <code>{frontend.escape(finding.rule)}</code>{where}: "
                         f"{frontend.escape(finding.message)}<br><i>Fix:</i> {frontend.escape(finding.fix)}</li>")
        return f'<ul style="margin:0;padding-left:18px">{"".join(items)}</ul>'

    def summary_html(self) -> str:
        experiment = self.experiment
        verdict = ('<span style="color:#2f855a;font-weight:600">ready to submit</span>' if self.valid else
                   f'<span style="color:#c53030;font-weight:600">{len(self.errors)} error(s): fix before '
                   "submitting</span>")
        memory = ""
        if self.estimate is not None:
            memory = (f" · estimate for {experiment.model} on GPUs: model states "
                      f"{self.estimate.model_states / 2**30:.1f} GiB, <b>peak {self.estimate.total / 2**30:.1f} GiB "
                      "per GPU</b>")
        return (f"<div><code>{frontend.escape(experiment.id)}</code> · {experiment.gpus} GPU(s) on "
                f"{experiment.nodes} node(s) · profile {frontend.escape(self.profile.name)} · "
                f"hash {experiment.content_hash[:8]}{memory} · {verdict}</div>")

    def static_html(self) -> str:
        """The whole builder as static HTML: the controls' values and choices, findings, script, estimate."""
        rows = []
        for control in CONTROLS:
            applies = self.chapter in control.chapters
            choices = self.choices(control.name)
            offered = ", ".join(label for label, _ in choices) if choices else "a whole number >= 1"
            rows.append({"control": control.label, "set(...) name": control.name,
                         "value": _show(self.values[control.name]) if applies else "—",
                         "choices": offered if applies else f"chapter {', '.join(map(str, control.chapters))} only",
                         "what it does": control.help})
        script = frontend.pre(self.script_text, max_height="30em") if self.script_text else \
            "<p><em>No script: the errors above stop the rendering.</em></p>"
        return (f'<div class="{BUILDER_CLASS}-static"><p><b>Experiment builder</b> (static view: no live widget '
                "frontend here, e.g. papermill or the book). In JupyterLab the controls below are live; from code: "
                "<code>ExperimentBuilder(chapter=3).set(gpus=2, zero_stage=3)</code>.</p>"
                f"{self.summary_html()}{frontend.table(rows, BUILDER_CLASS + '-controls')}"
                f"<p><b>Checks</b></p>{self.findings_html()}"
                f"<details><summary><b>Job script</b></summary>{script}</details>"
                f"<details open><summary><b>Memory estimate</b> (the real model on GPUs)</summary>"
                f"{frontend.pre(self.estimate_text)}</details></div>")

    def text(self) -> str:
        experiment = self.experiment
        knobs = ", ".join(f"{name}={_show(self.values[name])}" for name in CONTROL_NAMES
                          if self.chapter in _BY_NAME[name].chapters)
        checks = "\n".join("  " + message for message in self.validation_messages) or "  no finding"
        headline = (f"estimate: model states {self.estimate.model_states / 2**30:.1f} GiB, peak "
                    f"{self.estimate.total / 2**30:.1f} GiB per GPU" if self.estimate is not None
                    else self.estimate_text)
        return f"Experiment builder: {experiment.id}\n  {knobs}\n  {headline}\nChecks:\n{checks}"

    def static_view(self) -> frontend.StaticView:
        return frontend.StaticView(self.static_html(), self.text())

    def __repr__(self) -> str:
        return self.text()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget if self.interactive else self.static_view())

    # ---- the live view -------------------------------------------------------------------------------
    @property
    def controls(self) -> dict:
        """The ipywidgets controls by name (made on first use). Changing one's value updates the builder."""
        if not self._controls:
            self._build_widget()
        return self._controls

    @property
    def submit_button(self):
        self.controls
        return self._views["submit"]

    @property
    def widget(self):
        """The whole builder as one ipywidgets box."""
        if self._widget is None:
            self._build_widget()
        return self._widget

    def _build_widget(self) -> None:
        import ipywidgets as widgets

        style = {"description_width": "110px"}
        layout = widgets.Layout(width="300px")
        for control in CONTROLS:
            if control.name in _CHECKBOXES:
                widget = widgets.Checkbox(description=control.label, indent=True, style=style, layout=layout)
            elif control.name == "per_device_batch":
                widget = widgets.BoundedIntText(description=control.label, min=1, max=512, style=style,
                                                layout=layout)
            else:
                widget = widgets.Dropdown(description=control.label, style=style, layout=layout)
            widget.tooltip = control.help
            widget.observe(self._on_control, names="value")
            self._controls[control.name] = widget
        submit = widgets.Button(description="Submit", icon="paper-plane", button_style="primary",
                                layout=widgets.Layout(width="300px"))
        submit.on_click(self._on_submit)
        views = self._views
        views["submit"] = submit
        views["submit_note"] = widgets.HTML(layout=widgets.Layout(width="300px"))
        views["summary"] = widgets.HTML()
        views["findings"] = widgets.HTML()
        views["script"] = widgets.HTML()
        views["estimate"] = widgets.HTML()
        tabs = widgets.Tab(children=[views["script"], views["estimate"], self.monitor.widget])
        for index, title in enumerate(("Job script", "Memory estimate", "Job")):
            tabs.set_title(index, title)
        views["tabs"] = tabs
        left = widgets.VBox([widgets.HTML("<b>Experiment builder</b>"), *self._controls.values(), submit,
                             views["submit_note"]], layout=widgets.Layout(min_width="310px"))
        right = widgets.VBox([views["summary"], widgets.HTML("<b>Checks</b>"), views["findings"], tabs],
                             layout=widgets.Layout(flex="1 1 auto", min_width="0", padding="0 0 0 12px"))
        self._widget = widgets.HBox([left, right], layout=widgets.Layout(width="100%"))
        self._widget.add_class(BUILDER_CLASS)
        self._render()

    def _render(self) -> None:
        """Push the state into the widgets (options, values, enabled) and the outputs into the views."""
        self._syncing = True
        try:
            for name, widget in self._controls.items():
                applies = self.chapter in _BY_NAME[name].chapters
                choices = self.choices(name)
                if choices is not None and name not in _CHECKBOXES:
                    encoded = [(label, _encode(value)) for label, value in choices]
                    if list(widget.options) != encoded:
                        widget.options = encoded
                widget.value = _encode(self.values[name]) if name not in _CHECKBOXES else bool(self.values[name])
                widget.disabled = not applies
        finally:
            self._syncing = False
        views = self._views
        views["summary"].value = self.summary_html()
        views["findings"].value = self.findings_html()
        views["script"].value = (frontend.pre(self.script_text, max_height="420px") if self.script_text else
                                 "<p><em>No script: the errors above stop the rendering.</em></p>")
        views["estimate"].value = frontend.pre(self.estimate_text, max_height="420px")
        views["submit"].disabled = not self.can_submit
        views["submit"].tooltip = ("submit through runs.submit_experiment" if self.can_submit else
                                   "fix the errors first" if not self.valid else "$WORKSHOP_SUBMIT=0: no submission")
        views["submit_note"].value = frontend.escape(self.submit_note) if self.submit_note else ""

    def _on_control(self, change) -> None:
        if self._syncing:
            return
        name = next(key for key, widget in self._controls.items() if widget is change.owner)
        try:
            self.set(**{name: _decode(change.new)})
        except WorkshopError as error:
            self.submit_note = str(error)
            self._render()

    def _on_submit(self, _button) -> None:
        self._views["submit"].disabled = True
        self.submit_note = "submitting..."
        self._views["submit_note"].value = self.submit_note
        try:
            self.submit()
        except WorkshopError as error:
            self.submit_note = f"not submitted: {error}"
            self._render()
