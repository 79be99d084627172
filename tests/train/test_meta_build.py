"""Real shapes are never built whole: the model is made on the meta device, split Megatron-style over the
tensor-parallel ranks, and each rank materialises only its shard (checked here on a small Llama, 2 CPU ranks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, free_port

from workshop_lib.core.errors import WorkshopError
from workshop_lib.train.lora import NEMO_TARGETS, hf_targets
from workshop_lib.train.models import model_spec
from workshop_lib.train.parallel import batch_split

SCRIPT = """
import json, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from transformers import LlamaConfig
from workshop_lib.train.models import ModelSpec, build_on_meta, materialise
from workshop_lib.train.parallel import shard_dense, synchronise_and_clip
from workshop_lib.train.sharding import local_parameter_count

dist.init_process_group("gloo")
config = lambda: LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256)
spec = ModelSpec("small-llama", "llama", "not/on-the-hub", config, "LlamaDecoderLayer")
model = build_on_meta(spec)
on_meta = all(p.is_meta for p in model.parameters())
shard_dense(model, init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))["tp"])
materialise(model, torch.device("cpu"), seed=3)
ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(0))
loss = model(input_ids=ids, labels=ids).loss
loss.backward()
norm = synchronise_and_clip([p for p in model.parameters()], 1, 2, 1.0)
fresh = type(model.model.rotary_emb)(config=model.config).inv_freq
norms = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
json.dump({"on_meta": on_meta, "loss": float(loss), "norm": norm, "local": local_parameter_count(model),
           "global": sum(p.numel() for p in model.parameters()),
           "norms_are_ones": all(bool((p == 1).all()) for p in norms),
           "norms_replicated": all(not isinstance(p, DTensor) for p in norms),
           "rotary_ok": bool(torch.allclose(model.model.rotary_emb.inv_freq, fresh))},
          open(sys.argv[1] + f".{dist.get_rank()}", "w"))
"""


@pytest.mark.train
def test_tensor_parallel_shards_are_materialised_from_the_meta_device(tmp_path):
    script = tmp_path / "meta_build.py"
    script.write_text(SCRIPT)
    result = tmp_path / "result"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                    f"--master_port={free_port()}", str(script), str(result)], check=True, env=env, timeout=300)
    ranks = [json.loads((tmp_path / f"result.{rank}").read_text()) for rank in (0, 1)]
    for record in ranks:
        assert record["on_meta"] and record["norms_are_ones"] and record["norms_replicated"] and record["rotary_ok"]
        # every matrix, the embedding and the LM head are split in two; only the norms stay whole
        assert record["local"] < 0.52 * record["global"]
        assert record["loss"] == pytest.approx(ranks[0]["loss"])  # one model, whatever the rank
        assert record["norm"] == pytest.approx(ranks[0]["norm"]) and record["norm"] > 0


def test_nemo_lora_targets_map_onto_hugging_face_modules():
    llama, mixtral = model_spec("llama-3.1-8b"), model_spec("mixtral-8x7b")
    assert hf_targets("linear_qkv,linear_proj,linear_fc1,linear_fc2", llama) == [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert hf_targets("linear_qkv,linear_proj", mixtral) == ["q_proj", "k_proj", "v_proj", "o_proj"]
    with pytest.raises(WorkshopError, match="experts"):
        hf_targets("linear_fc1", mixtral)
    with pytest.raises(WorkshopError, match="NeMo's names"):
        hf_targets("q_proj", llama)
    assert set(NEMO_TARGETS) == {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"}


def test_megatron_batch_split():
    assert batch_split(8, 2, 1) == (1, 4)  # DP 2: 4 samples per rank, 4 micro-batches of 1
    assert batch_split(8, 1, None) == (8, 1)
    with pytest.raises(WorkshopError, match="does not divide"):
        batch_split(8, 2, 3)
