"""What the memory calculator page shows, computed in Python: Pyodide runs this module in the reader's browser.

The page sends the form's values as the browser holds them and draws what comes back. Every number, verdict
and message is made here, by the estimator (`workshop estimate`), the fit rule (`workshop_lib.estimate.fit`)
and the experiment rules of `workshop validate`; the page's script does no arithmetic of its own.
Standard library and the modules of ``bundle.PAGE_MODULES`` only: this is what the book ships.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Mapping

from workshop_lib.checks.experiment_rules import validate_experiment
from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.vocabulary import FSDP_STRATEGIES, GPT, HF, NEMO
from workshop_lib.estimate import GIB, OFFLOADS, PRECISIONS, TrainingSetup, estimate_memory
from workshop_lib.estimate.fit import MARGIN, FitVerdict
from workshop_lib.estimate.report import describe_setup
from workshop_lib.experiments import Experiment

MODELS = {"bloom-560m": "BLOOM-560m", "llama-3.1-8b": "Llama 3.1 8B", "mixtral-8x7b": "Mixtral 8x7B",
          "gpt": "custom GPT (chapter 4)"}
ENGINES = {"ddp": "PyTorch DDP (HF Trainer, no sharding)", "deepspeed": "DeepSpeed ZeRO", "fsdp": "FSDP",
           "megatron": "NeMo / Megatron (TP, PP, EP, SP)"}
# The cards the verdict names, with the GiB the site profiles give them (slurm/profiles/*.yml).
GPU_CARDS = (("A100-80GB", 80), ("H100-80GB", 80), ("H200", 140))
DEEPSPEED_OFFLOADS = {"none": "none", "optimizer": "optimizer states", "parameters": "optimizer states + parameters"}
# The estimator's components, in the order the bars stack them.
GPU_PARTS = (("parameters", "parameters"), ("gradients", "gradients"), ("optimizer_states", "optimizer states"),
             ("activations", "activations (layers)"), ("logits", "activations (logits)"),
             ("bucket_over_logits", "reduce bucket beyond the logits"), ("temporaries", "buffers / temporaries"))
HOST_PARTS = (("cpu_parameters", "parameters"), ("cpu_gradients", "gradients"),
              ("cpu_optimizer_states", "optimizer states"))


@dataclass(frozen=True)
class Field:
    """One input of the form. ``engines``: shown only for these methods (empty: always)."""

    name: str
    label: str
    kind: str  # choice | integer | flag
    default: object
    choices: tuple[tuple[str, str], ...] = ()
    engines: tuple[str, ...] = ()

    def applies_to(self, engine: str) -> bool:
        return not self.engines or engine in self.engines


FIELDS = (
    Field("model", "Model", "choice", "llama-3.1-8b", tuple(MODELS.items())),
    Field("gpus_per_node", "GPUs per node", "integer", 1),
    Field("nodes", "Nodes", "integer", 1),
    Field("engine", "Method", "choice", "ddp", tuple(ENGINES.items())),
    Field("zero_stage", "ZeRO stage", "choice", "2", tuple((str(stage), str(stage)) for stage in range(4)),
          ("deepspeed",)),
    Field("offload", "CPU offload", "choice", "none", tuple((key, DEEPSPEED_OFFLOADS[key]) for key in OFFLOADS),
          ("deepspeed",)),
    Field("fsdp", "FSDP strategy", "choice", "FULL_SHARD", tuple((name, name) for name in FSDP_STRATEGIES), ("fsdp",)),
    Field("fsdp_offload", "CPU offload (parameters, gradients, optimizer)", "flag", False, (), ("fsdp",)),
    Field("tensor_parallel", "Tensor parallel (TP)", "integer", 1, (), ("megatron",)),
    Field("pipeline_parallel", "Pipeline parallel (PP)", "integer", 1, (), ("megatron",)),
    Field("expert_parallel", "Expert parallel (EP)", "integer", 1, (), ("megatron",)),
    Field("sequence_parallel", "Sequence parallel (SP)", "flag", False, (), ("megatron",)),
    Field("micro_batches", "Micro-batches per step (PP: in flight)", "integer", 1, (), ("megatron",)),
    Field("distributed_optimizer", "Distributed optimizer", "flag", True, (), ("megatron",)),
    Field("lora_rank", "LoRA rank (0: full fine-tune)", "integer", 0),
    Field("batch", "Micro-batch per GPU", "integer", 1),
    Field("seq_len", "Sequence length", "integer", 2048),
    Field("precision", "Precision", "choice", "bf16", tuple((name, name) for name in PRECISIONS)),
    Field("recompute", "Activation recomputation", "flag", False),
)
FIELDS_BY_NAME = {field.name: field for field in FIELDS}


class CalculatorInputError(WorkshopError):
    """A form value the calculator cannot read (a number field left empty, a choice it does not offer)."""


def read_inputs(values: Mapping) -> dict:
    """Typed inputs from the form's values (defaults for what is missing); raises CalculatorInputError."""
    inputs = {}
    for field in FIELDS:
        value = values.get(field.name, field.default)
        if field.kind == "integer":
            try:
                inputs[field.name] = int(str(value).strip())
            except ValueError:
                raise CalculatorInputError(f"{field.label}: {str(value)!r} is not a whole number; type a number "
                                           f"such as {field.default}") from None
        elif field.kind == "flag":
            inputs[field.name] = value in (True, "true", "on", "1", 1)
        else:
            allowed = [choice for choice, _ in field.choices]
            if str(value) not in allowed:
                raise CalculatorInputError(f"{field.label}: {value!r} is not offered; choose one of {', '.join(allowed)}")
            inputs[field.name] = int(value) if field.name == "zero_stage" else str(value)
    return inputs


