# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 1: Data parallel fine-tuning with LoRA
#
# In this chapter you fine-tune two very different models, the dense **Llama 3.1 8B** and the sparse
# mixture-of-experts **Mixtral 8×7B**, on more and more GPUs while keeping everything else fixed.
# Every GPU holds a full copy of the model and works on its own share of each batch: that is *data
# parallelism*. What makes an 8-billion-parameter model fit on one GPU at all is **LoRA**, which
# freezes the model and trains two small matrices per adapted layer instead.
#
# The notebook does the whole exercise: it writes a SLURM script per run, checks it, submits it,
# waits, reads the logs and fills the scaling tables that the original material asked you to fill in
# by hand. Then it asks the questions those tables were built to answer.
#
# ```{admonition} Where this runs
# :class: important
# On Ibex (`profile = "ibex"`) each run is NeMo Factory's `nemo llm finetune` in the NeMo container on A100
# GPUs, exactly as in the scripts below. Anywhere else the **tiny profile** runs the same chapter on CPUs,
# with a small PyTorch stand-in for NeMo; the section *Results* says what it keeps and what it drops.
# ```
#
# ```{admonition} The hyperparameters are deliberately small
# :class: note
# On Ibex every run stops after 250 optimizer steps with a global batch of 8 sequences, a short warm-up and a
# few validation batches, so that the chapter's jobs fit a workshop day (the plan before submitting gives
# each job's time). The measurements on real GPUs shown first in each section stopped earlier still, as each
# table's caption says. That is enough to see how time and memory change with the layout, which is the
# lesson. It is not a fine-tune worth keeping: a useful one of an 8-billion-parameter model runs over a whole
# data set, with global batches of
# hundreds of sequences and a learning-rate schedule tuned to them, for hours or days.
# ```

# %% tags=["parameters"]
profile = "tiny"  # "ibex" on the cluster, "tiny" anywhere else
experiments = None  # None: every experiment of the chapter that the profile can run; or a list of ids
wait_timeout_s = 1800  # stop waiting after this long (jobs keep running; re-run the cell to pick them up)
runs_dir = None  # None: <repository>/runs (or $WORKSHOP_RUNS_DIR)

# %%
from workshop_lib.book.chapter import facade as nb

selection = nb.chapter_header(1, profile, experiments, runs_dir)
nb.experiments_overview(selection);

