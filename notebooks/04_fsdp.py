# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 4: Fully Sharded Data Parallel (FSDP)
#
# **FSDP** is PyTorch's own answer to the redundancy of data parallelism: like ZeRO stage 3 it
# divides parameters, gradients and optimizer states over the GPUs and gathers each piece of the
# model only while it is needed. It ships with PyTorch, needs no separate runtime, and the Hugging
# Face Trainer switches it on with one argument. This chapter measures it on BLOOM-560m (a baseline,
# one GPU, the sharding strategies with and without CPU offload, more GPUs, more nodes), then on a
# small GPT written from scratch, and ends with *weak scaling by depth*: the model grows with the
# number of GPUs.
#
# As in chapter 3, a results section whose experiment was measured **on real GPUs** shows that reference
# first (with where and how it ran), then the same table from **your runs**, titled by the profile that
# produced them. The sections across nodes have no such measurement (they need several nodes of a real
# cluster) and say so. Sentences that state measured results are written from the reference data when
# the page is built.
#
# ```{admonition} Where this runs
# :class: note
# On Ibex (`profile = "ibex"`) the runs use A100s, fp16, batch 1 × accumulation 4, five epochs, an
# NCCL bandwidth check before every multi-node job, and `nvidia-smi` for GPU memory. On the **tiny
# profile** the same experiments run on CPU processes with a tiny random BLOOM (`tiny-bloom`, a stand-in
# for BLOOM-560m) and a narrow GPT (the layer counts and per-GPU batches of the experiments are kept),
# fp32, synthetic data, a few steps, no NCCL check and no GPU monitor. The sharding is real: PyTorch's
# FSDP runs on CPU with gloo, and each rank reports the tensor bytes it holds. (The Trainer's own
# `fsdp="full_shard"` flag silently falls back to plain DDP on CPU, so on CPU the engine wraps the model
# itself.)
# ```

# %% tags=["parameters"]
profile = "tiny"  # "ibex" on the cluster, "tiny" anywhere else
experiments = None  # None: every experiment of the chapter that the profile can run; or a list of ids
wait_timeout_s = 2400  # stop waiting after this long (jobs keep running; re-run the cell to pick them up)
runs_dir = None  # None: <repository>/runs (or $WORKSHOP_RUNS_DIR)
recipe = "seed"  # "seed": the original material's recipe (comparable numbers); "tuned": the faster one

# %% tags=["hide-input"]
from workshop_lib.book.chapter import facade as nb
from workshop_lib.book.claims import plots
from workshop_lib.book.claims import sentences as claims

selection = nb.chapter_header(4, profile, experiments, runs_dir, recipe)
reference = nb.reference_results(4)[1]

