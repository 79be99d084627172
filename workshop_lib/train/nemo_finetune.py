"""`nemo llm finetune` on a GPU machine that has NeMo but not the models (a workstation, the lent GPU).

    python -m workshop_lib.train.nemo_finetune --factory llama31_8b trainer.devices=1 ... --yes

It takes the words of the `nemo llm finetune` line a job script renders, hands them to NeMo-Run's own
parser (the CLI's ``RunContext.parse_fn``), prints NeMo's "Resolved Arguments" table as the CLI does, and
runs NeMo's ``llm.finetune`` in this process, as the CLI does without an executor. What differs from the
NeMo container on Ibex is printed at start-up, one `== nemo-local:` line each:

- base weights: Megatron's random initialisation instead of restoring ``nemo://<hub id>`` (nothing can
  come from a hub here); layers, LoRA adapters, optimizer, precision and step are the recipe's own;
- tokenizer: a byte-level BPE trained on the generated SQuAD, while the embedding and output layer keep
  the real model's vocabulary size (so the model has its real shape);
- SQuAD: generated records in NeMo's own prepared format under ``$NEMO_DATASETS_CACHE/squad``, so
  ``SquadDataModule`` finds them and skips its download (real prepared SQuAD there is used as it is);
- fusions that need Transformer Engine or Apex are switched off when neither is installed (kernel
  choices, not shapes: the container has both and runs faster).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from workshop_lib.train.flags import report_user_error

# The vocabulary of each factory's real model (its Hugging Face config.json): the tokenizer here is
# smaller, and Megatron sizes the embedding from this number when it is set.
REAL_VOCAB_SIZES = {"llama31_8b": 128256, "mixtral_8x7b": 32000}
# Megatron refuses these without Transformer Engine or Apex (or would look for their kernels).
FUSIONS_NEEDING_TE_OR_APEX = ("apply_rope_fusion", "gradient_accumulation_fusion", "masked_softmax_fusion",
                              "persist_layer_norm", "bias_activation_fusion", "bias_dropout_fusion",
                              "cross_entropy_loss_fusion", "moe_grouped_gemm")
TOKENIZER_VOCAB = 8192  # enough that most generated words are one or two tokens, as English is for Llama 3
GENERATED_MARKER = "GENERATED_BY_WORKSHOP"  # our files, never a real prepared SQuAD


class CommandError(ValueError):
    """The command line is not one `nemo llm finetune` would take."""


def split_command(argv: list[str]) -> tuple[str, list[str]]:
    """(factory, overrides) from `--factory NAME key=value ... [--yes]`."""
    factory, overrides = None, []
    words = iter(argv)
    for word in words:
        if word in ("--yes", "-y", "--no-confirm"):
            continue
        if word == "--factory":
            factory = next(words, None)
        elif word.startswith("--factory="):
            factory = word.split("=", 1)[1]
        elif word.startswith("-"):
            raise CommandError(f"option {word!r} is not supported here; give --factory NAME and key=value "
                               "overrides, as the job script's `nemo llm finetune` line does")
        elif "=" not in word:
            raise CommandError(f"{word!r} is not a key=value override")
        else:
            overrides.append(word)
    if not factory:
        raise CommandError("no --factory given (e.g. --factory llama31_8b)")
    return factory, overrides


def factory_base(factory: str) -> str:
    """`llama31_8b(peft_scheme=None)` -> `llama31_8b`."""
    return factory.split("(", 1)[0].strip()


def nemo_home() -> Path:
    home = Path(os.environ.setdefault("NEMO_HOME", str(Path.home() / ".cache" / "workshop" / "nemo-home")))
    os.environ.setdefault("NEMO_DATASETS_CACHE", str(home / "datasets"))
    return home


def prepare_squad(datasets_cache: Path) -> Path:
    """NeMo's prepared SQuAD files (training/validation/test.jsonl), generated when none are there."""
    from workshop_lib.train.synthetic import (
        SYNTHETIC_TRAIN_SIZE,
        SYNTHETIC_VALIDATION_SIZE,
        generate_split,
        write_atomically,
    )

    folder = datasets_cache / "squad"
    if (folder / "training.jsonl").exists():
        return folder
    # The record layout of SquadDataModule._preprocess_and_split_data (NeMo 2.4.1).
    for split, size, seed in (("training", SYNTHETIC_TRAIN_SIZE, 1234), ("validation", SYNTHETIC_VALIDATION_SIZE, 5678),
                              ("test", SYNTHETIC_VALIDATION_SIZE, 91011)):
        lines = []
        for example in generate_split(size, seed):
            record = {"input": f"Context: {example['context']} Question: {example['question']} Answer:",
                      "output": example["answers"]["text"][0]}
            if split == "test":
                record["original_answers"] = example["answers"]["text"]
            lines.append(json.dumps(record) + "\n")
        write_atomically(folder / f"{split}.jsonl", "".join(lines))
    write_atomically(folder / GENERATED_MARKER, "generated SQuAD-format records (workshop_lib.train.synthetic)\n")
    return folder