def setup_from_inputs(inputs: Mapping) -> TrainingSetup:
    """The estimator's TrainingSetup for the form: knobs of the other methods are left at their neutral value."""
    engine = inputs["engine"]
    megatron = engine == "megatron"
    offload = "none"
    if engine == "deepspeed":
        offload = inputs["offload"]
    elif engine == "fsdp" and inputs["fsdp_offload"]:
        offload = "parameters"  # FSDP's CPUOffload moves every state (setup_from_experiment says the same)
    return TrainingSetup(
        gpus=inputs["gpus_per_node"] * inputs["nodes"], nodes=inputs["nodes"], precision=inputs["precision"],
        zero_stage=inputs["zero_stage"] if engine == "deepspeed" else None,
        fsdp=inputs["fsdp"] if engine == "fsdp" else None, offload=offload, batch=inputs["batch"],
        seq_len=inputs["seq_len"], lora_rank=inputs["lora_rank"] or None,
        tensor_parallel=inputs["tensor_parallel"] if megatron else 1,
        expert_parallel=inputs["expert_parallel"] if megatron else 1,
        pipeline_parallel=inputs["pipeline_parallel"] if megatron else 1,
        sequence_parallel=inputs["sequence_parallel"] if megatron else False,
        micro_batches=inputs["micro_batches"] if megatron else 1,
        distributed_optimizer=inputs["distributed_optimizer"] if megatron else True,
        recompute=inputs["recompute"], engine=engine)


def inputs_from_setup(model: str, setup: TrainingSetup) -> dict:
    """The form's values for a model and setup (the inverse of ``setup_from_inputs`` on what the form holds)."""
    engine = setup.resolved_engine
    inputs = {field.name: field.default for field in FIELDS}
    inputs.update(model=model, gpus_per_node=setup.gpus_per_node, nodes=setup.nodes, engine=engine,
                  lora_rank=setup.lora_rank or 0, batch=setup.batch, seq_len=setup.seq_len,
                  precision=setup.precision, recompute=setup.recompute)
    inputs["zero_stage"] = int(inputs["zero_stage"])
    if engine == "deepspeed":
        inputs.update(zero_stage=setup.zero_stage, offload=setup.offload)
    if engine == "fsdp":
        inputs.update(fsdp=setup.fsdp, fsdp_offload=setup.offload != "none")
    if engine == "megatron":
        inputs.update(tensor_parallel=setup.tensor_parallel, pipeline_parallel=setup.pipeline_parallel,
                      expert_parallel=setup.expert_parallel, sequence_parallel=setup.sequence_parallel,
                      micro_batches=setup.micro_batches, distributed_optimizer=setup.distributed_optimizer)
    # Setups read from results tables may carry whole numbers as floats (4.0): the form holds integers.
    for field in FIELDS:
        if field.kind == "integer" or field.name == "zero_stage":
            inputs[field.name] = int(inputs[field.name])
    return inputs


