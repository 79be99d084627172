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
# Where an experiment was measured **on real GPUs**, its results section shows that reference first
# (with where and how it ran), then the same table from **your runs**, titled by the profile that produced
# them. The multi-node section has no such measurement (it needs several nodes of a real cluster) and says
# so; there your runs are the only numbers. The sentences that state measured orderings and figures are
# written from the reference data when the page is built.
#
# ```{admonition} Where this runs
# :class: note
# On Ibex (`profile = "ibex"`) each run is BLOOM-560m on A100s with fp16, batch 4 × accumulation 4,
# three epochs, GPU memory sampled by `nvidia-smi` and host memory by `psrecord`. On the **tiny
# profile** the same Trainer + DeepSpeed code runs on CPU processes with a tiny random BLOOM
# (`tiny-bloom`, a stand-in for BLOOM-560m), fp32, synthetic SQuAD-style data and a few steps. DeepSpeed
# really partitions and offloads there (it uses its CPU accelerator and gloo instead of NCCL), so the
# *structure* of the results is real, but there is no GPU memory to measure: your tables then show the
# tensor bytes each rank holds, counted by the engine, where GPU memory would be.
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

selection = nb.chapter_header(3, profile, experiments, runs_dir, recipe)
reference = nb.reference_results(3)[1]

# %% [markdown]
# ## The ideas
#
# **Where the memory goes.** Training a model of Ψ parameters with Adam in mixed precision keeps, per
# GPU, these **model states**: 2Ψ bytes of 16-bit parameters, 2Ψ of 16-bit gradients and 12Ψ of
# optimizer states (an fp32 master copy of the weights plus Adam's two fp32 moments): **16Ψ** in total,
# 8.3 GiB for BLOOM-560m's 559 M parameters. Plain data parallelism keeps all 16Ψ on each of the
# *N*<sub>d</sub> GPUs. ZeRO divides them:
#
# | ZeRO stage | what is divided over the *N*<sub>d</sub> GPUs | model-state bytes per GPU |
# |---|---|---|
# | 0 | nothing (plain data parallel) | 2Ψ + 2Ψ + 12Ψ |
# | 1 | optimizer states | 2Ψ + 2Ψ + 12Ψ/*N*<sub>d</sub> |
# | 2 | + gradients | 2Ψ + (2 + 12)Ψ/*N*<sub>d</sub> |
# | 3 | + parameters | (2 + 2 + 12)Ψ/*N*<sub>d</sub> |
#
# The table counts model states only. A GPU also holds the **activations** kept for the backward pass,
# the **logits** (one score per vocabulary word per token: BLOOM has 250,880 words) and working buffers;
# none of the stages divides those. The results below show how much that matters.

# %% tags=["hide-input"]
nb.show_figure(plots.memory_layout_diagram(plots.zero_layouts(2), "What each of 2 GPUs keeps, per ZeRO stage"));

# %% [markdown]
# Stages 1 and 2 cost no extra communication: the all-reduce of plain data parallelism is replaced
# by a reduce-scatter (each GPU receives only the gradient slice it updates) and an all-gather of
# the updated weights, the same volume. Stage 3 gathers each layer's parameters just before it runs,
# in the forward and again in the backward pass: about 1.5× the communication, in exchange for
# model states that keep falling as GPUs are added. **On one GPU**, *N*<sub>d</sub> = 1 and there is
# nobody to share with: the single-GPU table isolates the overhead of each stage and the effect of offload.
#
# **CPU offload** (`offload_optimizer`, and at stage 3 also `offload_param`) keeps the fp32 master
# weights and Adam moments, 12Ψ, in host memory and runs the Adam step on the CPU. The GPU keeps the
# 16-bit weights and gradients; gradients go to the host and updated weights come back every step over
# PCIe. **Which optimizer ran:** the configurations in `slurm/ds_configs/` have no `optimizer` block, so
# DeepSpeed steps the Trainer's own `torch.optim.AdamW` on the CPU copy (`zero_force_ds_cpu_optimizer:
# false`). The original material used DeepSpeed's `DeepSpeedCPUAdam`, a vectorised C++ Adam that is
# faster on the CPU but is compiled on the node the first time it is used. The offload figures below are therefore torch AdamW's; put the seed's `optimizer`
# block back into a configuration to measure CPU Adam. **Pinned memory** (`pin_memory: true`) allocates
# the host buffers page-locked, so copies can use DMA and overlap with compute: faster transfers, at the
# price of memory the operating system cannot swap or reuse. How much that buys depends on how often a
# stage copies: the results below show it for stage 2, which moves gradients to the host after every
# micro-batch.
#
# **The configuration itself.** This is the file the stage-2 offload runs use; `"auto"` means "take the
# value from the Trainer's arguments" (batch size, accumulation, fp16), so the script and the JSON never
# disagree. DeepSpeed does not search for anything.

