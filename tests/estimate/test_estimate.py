"""The estimator against hand-computed values, transformers' real architectures, PEFT, and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from repo_paths import REPO, TESTS

from workshop_lib.cli import main
from workshop_lib.core.errors import WorkshopError
from workshop_lib.estimate import (
    GIB,
    KNOWN_CONFIGS,
    ModelShape,
    TrainingSetup,
    activation_bytes,
    estimate_memory,
    flops_per_token,
    layer_activation_bytes,
    logits_bytes,
    lora_trainable_count,
    matmul_parameters,
    mfu,
    model_shape,
    model_state_bytes,
    parameter_count,
    parameter_counts,
    parameter_tensors,
    persistent_parameters,
    setup_from_experiment,
)

PSI = 1e9


# ---------------------------------------------------------------------------------------------
# Model states: the ZeRO paper's numbers
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stage, bytes_per_param", [(0, 16), (1, 4 + 12 / 4), (2, 2 + 14 / 4), (3, 16 / 4)])
def test_zero_stages_on_four_gpus_match_the_paper(stage, bytes_per_param):
    states = model_state_bytes(PSI, TrainingSetup(gpus=4, zero_stage=stage, precision="bf16"))
    assert states.gpu_total == pytest.approx(bytes_per_param * PSI)
    assert states.cpu_total == 0


def test_zero_stage_three_splits_each_state():
    states = model_state_bytes(PSI, TrainingSetup(gpus=4, zero_stage=3, precision="fp16"))
    assert (states.parameters, states.gradients, states.optimizer_states) == pytest.approx((0.5e9, 0.5e9, 3e9))


def test_fp32_training_is_4_4_8():
    states = model_state_bytes(PSI, TrainingSetup(gpus=4, zero_stage=0, precision="fp32"))
    assert (states.parameters, states.gradients, states.optimizer_states) == pytest.approx((4e9, 4e9, 8e9))
    assert model_state_bytes(PSI, TrainingSetup(gpus=4, fsdp="FULL_SHARD", precision="fp32")).gpu_total == \
        pytest.approx(4e9)


@pytest.mark.parametrize("stage, bytes_per_param", [(1, 4 + 4 + 12 / 4), (2, 4 + 16 / 4), (3, 20 / 4)])
def test_deepspeed_zero_keeps_an_fp32_master_even_of_fp32_weights(stage, bytes_per_param):
    """ZeRO 1-3 clone an fp32 master partition whatever the model's dtype (measured on the tiny CPU runs,
    tests/train/test_engines.py): K = 12 in fp32 too; plain DeepSpeed (stage 0) has no master copy."""
    states = model_state_bytes(PSI, TrainingSetup(gpus=4, zero_stage=stage, precision="fp32"))
    assert states.gpu_total == pytest.approx(bytes_per_param * PSI)
    assert states.optimizer_states == pytest.approx(12 * PSI / 4)


def test_zero3_keeps_small_tensors_whole_on_every_gpu():
    """stage3_param_persistence_threshold (1e5 elements by default): every tensor of tiny-bloom, only the norms
    and biases of BLOOM-560m."""
    tiny = parameter_counts("tiny-bloom").total
    setup = TrainingSetup(gpus=2, zero_stage=3, precision="fp32", batch=2, seq_len=128)
    assert persistent_parameters(model_shape("tiny-bloom"), setup) == tiny
    assert estimate_memory("tiny-bloom", setup).parameters == 4 * tiny / 2 + 4 * tiny
    auto = TrainingSetup(gpus=2, zero_stage=3, precision="fp32", persistence_threshold=10 * 64)  # HF's "auto"
    # norms (weight and bias of 64) and biases (192, 64, 256, 64 per layer): 2 x 832 + 2 x 128 elements
    assert estimate_memory("tiny-bloom", auto).parameters == 4 * tiny / 2 + 4 * (2 * 832 + 2 * 128)
    small = persistent_parameters(model_shape("bloom-560m"), TrainingSetup(gpus=2, zero_stage=3))
    assert small == 24 * (2 * 1024 * 2 + 3 * 1024 + 1024 + 4096 + 1024) + 4 * 1024  # norms and biases


def test_deepspeed_reduce_bucket_counts_where_it_is_alive():
    """ZeRO-3 allocates its reduce bucket once (a temporary throughout); ZeRO-1/2 at the first gradient, when the
    logits' gradients are gone: it replaces them in the peak if larger."""
    tiny = dict(gpus=2, precision="fp32", batch=2, seq_len=128)
    two = estimate_memory("tiny-bloom", TrainingSetup(zero_stage=2, **tiny))
    assert two.reduce_bucket == 4 * 500_000_000 and two.temporaries == 0
    assert two.total == two.model_states + two.activations + two.reduce_bucket
    three = estimate_memory("tiny-bloom", TrainingSetup(zero_stage=3, **tiny))
    assert three.reduce_bucket == 0 and three.temporaries > 4 * 500_000_000
    bloom = estimate_memory("bloom-560m", TrainingSetup(gpus=2, zero_stage=2, precision="fp16"))
    assert bloom.logits > bloom.reduce_bucket == 2 * 500_000_000  # BLOOM's logits are larger: no change
    assert bloom.total == bloom.model_states + bloom.activations + bloom.logits + bloom.temporaries
    assert estimate_memory("tiny-bloom", TrainingSetup(zero_stage=0, **tiny)).reduce_bucket == 0
    small = estimate_memory("tiny-bloom", TrainingSetup(zero_stage=2, reduce_bucket=64 * 64, **tiny))
    assert small.total == small.model_states + small.activations + small.logits


