# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 3: DeepSpeed ZeRO
#
# Data parallelism keeps a full copy of everything on every GPU. **ZeRO** (the *Zero Redundancy
# Optimizer* of DeepSpeed) removes that redundancy step by step: stage 1 divides the optimizer
# states among the GPUs, stage 2 also the gradients, stage 3 also the parameters. **Offload** moves
# some of those states into the host's memory and lets the CPU run the optimizer. This chapter
# fine-tunes BLOOM-560m on SQuAD with the Hugging Face Trainer and measures each option on one GPU,
# then scales out: several GPUs of one node, the stages on two GPUs, and several nodes.
#
# ```{admonition} Where this runs
# :class: note
# On Ibex (`profile = "ibex"`) each run is BLOOM-560m on A100s with fp16, batch 4 × accumulation 4,
# three epochs, GPU memory sampled by `nvidia-smi` and host memory by `psrecord`. On the **tiny
# profile** the same Trainer + DeepSpeed code runs on CPU processes with a tiny random BLOOM, fp32,
# synthetic SQuAD-style data and a few steps. DeepSpeed really partitions and offloads there (it uses
# its CPU accelerator and gloo instead of NCCL), so the *structure* of the results is real, but there
# is no GPU memory to measure: the memory figures are each process's own peak, and CPU memory comes
# from `psrecord` as on Ibex.
# ```

# %% tags=["parameters"]
profile = "tiny"  # "ibex" on the cluster, "tiny" anywhere else
experiments = None  # None: every experiment of the chapter that the profile can run; or a list of ids
wait_timeout_s = 2400  # stop waiting after this long (jobs keep running; re-run the cell to pick them up)
runs_dir = None  # None: <repository>/runs (or $WORKSHOP_RUNS_DIR)
recipe = "seed"  # "seed": the original material's recipe (comparable numbers); "tuned": the faster one

# %%
from workshop_lib import notebook as nb

selection = nb.chapter_header(3, profile, experiments, runs_dir, recipe)
nb.experiments_overview(selection);

# %% [markdown]
# ## The ideas
#
# **Where the memory goes.** Training a model of Ψ parameters with Adam in mixed precision keeps, per
# GPU: 2Ψ bytes of 16-bit parameters, 2Ψ of 16-bit gradients and 12Ψ of optimizer states (an fp32
# master copy of the weights plus Adam's two fp32 moments): **16Ψ** in total, 9 GB for BLOOM-560m
# before any activation. Plain data parallelism keeps all 16Ψ on each of the *N*<sub>d</sub> GPUs.
# ZeRO divides them:
#
# | ZeRO stage | what is divided over the *N*<sub>d</sub> GPUs | model-state bytes per GPU |
# |---|---|---|
# | 0 | nothing (plain data parallel) | 2Ψ + 2Ψ + 12Ψ |
# | 1 | optimizer states | 2Ψ + 2Ψ + 12Ψ/*N*<sub>d</sub> |
# | 2 | + gradients | 2Ψ + (2 + 12)Ψ/*N*<sub>d</sub> |
# | 3 | + parameters | (2 + 2 + 12)Ψ/*N*<sub>d</sub> |
#
# Stages 1 and 2 cost no extra communication: the all-reduce of plain data parallelism is replaced
# by a reduce-scatter (each GPU receives only the gradient slice it updates) and an all-gather of
# the updated weights, the same volume. Stage 3 gathers each layer's parameters just before it runs,
# in the forward and again in the backward pass: about 1.5× the communication, in exchange for
# memory that keeps falling as GPUs are added. None of the stages touches the **activations**; those
# depend on the batch, the sequence length and the model's width.
#
# **On one GPU**, *N*<sub>d</sub> = 1 and there is nobody to share with: stages 1 and 2 save nothing
# (stage 3 may save a little through the way it allocates). That is what the single-GPU table is
# for: it isolates the overhead of each stage and the effect of offload.
#
# **CPU offload** (`offload_optimizer`, and at stage 3 also `offload_param`) keeps the fp32 master
# weights and Adam moments, 12Ψ, in host memory and runs the Adam step on the CPU with DeepSpeed's
# vectorised CPU Adam. The GPU keeps only the 16-bit weights and gradients; gradients go to the host
# and updated weights come back every step over PCIe. It trades GPU memory for host memory and time.
# **Pinned memory** (`pin_memory: true`) allocates those host buffers page-locked, so copies can use
# DMA and overlap with compute: faster transfers, at the price of memory the operating system cannot
# swap or reuse.
#
# **`"auto"` in the configuration** (`slurm/ds_configs/*.json`) means "take the value from the
# Trainer's arguments" (batch size, accumulation, learning rate, fp16), so the script and the JSON
# never disagree. DeepSpeed does not search for anything.
#
# **Launching.** DeepSpeed needs a distributed launcher even on one GPU. Here every run is started by
# `torchrun`, which sets `RANK`, `LOCAL_RANK` and `WORLD_SIZE` for each process; multi-node runs use
# `srun` to start one `torchrun` per node and a c10d rendezvous on the first node
# ({doc}`../book/slurm_primer`).
#
# **Weak scaling.** In the multi-GPU and multi-node runs the data grows with the GPUs (500 samples per
# GPU on one node, 250 per GPU across nodes), so each GPU does the same work whatever the count.
# Ideally the runtime stays constant and the *total* throughput (`train_samples_per_second`, summed
# over all GPUs) grows linearly.