# %% [markdown]
# ## The ideas
#
# **How FSDP works.** The model is cut into *units*; here each transformer block (`BloomBlock`, or
# the GPT's `Block`) is one unit and everything else (embeddings, final norm) forms the root unit.
# Each unit's parameters are flattened and divided into *N* equal shards, one per GPU. Before a unit
# runs forward, the GPUs *all-gather* its full parameters; after it, the gathered copy is freed.
# The backward pass gathers again, computes the gradients, and *reduce-scatters* them so that each
# GPU keeps only the gradient of its own shard, which its optimizer then updates. At any moment a GPU
# holds its shards of everything plus the full parameters of the one or two units in flight, so the
# memory for model states falls as 1/*N*. Gathering the next unit's parameters while the current one
# computes (*prefetching*) hides part of the communication.
#
# **Which FSDP ran.** PyTorch has two implementations, and this chapter uses both:
#
# - *FSDP1* (`FullyShardedDataParallel`) flattens each unit's parameters into one flat buffer and shards
#   that; its prefetching is set by `forward_prefetch` and `backward_prefetch` (`BACKWARD_PRE` gathers the
#   next unit before the current unit's gradients are computed, faster and with more memory in flight;
#   `BACKWARD_POST`, the original material's choice, after them). The custom GPT is wrapped with FSDP1 by
#   the workshop's own loop, with the original's settings; the Trainer's `HYBRID_SHARD` runs also use FSDP1,
#   because FSDP2 has no hybrid strategy; they step PyTorch's foreach AdamW, since FSDP1's sharded loss
#   scaler trips the fused one.
# - *FSDP2* (`fully_shard`), Transformers 5's default, shards every parameter on its own (a `DTensor`) and
#   prefetches by itself. The Trainer's `FULL_SHARD` and `SHARD_GRAD_OP` runs use it.
#
# The original material's `fsdp_cfg` has four keys. `transformer_layer_cls_to_wrap` (which blocks become
# units: `BloomBlock`) counts under both. `backward_prefetch`, `forward_prefetch` and `sync_module_states`
# (copy rank 0's weights to every rank at start-up) are FSDP1 settings: the Trainer passes them to
# FSDP1 only, so under FSDP2 they change nothing. Neither set turns on *activation checkpointing*, which
# would recompute each unit's activations in the backward pass instead of keeping them: less memory, about
# a third more compute; the table captions say which implementation each table's rows used.
#
# **Sharding strategies** decide what is divided and over whom:
#
# | strategy | what is sharded | like | communication per step |
# |---|---|---|---|
# | `FULL_SHARD` | parameters, gradients, optimizer states over all GPUs | ZeRO-3 | all-gather in forward and backward, reduce-scatter: about 1.5× DDP |
# | `SHARD_GRAD_OP` | gradients and optimizer states; parameters stay gathered between forward and backward | ZeRO-2 | one all-gather, one reduce-scatter: about DDP's |
# | `HYBRID_SHARD` | `FULL_SHARD` inside each node, replicated across nodes | ZeRO-3 within a node + DDP across | heavy traffic on fast intra-node links, only a gradient all-reduce between nodes |
# | `NO_SHARD` | nothing: every GPU keeps everything | DDP (ZeRO-0) | one gradient all-reduce; not run in this chapter, since it is DDP under FSDP's API and chapter 3's DDP rows measure it |

# %% tags=["hide-input"]
nb.show_figure(plots.memory_layout_diagram(plots.fsdp_layouts(2, 2),
                                           "What each GPU keeps, per FSDP strategy (2 nodes × 2 GPUs)"));

# %% [markdown]
# `FULL_SHARD` saves the most memory; `SHARD_GRAD_OP` is faster when the parameters fit; `HYBRID_SHARD`
# suits many nodes connected by a slower network than the GPUs inside a node, and is the same as
# `FULL_SHARD` on a single node. That is why the strategy comparison runs on 2 nodes × 2 GPUs.
# **CPU offload** keeps the parameter shards (and so the optimizer step) in host memory and copies
# them to the GPU when a unit needs them: the largest memory saving, paid for in PCIe traffic and a
# CPU optimizer step (the Trainer's AdamW, stepping on the CPU copy).
#
# **Labels and the loss.** Each example is one text, `Question: … Context: … Answer: …<eos>`, padded to
# 512 tokens (`workshop_lib/train/data.py`). A causal model predicts every next token, so the labels are
# the input ids themselves (the model shifts them by one inside its loss). Where a label is **-100**,
# PyTorch's cross-entropy (`ignore_index=-100`) leaves that position out of the loss and of its average.
# Here the padding positions get -100: without that, most of each 512-token row would train the model to
# predict padding. The original material described a stricter scheme, with the prompt masked too, so that
# only the answer's tokens count. This workshop keeps the prompt in the loss (its loss then also measures
# how well the model copies question and context, and falls faster than the answer quality improves);
# masking it is one line in `CausalLMDataset`: set the labels of the prompt's tokens to -100 as well.
#
# **Exact match and F1** (`workshop_lib/train/evaluation.py`, the original's `evaluate_model` and
# `compute_em_and_f1`). After training, each held-out question's prompt, cut at `Answer:`, is fed to the
# model, which generates greedily (always the most likely token, at most 16 of them, stopping at the end
# token); the first line of that text is the prediction. Prediction and each reference answer are
# normalised the way SQuAD's official script does: lower case, punctuation removed, the articles *a*,
# *an*, *the* dropped, whitespace collapsed. *Exact match* is 1 when the two normalised strings are equal;
# *F1* compares them as bags of words, with precision = shared words / predicted words and recall = shared
# words / reference words. SQuAD lists several reference answers per question and a prediction keeps its
# best score over them; the reported figures are the means over the questions, in percent. With
# sharded parameters (FULL_SHARD) every forward pass is a collective, so all ranks keep generating until
# the slowest is done (`synced_gpus`).
#
# **Throughput, two ways.** The Trainer reports `train_samples_per_second` over the whole run,
# including the first steps and evaluation (the runs of this chapter save no checkpoint; the original
# material saved one every epoch, inside its runtime); the custom GPT's callback also times each
# training step on its own. The two disagree, and the tables show both.
#
# **The custom GPT** (`workshop_lib/train/gpt_model.py`) is a decoder-only transformer written out in
# full: token and position embeddings, pre-norm blocks of causal self-attention and a GELU feed-forward
# layer, a final LayerNorm and an output layer tied to the token embedding. Every size is an argument.