# %% tags=["hide-input"]
nb.show_file("slurm/ds_configs/zero2_offload_pinned.json");

# %% [markdown]
# Key by key, and what the original material's file had that this one leaves out:
#
# | key | value here | what it does |
# |---|---|---|
# | `train_batch_size` | `"auto"` | samples per optimizer step over all GPUs. DeepSpeed checks that it equals micro-batch × accumulation × GPUs; `"auto"` lets the Trainer compute it (4 × 4 × 1 = 16 on one GPU). It does not look for the largest batch that fits. |
# | `train_micro_batch_size_per_gpu` | `"auto"` | samples in one forward and backward pass on one GPU: the Trainer's `--per-device-batch` (4). |
# | `gradient_accumulation_steps` | `"auto"` | micro-batches summed before each optimizer step: the Trainer's `--grad-accum` (4). DeepSpeed's engine, not the Trainer, decides where a step ends, and ZeRO-2 with offload copies gradients at every one of these micro-batches. |
# | `gradient_clipping` | `1.0` | rescales the gradients when their global L2 norm exceeds 1.0, before the update. With ZeRO the norm is computed over all partitions (one extra reduction). |
# | `fp16.enabled` / `bf16.enabled` | `"auto"` | mixed precision as the Trainer's `--precision` says (fp16 in these runs, as in the seeds). With fp16 DeepSpeed adds dynamic loss scaling: it multiplies the loss before backward and skips a step whose gradients overflow. |
# | `zero_allow_untested_optimizer` | `true` | accepts an optimizer DeepSpeed did not create (the Trainer's `torch.optim.AdamW`). Without it DeepSpeed refuses any optimizer it has not tested with ZeRO. |
# | `zero_force_ds_cpu_optimizer` | `false` | with offload, lets that torch AdamW step on the host copy instead of requiring DeepSpeed's compiled `DeepSpeedCPUAdam`. |
# | `steps_per_print` / `wall_clock_breakdown` | `1000000` / `false` | keep DeepSpeed's own progress and timing lines out of the log; the Trainer logs the metrics. |
# | `zero_optimization.stage` | `2` | what is partitioned: 1 optimizer states, 2 also gradients, 3 also parameters; 0 turns ZeRO off and keeps DeepSpeed's engine (its fp16 optimizer and loss scaling). |
# | `offload_optimizer.device` | `"cpu"` | keeps the fp32 master weights and Adam moments in host memory and runs the update there. |
# | `offload_optimizer.pin_memory` | `true` | allocates those host buffers page-locked (the unpinned files say `false`). |
# | `offload_param` (stage 3 file only) | `{"device": "cpu"}` | also keeps the 16-bit parameters on the host; each layer's are fetched for its forward and backward pass. |
#
# The original material's files also had an `optimizer` block (`AdamW`, learning rate 5e-5, betas 0.9 and
# 0.999, eps 1e-8, weight decay 0.01). Here those values come from the Trainer's own flags and the Trainer
# builds the optimizer, for the reason given above. Every other setting (bucket sizes, `overlap_comm`,
# `contiguous_gradients`, stage 3's prefetch and persistence thresholds) is DeepSpeed's default; the
# [configuration reference](https://www.deepspeed.ai/docs/config-json/) lists them.