# %% [markdown]
# ## The job scripts
#
# Each experiment's script, folded, with the checker's findings (offload with stage 0, pinned memory
# without offload, a DeepSpeed JSON that offloads at stage 0, killed monitor PIDs that live in another
# shell, a fixed rendezvous port). The DeepSpeed configuration the script names is copied into the run
# folder at submission, so editing `slurm/ds_configs/` later cannot change a queued job.

# %%
nb.show_scripts(selection);

# %% [markdown]
# ## Submit and wait
#
# DeepSpeed compiles a few of its CPU operations the first time they are used (cached in
# `~/.cache/torch_extensions` afterwards), so the first runs on a fresh machine take longer.
# Completed runs are reused; only what has not completed is submitted.

# %%
runs = nb.run_experiments(selection, runs_dir, wait_timeout_s)

# %% [markdown]
# ## Results
#
# The seed's tables: the baseline summary, the single-GPU stage comparison, weak scaling on one
# node, the 2-GPU stage comparison with and without offload, and weak scaling across nodes. The last
# table puts the memory estimator's prediction (the formulas above, plus activations and logits,
# `workshop estimate`) next to what each run measured: the tensor bytes of one training step on rank 0,
# counted by the engine itself (model states when the optimizer step begins, and the step's peak), which
# is what the formulas predict even on the tiny profile. A cell shows the run's state when it did not
# complete and `n/a` when the run did not record the value (no `nvidia-smi` on the tiny profile).

# %%
nb.show_tables(selection, runs_dir);

# %%
nb.show_plots(selection, runs_dir);

# %% [markdown]
# **Reading the tiny results.** With a model of a few hundred thousand parameters the model states are
# a rounding error next to the Python process, so the per-process memory barely moves between stages
# (the prediction table, which counts tensor bytes, does show each stage's share; its ZeRO peaks are
# mostly DeepSpeed's gradient bucket of 5·10⁸ elements, allocated whatever the model's size);
# the differences you can see are in time (stage 3 and offload add work per step) and in CPU memory
# (offload and pinned buffers live in host memory, which `psrecord` records). On A100s with
# BLOOM-560m the GPU memory column is where the stages separate: on one GPU only offload (and
# stage 3's parameter offload) lowers the peak, and on two GPUs each stage lowers it further.

# %% [markdown]
# ## Measured on real GPUs
#
# The same experiments at real size — BLOOM-560m's architecture (random weights, so the loss means
# nothing, but memory and speed are the real model's), 512-token samples, the seed's recipe, 30 optimizer
# steps — rendered with the `gpu-workstation` profile and run through the local executor on one machine
# with four H200 GPUs (`benchmarks/reference_runs.py`). Multi-node rows need a real cluster and are empty.
# Things to notice: on one GPU, ZeRO stages 1–3 change nothing (there is nobody to share with) while
# offload cuts GPU memory and costs time; pinned host memory more than doubles the speed of optimizer
# offload; on two GPUs each stage lowers the per-GPU memory, and stage 3 pays for it in throughput.

# %%
nb.show_reference_tables(3);

# %% [markdown]
# ## Weak scaling: DDP, ZeRO-2 and FSDP side by side
#
# The same run — BLOOM-560m, the seed's recipe (fp16, batch 4 × accumulation 4), 500 samples per GPU —
# under three data-parallel engines on 1, 2 and 4 H200s (experiments `scaling/ddp|zero2|full-shard/N-gpus`,
# not part of the tiny workshop; `workshop submit scaling/zero2/4-gpus` runs one on Ibex). Each GPU does
# the same work, so a perfect engine keeps the step time flat: efficiency = *T*<sub>1</sub>/*T*<sub>N</sub>.
#
# - **DDP** keeps its step time flat to 4 GPUs (0.257 s on 2 and on 4 GPUs; the 1-GPU step measured
#   0.227–0.270 s in two runs, so 88–105 %) once one default is fixed. The Trainer sets
#   `ddp_find_unused_parameters=True` for a model without gradient checkpointing, which makes DDP walk
#   the whole autograd graph after every forward — four times per optimizer step here. With it, the
#   4-GPU step took 0.299 s against 0.227 s on one GPU (76 %); the profile showed every CPU-side operator
#   1.5–1.8× slower and the GPUs idle, while the all-reduce itself (2.2 GB of fp32 gradients, once per
#   step) took 12 ms. The workshop's engine now passes `False`: every parameter gets a gradient.
# - **ZeRO-2** scales *above* 100 %: its optimizer works on 1/*N* of the parameters, so the optimizer
#   step shrinks as GPUs are added, which more than pays for reducing gradients at every micro-batch.
# - **FSDP FULL_SHARD** falls to about 60 % at 4 GPUs: it gathers every unit's parameters again for each
#   micro-batch's forward and backward — 4 micro-batches × 2 × 25 units = 200 all-gathers per step,
#   a third of the step's GPU time in the profile. With gradient accumulation, `SHARD_GRAD_OP` or fewer,
#   larger micro-batches communicate far less.