def experiment_for_inputs(inputs: Mapping) -> Experiment:
    """The form as a workshop Experiment, so that `workshop validate`'s rules judge the layout."""
    engine = inputs["engine"]
    megatron = engine == "megatron"
    return Experiment(
        id="calculator", chapter=2 if megatron else 3, group="calculator", title="the calculator's layout",
        engine=NEMO if megatron else (GPT if inputs["model"] == "gpt" else HF), model=inputs["model"],
        nodes=inputs["nodes"], gpus_per_node=inputs["gpus_per_node"],
        peft="lora" if inputs["lora_rank"] else "none", lora_rank=inputs["lora_rank"] or None,
        tensor_parallel=inputs["tensor_parallel"] if megatron else 1,
        expert_parallel=inputs["expert_parallel"] if megatron else None,
        pipeline_parallel=inputs["pipeline_parallel"] if megatron else 1,
        sequence_parallel=inputs["sequence_parallel"] if megatron else False,
        zero_stage=inputs["zero_stage"] if engine == "deepspeed" else None,
        fsdp=inputs["fsdp"] if engine == "fsdp" else None,
        offload=(inputs["offload"] != "none") if engine == "deepspeed" else (engine == "fsdp" and inputs["fsdp_offload"]),
        per_device_batch=inputs["batch"], precision=inputs["precision"])


def cli_command(model: str, setup: TrainingSetup) -> str | None:
    """The `workshop estimate` command that prints the same estimate, or None where the CLI has no flag for
    the setup (NeMo without model parallelism, Megatron without its distributed optimizer)."""
    if replace(setup, engine="auto").resolved_engine != setup.resolved_engine or not setup.distributed_optimizer:
        return None
    words = ["workshop estimate", f"--model {model}", f"--gpus {setup.gpus}", f"--nodes {setup.nodes}"]
    words += [f"--zero {setup.zero_stage}"] if setup.zero_stage is not None else []
    words += [f"--fsdp {setup.fsdp}"] if setup.fsdp else []
    words += [f"--offload {setup.offload}"] if setup.offload != "none" else []
    words += [f"--precision {setup.precision}", f"--batch {setup.batch}", f"--seq-len {setup.seq_len}"]
    words += [f"--lora-rank {setup.lora_rank}"] if setup.lora_rank else []
    for flag, value in (("--tp", setup.tensor_parallel), ("--pp", setup.pipeline_parallel),
                        ("--ep", setup.expert_parallel), ("--micro-batches", setup.micro_batches)):
        words += [f"{flag} {value}"] if value != 1 else []
    words += ["--sp"] if setup.sequence_parallel else []
    words += ["--recompute"] if setup.recompute else []
    return " ".join(words)


def gib(value: float) -> str:
    """GiB as the page shows them."""
    return f"{value / GIB:,.2f}"


def _bars(estimate, scale: float) -> list[dict]:
    return [{"part": part, "label": label, "gib": gib(getattr(estimate, part)),
             "share": getattr(estimate, part) / scale if scale else 0.0}
            for part, label in GPU_PARTS if getattr(estimate, part) > 0]


def fit_verdicts(total_bytes: float) -> list[dict]:
    """One verdict per card, by the fit rule of `workshop validate` (the estimate under the card less MARGIN)."""
    verdicts = []
    for card, memory in GPU_CARDS:
        verdict = FitVerdict("this layout", total_bytes / GIB, memory, memory * (1 - MARGIN), "")
        verdicts.append({"card": card, "memory_gib": memory, "usable_gib": f"{verdict.usable_gib:.1f}",
                         "fits": verdict.fits,
                         "text": (f"fits: {verdict.predicted_gib:,.2f} of {verdict.usable_gib:.1f} GiB usable"
                                  if verdict.fits else
                                  f"does not fit: {verdict.predicted_gib:,.2f} GiB > {verdict.usable_gib:.1f} GiB usable")})
    return verdicts


def _problem(source: str, message: str, fix: str = "", rule: str = "", severity: str = "error") -> dict:
    return {"source": source, "rule": rule, "message": message, "fix": fix, "severity": severity}