def test_parameter_tensors_add_up_to_the_counts():
    for name in KNOWN_CONFIGS:
        assert sum(parameter_tensors(name)) == parameter_count(name), name


def test_optimizer_offload_keeps_16bit_params_on_gpu_and_moves_master_states_and_fp32_grads():
    states = model_state_bytes(PSI, TrainingSetup(gpus=4, zero_stage=2, offload="optimizer", precision="bf16"))
    assert states.gpu_total == pytest.approx(2e9)  # 16-bit parameters only
    assert states.cpu_optimizer_states == pytest.approx(12e9 / 4)
    assert states.cpu_gradients == pytest.approx(4e9 / 4)


def test_parameter_offload_empties_the_gpu_of_model_states():
    states = model_state_bytes(PSI, TrainingSetup(gpus=4, zero_stage=3, offload="parameters", precision="bf16"))
    assert states.gpu_total == 0
    assert states.cpu_total == pytest.approx((2 + 4 + 12) * PSI / 4)


@pytest.mark.parametrize("strategy, nodes, shard", [("FULL_SHARD", 1, 8), ("HYBRID_SHARD", 2, 4), ("NO_SHARD", 1, 1)])
def test_fsdp_shards_over_the_right_group(strategy, nodes, shard):
    states = model_state_bytes(PSI, TrainingSetup(gpus=8, nodes=nodes, fsdp=strategy, precision="bf16"))
    assert states.gpu_total == pytest.approx(16 * PSI / shard)  # fp32 params + grads + Adam, sharded


def test_fsdp_offload_moves_everything_to_cpu():
    states = model_state_bytes(PSI, TrainingSetup(gpus=4, fsdp="FULL_SHARD", offload="parameters"))
    assert states.gpu_total == 0 and states.cpu_total == pytest.approx(4e9)


def test_lora_frozen_base_has_no_gradients_or_optimizer_state():
    trainable = 1e7
    states = model_state_bytes(PSI, TrainingSetup(precision="bf16"), trainable=trainable)
    assert states.parameters == pytest.approx(2 * (PSI - trainable) + 4 * trainable)
    assert states.gradients == pytest.approx(4 * trainable)
    assert states.optimizer_states == pytest.approx(8 * trainable)