# %%
nb.show_engine_scaling();

# %% [markdown]
# ## The tuned recipe: how far it goes and why
#
# The exercises keep the seed's recipe so that their numbers compare with the original material. The
# workshop also has a tuned one: set `recipe = "tuned"` in the parameters cell (or pass `--recipe tuned`
# to `workshop_lib.train.hf`) and the Trainer runs get their own `…-tuned` ids and run folders. It adds,
# in order: bf16 instead of fp16; the four accumulated micro-batches as one batch of 16 (same global batch
# and optimizer steps); each batch padded to its longest sample instead of to 512 tokens; batches of
# similar lengths (the synthetic prompts average 218 tokens); the cross-entropy over the 250,880-word
# vocabulary computed in chunks so the full logits never exist, with each chunk's loss and gradient as
# fused compiled kernels; fused AdamW; `torch.compile` of each transformer block, its kernels launched
# from compiled C++ rather than generated Python; and the objects alive at the start of training frozen
# out of Python's garbage collector. The benchmark (`benchmarks/recipe_benchmark.py`) runs the real entry
# point on one GPU, same samples, same steps: most of the gain comes from not computing on padding and
# from larger matrix products. The last two changes are about the CPU: a profile of the tuned step showed
# the GPU busy only half of the time, waiting for Python to launch its ~1,000 kernels, so every
# microsecond of host work per kernel counts. The same reason makes the seed's own speed depend on the
# host's CPU: it ran at 50.6 samples/s in the run below and at 66.6 on another day, so compare recipes
# only within one run. A 4× larger batch
# (`+large-batch`) runs faster still, but a quarter of the optimizer steps costs 17–42 % in loss in a
# run this short, so the tuned recipe leaves it out. What each change was predicted to do and did is in
# `benchmarks/NOTES.md`.

# %%
nb.show_recipe_benchmark();

# %% [markdown]
# ## Questions
#
# Answers: {doc}`../book/answers` (section *Chapter 3*).
#
# 1. Baseline: how many optimizer steps does one epoch take, and how do you compute it from the
#    settings?
# 2. Baseline: what do the training and evaluation losses tell you?
# 3. On one GPU, why do ZeRO stages 1 and 2 without offload save no memory?
# 4. Which ZeRO stage gave the lowest peak GPU memory?
# 5. How does the runtime change when offloading is enabled, stage by stage?
# 6. Under weak scaling, should the peak GPU memory per GPU stay constant? Explain any deviation.
# 7. On two GPUs, what should stages 1, 2 and 3 show, with and without offload?
# 8. Should `train_samples_per_second` stay constant as nodes are added under weak scaling?
# 9. Does the average GPU memory increase, decrease or stay stable with more nodes?
#
# ## Where the original material was wrong
#
# - It explained `"auto"` as "the largest batch that fits"; under the Trainer it means "the
#   Trainer's value".
# - It credited stage 2 with reducing activation memory; stage 2 divides gradients (and optimizer
#   states), never activations. And the largest saving is stage 3 with parameter offload, not stage
#   2 with offload.
# - Its "no ZeRO" multi-GPU exercise launched with a stage-2 offload configuration; here the
#   weak-scaling runs use stage 0 (DeepSpeed's data parallelism without partitioning).
# - It expected `train_samples_per_second` to stay constant under weak scaling. That figure is the
#   total over all GPUs and should *grow* with them; what should stay constant is the per-GPU share.
# - It read "steps per epoch" from `93/93`, which counts all three epochs (31 per epoch), and its
#   samples/s formula left out gradient accumulation.
# - It said `LOCAL_RANK` comes from SLURM; `torchrun` sets it (SLURM's equivalent is
#   `SLURM_LOCALID`). The multi-node run here keeps 250 samples per GPU, as the text said (the code
#   said 10 000, more than SQuAD has at 16 GPUs).
#
# Details: {doc}`../book/seed_corrections`.
