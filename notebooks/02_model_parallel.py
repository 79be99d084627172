# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 2: Model parallel fine-tuning without LoRA
#
# Chapter 1 made the models fit by training almost nothing. This chapter trains **every weight** of
# Llama 3.1 8B and Mixtral 8×7B. Full fine-tuning needs roughly 16 bytes per parameter for weights,
# gradients and Adam states, far more than one GPU has, so the model itself must be cut into pieces
# that live on different GPUs: *model parallelism*. You will use **tensor parallelism** (TP) for both
# models, **expert parallelism** (EP) for Mixtral's experts, and **sequence parallelism** (SP) to
# divide the activations that tensor parallelism leaves whole.
#
# ```{admonition} Where this runs
# :class: important
# On Ibex (`profile = "ibex"`) these are NeMo Factory runs with `peft=none` and Megatron's
# tensor/expert/sequence parallelism, in the NeMo container on A100s. On the **tiny profile** NeMo is
# replaced by a **PyTorch stand-in** (`workshop_lib.train.parallel`): tiny random Llama and Mixtral
# models loaded with `transformers`' native tensor/expert-parallel plans under `torchrun`, trained in
# full (no LoRA) on synthetic data, on CPU processes. The sharding is real (each rank holds a slice of
# every layer, and the losses match an unsharded run), but it is PyTorch's DTensor implementation,
# not Megatron's: no fused kernels, no distributed optimizer, and on the tiny profile sequence
# parallelism is passed along but has nothing measurable to save. No GPU memory monitor runs there,
# so memory is each process's own peak.
# ```

# %% tags=["parameters"]
profile = "tiny"  # "ibex" on the cluster, "tiny" anywhere else
experiments = None  # None: every experiment of the chapter that the profile can run; or a list of ids
wait_timeout_s = 1800  # stop waiting after this long (jobs keep running; re-run the cell to pick them up)
runs_dir = None  # None: <repository>/runs (or $WORKSHOP_RUNS_DIR)

# %%
from workshop_lib import notebook as nb

selection = nb.chapter_header(2, profile, experiments, runs_dir)
nb.experiments_overview(selection);

# %% [markdown]
# ## The ideas
#
# **Tensor parallelism** splits the big matrices *inside* every layer. In a transformer block the
# first linear layer of a pair is split by columns and the second by rows (Megatron's scheme), so each
# of the TP GPUs computes its share of the attention heads and of the feed-forward hidden units
# without talking to the others, and one all-reduce per pair puts the output back together. Every GPU
# then holds about 1/TP of the layer weights, their gradients and optimizer states: memory for model
# states falls roughly as 1/TP. The price is communication *inside* every layer, twice per block in
# the forward pass and twice in the backward pass, which is why TP stays inside one node where GPUs
# are linked by NVLink. (Placing *whole layers* on different GPUs is a different technique, pipeline
# parallelism, which this workshop does not use.)
#
# **Expert parallelism** is the natural split for a mixture of experts: each of the EP GPUs keeps a
# subset of the experts. Tokens are routed to the GPU that holds their expert and back with two
# all-to-all exchanges per MoE layer. Combined with TP, Mixtral's experts are split over TP × EP GPUs
# while the attention layers are split over TP.
#
# **Sequence parallelism** attacks what tensor parallelism leaves whole: the layer norms and dropouts
# between the split matrices work on the full activations on every TP rank. SP cuts those activations
# along the sequence dimension over the same TP group, turning each all-reduce into a
# reduce-scatter plus an all-gather of the same total size. It saves activation memory at no extra
# communication, but only exists together with TP (Megatron refuses SP when TP = 1, and requires it
# when TP > 1 is combined with EP > 1).
#
# **How many GPUs?** Without data parallelism, every GPU holds a different slice of the model, so
# GPUs = TP × EP × PP. Any extra factor would be data parallelism: GPUs = TP × EP × PP × DP. The
# layouts here are Llama with TP = 2, 4, 8, and Mixtral with TP = 2 × EP = 2 on 4 GPUs and
# TP = 4 × EP = 2 on 8, both with SP. There is no single-GPU run: fully fine-tuning either model on one
# A100 does not fit.
#
# **Why LoRA is off.** With LoRA the trainable part is tiny, so the memory that model parallelism is
# meant to divide (gradients and optimizer states of every weight) is not there to divide. The
# checker rejects a model-parallel experiment with LoRA left on.
#
# **What to expect.** Per-GPU memory should fall as TP grows (the weights, gradients and optimizer
# states divide; activations and buffers only partly). The step time does not fall like data
# parallelism's: all TP ranks work on the *same* samples, and each extra rank adds communication, so a
# higher TP buys memory, not speed. The batch per GPU stays the whole global batch, because there is no
# data-parallel dimension to split it.