# %% tags=["hide-input"]
nb.say(claims.gpt_architecture(reference));

# %% [markdown]
# **Weak scaling by depth.** In the last experiment the GPT gets deeper as GPUs are added (3 layers on
# 2 GPUs, 6 on 4, 12 on 8, 24 on 16) while the per-GPU batch halves. *Efficiency* is
# step time(2 GPUs) / step time(*N* GPUs) × 100 %: 100 % means the extra GPUs absorbed the extra work
# without overhead. The work per GPU is not really constant: the embedding does not grow with the
# layers, so the model grows by less than the layer count.
#
# **Multi-node runs and NCCL.** Multi-node jobs start one `torchrun` per node with `srun`; every node
# connects to a static master address (the first node of the allocation) and a port chosen free when the
# job starts. On Ibex they first run an NCCL all-reduce test and stop if its bus bandwidth is below the
# profile's threshold. The Ibex profile exports two of the NCCL variables the original material used
# before that check (`bandwidth_check.environment` in `slurm/profiles/ibex.yml`), so the training inherits
# them:
#
# - `TORCH_NCCL_ASYNC_ERROR_HANDLING=1`: a rank whose collective fails or times out raises instead of
#   hanging, so a broken node ends the job rather than burning its hours.
# - `NCCL_IB_HCA=mlx5`: use the Mellanox InfiniBand adapters (all ports whose name starts with `mlx5`).
# - The original also set `NCCL_ALGO=Tree` (a fixed all-reduce algorithm instead of NCCL's choice per
#   message size), `NCCL_NET_GDR_LEVEL=4` (let the network card read GPU memory directly, GPUDirect RDMA,
#   up to the farthest PCIe distance) and `NCCL_SOCKET_IFNAME=ib0` (the interface for NCCL's bootstrap
#   connections). They are site tuning, not correctness: a profile can add them under
#   `bandwidth_check.environment`.
#   `NCCL_DEBUG=INFO` in a job prints which transport NCCL picked (look for `NET/IB` against `NET/Socket`).

# %% [markdown]
# ## Try a layout: the memory calculator
#
# The calculator below runs the workshop's estimator (`workshop estimate`) in the page, opened on this
# chapter's runs: pick another run of the chapter, or change the sharding strategy, the offload, the nodes or
# the model, and see what each GPU holds, whether it fits an A100-80GB, and the closest run measured on a real
# GPU.
#
# ```{raw} html
# <iframe class="memory-calculator" title="Memory calculator" loading="lazy"
#         src="../_static/memory-calculator/calculator.html?chapter=4&amp;experiment=fsdp/strategies/full-shard"
#         style="width: 100%; height: 900px; border: 1px solid #ddd;"></iframe>
# ```

# %% [markdown]
# ## The experiments, their scripts, and the jobs
#
# What the chapter runs, each experiment's script with the checker's findings (a `HYBRID_SHARD` run on one
# node, `--ntasks` where `torchrun` starts the processes, a fixed rendezvous port, GPUs requested and left
# unused), and the jobs: completed runs are reused, only what has not completed is submitted. The
# multi-node jobs take both nodes of the local cluster, so they run one at a time.

# %% tags=["hide-input"]
nb.experiments_overview(selection)
nb.show_scripts(selection);