# %% [markdown]
# ## The ideas
#
# **Data parallelism.** Start *N* identical copies of the training program, one per GPU. Each copy
# holds the whole model, reads a different slice of the batch, and computes its own gradients. Before
# the optimizer step the copies average their gradients with an *all-reduce*, so every copy applies
# the same update and the models stay identical. The benefit is throughput: *N* GPUs process *N*
# times as many samples per second, minus the time spent communicating. The cost is memory: nothing
# is divided, every GPU still holds all weights, gradients and optimizer states. A model that does not
# fit on one GPU does not fit on eight either.
#
# **The global batch.** NeMo's recipe sets the *global* batch (its default is 128 sequences per optimizer step;
# the workshop's commands override it to 8 with `data.global_batch_size=8`, to keep the jobs short) and the
# *micro* batch (1 sequence per forward pass). With *N* data-parallel GPUs each GPU gets
# 8 / *N* sequences per step, and runs that many micro-batches, accumulating gradients, before the
# all-reduce. So adding GPUs does not change what the model learns per step; it changes how long a
# step takes.
#
# **LoRA.** Fine-tuning all 8 B parameters of Llama with Adam in mixed precision needs about 18 bytes per
# parameter as Megatron keeps them (bf16 weights 2, fp32 gradients 4, fp32 master weights and two fp32 Adam
# moments 12; chapter 2 counts the same), over 140 GB before any activation: more than an 80 GB A100. LoRA
# freezes the pretrained weight *W* and learns a low-rank correction: for a layer *y = Wx* it trains *A* (*r ×
# k*) and *B* (*d × r*) and computes *y = Wx + (α/r)·BAx*. NeMo's Llama recipe uses rank *r* = 8 (α = 16) on
# the fused Q/K/V projection, the attention output and both MLP matrices; its Mixtral recipe rank 32 on the
# attention projections only. Either way that is a few tens of millions of trainable parameters, a fraction of
# a percent of the model (NeMo's log prints the count; "Predict, then run" below compares it with the
# stand-in's, which adapts the query, key and value projections separately and so trains a few million more).
# The frozen weights cost only their 2 bytes each (about 16 GB for Llama), the adapters' gradients and Adam
# states are tiny, and the whole fine-tune fits on one GPU. Because *B* starts at zero, training starts
# exactly from the pretrained model.
#
# **Mixtral and expert parallelism.** Mixtral replaces each feed-forward block by 8 *experts* and a router
# that sends every token to 2 of them: about 46.7 B parameters in total, about 12.9 B used per token. Its bf16
# weights alone (about 93 GB) exceed one A100, even with LoRA, so Mixtral starts at 2 GPUs and spreads the
# experts over them with *expert parallelism* (EP): with EP = *N* each GPU keeps 8/*N* experts of every layer,
# and tokens travel to the GPU that holds their expert (an all-to-all exchange) and back. NeMo's Mixtral
# recipe uses EP = 8 unless told otherwise, which cannot be laid out on 2 or 4 GPUs (NeMo stops at start-up),
# so every Mixtral run of this chapter sets EP to its GPU count. Everything that is not an expert (attention,
# norms, router, embeddings) is still replicated, and each GPU takes its own share of the batch: Megatron
# carves the expert-parallel ranks out of the data-parallel ones, so these runs are data parallel *and* expert
# parallel.
#
# **What the tables measure.** The *total job time* (from the job's footer) includes starting the container,
# loading the checkpoint and saving the adapters (NeMo saves adapter checkpoints; the PyTorch stand-in and the
# Hugging Face and GPT runs of chapters 3-4 save none, so their job times leave that out); the *train step
# time* is the mean of NeMo's own per-step timings (`train_step_timing`), the first step left out because it
# carries the one-off set-up (one step alone is too noisy to compare). *Time scaling* is time(baseline) /
# time(*N* GPUs): 2.0 on 2 GPUs would be perfect. *Peak memory scaling* divides the baseline's GPU 0 peak by
# the *N*-GPU one, both as `nvidia-smi` reads them (memory the process holds on the card: the CUDA context and
# PyTorch's cache included, more than the tensors PyTorch has allocated). For Llama, pure data parallelism,
# expect about 1.0: nothing is sharded. For Mixtral expect it to *grow* with the GPU count, because EP = *N*
# leaves each GPU 8/*N* of the experts (about 24.2 B parameters per GPU on 2 GPUs, 12.9 B on 4, 7.2 B on 8).

# %% tags=["hide-input"]
from workshop_lib.book.claims import plots

mixtral_on_2 = plots.mixtral_layouts(2)
nb.show_figure(plots.gpu_layout_diagram({name: mixtral_on_2[name] for name in ("DP 2", "EP 2")},
                                        "Mixtral on 2 GPUs: plain data parallel (does not fit) vs expert parallel"));

# %% [markdown]
# ## Try a layout: the memory calculator
#
# The calculator below runs the workshop's estimator (`workshop estimate`) in the page, opened on this
# chapter's runs: pick another run of the chapter, or change the GPUs, LoRA's rank, the micro-batch or the
# sequence length, and see what each GPU holds, whether it fits an A100-80GB, and the closest run measured on
# a real GPU.
#
# ```{raw} html
# <iframe class="memory-calculator" title="Memory calculator" loading="lazy"
#         src="../_static/memory-calculator/calculator.html?chapter=1&amp;experiment=lora/llama/1-gpu"
#         style="width: 100%; height: 900px; border: 1px solid #ddd;"></iframe>
# ```

# %% [markdown]
# ## The job scripts
#
# Below, each experiment's script as this profile submits it, folded (click to open), with what the
# checker says about it: the experiment rules (GPUs, parallel sizes, LoRA) and the script linter
# (`--ntasks` instead of `--ntasks-per-node`, `--gpus-per-task`, devices that do not match the
# tasks, a monitor that is never stopped). The same checks run on your own scripts with
# `workshop check SCRIPT`. Experiments that need more GPUs than this profile offers are shown as Ibex
# would run them.

# %%
nb.show_scripts(selection);