# %% [markdown]
# **Data and prompt.** Each SQuAD example becomes one training text,
# `Question: <question> Context: <context> Answer: <answer><eos>` (`workshop_lib/train/data.py`), tokenized,
# padded or cut to 512 tokens. The labels are the input ids (a causal language model learns to predict
# each next token) with the padding positions set to −100, the value the loss skips, so the model is not
# trained to predict padding. The baseline and single-GPU runs take 500 examples; the multi-GPU runs
# take 500 *per GPU* (weak scaling: the data grows with the GPUs), the multi-node runs 250 per GPU.
# After training, the model answers held-out questions by greedy generation from the prompt up to
# `Answer:`, scored with SQuAD's **exact match** and **F1** (token overlap).
#
# **The Trainer's settings** are the original material's: learning rate 5e-5, weight decay 0.01, fp16,
# per-device batch 4 with 4 accumulated batches, three epochs, evaluation at the end of each epoch and no
# gradient checkpointing. One departure: the original saved a checkpoint every epoch; the runs here save
# none (`--save-checkpoints` is off), so their `train_runtime` leaves out the seconds a save would add.
#
# **Launching.** DeepSpeed needs a distributed launcher even on one GPU: every run is started by
# `torchrun`, which sets `RANK`, `LOCAL_RANK` and `WORLD_SIZE` for each process. Multi-node runs use
# `srun` to start one `torchrun` per node; all of them connect to a static master address (the first
# node of the allocation) and a port chosen free when the job starts (`MASTER_ADDR`, `MASTER_PORT`),
# see {doc}`../book/slurm_primer`.
#
# **What the training script needs for several nodes.** Two edits, both in
# `workshop_lib/train/runtime.py`, which every training entry point calls first:
#
# - *Pick the GPU before any collective.* A node runs one process per GPU, and every process first sees
#   all the node's GPUs. `torch.cuda.set_device(local_rank)`, with `local_rank` read from `LOCAL_RANK`
#   (set by `torchrun`: the process's index on its node, 0 to GPUs per node − 1), binds each process to
#   its own card. Skip it and every process of a node creates its CUDA context and NCCL communicator on
#   GPU 0: the job either runs out of memory there or NCCL refuses two ranks on one device. `RANK` (the
#   index in the whole job) is the wrong number for this on the second node: rank 4 of a 2 × 4 job would
#   ask for a fifth GPU that does not exist.
# - *Let one process speak.* Every rank runs the same code, so every `print` appears once per GPU, and a
#   file written by all ranks is overwritten in a race. The entry points write metrics and summaries only
#   where `runtime.is_main` (rank 0) is true, and the Trainer logs on the main process only. Lines that
#   differ per rank, such as which GPU a process bound to or which master address it connects to, are
#   worth printing on every rank *with the rank in front*: when one node hangs, they tell you which.

# %% [markdown]
# ## Try a layout: the memory calculator
#
# The calculator below runs the workshop's estimator (`workshop estimate`) in the page, opened on this
# chapter's runs: pick another run of the chapter, or change the ZeRO stage, the offload, the GPUs or the
# batch, and see what each GPU holds, whether it fits an A100-80GB, and the closest run measured on a real
# GPU.
#
# ```{raw} html
# <iframe class="memory-calculator" title="Memory calculator" loading="lazy"
#         src="../_static/memory-calculator/calculator.html?chapter=3&amp;experiment=zero/two-gpus/zero2"
#         style="width: 100%; height: 900px; border: 1px solid #ddd;"></iframe>
# ```