# %% [markdown]
# ## How many GPUs, and how long on Ibex
#
# Before anything is submitted: how many GPUs this chapter's jobs ask for on Ibex, how they queue under
# KAUST's limit of 24 GPUs per user in running jobs, and about how long each job runs on an A100. The
# times come from the reference runs (H100/H200), scaled by the datasheet ratios named under the table,
# and the sentence is written from the same numbers. Whatever profile runs here, this is the Ibex plan.

# %% tags=["hide-input"]
nb.show_time_plan(selection);

# %% tags=["hide-input"]
runs = nb.run_experiments(selection, runs_dir, wait_timeout_s)

# %% [markdown]
# ## Exercise: read the memory line yourself
#
# Open the baseline's log, `runs/fsdp/baseline/slurm-<job id>.out`, and find the Trainer's final
# dictionary (it contains `'train_runtime'`): note `train_samples_per_second` and `train_runtime`, and
# compute the samples per second yourself from the number of samples and the runtime. Then compare with
# the baseline table below. The next cell shows the line from your run.

# %% tags=["hide-input"]
nb.show_log_lines("fsdp/baseline", "train_runtime", runs_dir);

# %% [markdown]
# ## Results: the baseline
#
# **Exact match and F1** are 0 in the reference: its weights are random and it trains 30 steps, so it
# generates no answer that matches SQuAD's. On Ibex the trained BLOOM-560m gives real scores.

# %% tags=["hide-input"]
nb.show_results(selection, ["baseline"], runs_dir, plots=False)

# %% [markdown]
# ## Results: the sharding strategies
#
# The strategy comparison asks for 2 nodes × 2 GPUs. The reference ran it on one machine with four GPUs,
# each half of them playing one node: each half's `torchrun` got its own node rank, node name and two GPUs,
# as `srun` would hand them out, so the rendezvous, the per-node monitors and HYBRID_SHARD's node groups
# behave as on a cluster. Only the link between the two "nodes" differs: NVLink inside one machine instead
# of a network, which flatters every strategy that talks across nodes.

# %% tags=["hide-input"]
nb.show_results(selection, ["strategies"], runs_dir)
nb.say(claims.fsdp_strategies(reference));

# %% [markdown]
# **Reading your tiny runs.** Offload can look free, or even faster, on the tiny profile: a CPU "device"
# and the host share one memory, so there is no PCIe copy to pay for, and a step of a tiny model is
# dominated by start-up and gloo messages. On GPUs it costs what the sentence just above states.
#
# **HYBRID_SHARD has no reference row yet.** It has not been measured on GPUs with the strategy it
# should have; your tiny runs show it, with 2 ranks per shard group (the *Shard Group* column records the
# group each run really got, so a run that fell back to another strategy would show it).
#
# ## Results: BLOOM-560m on one node

# %% tags=["hide-input"]
nb.show_results(selection, ["multi-gpu"], runs_dir)
nb.say(claims.fsdp_single_gpu(reference))
nb.say(claims.fsdp_one_node(reference));

# %% [markdown]
# **What kind of scaling this is.** The original experiment trains a fixed data set for full epochs:
# strong scaling, where more GPUs should finish sooner. The reference and the tiny runs instead train a
# fixed number of optimizer steps with the same batch per GPU, so each GPU does the same work at every
# GPU count: weak scaling. Each table says which one its rows measured, and computes efficiency from the
# per-step time, not from a runtime that start-up dominates in a short run.
#
# **Reading your tiny runs.** The tiny runs spend most of their time starting processes and exchanging
# shards between CPU ranks that share two cores, so the step time grows quickly with the rank count. What
# carries over: every strategy reaches the same loss (sharding changes where the numbers live, not the
# arithmetic), and the model states per rank fall as 1/*N*. Tiny timings also come from a CPU machine
# that other work shares: a run that happened to share the cores is slower, so tiny efficiencies swing
# far above and below 100 %.
#
# ## Results: BLOOM-560m across nodes

# %% tags=["hide-input"]
nb.show_results(selection, ["multi-node"], runs_dir, missing="needs several nodes of a real cluster")

# %% [markdown]
# ## Results: the custom GPT

# %% tags=["hide-input"]
nb.show_results(selection, ["gpt", "gpt-multi-node"], runs_dir)

# %% [markdown]
# ## Results: weak scaling by depth