# ---------------------------------------------------------------------------------------------
# Parameter counts against transformers' real architectures (meta device: no memory, no download)
# ---------------------------------------------------------------------------------------------

def _meta_model_tensors(config) -> list[int]:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sorted(p.numel() for p in model.parameters())  # tied weights appear once


@pytest.mark.parametrize("name", ["bloom-560m", "llama-3.1-8b", "mixtral-8x7b", "tiny-bloom", "tiny-llama",
                                  "tiny-mixtral"])
@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_parameter_count_matches_the_transformers_model(name):
    from workshop_lib.train.models import REGISTRY, build_config

    config = build_config(REGISTRY[name])
    tensors = _meta_model_tensors(config)
    real = sum(tensors)
    assert parameter_count(name) == real  # the built-in table agrees with the training registry
    assert parameter_count(config.to_dict()) == real  # and the reader understands the real config.json
    assert sorted(parameter_tensors(name)) == tensors  # tensor by tensor (what ZeRO-3 keeps whole)


def test_known_sizes():
    assert parameter_count("bloom-560m") == 559_214_592
    assert parameter_count("llama-3.1-8b") == pytest.approx(8.03e9, rel=1e-3)
    mixtral = parameter_counts("mixtral-8x7b")
    assert mixtral.total == pytest.approx(46.7e9, rel=1e-3)
    assert mixtral.active == pytest.approx(12.9e9, rel=2e-3)


def test_custom_gpt_count_matches_the_module():
    torch = pytest.importorskip("torch")
    from workshop_lib.train.gpt_model import GPT, GPTConfig

    config = {"model_type": "gpt", "hidden": 64, "layers": 2, "heads": 4, "ffn": 256, "vocab": 512, "seq_len": 128}
    with torch.device("meta"):
        model = GPT(GPTConfig(**{k: v for k, v in config.items() if k != "model_type"}))
    assert parameter_count(config) == sum(p.numel() for p in model.parameters())


def test_config_json_path(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(KNOWN_CONFIGS["tiny-llama"]))
    assert parameter_count(str(path)) == parameter_count("tiny-llama")
    assert model_shape(str(tmp_path)).hidden_size == 64  # a model folder works too


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(WorkshopError, match="bloom-560m, llama-3.1-8b, mixtral-8x7b"):
        model_shape("bloom-7b")
    with pytest.raises(WorkshopError, match="model_type 'gpt_neox'"):
        parameter_count({"model_type": "gpt_neox", "hidden_size": 8})