# %% [markdown]
# ## The job scripts
#
# Each experiment's script as this profile submits it, folded, with the checker's findings (parallel
# sizes that do not multiply to the GPU count, Mixtral without EP, SP without TP, LoRA left on).

# %%
nb.show_scripts(selection);

# %% [markdown]
# The same Mixtral layout as Ibex runs it with NeMo: note `peft=none`, the three `trainer.strategy`
# overrides and `trainer.devices` equal to TP × EP.

# %%
nb.show_reference_script("model-parallel/mixtral/tp2-ep2-sp", "ibex");

# %% [markdown]
# ## Submit and wait
#
# Completed runs of the same experiment are reused; only what has not completed is submitted.

# %%
runs = nb.run_experiments(selection, runs_dir, wait_timeout_s)

# %% [markdown]
# ## Results
#
# Ratios compare with the smallest layout that fits: 2 GPUs for Llama, 4 for Mixtral.

# %%
nb.show_tables(selection, runs_dir);

# %%
nb.show_plots(selection, runs_dir);

# %% [markdown]
# **Reading the tiny results.** A tiny model split over more CPU ranks gets slower: there is almost no
# arithmetic to divide and every layer now waits for collective communication. What carries over to
# real hardware is the bookkeeping: each rank holds 1/TP of the sharded weights, the losses do not
# depend on the layout (the split changes who computes, not what), and the global batch is the batch
# of every rank. On A100s the interesting numbers are the peak memory per GPU falling with TP and the
# step time staying flat or rising.

# %% [markdown]
# ## Questions
#
# Answers: {doc}`../book/answers` (section *Chapter 2*).
#
# 1. Why is there no single-GPU run in this chapter?
# 2. Why turn LoRA off here?
# 3. How many GPUs does a layout need? Is "total GPUs = TP × EP" a rule?
# 4. What goes in the "batch per GPU" column?
# 5. How does the peak memory per GPU change from TP = 2 to 4 to 8 (Llama)?
# 6. How does the step time change with more tensor parallelism?
# 7. Why does sequence parallelism need tensor parallelism?
# 8. What changes for Mixtral between 4 and 8 GPUs?
#
# ## Where the original material was wrong
#
# - Its "try it yourself" list asked for LoRA runs on 1–8 GPUs, copied from the data-parallel
#   chapter; this chapter has LoRA off, Llama on TP 2/4/8 and Mixtral on 4/8 GPUs only.
# - It said tensor parallelism distributes the model's *layers*; TP splits the matrices inside each
#   layer. Whole layers on different GPUs is pipeline parallelism.
# - It gave Mixtral "~24 B parameters"; the model has about 46.7 B, about 12.9 B active per token.
# - It listed TP = 1 layouts next to Mixtral overrides that switch SP on; SP needs TP ≥ 2, and the
#   checker says so.
# - It presented "total GPUs = TP × EP" as a rule; it holds only without data parallelism.
#
# Details: {doc}`../book/seed_corrections`.
