"""Per-GPU (and CPU) memory of fine-tuning a transformer: model states, activations, logits, temporaries.

Model states follow the ZeRO paper (Rajbhandari et al. 2020). With Ψ parameters, Adam, and N_d
data-parallel ranks sharing the states, mixed precision (DeepSpeed fp16/bf16) keeps per GPU

    2Ψ (16-bit parameters) + 2Ψ (16-bit gradients) + KΨ (optimizer states), K = 12
    (fp32 master parameters 4 + momentum 4 + variance 4 bytes)

    stage 0: 2Ψ + 2Ψ + 12Ψ            stage 2: 2Ψ + (2 + 12)Ψ/N_d
    stage 1: 2Ψ + 2Ψ + 12Ψ/N_d        stage 3: (2 + 2 + 12)Ψ/N_d

and pure fp32 training 4Ψ + 4Ψ + 8Ψ (no master copy), except that DeepSpeed ZeRO 1-3 builds its fp32
master partition even from fp32 weights (K = 12 whatever the precision). PyTorch autocast (HF Trainer --fp16/--bf16
without DeepSpeed, DDP, FSDP) keeps the parameters themselves in fp32: 4Ψ + 4Ψ + 8Ψ, plus 16-bit
working copies of the weights (counted as temporaries). FSDP shards like ZeRO: FULL_SHARD ≈ ZeRO-3,
SHARD_GRAD_OP ≈ ZeRO-2 (fp32 shards, 16-bit parameters gathered for the whole step), HYBRID_SHARD
shards over the GPUs of a node and replicates across nodes, NO_SHARD = DDP. NeMo/Megatron keeps bf16
parameters, fp32 main gradients (4 bytes) and a distributed optimizer (12Ψ sharded over data parallel).

DeepSpeed adds two things the paper does not count, both measured (``workshop_lib.train.tensor_census``):
ZeRO-3 keeps every parameter tensor of at most ``stage3_param_persistence_threshold`` elements (default
1e5) whole on every GPU next to its partition, and ZeRO 1-3 reduce gradients through a bucket of
``reduce_bucket_size`` elements (default 5e8: 1 GB in 16-bit, 2 GB in fp32) whatever the model's size.

Activations per layer follow Korthikanti et al. 2022 (s·b·h·(34 + 5·a·s/h) bytes in 16-bit with
dropout), built here tensor by tensor so that fp32, autocast (fp32 residual stream), fp32 softmax,
SDPA/flash attention, SwiGLU, RoPE, MoE, tensor/sequence parallel and recomputation each change the
right term. The logits term 12·s·b·V bytes (three fp32 s×b×V tensors alive when the backward pass
starts: the log-softmax output saved for backward, its gradient, and the gradient of the logits)
dominates BLOOM-560m, whose vocabulary has 250 880 entries.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from workshop_lib.core.errors import WorkshopError
from workshop_lib.estimate import pitfall_text
from workshop_lib.estimate.pitfall_text import PitfallError
from workshop_lib.estimate.shapes import (
    ModelShape,
    ParameterCounts,
    lora_trainable_count,
    model_shape,
    parameter_counts,
    parameter_tensors,
)

GIB = 1024**3
PRECISIONS = ("fp32", "fp16", "bf16")
FSDP_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
OFFLOADS = ("none", "optimizer", "parameters")
ENGINES = ("auto", "ddp", "deepspeed", "fsdp", "megatron")
DEEPSPEED_REDUCE_BUCKET = 500_000_000  # reduce_bucket_size, DeepSpeed's default (elements)
DEEPSPEED_PERSISTENCE_THRESHOLD = 100_000  # stage3_param_persistence_threshold, DeepSpeed's default (elements)


@dataclass(frozen=True)
class TrainingSetup:
    """How a model is trained: GPUs, sharding, offload, precision, batch, LoRA, model parallelism."""

    gpus: int = 1  # all GPUs of the job
    nodes: int = 1
    precision: str = "bf16"  # fp32 | fp16 | bf16 (16-bit: mixed precision)
    zero_stage: int | None = None  # DeepSpeed ZeRO stage 0-3; None: no DeepSpeed
    fsdp: str | None = None  # FULL_SHARD | SHARD_GRAD_OP | HYBRID_SHARD | NO_SHARD
    offload: str = "none"  # none | optimizer | parameters (parameters implies optimizer)
    batch: int = 4  # micro batch per GPU (sequences)
    seq_len: int = 512
    lora_rank: int | None = None
    lora_modules: tuple[str, ...] | None = None  # None: the attention projections
    tensor_parallel: int = 1
    expert_parallel: int = 1
    sequence_parallel: bool = False
    pipeline_parallel: int = 1  # Megatron: layers split into this many stages
    micro_batches: int = 1  # Megatron: micro-batches per step on each data-parallel rank (1F1B in flight)
    distributed_optimizer: bool = True  # Megatron: optimizer states sharded over the data-parallel ranks
    recompute: bool = False  # full activation checkpointing of every layer
    engine: str = "auto"  # auto: deepspeed with zero_stage, fsdp with fsdp, megatron with TP/EP > 1, else ddp
    reduce_bucket: int = DEEPSPEED_REDUCE_BUCKET  # DeepSpeed ZeRO's reduce_bucket_size (elements)
    persistence_threshold: int = DEEPSPEED_PERSISTENCE_THRESHOLD  # ZeRO-3: tensors this small stay whole
    ddp_buckets: bool | None = None  # DDP gradient buckets; None: with more than one GPU (the HF Trainer
    #                                  wraps even a single CPU process in DDP)

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes

    @property
    def mixed(self) -> bool:
        return self.precision != "fp32"

    @property
    def element_bytes(self) -> int:
        """Bytes of a 16-bit or fp32 activation / working weight."""
        return 4 if self.precision == "fp32" else 2

    @property
    def resolved_engine(self) -> str:
        if self.engine != "auto":
            return self.engine
        if self.zero_stage is not None:
            return "deepspeed"
        if self.fsdp is not None:
            return "fsdp"
        if self.tensor_parallel > 1 or self.expert_parallel > 1 or self.pipeline_parallel > 1:
            return "megatron"
        return "ddp"

    @property
    def model_parallel(self) -> int:
        """GPUs that hold one copy of the dense layers (TP x PP)."""
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def data_parallel(self) -> int:
        """Megatron's data-parallel size for attention, embeddings and norms: GPUs / (TP x PP)."""
        return max(self.gpus // self.model_parallel, 1)

    @property
    def expert_data_parallel(self) -> int:
        """Megatron carves the experts out of the data-parallel ranks: GPUs / (expert TP x EP x PP),
        expert TP being the dense TP size (NeMo's default)."""
        return max(self.gpus // (self.model_parallel * self.expert_parallel), 1)

    @property
    def has_ddp_buckets(self) -> bool:
        return self.gpus > 1 if self.ddp_buckets is None else self.ddp_buckets

    @property
    def shard_degree(self) -> int:
        """How many GPUs share one copy of the sharded states (N_d of the ZeRO paper)."""
        if self.fsdp == "HYBRID_SHARD":
            return self.gpus_per_node
        if self.fsdp == "NO_SHARD":
            return 1
        return self.data_parallel if self.resolved_engine == "megatron" else self.gpus


@dataclass(frozen=True)
class ModelStates:
    """Bytes of parameters, gradients and optimizer states on one GPU and in one process's CPU memory."""

    parameters: float = 0.0
    gradients: float = 0.0
    optimizer_states: float = 0.0
    cpu_parameters: float = 0.0
    cpu_gradients: float = 0.0
    cpu_optimizer_states: float = 0.0

    def __add__(self, other: "ModelStates") -> "ModelStates":
        return ModelStates(*(a + b for a, b in zip(asdict(self).values(), asdict(other).values())))

    @property
    def gpu_total(self) -> float:
        return self.parameters + self.gradients + self.optimizer_states

    @property
    def cpu_total(self) -> float:
        return self.cpu_parameters + self.cpu_gradients + self.cpu_optimizer_states


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter: stored parameter, gradient, optimizer states (Adam)."""

    parameter: int
    gradient: int
    optimizer: int


def state_bytes(setup: TrainingSetup) -> StateBytes:
    """Bytes per trainable parameter of each model state for the engine and precision (see module docstring)."""
    engine = setup.resolved_engine
    if not setup.mixed:  # ZeRO 1-3 still clone an fp32 master partition of fp32 weights
        return StateBytes(4, 4, 12 if engine == "deepspeed" and setup.zero_stage else 8)
    if engine == "deepspeed":
        return StateBytes(2, 2, 12)
    if engine == "megatron":
        return StateBytes(2, 4, 12)
    return StateBytes(4, 4, 8)  # autocast keeps fp32 parameters and gradients (DDP, FSDP)


def model_state_bytes(n_params: float, setup: TrainingSetup, trainable: float | None = None,
                      shard: int | None = None) -> ModelStates:
    """Model-state bytes per GPU (and CPU per process) for n_params parameters of which `trainable` train.

    Frozen parameters (LoRA's base) are stored in 16-bit under mixed precision and carry no gradient or
    optimizer state. `shard` overrides the number of GPUs sharing the states (default setup.shard_degree).
    """
    check_setup(setup)
    trainable = n_params if trainable is None else trainable
    frozen = n_params - trainable
    n = shard or setup.shard_degree
    per = state_bytes(setup)
    engine = setup.resolved_engine
    params = per.parameter * trainable + setup.element_bytes * frozen
    grads = per.gradient * trainable
    optim = per.optimizer * trainable
    # Which states are divided by n.
    if engine == "deepspeed":
        stage = setup.zero_stage
        params_div, grads_div, optim_div = (n if stage >= 3 else 1), (n if stage >= 2 else 1), (n if stage >= 1 else 1)
    elif engine == "fsdp":
        params_div = grads_div = optim_div = n
    elif engine == "megatron":
        params_div, grads_div, optim_div = 1, 1, (n if setup.distributed_optimizer else 1)
    else:
        params_div = grads_div = optim_div = 1
    gpu = ModelStates(params / params_div, grads / grads_div, optim / optim_div)
    return _apply_offload(gpu, setup, trainable, n)


def _apply_offload(gpu: ModelStates, setup: TrainingSetup, trainable: float, n: int) -> ModelStates:
    """Move states to CPU: ZeRO-Offload moves optimizer states (with the fp32 master) and an fp32 gradient
    partition; parameter offload (stage 3) also the 16-bit parameters; FSDP CPU offload moves all states."""
    if setup.offload == "none":
        return gpu
    if setup.resolved_engine == "fsdp":
        return ModelStates(cpu_parameters=gpu.parameters, cpu_gradients=gpu.gradients,
                           cpu_optimizer_states=gpu.optimizer_states)
    # DeepSpeed: gradients stream to an fp32 CPU partition; stage 1 still keeps its full 16-bit gradients.
    gpu_grads = gpu.gradients if setup.zero_stage == 1 else 0.0
    moved = ModelStates(parameters=gpu.parameters, gradients=gpu_grads,
                        cpu_gradients=4 * trainable / n, cpu_optimizer_states=gpu.optimizer_states)
    if setup.offload == "parameters":
        moved = replace(moved, parameters=0.0, cpu_parameters=gpu.parameters)
    return moved


def check_setup(setup: TrainingSetup, shape: ModelShape | None = None) -> None:
    """Raise WorkshopError for a setup that cannot run (the message says which knob and how to fix it)."""
    def fail(message: str) -> None:
        raise WorkshopError(message)

    if setup.precision not in PRECISIONS:
        fail(f"precision {setup.precision!r} is unknown; use one of {', '.join(PRECISIONS)}")
    if setup.engine not in ENGINES:
        fail(f"engine {setup.engine!r} is unknown; use one of {', '.join(ENGINES)}")
    for name in ("gpus", "nodes", "batch", "seq_len", "tensor_parallel", "expert_parallel", "pipeline_parallel",
                 "micro_batches"):
        if getattr(setup, name) < 1:
            fail(f"{name}={getattr(setup, name)} must be at least 1")
    if setup.gpus % setup.nodes:
        fail(f"{setup.gpus} GPUs do not split evenly over {setup.nodes} nodes; use a multiple of the node count")
    if setup.zero_stage is not None and setup.zero_stage not in (0, 1, 2, 3):
        fail(f"ZeRO stage {setup.zero_stage} does not exist; use 0, 1, 2 or 3")
    if setup.zero_stage is not None and setup.fsdp is not None:
        fail("ZeRO and FSDP both set; pick one (DeepSpeed --zero N or --fsdp STRATEGY)")
    if setup.fsdp is not None and setup.fsdp not in FSDP_STRATEGIES:
        fail(f"FSDP strategy {setup.fsdp!r} is unknown; use one of {', '.join(FSDP_STRATEGIES)}")
    if setup.fsdp == "HYBRID_SHARD" and setup.nodes < 2:
        raise PitfallError(pitfall_text.hybrid_shard_single_node())  # the checks' words: one message per pitfall
    _check_offload(setup, fail)
    _check_model_parallel(setup, shape, fail)
    if setup.lora_rank is not None and setup.lora_rank < 1:
        fail(f"LoRA rank {setup.lora_rank} must be a positive integer (the seeds use 32)")


def _check_offload(setup: TrainingSetup, fail) -> None:
    if setup.offload not in OFFLOADS:
        fail(f"offload {setup.offload!r} is unknown; use one of {', '.join(OFFLOADS)}")
    if setup.offload == "none":
        return
    if setup.fsdp is None and setup.zero_stage == 0:
        raise PitfallError(pitfall_text.offload_with_zero0())
    if setup.fsdp is None and not setup.zero_stage:
        fail(f"offload {setup.offload} needs ZeRO stage 1 or more (or FSDP); ZeRO stage 0 and plain DDP "
             "keep every state on the GPU: add --zero 2 (optimizer) or --zero 3 (parameters)")
    if setup.offload == "parameters" and setup.zero_stage is not None and setup.zero_stage != 3:
        fail(f"parameter offload needs ZeRO stage 3 (got {setup.zero_stage}); use --zero 3 or --offload optimizer")
    if setup.fsdp == "NO_SHARD":
        fail("FSDP CPU offload with NO_SHARD is not supported by PyTorch; use FULL_SHARD")


def _check_model_parallel(setup: TrainingSetup, shape: ModelShape | None, fail) -> None:
    tp, ep, pp = setup.tensor_parallel, setup.expert_parallel, setup.pipeline_parallel
    if tp * ep * pp == 1:
        return
    if setup.zero_stage is not None or setup.fsdp is not None:
        fail("tensor/expert/pipeline parallel is estimated for NeMo/Megatron only; drop --zero/--fsdp or use "
             "--tp 1 --ep 1 --pp 1")
    mismatch = pitfall_text.parallel_sizes_mismatch(tp, ep, pp, 1, setup.gpus // setup.nodes, setup.nodes)
    if mismatch is not None:
        raise PitfallError(mismatch)
    if shape is None:
        return
    if shape.num_layers % pp:
        fail(f"PP={pp} does not divide {shape.name}'s {shape.num_layers} layers; use a divisor")
    if shape.num_heads % tp or shape.num_kv_heads % tp:
        fail(f"TP={tp} does not divide {shape.name}'s {shape.num_heads} attention heads / "
             f"{shape.num_kv_heads} KV heads; use a divisor")
    if ep > 1 and not shape.is_moe:
        fail(f"EP={ep} needs a mixture-of-experts model; {shape.name} is dense: use --ep 1")
    if ep > 1 and shape.num_experts % ep:
        fail(f"EP={ep} does not divide {shape.name}'s {shape.num_experts} experts; use a divisor")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU by component, CPU bytes per training process, and what the numbers assume."""

    model: str
    setup: TrainingSetup
    total_parameters: int
    trainable_parameters: int
    parameters: float
    gradients: float
    optimizer_states: float
    activations: float  # layers (and the few tensors outside them), without the logits
    logits: float
    temporaries: float  # working 16-bit weights, gathered shards, DDP buckets, ZeRO-3's reduce bucket
    cpu_parameters: float = 0.0
    cpu_gradients: float = 0.0
    cpu_optimizer_states: float = 0.0
    reduce_bucket: float = 0.0  # ZeRO-1/2: allocated at the first gradient, after the logits are freed
    formula: str = ""
    assumptions: tuple[str, ...] = field(default_factory=tuple)

    @property
    def model_states(self) -> float:
        return self.parameters + self.gradients + self.optimizer_states

    @property
    def bucket_over_logits(self) -> float:
        """What ZeRO-1/2's reduce bucket adds to the peak: it replaces the logits' gradients, freed by the
        time the first parameter gradient (and with it the bucket) exists, so only its excess counts."""
        return max(0.0, self.reduce_bucket - self.logits)

    @property
    def total(self) -> float:
        """Peak bytes allocated per GPU (what torch.cuda.max_memory_allocated reports)."""
        return self.model_states + self.activations + self.logits + self.bucket_over_logits + self.temporaries

    @property
    def cpu_total(self) -> float:
        """CPU bytes of offloaded states per training process (one per GPU)."""
        return self.cpu_parameters + self.cpu_gradients + self.cpu_optimizer_states

    @property
    def cpu_per_node(self) -> float:
        return self.cpu_total * self.setup.gpus_per_node

    def rows(self) -> list[tuple[str, float, float]]:
        """(component, GiB per GPU, GiB CPU per process) for tables."""
        return [
            ("parameters", self.parameters / GIB, self.cpu_parameters / GIB),
            ("gradients", self.gradients / GIB, self.cpu_gradients / GIB),
            ("optimizer states", self.optimizer_states / GIB, self.cpu_optimizer_states / GIB),
            ("activations (layers)", self.activations / GIB, 0.0),
            ("activations (logits)", self.logits / GIB, 0.0),
            ("reduce bucket > logits", self.bucket_over_logits / GIB, 0.0),
            ("buffers / temporaries", self.temporaries / GIB, 0.0),
            ("total", self.total / GIB, self.cpu_total / GIB),
        ]

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(model_states=self.model_states, total=self.total, cpu_total=self.cpu_total,
                    bucket_over_logits=self.bucket_over_logits,
                    cpu_per_node=self.cpu_per_node, gib={name: [gpu, cpu] for name, gpu, cpu in self.rows()})
        return data


# ---------------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------------

def _residual_bytes(setup: TrainingSetup) -> int:
    """Autocast over fp32 weights (DDP engine, full fine-tuning) keeps the residual stream and norm inputs
    in fp32; a 16-bit model (DeepSpeed, FSDP mixed precision, Megatron, LoRA's 16-bit base) does not."""
    full_fp32_weights = setup.resolved_engine == "ddp" and setup.lora_rank is None
    return 4 if full_fp32_weights else setup.element_bytes


def layer_activation_bytes(model: ModelShape | str, setup: TrainingSetup) -> float:
    """Bytes one transformer layer saves for backward (per GPU), Korthikanti-style, tensor by tensor.

    With e the 16-bit/fp32 element size, r the residual-stream element size, sbh = s·b·h:
    norms 2·r·sbh (LayerNorm) or 2·(4 + r)·sbh (HF RMSNorm's fp32 copies); attention e·sbh (QKV input)
    + e·sbh·(1 + 2·kv/a) (Q, K, V) + e·sbh (output-projection input) [+ 2·e·sbh·(1 + kv/a) RoPE]
    [+ e·sbh SDPA output] [eager: (4 + e)·a·s²·b, fp32 softmax and its 16-bit copy]; MLP e·sbh +
    2·e·sbf (two matrices) or 4·e·sbf (SwiGLU), times experts_per_token for MoE; dropout adds
    1-byte masks (2·sbh + a·s²·b) and e·a·s²·b. Tensor parallel t divides all but the norms and the
    sbh masks and the two column-parallel inputs (Korthikanti's sbh·(10 + 24/t) split); sequence parallel
    divides those too. For BLOOM (16-bit, dropout on) this is Korthikanti's 34·sbh + 5·a·s²·b plus
    4·a·s²·b for the fp32 softmax it keeps.
    """
    shape = model_shape(model)
    s, b, h, f, a = setup.seq_len, setup.batch, shape.hidden_size, shape.intermediate_size, shape.num_heads
    e, r, t = setup.element_bytes, _residual_bytes(setup), setup.tensor_parallel
    sbh, kv = s * b * h, shape.num_kv_heads / shape.num_heads
    # Norm inputs and the inputs of the column-parallel QKV and MLP matmuls are whole on every TP rank.
    replicated = 2 * (r if shape.layer_norm else 4 + r) * sbh + 2 * e * sbh
    split = e * sbh * ((1 + 2 * kv) + 1)  # Q/K/V, output-projection input
    if shape.family in ("llama", "mixtral"):
        split += 2 * e * sbh * (1 + kv)  # RoPE saves q, k and their rotated halves
    if shape.eager_attention:
        split += (4 + (e if e != 4 else 0)) * a * s * s * b
    else:
        split += e * sbh  # SDPA/flash keeps its output (and an O(s) log-sum-exp)
    mlp = (4 if shape.gated_mlp else 2) * e * s * b * f
    if shape.is_moe:  # each token's hidden state is gathered into k experts; fp32 router logits and probabilities
        mlp = shape.experts_per_token * (e * sbh + mlp) + 2 * 4 * s * b * shape.num_experts
    split += mlp
    if shape.dropout:
        replicated += 2 * sbh
        split += (1 + e) * a * s * s * b
    if setup.sequence_parallel:
        return (replicated + split) / t
    return replicated + split / t


def activation_bytes(model: ModelShape | str, setup: TrainingSetup) -> float:
    """All layers' saved activations per GPU, plus the final norm's input and the LM head's input.

    With recomputation each layer keeps only its input (r·sbh) and one layer is rebuilt at a time.
    """
    shape = model_shape(model)
    sbh = setup.seq_len * setup.batch * shape.hidden_size
    r, e = _residual_bytes(setup), setup.element_bytes
    per_layer = layer_activation_bytes(shape, setup)
    outside = r * sbh + e * sbh  # final norm input, LM head input
    if setup.recompute:
        return shape.num_layers * r * sbh + per_layer + outside
    return shape.num_layers * per_layer + outside


def logits_bytes(model: ModelShape | str, setup: TrainingSetup) -> float:
    """12·s·b·V bytes (/TP): the fp32 log-softmax output saved for backward, its gradient and the
    gradient of the logits, alive together when backward starts. The forward peak is lower:
    e·sbV (logits) + 4·sbV (fp32 upcast) + 4·sbV (log-softmax output)."""
    shape = model_shape(model)
    sbv = setup.seq_len * setup.batch * shape.vocab_size
    forward = setup.element_bytes * sbv + (4 * sbv if setup.mixed else 0) + 4 * sbv
    backward = 12 * sbv
    return max(forward, backward) / setup.tensor_parallel


# ---------------------------------------------------------------------------------------------
# Temporaries and the whole estimate
# ---------------------------------------------------------------------------------------------

def _matmul_weights(counts: ParameterCounts, shape: ModelShape) -> int:
    """Weights that enter a matmul (autocast casts these; the embedding lookup and norms stay fp32)."""
    return counts.attention + counts.mlp + counts.experts + counts.router + shape.vocab_size * shape.hidden_size


def temporaries_bytes(model: ModelShape | str, setup: TrainingSetup, trainable: float) -> float:
    """Working weights and communication buffers alive at the activation peak.

    DDP: autocast's 16-bit copies of the matmul weights (held by the autograd graph) and, with more than
    one GPU, gradient buckets as large as the gradients (gradient_as_bucket_view off, the default).
    ZeRO-3: two gathered units (the one in use and the prefetched one) and its reduce bucket, allocated
    once. FSDP: the root unit (embeddings, LM head) plus two layers gathered (FULL/HYBRID), or every
    parameter gathered (SHARD_GRAD_OP, NO_SHARD). Megatron and ZeRO 0-2: none (ZeRO-1/2's bucket is
    `MemoryEstimate.reduce_bucket`).
    """
    shape = model_shape(model)
    counts = parameter_counts(shape)
    engine, e = setup.resolved_engine, setup.element_bytes
    layer = (counts.attention + counts.mlp + counts.experts + counts.router) / shape.num_layers
    if engine == "ddp":
        copies = e * _matmul_weights(counts, shape) if setup.mixed and setup.lora_rank is None else 0.0
        buckets = state_bytes(setup).gradient * trainable if setup.has_ddp_buckets else 0.0
        return copies + buckets
    if engine == "deepspeed" and setup.zero_stage == 3:
        return 2 * e * max(layer, counts.embedding) + reduce_bucket_bytes(setup)
    if engine == "fsdp":
        if setup.fsdp in ("SHARD_GRAD_OP", "NO_SHARD"):
            return e * counts.total
        root = counts.embedding + counts.lm_head + counts.norms
        return e * (root + 2 * layer)
    return 0.0


def reduce_bucket_bytes(setup: TrainingSetup) -> float:
    """DeepSpeed ZeRO 1-3 reduce gradients through a bucket of reduce_bucket_size elements of the 16-bit
    (fp32) type, however small the model; plain DeepSpeed (stage 0) has none."""
    if setup.resolved_engine != "deepspeed" or not setup.zero_stage:
        return 0.0
    return float(setup.reduce_bucket * setup.element_bytes)


def persistent_parameters(shape: ModelShape, setup: TrainingSetup) -> int:
    """ZeRO-3 keeps tensors of at most stage3_param_persistence_threshold elements whole on every GPU (norms
    and biases of a large model; every tensor of a tiny one), besides their share of the partition."""
    if setup.resolved_engine != "deepspeed" or setup.zero_stage != 3:
        return 0
    return sum(n for n in parameter_tensors(shape) if n <= setup.persistence_threshold)


def _states(setup: TrainingSetup, shape: ModelShape, counts: ParameterCounts, trainable: int) -> ModelStates:
    """Model states per GPU after the tensor/expert-parallel split; experts shard over fewer data-parallel ranks."""
    tp, ep, pp = setup.tensor_parallel, setup.expert_parallel, setup.pipeline_parallel
    if tp * ep * pp == 1:
        states = model_state_bytes(counts.total, setup, trainable)
        whole = setup.element_bytes * persistent_parameters(shape, setup)
        return replace(states, parameters=states.parameters + whole) if whole else states
    # Megatron: everything but norms and router split by TP (vocab-parallel embedding and LM head); the
    # layers split into PP stages, the heaviest stage holding one of the embedding and the LM head.
    layers = (counts.total - counts.experts - counts.norms - counts.router - counts.embedding - counts.lm_head)
    vocabulary = max(counts.embedding, counts.lm_head) if pp > 1 else counts.embedding + counts.lm_head
    dense = (layers / pp + vocabulary) / tp + (counts.norms + counts.router) / pp
    experts = counts.experts / (tp * ep * pp)
    if setup.lora_rank:
        local_trainable = trainable / (tp * pp)
        return model_state_bytes(dense + experts, setup, local_trainable)
    return (model_state_bytes(dense, setup, shard=setup.data_parallel)
            + model_state_bytes(experts, setup, shard=setup.expert_data_parallel))


def estimate_memory(model: ModelShape | str | dict, setup: TrainingSetup) -> MemoryEstimate:
    """Estimate per-GPU peak memory (and CPU memory under offload) of one training step."""
    shape = model_shape(model)
    check_setup(setup, shape)
    counts = parameter_counts(shape)
    trainable = (lora_trainable_count(shape, setup.lora_rank, setup.lora_modules,
                                      fused=setup.resolved_engine == "megatron")
                 if setup.lora_rank else counts.total)
    states = _states(setup, shape, counts, trainable)
    activations, logits = activation_bytes(shape, setup), logits_bytes(shape, setup)
    if setup.pipeline_parallel > 1:
        activations, logits = _pipeline_stage_peak(shape, setup)
    return MemoryEstimate(
        model=shape.name, setup=setup, total_parameters=counts.total, trainable_parameters=trainable,
        parameters=states.parameters, gradients=states.gradients, optimizer_states=states.optimizer_states,
        activations=activations, logits=logits,
        temporaries=temporaries_bytes(shape, setup, trainable / setup.tensor_parallel),
        cpu_parameters=states.cpu_parameters, cpu_gradients=states.cpu_gradients,
        cpu_optimizer_states=states.cpu_optimizer_states,
        reduce_bucket=reduce_bucket_bytes(setup) if setup.zero_stage in (1, 2) else 0.0,
        formula=model_state_formula(setup), assumptions=assumptions(shape, setup))


def _pipeline_stage_peak(shape: ModelShape, setup: TrainingSetup) -> tuple[float, float]:
    """(activations, logits) of the fuller pipeline stage. Under 1F1B the first stage holds the activations
    of up to PP micro-batches for its L/PP layers; the last stage holds one, plus the logits."""
    per_layer = layer_activation_bytes(shape, setup)
    stage_layers = shape.num_layers / setup.pipeline_parallel
    in_flight = min(setup.pipeline_parallel, setup.micro_batches)
    sbh = setup.seq_len * setup.batch * shape.hidden_size
    first = in_flight * stage_layers * per_layer
    last = stage_layers * per_layer + (_residual_bytes(setup) + setup.element_bytes) * sbh
    logits = logits_bytes(shape, setup)
    return (first, 0.0) if first > last + logits else (last, logits)


def model_state_formula(setup: TrainingSetup) -> str:
    """The model-state formula for this setup, e.g. '2Ψ + (2 + 12)Ψ/N_d, N_d = 2'."""
    per = state_bytes(setup)
    p, g, o = per.parameter, per.gradient, per.optimizer
    engine, stage = setup.resolved_engine, setup.zero_stage
    if engine == "deepspeed":
        sharded = {0: [], 1: ["o"], 2: ["g", "o"], 3: ["p", "g", "o"]}[stage]
    elif engine == "fsdp" and setup.fsdp != "NO_SHARD":
        sharded = ["p", "g", "o"]
    elif engine == "megatron":
        sharded = ["o"]
    else:
        sharded = []
    whole = [str(v) for k, v in (("p", p), ("g", g), ("o", o)) if k not in sharded]
    split = [str(v) for k, v in (("p", p), ("g", g), ("o", o)) if k in sharded]
    terms = []
    if whole:
        terms.append(f"{' + '.join(whole)}Ψ" if len(whole) == 1 else f"({' + '.join(whole)})Ψ")
    if split:
        terms.append((f"{split[0]}" if len(split) == 1 else f"({' + '.join(split)})") + "Ψ/N_d")
    text = " + ".join(terms) + f"  (params {p} + grads {g} + optimizer {o} bytes per trainable parameter"
    if split:
        text += f"; N_d = {setup.shard_degree}"
    return text + ")"


def assumptions(shape: ModelShape, setup: TrainingSetup) -> tuple[str, ...]:
    """What the estimate assumes or leaves out for this model and setup (shown under the table)."""
    notes = ["peak allocated by PyTorch; CUDA context, cuBLAS/NCCL workspaces and allocator fragmentation "
             "are left out", "Adam/AdamW: two fp32 states per trainable parameter"]
    engine = setup.resolved_engine
    if engine == "ddp" and setup.mixed:
        notes.append("autocast (HF Trainer --fp16/--bf16): fp32 weights, 16-bit copies of the matmul weights "
                     "held for backward, fp32 residual stream")
    if engine == "ddp" and setup.has_ddp_buckets:
        notes.append("DDP gradient buckets as large as the gradients (gradient_as_bucket_view off)")
    if engine == "deepspeed" and setup.zero_stage:
        notes.append("the transient fp32 gradient partition of the optimizer step (4Ψ/N_d) is left out")
        if not setup.mixed:
            notes.append("ZeRO keeps an fp32 master partition even of fp32 weights (optimizer 12 bytes)")
        bucket = f"reduce bucket of {setup.reduce_bucket:,} elements (reduce_bucket_size)"
        notes.append(f"{bucket}, alive throughout" if setup.zero_stage == 3 else
                     f"{bucket} from the first gradient on: the logits are freed by then, so only its excess counts")
    if engine == "deepspeed" and setup.zero_stage == 3:
        notes.append(f"tensors of at most {setup.persistence_threshold:,} elements stay whole on every GPU "
                     "(stage3_param_persistence_threshold)")
    if engine == "megatron":
        notes.append("Megatron: vocab-parallel embedding/LM head split by TP; norms and router replicated; "
                     + ("distributed optimizer over DP" if setup.distributed_optimizer else "no distributed optimizer")
                     + f" (dense DP = {setup.data_parallel}, expert DP = {setup.expert_data_parallel}); "
                     "experts split by TP x EP x PP")
    if setup.pipeline_parallel > 1:
        notes.append(f"pipeline 1F1B: the first stage keeps {min(setup.pipeline_parallel, setup.micro_batches)} "
                     "micro-batches of activations in flight, the last stage one plus the logits")
    if setup.lora_rank:
        notes.append("LoRA: frozen base stored in the training precision's 16-bit (fp32 with --precision fp32)")
    if shape.eager_attention:
        notes.append("eager attention: s x s scores kept (fp32 softmax + 16-bit copy)")
    else:
        notes.append("SDPA/flash attention: no s x s term")
    if setup.offload != "none":
        notes.append("CPU memory counts offloaded states only (add a few GiB per process for Python/CUDA)")
    return tuple(notes)