# ---------------------------------------------------------------------------------------------
# LoRA against PEFT
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("modules", [None, ("q_proj", "v_proj", "gate_proj", "up_proj", "down_proj")])
@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_lora_trainable_count_matches_peft(modules):
    torch = pytest.importorskip("torch")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(**{k: v for k, v in KNOWN_CONFIGS["tiny-llama"].items() if k != "model_type"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    targets = list(modules or ("q_proj", "k_proj", "v_proj", "o_proj"))
    model = get_peft_model(model, LoraConfig(r=8, target_modules=targets, lora_dropout=0.0, bias="none"))
    peft_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert lora_trainable_count("tiny-llama", 8, modules) == peft_trainable


def test_lora_rejects_a_module_the_family_lacks():
    with pytest.raises(WorkshopError, match="choose from query_key_value, dense"):
        lora_trainable_count("bloom-560m", 32, ["q_proj"])


def test_llama_lora_r32_on_attention_by_hand():
    # per layer: q 32·(4096+4096) + k 32·(4096+1024) + v same + o 32·(4096+4096) = 851,968; 32 layers
    assert lora_trainable_count("llama-3.1-8b", 32) == 32 * 851_968


# ---------------------------------------------------------------------------------------------
# Activations and logits by hand
# ---------------------------------------------------------------------------------------------

def _bloom_like(dropout: bool) -> ModelShape:
    return ModelShape(name="toy", family="bloom", hidden_size=8, num_layers=3, num_heads=2, num_kv_heads=2,
                      head_dim=4, intermediate_size=32, vocab_size=10, tie_embeddings=True, gated_mlp=False,
                      qkv_bias=True, output_bias=True, mlp_bias=True, layer_norm=True, embedding_norm=True,
                      eager_attention=True, dropout=dropout)


S, B, H, A, V = 4, 2, 8, 2, 10
SBH, AS2B = S * B * H, A * S * S * B


def test_layer_activations_are_korthikanti_plus_the_fp32_softmax():
    setup = TrainingSetup(zero_stage=0, precision="fp16", batch=B, seq_len=S)
    # Korthikanti et al. 2022 (16-bit, dropout): 34·sbh + 5·a·s²·b; BLOOM keeps its softmax in fp32: +4·a·s²·b.
    assert layer_activation_bytes(_bloom_like(True), setup) == 34 * SBH + (5 + 4) * AS2B
    # Without dropout: no masks (2·sbh + a·s²·b) and no dropout output (2·a·s²·b).
    assert layer_activation_bytes(_bloom_like(False), setup) == 32 * SBH + 6 * AS2B


def test_tensor_and_sequence_parallel_split_like_the_paper():
    shape = _bloom_like(True)
    tp = TrainingSetup(gpus=2, tensor_parallel=2, precision="bf16", batch=B, seq_len=S)
    assert layer_activation_bytes(shape, tp) == SBH * (10 + 24 / 2) + 9 * AS2B / 2
    sp = TrainingSetup(gpus=2, tensor_parallel=2, sequence_parallel=True, precision="bf16", batch=B, seq_len=S)
    assert layer_activation_bytes(shape, sp) == (34 * SBH + 9 * AS2B) / 2


def test_fp32_doubles_all_but_the_masks():
    setup = TrainingSetup(zero_stage=0, precision="fp32", batch=B, seq_len=S)
    # 16-bit tensors 32·sbh + 4·a·s²·b (softmax already fp32: 4) double to 64·sbh + 4·a·s²·b + 4 (dropout out);
    # masks stay 2·sbh + a·s²·b.
    assert layer_activation_bytes(_bloom_like(True), setup) == 64 * SBH + 2 * SBH + (4 + 4 + 1) * AS2B


def test_all_layers_and_recomputation():
    shape = _bloom_like(False)
    setup = TrainingSetup(zero_stage=0, precision="fp16", batch=B, seq_len=S)
    outside = 2 * SBH + 2 * SBH  # final norm input, LM head input
    assert activation_bytes(shape, setup) == 3 * (32 * SBH + 6 * AS2B) + outside
    recompute = TrainingSetup(zero_stage=0, precision="fp16", batch=B, seq_len=S, recompute=True)
    assert activation_bytes(shape, recompute) == 3 * 2 * SBH + (32 * SBH + 6 * AS2B) + outside


def test_logits_are_three_fp32_copies():
    shape = _bloom_like(False)
    assert logits_bytes(shape, TrainingSetup(precision="bf16", batch=B, seq_len=S)) == 12 * S * B * V
    assert logits_bytes(shape, TrainingSetup(precision="fp32", batch=B, seq_len=S)) == 12 * S * B * V
    assert logits_bytes(shape, TrainingSetup(gpus=2, tensor_parallel=2, batch=B, seq_len=S)) == 6 * S * B * V


def test_bloom_logits_at_the_seed_recipe():
    # 512 · 4 · 250,880 · 12 bytes = 5.74 GiB: larger than all 24 layers' activations together.
    setup = TrainingSetup(precision="fp16", batch=4, seq_len=512)
    assert logits_bytes("bloom-560m", setup) / GIB == pytest.approx(5.742, abs=1e-3)
    assert logits_bytes("bloom-560m", setup) > activation_bytes("bloom-560m", setup)


# ---------------------------------------------------------------------------------------------
# The whole estimate against a measurement (FINDINGS.md: one H200, HF Trainer fp16, batch 4 x 512)
# ---------------------------------------------------------------------------------------------

def test_bloom_560m_seed_recipe_is_close_to_the_measured_19_6_gib():
    estimate = estimate_memory("bloom-560m", TrainingSetup(precision="fp16", batch=4, seq_len=512))
    assert estimate.model_states / GIB == pytest.approx(16 * 559_214_592 / GIB)
    assert estimate.temporaries / GIB == pytest.approx(2 * matmul_parameters("bloom-560m") / GIB)
    assert estimate.total / GIB == pytest.approx(19.6, rel=0.05)  # measured peak allocated


def test_ddp_adds_gradient_buckets_and_zero_removes_the_autocast_copies():
    one = estimate_memory("tiny-llama", TrainingSetup(gpus=1, precision="bf16"))
    two = estimate_memory("tiny-llama", TrainingSetup(gpus=2, precision="bf16"))
    assert two.temporaries - one.temporaries == 4 * parameter_count("tiny-llama")
    zero = estimate_memory("tiny-llama", TrainingSetup(gpus=2, zero_stage=1, precision="bf16"))
    assert zero.temporaries == 0


def test_megatron_tp_ep_divides_experts_by_both():
    setup = TrainingSetup(gpus=8, tensor_parallel=2, expert_parallel=4, precision="bf16", seq_len=2048, batch=1)
    counts = parameter_counts("mixtral-8x7b")
    local = (counts.total - counts.experts - counts.norms - counts.router) / 2 + counts.norms + counts.router \
        + counts.experts / 8
    assert estimate_memory("mixtral-8x7b", setup).parameters == pytest.approx(2 * local)


def test_deepspeed_cross_check_differs_by_the_fp32_gradient_partition():
    pytest.importorskip("deepspeed")
    from workshop_lib.estimate import deepspeed_zero_estimates

    result = deepspeed_zero_estimates("bloom-560m", TrainingSetup(gpus=2, zero_stage=2, precision="fp16"))
    # DeepSpeed: 2Ψ + 18Ψ/N; ours 2Ψ + 14Ψ/N (its extra 4 bytes: the fp32 gradient partition).
    assert result["deepspeed_gpu"] - result["ours_gpu"] == pytest.approx(4 * 559_214_592 / 2, rel=1e-6)


# ---------------------------------------------------------------------------------------------
# FLOPs and MFU
# ---------------------------------------------------------------------------------------------

def test_flops_per_token_by_hand():
    shape = _bloom_like(False)
    # matmul parameters: attention 4·64+4·8 = 288, MLP 2·8·32+32+8 = 552, LM head 10·8 = 80 → per layer 840
    assert matmul_parameters(shape) == 3 * (288 + 552) + 80
    assert flops_per_token(shape, seq_len=4) == 6 * 2600 + 12 * 3 * 4 * 8
    assert flops_per_token(shape, seq_len=4, recompute=True) == pytest.approx((8 * 2600 + 16 * 3 * 4 * 8))


def test_mfu_by_hand_and_the_findings_ceiling():
    assert mfu(2.0, 1000, 1e9, 6e12) == pytest.approx(0.5)
    assert mfu(1.0, 1000, 1e9, 6e12, attention_flops=6e9) == pytest.approx(2.0)
    # FINDINGS: 6·N·tokens at ~790 TFLOP/s is ~460 BLOOM-560m samples of 512 tokens per second.
    samples = 790e12 / (6 * parameter_count("bloom-560m") * 512)
    assert samples == pytest.approx(460, rel=0.01)
    with pytest.raises(WorkshopError, match="step time"):
        mfu(0, 1000, 1e9, 6e12)


# ---------------------------------------------------------------------------------------------
# Impossible setups, the Experiment bridge, the CLI
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("setup, message", [
    (TrainingSetup(zero_stage=0, offload="optimizer"), "stage 0 partitions nothing"),
    (TrainingSetup(offload="optimizer"), "needs ZeRO stage 1 or more"),
    (TrainingSetup(zero_stage=2, offload="parameters"), "parameter offload needs ZeRO stage 3"),
    (TrainingSetup(gpus=4, fsdp="HYBRID_SHARD"), "HYBRID_SHARD shards inside a node .* use 2 or more nodes"),
    (TrainingSetup(gpus=6, tensor_parallel=2, expert_parallel=2), "does not divide the 6 GPUs"),
    (TrainingSetup(gpus=3, nodes=2), "do not split evenly over 2 nodes"),
    (TrainingSetup(zero_stage=1, fsdp="FULL_SHARD"), "pick one"),
])
def test_impossible_setups_are_refused(setup, message):
    with pytest.raises(WorkshopError, match=message):
        estimate_memory("mixtral-8x7b", setup)


def test_expert_parallel_needs_an_moe_model():
    with pytest.raises(WorkshopError, match="bloom-560m is dense"):
        estimate_memory("bloom-560m", TrainingSetup(gpus=2, expert_parallel=2))


def test_setup_from_chapter_experiments():
    from workshop_lib.experiments import get_experiment

    setup = setup_from_experiment(get_experiment("zero/two-gpus/zero3-offload"))
    assert (setup.gpus, setup.zero_stage, setup.offload) == (2, 3, "parameters")
    assert setup_from_experiment(get_experiment("zero/two-gpus/zero2-offload")).offload == "optimizer"


def test_cli_prints_the_breakdown(capsys):
    assert main(["estimate", "--model", "bloom-560m", "--gpus", "2", "--zero", "2", "--precision", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "2 GPUs on 1 node, DeepSpeed, ZeRO-2, fp16" in out
    optimizer_row = next(line for line in out.splitlines() if line.startswith("optimizer states"))
    assert float(optimizer_row.split()[2]) == pytest.approx(12 * 559_214_592 / 2 / GIB, abs=0.005)
    assert "2Ψ + (2 + 12)Ψ/N_d" in out and "N_d = 2" in out


def test_cli_json_and_offload(capsys):
    argv = ["estimate", "--model", "bloom-560m", "--gpus", "2", "--zero", "3", "--offload", "parameters", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    # Only the tensors ZeRO-3 keeps whole (norms, biases) stay on the GPU; DeepSpeed never offloads them.
    small = persistent_parameters(model_shape("bloom-560m"), TrainingSetup(gpus=2, zero_stage=3))
    assert data["parameters"] == 2 * small and data["cpu_total"] == pytest.approx(18 * 559_214_592 / 2)
    assert data["cpu_per_node"] == pytest.approx(2 * data["cpu_total"])


@pytest.mark.parametrize("argv, message", [
    (["--model", "bloom-7b"], "unknown model 'bloom-7b'; use one of bloom-560m"),
    (["--model", "bloom-560m", "--zero", "0", "--offload", "optimizer"], "stage 0 partitions nothing"),
    (["--model", "bloom-560m", "--gpus", "4", "--fsdp", "HYBRID_SHARD"], "use 2 or more nodes (--nodes=2)"),
    (["--model", "mixtral-8x7b", "--gpus", "6", "--tp", "2", "--ep", "2"], "does not divide the 6 GPUs"),
])
def test_cli_errors_name_the_problem(capsys, argv, message):
    assert main(["estimate", *argv]) == 2
    assert message in capsys.readouterr().err


def test_estimator_imports_neither_torch_nor_transformers():
    code = ("import sys, workshop_lib.estimate, workshop_lib.cli.estimate; "
            "sys.exit(1 if {'torch', 'transformers'} & set(sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_megatron_data_parallel_sizes_under_tp_ep_pp():
    """Dense DP = GPUs / (TP x PP); the experts' DP = GPUs / (TP x EP x PP): EP comes out of DP."""
    seed = TrainingSetup(gpus=4, tensor_parallel=2, expert_parallel=2, engine="megatron")
    assert (seed.data_parallel, seed.expert_data_parallel) == (2, 1)
    two_nodes = TrainingSetup(gpus=16, nodes=2, tensor_parallel=2, pipeline_parallel=4, expert_parallel=2)
    assert two_nodes.resolved_engine == "megatron" and (two_nodes.data_parallel, two_nodes.expert_data_parallel) == (2, 1)
    with pytest.raises(WorkshopError, match="TP x EP x PP"):
        estimate_memory("mixtral-8x7b", TrainingSetup(gpus=8, tensor_parallel=2, expert_parallel=4, pipeline_parallel=2))


def test_pipeline_stages_divide_the_model_states_and_hold_micro_batches_in_flight():
    base = dict(gpus=16, nodes=2, tensor_parallel=2, expert_parallel=2, sequence_parallel=True, batch=1,
                seq_len=2048, precision="bf16")
    one = estimate_memory("mixtral-8x7b", TrainingSetup(**base, pipeline_parallel=1, micro_batches=4))
    four = estimate_memory("mixtral-8x7b", TrainingSetup(**base, pipeline_parallel=4, micro_batches=4))
    assert four.parameters < one.parameters / 3  # layers split over 4 stages (the heaviest keeps a vocabulary)
    # the first stage keeps 4 micro-batches of its 8 layers: as many layer activations as 32 layers of one
    assert four.activations == pytest.approx(one.activations, rel=0.05) and four.logits == 0
    fewer = estimate_memory("mixtral-8x7b", TrainingSetup(**base, pipeline_parallel=4, micro_batches=1))
    assert fewer.activations < four.activations / 3
    without = estimate_memory("llama-3.1-8b", TrainingSetup(gpus=4, tensor_parallel=2, distributed_optimizer=False))
    sharded = estimate_memory("llama-3.1-8b", TrainingSetup(gpus=4, tensor_parallel=2))
    assert sharded.optimizer_states == pytest.approx(without.optimizer_states / 2)


def test_nemo_lora_targets_are_what_nemo_resolved_for_each_recipe():
    """The recipes' targets as NeMo 2.4.1 resolved them (book/reference/nemo): a name missing there means
    LoRA's default, all four of Megatron's linears."""
    import yaml

    from workshop_lib.estimate.report import NEMO_RECIPE_LORA_TARGETS

    reference = REPO / "book" / "reference" / "nemo"
    for model, short in (("llama-3.1-8b", "llama"), ("mixtral-8x7b", "mixtral")):
        for path in sorted(reference.glob(f"lora_{short}_*.yaml")):
            peft = yaml.safe_load(path.read_text())["peft"]
            resolved = tuple(peft.get("target_modules") or ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"))
            assert resolved == NEMO_RECIPE_LORA_TARGETS[model], path.name


def test_nemo_lora_trainable_parameters_equal_what_nemo_printed_on_the_gpu():
    """NeMo 2.4.1 on an H100 printed `17.8 M Trainable params` for chapter 1's Llama LoRA (its log is a
    fixture); the estimator counts Megatron's fused linears, not Hugging Face's separate ones."""
    from workshop_lib.estimate.report import setup_from_experiment
    from workshop_lib.experiments import get_experiment
    from workshop_lib.results.parse.nemo import parse_nemo_log

    log = TESTS / "samples" / "nemo" / "llama_lora_1gpu_nemo241_h100.out"
    printed = parse_nemo_log(log.read_text()).after_lora.trainable_params
    experiment = get_experiment("lora/llama/1-gpu")
    estimated = estimate_memory(experiment.model, setup_from_experiment(experiment)).trainable_parameters
    assert abs(estimated - printed) / printed < 0.01, (estimated, printed)
