"""Fine-tune the custom GPT (chapter 4's own model) with FSDP, DDP or on one process.

    torchrun --nproc_per_node=N -m workshop_lib.train.gpt --output-dir DIR --layers 3 --hidden 2048 \\
        --heads 16 --ffn 8192 --vocab 50000 --seq-len 512 [--fsdp FULL_SHARD [--offload]]

The model is :class:`workshop_lib.train.gpt_model.GPT`; it reads the locally trained tokenizer,
whose ids stay below 512, so any ``--vocab`` of at least 512 works (larger ones only add rows that
are never looked up, like the seed's 50 000-entry table).
"""

from __future__ import annotations

import sys

import torch

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.vocabulary import TINY_GPT
from workshop_lib.train.cli import add_sample_count_flags, common_parser, resolve_precision, sample_counts
from workshop_lib.train.common import answer_quality, prepare_data, print_header
from workshop_lib.train.data import LOCAL_TOKENIZER_VOCAB, local_tokenizer
from workshop_lib.train.flags import check_positive
from workshop_lib.train.gpt_model import GPT, GPTConfig
from workshop_lib.train.loop import LoopSettings, run_loop
from workshop_lib.train.metrics import MetricsWriter, summary_fields
from workshop_lib.train.models import count_parameters
from workshop_lib.train.runtime import Runtime, print_main, run_entry_point
from workshop_lib.train.sharding import STRATEGIES, local_parameter_count, wrap_fsdp


def parse_args(argv=None):
    parser = common_parser("workshop_lib.train.gpt", __doc__.splitlines()[0])
    parser.set_defaults(model="gpt")
    parser.add_argument("--layers", type=int, default=TINY_GPT.layers)
    parser.add_argument("--hidden", type=int, default=TINY_GPT.hidden)
    parser.add_argument("--heads", type=int, default=TINY_GPT.heads)
    parser.add_argument("--ffn", type=int, default=TINY_GPT.ffn)
    parser.add_argument("--vocab", type=int, default=LOCAL_TOKENIZER_VOCAB)
    parser.add_argument("--seq-len", type=int, default=TINY_GPT.seq_len)
    parser.add_argument("--per-device-batch", type=int, default=1)
    parser.add_argument("--grad-accum", type=int, default=4)
    add_sample_count_flags(parser)
    parser.add_argument("--eval-samples", type=int, default=100)
    parser.add_argument("--generation-samples", type=int, default=20)
    parser.add_argument("--fsdp", choices=STRATEGIES, help="FSDP strategy (default: DDP)")
    parser.add_argument("--offload", action="store_true")
    args = parser.parse_args(argv)
    args.samples_total, args.samples_per_gpu = sample_counts(args)
    check_positive(layers=args.layers, hidden=args.hidden, heads=args.heads, ffn=args.ffn,
                   per_device_batch=args.per_device_batch, grad_accum=args.grad_accum)
    if args.model != "gpt":
        raise WorkshopError(f"workshop_lib.train.gpt trains the custom GPT only (got --model {args.model}); "
                            "use workshop_lib.train.hf for Hugging Face models")
    if args.vocab < LOCAL_TOKENIZER_VOCAB:
        raise WorkshopError(f"--vocab {args.vocab} is smaller than the tokenizer's {LOCAL_TOKENIZER_VOCAB} ids")
    if args.seq_len < args.max_length:
        raise WorkshopError(f"--seq-len {args.seq_len} is shorter than --max-length {args.max_length}; "
                            "samples would not fit the position table")
    if args.offload and not args.fsdp:
        raise WorkshopError("--offload goes with --fsdp")
    return args


def wrap(model, args, runtime: Runtime):
    if args.fsdp:
        if args.offload and runtime.device_kind == "cpu":
            print_main(runtime, "== note: --offload is a no-op on a CPU (parameters already live in host memory)")
        return wrap_fsdp(model, args.fsdp, "Block", runtime.device, args.offload,
                         runtime.nodes, runtime.local_world_size), "fsdp"
    model = model.to(runtime.device)
    if runtime.world_size > 1:
        return torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[runtime.local_rank] if runtime.device_kind == "cuda" else None), "ddp"
    return model, "single"


def run(args, runtime: Runtime) -> dict:
    precision = resolve_precision(args.precision, runtime.device_kind)
    writer = MetricsWriter(args.output_dir, enabled=runtime.is_main)
    tokenizer = local_tokenizer(runtime)
    data = prepare_data(args.data, runtime, tokenizer, args.samples_total, args.eval_samples, args.generation_samples,
                        args.max_length, per_gpu=args.samples_per_gpu)
    config = GPTConfig(vocab=args.vocab, hidden=args.hidden, layers=args.layers, heads=args.heads,
                       ffn=args.ffn, seq_len=args.seq_len)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = GPT(config)
    trainable, total = count_parameters(model)
    wrapped, parallelism = wrap(model, args, runtime)
    local_params = local_parameter_count(wrapped)
    print_header(runtime, "gpt", "gpt", trainable, total, precision=precision, layers=args.layers,
                 hidden=args.hidden, heads=args.heads, ffn=args.ffn, vocab=args.vocab, seq_len=args.seq_len,
                 parallelism=parallelism + (f" {args.fsdp}" if args.fsdp else ""))
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    settings = LoopSettings(epochs=args.epochs, max_steps=args.max_steps, micro_batch=args.per_device_batch,
                            grad_accum=args.grad_accum, learning_rate=args.learning_rate,
                            weight_decay=args.weight_decay, warmup_steps=0, precision=precision,
                            seed=args.seed, data_rank=runtime.rank, data_world=runtime.world_size)
    clip = (wrapped.clip_grad_norm_ if args.fsdp
            else lambda norm: torch.nn.utils.clip_grad_norm_(wrapped.parameters(), norm))
    quality = None
    if data.generation_examples:
        quality = lambda: answer_quality(wrapped, model, tokenizer, data.generation_examples,  # noqa: E731
                                         runtime, precision, args.max_length)
    result = run_loop(wrapped, optimizer, data.train, data.validation, runtime, writer, settings,
                      clip=clip, answer_quality=quality)
    engine_settings = {"layers": args.layers, "hidden": args.hidden, "heads": args.heads, "ffn": args.ffn,
                       "vocab": args.vocab, "seq_len": args.seq_len, "parallelism": parallelism,
                       "fsdp": args.fsdp, "offload": args.offload,
                       "offload_applied": bool(args.offload and runtime.device_kind == "cuda"),
                       "per_device_batch": args.per_device_batch, "grad_accum": args.grad_accum,
                       "samples_per_gpu": args.samples_per_gpu, "samples_total": args.samples_total or None,
                       "max_length": args.max_length, "max_steps": args.max_steps}
    summary = summary_fields(runtime=runtime, engine="gpt", settings=engine_settings, model="gpt",
                             precision=precision, samples=len(data.train),
                             trainable_params=trainable, total_params=total, local_params=local_params,
                             **result.outcome())
    return writer.summary(**summary)


def main(argv=None) -> int:
    return run_entry_point(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