# %% [markdown]
# On Ibex the same experiment becomes a NeMo Factory run in the Singularity container. Read it even if
# you run the tiny profile: the overrides (`trainer.devices`, the batch sizes, and for Mixtral
# `trainer.strategy.expert_model_parallel_size`) are what this chapter is about; LoRA is the factory's
# default, so no `peft` override appears. The training line has four layers, from the outside in:
#
# - `srun` starts one task per GPU on every node (`--ntasks-per-node` = `--gpus-per-node`); Lightning turns
#   each task into one rank.
# - `singularity exec --nv --bind "/ibex/user/$USER" "$NEMO_IMAGE"` runs the rest inside the NeMo container:
#   `--nv` makes the node's GPUs and driver visible inside it, `--bind` mounts your project storage (the
#   caches, the prepared data and the imported checkpoint) at the same path.
# - `nemo llm finetune --factory mixtral_8x7b` is NeMo Factory's command line: `finetune` is the task, and
#   the *factory* (a *recipe*) builds the whole default configuration for that model: model, data module,
#   optimizer, trainer, parallel strategy, and LoRA unless told otherwise (`mixtral_8x7b(peft_scheme=None)`
#   asks for the full fine-tune, chapter 2).
# - Each `key.subkey=value` after it is a *dot-notation override* of one field of that configuration:
#   `trainer.devices=2` sets the trainer's `devices`, `data.global_batch_size=8` the data module's global
#   batch, `trainer.strategy.expert_model_parallel_size=2` a field of the strategy inside the trainer.
#
# The "What NeMo will run" table below shows each of those fields after the overrides, as NeMo resolved
# them: `trainer.devices` in the `trainer` row, `data.global_batch_size` in the `data` row, the strategy's
# sizes in the `strategy` row. A key NeMo does not know stops the dry run with "No parameter named …".

# %%
nb.show_reference_script("lora/mixtral/2-gpus", "ibex");

# %% [markdown]
# ## What NeMo will run
#
# Every command of the chapter as its job script renders it, resolved by NeMo itself (its parser and
# dry run, `make nemo-check`): the recipe settings the runs get, and NeMo's own "Resolved Arguments"
# table for one of them.

# %%
from workshop_lib.book.reference import nemo_views as nemo_reference

nemo_reference.show_resolved(1, "lora/llama/2-gpus");

# %% [markdown]
# ## Predict, then run: measured on real GPUs
#
# The memory estimator predicts each run's peak per GPU before it runs: for NeMo on Ibex's 80 GB A100s
# (Megatron's layout, Mixtral's experts split over EP) and for the PyTorch stand-in, which was run at
# the real models' shapes (random weights, synthetic data) on the GPUs named below. Rows no run has
# measured yet say "not measured yet" and how many GPUs they need.
#
# Two engines ran these rows, and the second table names the engine and the card of each. NeMo 2.4.1 itself
# trained the chapter's own `nemo llm finetune` words with random weights and without Transformer Engine (the
# Ibex container has it; how fast NeMo runs there has not been measured). The other rows are the PyTorch
# stand-in: no Megatron kernels, every sample padded to 2,048 tokens, and for Mixtral every GPU holds all
# experts. Where both engines ran the same experiment on the same card, the text above the table puts them
# side by side with the conditions each ran under: one observation, not a factor that turns stand-in numbers
# into NeMo's. The results tables further down show one engine on one card each: NeMo's rows where NeMo ran
# that table.

# %%
nemo_reference.show(1);

# %% [markdown]
# ## How many GPUs, and how long on Ibex
#
# Before anything is submitted: how many GPUs this chapter's jobs ask for on Ibex, how they queue under
# KAUST's limit of 24 GPUs per user in running jobs, and about how long each job runs on an A100. The
# times come from the reference runs (H100/H200), each table's jobs from one engine on one card (NeMo's own
# runs where NeMo ran that table), scaled by the datasheet ratios named under the table, and the sentence is
# written from the same numbers. Whatever profile runs here, this is the Ibex plan.

# %% tags=["hide-input"]
nb.show_time_plan(selection);

# %% [markdown]
# ## Submit and wait
#
# The next cell submits every experiment that has no completed run yet and waits for all of them,
# showing a progress line. Each run gets its own folder `runs/<experiment id>/` with the script as
# submitted, the job's log, the monitors and the trainer's metrics. Executing the cell again does not
# submit anything that already completed (the run is recognised by a hash of the experiment): it only
# re-reads the results.

# %%
runs = nb.run_experiments(selection, runs_dir, wait_timeout_s)