# %% tags=["hide-input"]
nb.show_results(selection, ["weak-scaling"], runs_dir)
nb.say(claims.gpt_depth(reference));

# %% [markdown]
# ## Results: predicted against measured memory
#
# The memory estimator beside the tensor bytes each run counted on rank 0: the model states each rank
# holds when the optimizer step begins, and the peak of one step (on a CPU counted tensor by tensor, on a
# GPU by the CUDA allocator). Chapter 3's section *Weak scaling: DDP, ZeRO-2 and FSDP side by side* puts
# FULL_SHARD next to DDP and ZeRO-2 on the same run.

# %% tags=["hide-input"]
nb.show_results(selection, ["prediction"], runs_dir, plots=False)

# %% [markdown]
# ## GPU utilisation
#
# The original callback logged `utilization.gpu` next to the memory; the seed's tables have a column
# for it. This workshop's GPU monitor records it beside the memory, and the tables above fill the seed's
# *GPU Utilization (%)* column (and add it to the BLOOM and strategy tables) with GPU 0's mean over the
# samples taken while training, where the runs recorded it (not on the tiny profile's CPUs). See
# chapter 3's section *GPU utilisation* for what the figure means, how it is averaged and how to watch it
# on a running job.

# %% [markdown]
# ## Optional: the class's runs
#
# On the workshop day each participant runs part of the chapter, and the class fills the tables together. This
# cell publishes your completed runs to the class folder (into a folder of your own there: nobody else can change
# or delete what you publish) and shows the chapter's tables filled by everyone's runs. Where the class has no
# folder (working alone, or the book) it says so and does nothing. From a shell:
# `workshop class publish --chapter 4` and `workshop class pool --chapter 4`.

# %% tags=["hide-input"]
nb.show_class_results(selection, runs_dir);

# %% [markdown]
# ## Questions
#
# Answers: {doc}`../book/answers` (section *Chapter 4*).
#
# 1. How do you compute the steps per epoch from the settings?
# 2. Which sharding strategy would you choose, and when would you offload?
# 3. Why wrap `BloomBlock`, and how much of BLOOM-560m is in those blocks?
# 4. How do samples/s, runtime and memory change from 1 to 8 GPUs?
# 5. Why do the "default" and the "callback" columns disagree?
# 6. What does the NCCL bandwidth test check, and what does a low result mean?
# 7. Multi-node with one GPU per node: what should you expect?
# 8. Weak scaling by depth: how is efficiency computed, and is the workload really constant?
#
# ## Where the original material was wrong
#
# - It computed weak-scaling efficiency as current ÷ baseline runtime × 100, which exceeds 100 % when
#   a run gets *slower*. The right ratio is baseline ÷ current × 100, as used above.
# - Its two names for the same settings disagree: the description of `baseline.py` maps the Trainer's
#   accumulation and learning rate to `GRAD_ACC_STEPS` and `LR`, while every `env_vars.sh` it shows exports
#   `GRAD_ACC` and `LEARNING_RATE`. The scripts themselves are not part of the material, so which name they
#   read cannot be checked from it; whichever it is, one side is set for nothing. Its weak-scaling rule
#   "total batch = GPUs × per-device batch" counts one micro-batch per GPU per step: with accumulation
#   (4 in the `env_vars.sh` files shown; the weak-scaling one shows only `BATCH_SIZE` and `NUM_LAYERS`) a
#   step takes that many times more samples. Here batch and accumulation are fields of each experiment
#   and reach the trainer as arguments.
# - It said the model "doubles" with the layer count; the fixed embedding makes it grow by less (above).
# - It put about 80 % of BLOOM-560m's parameters in its blocks; they hold about half, the embedding
#   most of the rest.
# - Its multi-node launch gave every node `--node_rank=$SLURM_NODEID` expanded once by the batch shell
#   (so all nodes claimed rank 0). It ran anyway because its rendezvous backend, c10d, assigns node ranks
#   itself and ignores `--node_rank`; with a static rendezvous, as in the scripts above, every node must expand its own. Several
#   scripts reserved 8 GPUs to use 1 or 2. The scripts above ask for exactly the GPUs they use.
#
# Details: {doc}`../book/seed_corrections`.