# %% [markdown]
# ## The experiments, their scripts, and the jobs
#
# What the chapter runs, each experiment's script with the checker's findings (offload with stage 0,
# pinned memory without offload, killed monitor PIDs that live in another shell, a fixed rendezvous
# port), and then the jobs: completed runs are reused, only what has not completed is submitted.
# DeepSpeed compiles one of its CPU operations once per Python environment (`make setup` does it, into
# `.venv/torch_extensions`; elsewhere the first run pays about a minute). The
# DeepSpeed configuration a script names is copied into its run folder at submission, so editing
# `slurm/ds_configs/` later cannot change a queued job.

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
# ## Exercise: read one number from the log yourself
#
# Before the tables do it for you: open the baseline's job log, `runs/zero/baseline/slurm-<job id>.out`,
# find the dictionary the Trainer prints when training ends (it contains `'train_runtime'`), and write
# down `train_samples_per_second`. (Transformers 5 prints the values as strings, `'3.755'`.) Then
# compare it with the baseline table below. The next cell shows the line from your run.

# %% tags=["hide-input"]
nb.show_log_lines("zero/baseline", "train_samples_per_second", runs_dir);

# %% [markdown]
# ## Results: the baseline

# %% tags=["hide-input"]
nb.show_results(selection, ["baseline"], runs_dir, plots=False)
samples, batch, accumulation = 500, 4, 4
batches, steps = claims.steps_per_epoch(samples, batch, accumulation)
short = " (the last one short)" if samples % batch else ""
nb.say(f"**Steps per epoch.** {samples} samples at {batch} per batch make {batches} batches on one GPU{short}; "
       f"the Trainer rounds up, so {accumulation} accumulated batches per optimizer step give {steps} steps per "
       f"epoch and {3 * steps} over three epochs. The reference runs and the tiny ones are capped at a fixed "
       "number of optimizer steps instead (`max_steps`), so their tables say *Optimizer Steps (max_steps "
       "cap)*, not steps per epoch.");

# %% [markdown]
# **Reading your tiny runs.** A tiny model trained a few steps from random weights can see its loss
# rise from one evaluation to the next: that is noise, and says nothing about the recipe.
#
# **Exact match and F1.** The reference models start from random weights and train 30 steps, so they
# generate no answer that matches SQuAD's: both scores are 0, as they must be. On Ibex, with the trained
# BLOOM-560m, the same evaluation gives real scores; on the tiny profile the synthetic answers are
# short and a tiny model now and then hits a word of them, so F1 can be slightly above 0.

# %% [markdown]
# ## Results: ZeRO stages on one GPU

# %% tags=["hide-input"]
nb.show_results(selection, ["single-gpu"], runs_dir)
nb.say(claims.zero_one_gpu(reference));

# %% [markdown]
# **Reading your tiny runs.** With a model of a few hundred thousand parameters, offload looks free
# and the stages barely differ in speed: there is no PCIe bus between a CPU "device" and host memory,
# and the optimizer step of so few parameters takes microseconds. The tensor-byte columns still show
# each stage's layout; their ZeRO peaks are mostly DeepSpeed's gradient bucket of 5·10⁸ elements,
# allocated whatever the model's size.

# %% [markdown]
# ## Results: weak scaling on one node

# %% tags=["hide-input"]
nb.show_results(selection, ["multi-gpu"], runs_dir)
nb.say(claims.zero_weak_scaling(reference))
nb.say(claims.losses_differ(reference));

# %% [markdown]
# **Reading your tiny runs.** A tiny run takes only a few optimizer steps, and the first one carries
# one-off start-up work, so its mean step time is noisy: tiny efficiencies can land above 100 %, which
# a real run of this kind cannot sustain.

# %% [markdown]
# ## Results: the stages on two GPUs

# %% tags=["hide-input"]
nb.show_results(selection, ["two-gpus"], runs_dir)
nb.say(claims.zero_two_gpus(reference))
nb.say(claims.model_states_versus_peak(reference));

# %% [markdown]
# ## Results: weak scaling across nodes

# %% tags=["hide-input"]
nb.show_results(selection, ["multi-node"], runs_dir, missing="needs several nodes of a real cluster")