class Calculator:
    """The page's one object: built once from the data file the book build wrote (measured runs, presets)."""

    def __init__(self, data: Mapping | str):
        data = json.loads(data) if isinstance(data, str) else data
        self.references: list[dict] = list(data.get("references", []))
        self.chapters: dict = dict(data.get("chapters", {}))

    def options(self) -> dict:
        """The form as data: fields, choices, defaults, which method shows which field, the chapters' presets."""
        return {"fields": [{"name": f.name, "label": f.label, "kind": f.kind, "default": f.default,
                            "choices": [list(choice) for choice in f.choices], "engines": list(f.engines)}
                           for f in FIELDS],
                "cards": [{"card": card, "memory_gib": memory} for card, memory in GPU_CARDS],
                "margin": MARGIN, "chapters": self.chapters}

    def calculate(self, values: Mapping) -> dict:
        """Everything the page shows for the form's values."""
        try:
            inputs = read_inputs(values)
        except CalculatorInputError as error:
            return {"ok": False, "problems": [_problem("the form", str(error))]}
        problems = [_problem("workshop validate", finding.message, finding.fix, finding.rule, finding.severity)
                    for finding in validate_experiment(experiment_for_inputs(inputs))]
        setup = setup_from_inputs(inputs)
        try:
            estimate = estimate_memory(inputs["model"], setup)
        except WorkshopError as error:  # the estimator's own check (check_setup): its message, no numbers
            rule = getattr(error, "rule", "")  # a seed pitfall (PitfallError): validate said it in the same words
            said = rule and any(problem["rule"] == rule for problem in problems)
            return {"ok": False, "problems": ([] if said else [_problem("workshop estimate", str(error), rule=rule)])
                    + problems, "inputs": inputs}
        return {"ok": True, "inputs": inputs, "problems": problems, "description": describe_setup(setup),
                "command": cli_command(inputs["model"], setup),
                "parameters": (f"{estimate.total_parameters:,} parameters, {estimate.trainable_parameters:,} "
                               f"trainable ({estimate.trainable_parameters / estimate.total_parameters:.2%})"),
                "gpu": self._gpu(estimate), "host": self._host(estimate), "fits": fit_verdicts(estimate.total),
                "formula": estimate.formula, "assumptions": list(estimate.assumptions),
                "reference": self.closest_reference(inputs, estimate.total)}

    @staticmethod
    def _gpu(estimate) -> dict:
        scale = max(estimate.total, max(memory for _, memory in GPU_CARDS) * GIB)
        by_memory: dict[int, list[str]] = {}
        for card, memory in GPU_CARDS:  # cards of the same size share one marker
            by_memory.setdefault(memory, []).append(card)
        return {"total_gib": gib(estimate.total), "parts": _bars(estimate, scale),
                "cards": [{"card": " / ".join(cards), "share": memory * (1 - MARGIN) * GIB / scale}
                          for memory, cards in by_memory.items()]}

    @staticmethod
    def _host(estimate) -> dict:
        processes = estimate.setup.gpus_per_node
        per_node = estimate.cpu_total * processes
        text = (f"{gib(estimate.cpu_total)} GiB per training process, {gib(per_node)} GiB per node "
                f"({processes} process{'es' if processes != 1 else ''})" if estimate.cpu_total else
                "nothing offloaded: the host holds only Python, the CUDA context and the data loader "
                "(a few GiB per process)")
        return {"per_process_gib": gib(estimate.cpu_total), "per_node_gib": gib(per_node), "processes": processes,
                "text": text,
                "parts": [{"part": part, "label": label, "gib": gib(getattr(estimate, part) * processes),
                           "share": getattr(estimate, part) / estimate.cpu_total}
                          for part, label in HOST_PARTS if getattr(estimate, part) > 0]}

    # ---- the closest measured run --------------------------------------------------------------------

    def closest_reference(self, inputs: Mapping, predicted_total: float) -> dict:
        """The measured run (book/reference) nearest to the form: same model, fewest and least important
        differences; ``exact`` when the form is that run's configuration."""
        candidates = [ref for ref in self.references if ref["inputs"]["model"] == inputs["model"]]
        if not candidates:
            return {"found": False, "text": f"no run of {MODELS[inputs['model']]} was measured on a real GPU yet"}
        scored = [(sum(weight for _, weight, _ in differences(inputs, ref["inputs"])), index, ref)
                  for index, ref in enumerate(candidates)]
        best_score, _, best = min(scored, key=lambda item: item[:2])
        others = [ref["label"] for score, _, ref in scored if score == best_score and ref is not best]
        shown = [text for _, _, text in differences(inputs, best["inputs"])]
        return {"found": True, "exact": not shown, "id": best["id"], "label": best["label"],
                "title": best["title"], "ran_with": best["ran_with"], "gpu": best["gpu"], "source": best["source"],
                "differences": shown, "also": others, "measured": self._measured(best),
                "predicted_for_run": self._predicted_for_run(best), "inputs": best["inputs"],
                "engine_error": self.engine_error(best.get("engine", ""))}

    def engine_error(self, engine: str) -> str:
        """How far the estimator was from every run measured with this engine: its error, in one line."""
        errors = []
        for reference in self.references:
            if reference.get("engine", "") != engine:
                continue
            predicted = self._predicted_for_run(reference)
            if predicted and predicted["error_fraction"] is not None:
                errors.append(predicted["error_fraction"])
        if not errors:
            return ""
        against = "nvidia-smi peak" if engine == "nemo" else "peak allocated"
        def percent(value: float) -> str:
            return f"{round(100 * value):+d} %".replace("+0 %", "0 %")

        spread = percent(errors[0]) if len(errors) == 1 else f"from {percent(min(errors))} to {percent(max(errors))}"
        runs = f"{len(errors)} run{'s' if len(errors) != 1 else ''}"
        return (f"The estimator's error on the {runs} measured with {ENGINE_FAMILIES.get(engine, engine)}: {spread} "
                f"of the {against}, each run estimated as it ran.")

    @staticmethod
    def _measured(reference: dict) -> list[dict]:
        rows = []
        for key, label in (("allocated_peak_mib", "peak allocated by PyTorch during the training steps (torch.cuda.max_memory_allocated), rank 0"),
                           ("nvidia_smi_peak_mib", "peak on GPU 0 by nvidia-smi (CUDA context and caches included)"),
                           ("model_states_mib", "model states at the second optimizer step, rank 0"),
                           ("host_peak_mib", "host memory of the training processes (psrecord)")):
            value = reference["measured"].get(key)
            if value is not None:
                rows.append({"what": key, "label": label, "gib": gib(value * 2**20)})
        return rows

    @staticmethod
    def _predicted_for_run(reference: dict) -> dict | None:
        """The estimate for the run as it ran (buffer sizes its engine chose included), beside its measured peak."""
        setup = dict(reference["setup"])
        if setup.get("lora_modules") is not None:
            setup["lora_modules"] = tuple(setup["lora_modules"])
        estimate = estimate_memory(reference["model"], TrainingSetup(**setup))
        # Against the allocator's peak where the run recorded one; NeMo records none, only nvidia-smi's.
        measured = reference["measured"].get("allocated_peak_mib")
        against = "the peak allocated"
        if not measured and reference.get("engine") == "nemo":
            measured, against = reference["measured"].get("nvidia_smi_peak_mib"), "the nvidia-smi peak"
        error = (estimate.total / 2**20 - measured) / measured if measured else None
        return {"gib": gib(estimate.total), "error": None if error is None else f"{error:+.1%} vs {against}",
                "error_fraction": error}

    # ---- for the page's script: JSON strings in and out (no Python objects cross into JavaScript) ----

    def options_json(self) -> str:
        return json.dumps(self.options())

    def calculate_json(self, values: str) -> str:
        return json.dumps(self.calculate(json.loads(values)))