# %% [markdown]
# ## Results
#
# :::{dropdown} What the tiny profile runs instead of NeMo
# On the tiny profile CPU processes stand in for GPUs, and **NeMo is replaced by a small PyTorch/PEFT
# stand-in** (`workshop_lib.train.lora`) that trains tiny, randomly initialised Llama and Mixtral models on
# synthetic question–answer data. The stand-in takes the recipe NeMo resolved for the same experiment (LoRA
# rank, alpha and target modules, micro-batch 1 × 2048 tokens, learning rate, global batch split over DDP
# ranks with gradient accumulation) and drops what needs real hardware: no container, no Megatron kernels,
# no checkpoint download, no GPU memory monitor, and only a few steps. Unlike NeMo it keeps all of
# Mixtral's experts on every GPU (no EP). Its times and losses show the *shape* of the results, not the
# numbers an A100 gives. Every command of the chapter has been resolved by NeMo 2.4.1 itself (the NeMo
# 25.07 container's version) with its dry run.
# :::
#
# The tables of the original material, filled from the logs. A cell shows the run's state (FAILED,
# TIMEOUT, …) instead of a number when the run did not complete, and `n/a` when the run did not
# record that value. The tiny profile has no `nvidia-smi`: there the memory columns hold each
# process's own peak (its resident set size), as the note under each table says, and the memory
# plot does the same. Each part shows first what was measured on real GPUs (one engine on one card per
# table, NeMo's own runs where NeMo ran it; the caption says which, and which rows of
# `book/reference/chapter1.json` it leaves out), then your runs, titled by profile.

# %% [markdown]
# ## Results: Llama 3.1 8B + LoRA

# %% tags=["hide-input"]
from workshop_lib.book.claims import sentences as claims

reference = nb.reference_results(1)[1]
nb.show_results(selection, ["llama"], runs_dir)
nb.say(claims.nemo_data_parallel(reference, "llama"));

# %% [markdown]
# ## Results: Mixtral 8x7B + LoRA

# %% tags=["hide-input"]
nb.show_results(selection, ["mixtral"], runs_dir)
nb.say(claims.nemo_data_parallel(reference, "mixtral"));

# %% [markdown]
# ## Read the log yourself
#
# The original exercise filled the tables by hand from each job's log, and it is worth doing once. Open
# `runs/lora/llama/2-gpus/slurm-<job id>.out` and find: the step lines, where NeMo prints
# `train_step_timing in s` (and `reduced_train_loss`) for every optimizer step; the job's footer, whose
# `Total time` is the job time the scaling columns divide; and the memory summary at the end, one line per GPU
# with GPU 0's `Peak`, `Avg` and `Mode` in MiB. The cells below pick those lines out of your run. The tiny
# profile's stand-in prints no NeMo step line (its steps are in `train/metrics.jsonl`); the footer and the
# memory summary are there on every profile. {doc}`../book/reading_logs` explains each line.

# %% tags=["hide-input"]
nb.show_log_lines("lora/llama/2-gpus", "train_step_timing", runs_dir)
nb.show_log_lines("lora/llama/2-gpus", "Total time", runs_dir)
nb.show_log_lines("lora/llama/2-gpus", "Peak =", runs_dir, limit=4);

# %% [markdown]
# **Reading the tiny results.** The stand-in models are so small that a training step takes a few
# milliseconds of arithmetic and much more of process start-up and communication, and the "GPUs"
# share two CPU cores. So the tiny tables show the overheads of data parallelism, not its benefit:
# the total time is dominated by starting Python and `torchrun`, and more ranks often mean a slower
# job. One exception reads the other way: the first job on a fresh machine also pays a one-off warm-up
# (Python, PyTorch and the data loaded and cached for the first time), so if the 1-GPU job ran first its
# time ratios come out *above* the ideal, which no number of GPUs can give. The note under the table
# and the plot name such rows; the step times, which leave each run's first step out, are the fairer
# comparison. The loss, on the other hand, behaves as it should on any hardware: with the same global batch,
# learning rate and seed, the last loss is nearly the same on every GPU count, because data
# parallelism changes who computes the gradient, not the gradient itself. On real GPUs the training part
# is large enough for the step time to fall as GPUs are added; the reference tables above show by how
# much wherever one engine was measured on more than one GPU count of one card.