# %% [markdown]
# **Reading your tiny runs.** On the tiny profile the "nodes" are processes on the same few CPU cores,
# so a two-node run can even beat a one-node run of the same size: the node count changes how processes
# share the cores, not which network they talk over. On a real cluster, gradients cross InfiniBand
# between nodes instead of NVLink inside one, and the per-GPU throughput drops as nodes are added.

# %% [markdown]
# ## Results: predicted against measured memory
#
# The memory estimator (`workshop estimate`: the formulas above plus activations and logits) beside what
# each run measured: the tensor bytes of one training step on rank 0, counted by the engine itself
# (model states when the optimizer step begins, and the step's peak), which is what the formulas
# predict on any profile.

# %% tags=["hide-input"]
nb.show_results(selection, ["prediction"], runs_dir, plots=False)

# %% [markdown]
# ## Weak scaling: DDP, ZeRO-2 and FSDP side by side
#
# The same run — BLOOM-560m, the seed's recipe (fp16, batch 4 × accumulation 4), 500 samples per GPU —
# under three data-parallel engines on 1, 2 and 4 GPUs (experiments `scaling/ddp|zero2|full-shard/N-gpus`,
# not part of the tiny workshop; `workshop submit scaling/zero2/4-gpus` runs one on Ibex). Each GPU does
# the same work, so a perfect engine keeps the step time flat: efficiency = *T*<sub>1</sub>/*T*<sub>N</sub>.

# %% tags=["hide-input"]
nb.show_engine_scaling()
nb.say(claims.engine_scaling(nb.reference_results("engine_scaling")[1]));

# %% [markdown]
# :::{dropdown} Two settings behind these numbers
# **DDP and unused parameters.** The Trainer sets `ddp_find_unused_parameters=True` for a model without
# gradient checkpointing, which makes DDP walk the whole autograd graph after every forward (four times per
# optimizer step here) and keeps the GPUs waiting on the CPU. Every parameter of these models gets a
# gradient, so the runs pass `False`, and DDP's step stays flat as GPUs are added.
#
# **FSDP and accumulation.** FULL_SHARD gathers every unit's parameters again for each micro-batch's forward
# and backward: 4 micro-batches × 2 × 25 units = 200 all-gathers per step. `SHARD_GRAD_OP`, or fewer and
# larger micro-batches, communicate far less.
# :::
#
# ## The tuned recipe
#
# The exercises keep the seed's recipe so that their numbers compare with the original material. The
# workshop also has a tuned one: set `recipe = "tuned"` in the parameters cell (or pass `--recipe tuned`
# to `workshop_lib.train.hf`) and the Trainer runs get their own `…-tuned` ids and run folders.
#
# :::{dropdown} What the tuned recipe changes, and why
# - **bf16** instead of fp16: no loss scaler.
# - **One batch of 16** instead of four accumulated micro-batches of 4: the same global batch and optimizer
#   steps, larger matrix products, a quarter of the kernel launches.
# - **Padding to the longest sample** of each batch instead of to 512 tokens, with samples of similar length
#   batched together, so most computed tokens are real.
# - **Liger's fused linear cross-entropy**: the batch × length × 250,880 logits never exist at once (memory,
#   not speed).
# - **Fused kernels**: BLOOM's attention as one `scaled_dot_product_attention` call with the ALiBi bias as its
#   mask, BLOOM's tanh-GELU as PyTorch's single kernel, fused AdamW; and the objects alive at the start of
#   training frozen out of Python's garbage collector.
# - **CUDA graphs**: the 24 transformer blocks of each training step replayed as one graph per batch length
#   (`workshop_lib/train/graphs.py`). Without them the step is bound by the host CPU launching kernels one by
#   one, which also makes the seed's own speed depend on the host: compare recipes only within one run. A
#   graph is recorded the first time a batch length appears (a fraction of a second each; lengths are padded
#   to a multiple of 64 so a job sees only a handful) and then replayed with one launch, so the GPU sets the
#   pace.
#
# There is **no `torch.compile`**: it makes the steps faster, but compiling takes longer than these short
# jobs run, so end to end it is slower than the seed. The tables below give the measured figures and the
# reason for each gain.
# :::