# The engines the estimator's error is shown for (book/calculator/measured_runs.py groups the runs by them).
ENGINE_FAMILIES = {"nemo": "NeMo itself", "stand-in": "the PyTorch stand-in for NeMo",
                   "hf": "the Hugging Face Trainer alone", "hf-deepspeed": "the Hugging Face Trainer with DeepSpeed",
                   "hf-fsdp": "the Hugging Face Trainer with FSDP", "gpt": "the custom GPT"}


# How much each kind of difference moves a run away from the form (the method matters most, a batch least).
_WEIGHTS = {"engine": 16, "lora_rank": 1, "zero_stage": 6, "fsdp": 6, "offload": 4, "fsdp_offload": 4,
            "tensor_parallel": 4, "pipeline_parallel": 4, "expert_parallel": 4, "gpus_per_node": 3, "nodes": 2,
            "sequence_parallel": 1, "micro_batches": 1, "distributed_optimizer": 1, "batch": 1, "seq_len": 1,
            "precision": 1, "recompute": 1}


def differences(inputs: Mapping, other: Mapping) -> list[tuple[str, int, str]]:
    """(field, weight, sentence) for each input that differs from `other`'s, among those the form's method uses.
    LoRA on/off weighs like a method change; only the rank differing weighs 1."""
    found = []
    for field in FIELDS:
        name = field.name
        if name == "model" or not field.applies_to(inputs["engine"]) or inputs[name] == other[name]:
            continue
        if name != "engine" and not field.applies_to(other["engine"]):
            continue  # the method differs already; its own knobs say nothing more
        weight = _WEIGHTS[name]
        if name == "lora_rank" and bool(inputs[name]) != bool(other[name]):
            weight = _WEIGHTS["engine"]
        found.append((name, weight, f"{field.label}: {_shown(field, inputs[name])} here, "
                                    f"{_shown(field, other[name])} in the run"))
    return found


def _shown(field: Field, value) -> str:
    if field.kind == "flag":
        return "on" if value else "off"
    if field.name == "lora_rank" and not value:
        return "full fine-tune"
    return dict(field.choices).get(str(value), str(value)) if field.choices else str(value)


__all__ = ["Calculator", "CalculatorInputError", "FIELDS", "GPU_CARDS", "MODELS", "cli_command", "differences",
           "experiment_for_inputs", "fit_verdicts", "inputs_from_setup", "read_inputs", "setup_from_inputs"]