def prepare_tokenizer(home: Path, squad: Path) -> Path:
    """A Hugging Face tokenizer folder trained on the SQuAD records (once)."""
    folder = home / "workshop-local" / f"bpe-{TOKENIZER_VOCAB}"
    if (folder / "tokenizer.json").exists():
        return folder
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    records = [json.loads(line) for line in (squad / "training.jsonl").read_text().splitlines()]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator((r["input"] + " " + r["output"] for r in records), vocab_size=TOKENIZER_VOCAB,
                            min_frequency=2, special_tokens=["<s>", "</s>", "<pad>", "<unk>"], show_progress=False)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                        pad_token="<pad>", unk_token="<unk>")
    staging = folder.with_name(folder.name + f".tmp-{os.getpid()}")
    tokenizer.save_pretrained(staging)
    try:
        os.replace(staging, folder)  # whole or not at all; another process may have won the race
    except OSError:
        if not (folder / "tokenizer.json").exists():
            raise
    return folder


def mean_sample_tokens(squad: Path, tokenizer_dir: Path, limit: int = 2000) -> float:
    """Mean tokens of a training record (prompt + answer + EOS), before the batch is padded to a multiple of 16."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
    lines = (squad / "training.jsonl").read_text().splitlines()[:limit]
    lengths = [len(tokenizer(json.loads(line)["input"] + " " + json.loads(line)["output"])["input_ids"]) + 1
               for line in lines]
    return sum(lengths) / len(lengths)


def restore_numpy_aliases() -> list[str]:
    """Megatron-core 0.13.1 (NeMo 2.4.1's) calls `numpy.product`, which NumPy 2 removed, when it saves a
    checkpoint with data parallel > 1 (dist_checkpointing/exchange_utils.py). NeMo's requirements pin NumPy < 2;
    a machine whose other packages need NumPy 2 gets the alias back instead."""
    import numpy

    restored = []
    for old, new in (("product", "prod"), ("cumproduct", "cumprod"), ("alltrue", "all"), ("sometrue", "any")):
        if not hasattr(numpy, old):
            setattr(numpy, old, getattr(numpy, new))
            restored.append(f"numpy.{old} = numpy.{new}")
    return restored


def packed_tokens_per_pack(datasets_cache: Path) -> float | None:
    """Mean real tokens of one packed sequence, from the packed training file NeMo wrote (None if none)."""
    import numpy

    files = sorted((datasets_cache / "squad" / "packed").glob("*/training_*.npy"))
    if not files:
        return None
    packs = numpy.load(files[-1], allow_pickle=True)
    return sum(len(pack["input_ids"]) for pack in packs) / len(packs) if len(packs) else None


def transformer_engine_available() -> bool:
    try:
        import transformer_engine  # noqa: F401
    except Exception:
        return False
    return True


def localise(task, factory: str, tokenizer_dir: Path) -> list[str]:
    """Change what this machine cannot have; return one line per change."""
    import nemo_run as run
    from nemo.collections.common.tokenizers.huggingface.auto_tokenizer import AutoTokenizer

    notes = []
    resume = getattr(task, "resume", None)
    restore = getattr(resume, "restore_config", None) if resume is not None else None
    if restore is not None:
        notes.append(f"base weights: random initialisation (no restore from {getattr(restore, 'path', '?')})")
        resume.restore_config = None
    task.tokenizer = run.Config(AutoTokenizer, pretrained_model_name=str(tokenizer_dir))
    vocab = REAL_VOCAB_SIZES.get(factory_base(factory))
    if vocab is None:
        raise CommandError(f"no real vocabulary size known for factory {factory!r}; add it to REAL_VOCAB_SIZES")
    task.model.config.vocab_size = vocab
    notes.append(f"tokenizer: local byte-level BPE ({TOKENIZER_VOCAB} tokens) in {tokenizer_dir}; "
                 f"embedding and output layer keep the real vocabulary ({vocab})")
    if not transformer_engine_available():
        switched = []
        for name in FUSIONS_NEEDING_TE_OR_APEX:
            try:
                setattr(task.model.config, name, False)
                switched.append(name)
            except (AttributeError, TypeError):
                pass
        notes.append("Transformer Engine not installed: Megatron's local layer spec, fusions off (" +
                     ", ".join(switched) + ")")
        notes += _lora_without_transformer_engine()
        notes += _moe_and_sequence_parallel_without_transformer_engine(task)
        if getattr(task.data, "packed_sequence_specs", None) is not None:
            from workshop_lib.train.packed_attention import install_on_megatron_local_attention

            install_on_megatron_local_attention()
            notes.append("packed sequences: Megatron's local attention takes them through PyTorch's "
                         "scaled_dot_product_attention with a per-record causal mask (the container uses TE's kernel)")
    return notes


def _lora_without_transformer_engine() -> list[str]:
    # NeMo 2.4.1's LoRA assumes Transformer Engine. Without it, Megatron's TE module still imports (its
    # classes are mocks or None), so NeMo's `peft.utils.HAVE_TE` reads True and `isinstance(m, None)` raises;
    # and `LoRA.transform` asks `m.__class__ == te.Linear` of every matched layer, where the placeholder `te`
    # raises on any attribute. Tell both the truth: no TE, and a te.Linear that no layer is.
    import types

    from nemo.collections.llm.peft import lora, utils

    if getattr(lora, "HAVE_TE", True):
        return []
    utils.HAVE_TE = False
    lora.te = types.SimpleNamespace(Linear=type("TransformerEngineLinearNotInstalled", (), {}))
    return ["LoRA: NeMo's Transformer Engine checks answered 'not installed' (peft.utils.HAVE_TE, te.Linear)"]


def _moe_and_sequence_parallel_without_transformer_engine(task) -> list[str]:
    # Megatron-core 0.13.1 without TE: moe_utils names `te_general_gemm` (and the fused permutes) only when TE
    # imports, then asks `te_general_gemm is not None` in every MoE router step (NameError); and its local norm
    # (WrappedTorchNorm) refuses sequence parallelism, because it does not mark its weights for the all-reduce
    # across the tensor-parallel group that Apex's and TE's norms get. Define the names as absent, and build the
    # norm with that mark, as Apex's FusedLayerNorm does (finalize_model_grads then all-reduces its gradients).
    notes = []
    from megatron.core.transformer.moe import moe_utils

    missing = [name for name in ("te_general_gemm", "fused_permute", "fused_permute_with_probs",
                                 "fused_sort_chunks_by_index", "fused_sort_chunks_by_index_with_probs",
                                 "fused_unpermute") if not hasattr(moe_utils, name)]
    for name in missing:
        setattr(moe_utils, name, None)
    if missing:
        notes.append("MoE: megatron-core's TE-only names defined as absent (" + ", ".join(missing) + ")")
    if getattr(task.trainer.strategy, "sequence_parallel", False):
        from megatron.core.transformer import torch_norm

        original = torch_norm.WrappedTorchNorm.__new__

        def new(cls, config, hidden_size, eps=1e-5, *args, **kwargs):
            if not config.sequence_parallel:
                return original(cls, config, hidden_size, eps, *args, **kwargs)
            config.sequence_parallel = False  # only for the norm's own assertion; restored at once
            try:
                norm = original(cls, config, hidden_size, eps, *args, **kwargs)
            finally:
                config.sequence_parallel = True
            for parameter in norm.parameters():
                parameter.sequence_parallel = True
            return norm

        torch_norm.WrappedTorchNorm.__new__ = new
        notes.append("sequence parallel: Megatron's local norm built with its weights marked for the "
                     "tensor-parallel all-reduce, as Apex's FusedLayerNorm marks them (the container uses TE's)")
    return notes


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        factory, overrides = split_command(argv)
    except CommandError as error:
        return report_user_error(error)
    home = nemo_home()
    squad = prepare_squad(Path(os.environ["NEMO_DATASETS_CACHE"]))
    tokenizer_dir = prepare_tokenizer(home, squad)
    restored = restore_numpy_aliases()

    import nemo
    import nemo_run as run
    from nemo.collections import llm
    from nemo_run.cli.api import RunContext
    from nemo_run.run.task import dryrun_fn

    print(f"== nemo-local: NeMo {nemo.__version__}, factory {factory}, overrides {' '.join(overrides)}", flush=True)
    task = RunContext(name="finetune", factory=factory).parse_fn(llm.finetune, overrides)
    dryrun_fn(task)  # the "Resolved Arguments" table, as the CLI prints it before running
    notes = localise(task, factory, tokenizer_dir)
    if restored:
        notes.append("NumPy 2 without the aliases Megatron-core 0.13.1 calls: " + ", ".join(restored))
    for note in notes:
        print(f"== nemo-local: {note}", flush=True)
    record_tokens = mean_sample_tokens(squad, tokenizer_dir)
    print(f"== nemo-local: SQuAD records in {squad}"
          f"{' (generated)' if (squad / GENERATED_MARKER).exists() else ''}, "
          f"mean {record_tokens:.0f} tokens per record", flush=True)
    run.run(task, direct=True)
    if _rank() == 0:
        print_tokens_per_step(task, record_tokens)
    return 0


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


def print_tokens_per_step(task, record_tokens: float) -> None:
    """The real (unpadded) tokens one optimizer step trains on, for tokens/s: global batch x a record's mean
    tokens, or x a pack's mean real tokens when the records were packed (read from NeMo's packed file)."""
    global_batch = getattr(task.data, "global_batch_size", None)
    if not global_batch:
        return
    packed = getattr(task.data, "packed_sequence_specs", None) is not None
    per_sample = packed_tokens_per_pack(Path(os.environ["NEMO_DATASETS_CACHE"])) if packed else record_tokens
    if per_sample is None:
        print("== nemo-local: no packed training file found; tokens per step unknown", flush=True)
        return
    what = "pack" if packed else "record"
    print(f"== nemo-local: real tokens per optimizer step: {global_batch * per_sample:.0f} "
          f"({global_batch} x mean {per_sample:.1f} tokens per {what})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