# %% tags=["hide-input"]
nb.show_recipe_benchmark();

# %% [markdown]
# ## GPU utilisation
#
# The original material's monitor asked `nvidia-smi` for `utilization.gpu` next to the memory: the share
# of time in which at least one kernel ran on the GPU. It is a coarse signal (a GPU that runs one small
# kernel at a time reads 100 %), but a low figure during training is a clear sign of a GPU waiting for its
# host: data loading, Python launching kernels, or offload. This workshop's monitor records it too, in
# each node's `gpu_memory_<node>.csv`.
#
# The tables above show it as *GPU Utilization (%)* beside the GPU memory: GPU 0's mean over the samples
# taken while training (memory at or above half its peak, so the idle minutes of start-up and shutdown do
# not pull it down). The baseline summary adds its peak, and `workshop memory runs/<experiment id>` prints
# it per GPU. A table has the column only where its runs recorded it: not on the tiny profile's CPUs, nor
# in reference measurements taken before the monitor recorded it.
#
# To watch it live on Ibex, open a shell on the node of a running job and ask `nvidia-smi` every 5 seconds:
#
# ```bash
# srun --jobid <job id> --overlap --pty bash
# nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv -l 5
# ```
#
# ## Exercise: change the model size or the data subset
#
# The original material's exercise, with this workshop's knobs. Every experiment is a frozen dataclass
# in `workshop_lib/experiments/matrix.py`: copy one with another sample count (or per-GPU batch), give it its own
# id, and run it. For example, twice the data for the stage-2 offload run, in a new cell:
#
# ```python
# from dataclasses import replace
# from workshop_lib.book.chapter import facade as nb
# from workshop_lib.experiments import get_experiment
#
# bigger = replace(get_experiment("zero/single-gpu/zero2-offload"), id="zero/single-gpu/zero2-offload-1000",
#                  samples=1000)
# mine = nb.select(3, profile)
# nb.run_experiments(nb.Selection(3, mine.profile, (bigger,), (bigger,), ()))
# ```
#
# Before you run a larger *model* or batch, predict it: `workshop estimate --model bloom-560m --zero 2
# --offload optimizer --batch 4` gives the model states, activations and logits of the run above; change
# `--batch 8`, or pass `--model path/to/config.json` of another model, and see which part grows. Then
# compare with the tensor-byte columns of your run.

# %% [markdown]
# ## Optional: the class's runs
#
# On the workshop day each participant runs part of the chapter, and the class fills the tables together. This
# cell publishes your completed runs to the class folder (into a folder of your own there: nobody else can change
# or delete what you publish) and shows the chapter's tables filled by everyone's runs. Where the class has no
# folder (working alone, or the book) it says so and does nothing. From a shell:
# `workshop class publish --chapter 3` and `workshop class pool --chapter 3`.

# %% tags=["hide-input"]
nb.show_class_results(selection, runs_dir);

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
#   states), never activations. Its answer that stage 2 with offload saves the most is what the
#   reference measured on one GPU (above).
# - Its "no ZeRO" multi-GPU exercise launched with a stage-2 offload configuration; here the
#   weak-scaling runs use stage 0 (DeepSpeed's data parallelism without partitioning).
# - It expected `train_samples_per_second` to stay constant under weak scaling. That figure is the
#   total over all GPUs and should *grow* with them; what should stay constant is the per-GPU share.
# - It read "steps per epoch" from the progress bar's total, which counts all three epochs, and its
#   samples/s formula left out gradient accumulation.
# - It said `LOCAL_RANK` comes from SLURM; `torchrun` sets it (SLURM's equivalent is
#   `SLURM_LOCALID`). The multi-node run of this chapter keeps 250 samples per GPU, as the text said (the code
#   said 10 000, more than SQuAD has at 16 GPUs).
#
# Details: {doc}`../book/seed_corrections`.