# %% [markdown]
# ## Why NeMo keeps the GPU mostly idle, and what packing does about it
#
# The GPU utilisation column of NeMo's rows is low (its note says how it is measured). Each optimizer step runs
# 8 micro-batches one after another, and each micro-batch is one SQuAD record of a couple of hundred tokens: far
# too little arithmetic per kernel to keep the GPU busy. The GPU then waits on the CPU, which launches the
# thousands of small kernels of 32 layers one by one: the step is *launch-bound*. **Sequence packing** puts
# several records into one sequence of the recipe's length (2,048 tokens), with their boundaries kept so that
# each record attends only to itself, so each kernel gets more work for the same launches. It is an option of
# NeMo's recipe. The run below is that option, measured by NeMo beside the unpacked 1-GPU run on the same card.
#
# :::{dropdown} How the packed run was made, and what differs on Ibex
# The packed run is `lora/llama/1-gpu-packed`: the same command as `lora/llama/1-gpu` with the factory
# `llama31_8b(packed_sequence=True, seq_length=2048)` (without `seq_length` the recipe packs to 4,096). NeMo then
# tokenises SQuAD once, packs it (`<datasets>/squad/packed/…/training_2048.npy`) and hands Megatron each record's
# boundaries. On the machine that measured it, Transformer Engine was not installed, and Megatron's own attention
# refuses packed input, so the workshop computed the per-record attention with PyTorch's
# `scaled_dot_product_attention` and a block-diagonal causal mask (`workshop_lib/train/packed_attention.py`, tested
# against an attention computed record by record). The NeMo container on Ibex has Transformer Engine and uses its
# own kernel. To try it on Ibex, submit it beside your 1-GPU run, from a terminal in your clone:
# `workshop submit lora/llama/1-gpu-packed --profile ibex`, then compare the two rows of `workshop collect --chapter 1`.
# :::

# %% tags=["hide-input"]
nb.show_results(selection, ["packing"], runs_dir)
nb.say(claims.nemo_packing(reference));

# %% [markdown]
# ## Optional: the class's runs
#
# On the workshop day each participant runs part of the chapter, and the class fills the tables together. This
# cell publishes your completed runs to the class folder (into a folder of your own there: nobody else can change
# or delete what you publish) and shows the chapter's tables filled by everyone's runs. Where the class has no
# folder (working alone, or the book) it says so and does nothing. From a shell:
# `workshop class publish --chapter 1` and `workshop class pool --chapter 1`.

# %% tags=["hide-input"]
nb.show_class_results(selection, runs_dir);

# %% [markdown]
# ## Questions
#
# Answer them from your own tables first; the answers are folded in {doc}`../book/answers`
# (section *Chapter 1*).
#
# 1. With a global batch of 8, what is the batch per GPU on 1, 2, 4 and 8 GPUs?
# 2. How should the train step time change from 1 to 8 GPUs, and why not by a factor of 8?
# 3. Why does the total job time scale worse than the step time?
# 4. Does the peak memory per GPU go down when you add GPUs (Llama)?
# 5. Why can Llama 3.1 8B be fine-tuned on one 80 GB A100 with LoRA, but not without it?
# 6. Why does Mixtral start at 2 GPUs, and why must the expert-parallel size be set? What is the
#    data-parallel size for attention and for the experts with EP = 2 on 2 GPUs?
# 7. Why is GPU 0's average so far below its peak, and when would its mode be the idle GPU's ~1 MiB rather than
#    the peak (as in the reference tables)?
# 8. Should the last `reduced_train_loss` be the same on every GPU count?
#
# ## Where the original material was wrong
#
# - It described `expert_model_parallel_size=N` as "every GPU holds all experts". Only EP = 1 means
#   that; EP = *N* divides the experts over *N* GPUs, which is why the Mixtral runs here set EP to the
#   GPU count.
# - It called the 24.2 B in the LoRA summary "the full Mixtral model". Mixtral 8×7B has about 46.7 B
#   parameters; 24.2 B is what one GPU holds with EP = 2.
# - Its `nvidia-smi` monitor line was broken over two lines without a `\`, so the second half ran as
#   a separate command; the scripts above keep the command on continued lines and stop the monitor
#   at the end.
#
# The complete list, for every chapter, is in {doc}`../book/seed_corrections`; how to read NeMo's
# log (resolved arguments, LoRA summaries, the harmless `SIGTERM` lines) is in {doc}`../book/reading_logs`.
