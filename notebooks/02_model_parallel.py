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
# Llama 3.1 8B and Mixtral 8×7B. Full fine-tuning with Adam in bf16 mixed precision keeps about
# 18 bytes per parameter (bf16 weights 2, fp32 gradients 4, fp32 master weights and two Adam moments
# 12), far more than one GPU has, so the model itself must be cut into pieces that live on different
# GPUs: *model parallelism*. You will use **tensor parallelism** (TP) for both models, **expert
# parallelism** (EP) for Mixtral's experts, **sequence parallelism** (SP) to divide the activations
# that TP leaves whole, and **pipeline parallelism** (PP) to spread Mixtral's layers over two nodes.
#
# **Predict, then run.** Every layout in this chapter was chosen with the memory estimator
# (`workshop estimate`) before anything ran, and `workshop validate` refuses a layout predicted not to
# fit the site's GPUs. The original material's Mixtral layouts cannot fit, and its Llama layout is refused at
# the recipe's maximum sequence length: the section "Predict, then run" shows the numbers.
#
# ```{admonition} Where this runs
# :class: important
# On Ibex (`profile = "ibex"`) these are NeMo Factory runs with the recipe's own full fine-tune and
# Megatron's tensor, pipeline, expert and sequence parallelism, in the NeMo container on A100s. Anywhere
# else the **tiny profile** runs a PyTorch stand-in for NeMo on CPUs; the section *Results* says what it
# keeps and what it drops.
# ```
#
# ```{admonition} What you run, and what the instructor ran for you
# :class: important
# You run the **Llama** layouts, one node each (4 or 8 GPUs). **Mixtral's full fine-tunes need two 8-GPU
# nodes each** (16 GPUs), and Ibex has eight such nodes for all of its users: the instructor runs them once
# before the day, and you read their results in the Mixtral table below. They are left out of what this
# notebook submits and of its time plan (name one in `experiments` to run it yourself). In a class, each
# participant makes one Llama layout and the class shares the rest: with `WORKSHOP_PARTICIPANT=K/N` set, this
# notebook submits yours only and its plan counts only those; `workshop class plan` shows who makes which,
# and the book's {doc}`../book/day_plan` the day around it.
# ```
#
# ```{admonition} The hyperparameters are deliberately small
# :class: note
# On Ibex every run stops after 250 optimizer steps with a global batch of 8 sequences, a short warm-up and a
# few validation batches, so that the chapter's jobs fit a workshop day (the plan before submitting gives
# each job's time). The measurements on real GPUs shown first stopped earlier still, as each caption says.
# That is enough to see how time and memory change with the layout, which is the lesson. It is not a
# fine-tune worth keeping: a useful one of an 8-billion-parameter model runs over a whole data set, with
# global batches of
# hundreds of sequences and a learning-rate schedule tuned to them, for hours or days.
# ```

# %% tags=["parameters"]
profile = "tiny"  # "ibex" on the cluster, "tiny" anywhere else
experiments = None  # None: every experiment of the chapter that the profile can run; or a list of ids
wait_timeout_s = 1800  # stop waiting after this long (jobs keep running; re-run the cell to pick them up)
runs_dir = None  # None: <repository>/runs (or $WORKSHOP_RUNS_DIR)

# %%
from workshop_lib.book.chapter import facade as nb

selection = nb.chapter_header(2, profile, experiments, runs_dir)
nb.experiments_overview(selection);

# %% [markdown]
# ## The ideas
#
# **Tensor parallelism** splits the big matrices *inside* every layer. In a transformer block the
# first linear layer of a pair is split by columns and the second by rows (Megatron's scheme), so each
# of the TP GPUs computes its share of the attention heads and of the feed-forward hidden units
# without talking to the others, and one all-reduce per pair puts the output back together. Every GPU
# then holds about 1/TP of the layer weights, their gradients and optimizer states. The price is
# communication *inside* every layer, twice per block in the forward pass and twice in the backward
# pass, which is why TP stays inside one node where GPUs are linked by NVLink.
#
# **Pipeline parallelism** places *whole layers* on different GPUs: with PP = 4 each GPU holds 8 of
# Mixtral's 32 layers. Micro-batches flow through the stages one after the other (Megatron's 1F1B
# schedule), so the first stage keeps the activations of up to PP micro-batches in flight. Between
# stages only one activation tensor per micro-batch travels, which is why PP is the split that crosses
# nodes. The price is the *bubble*: while the pipeline fills and drains, some stages wait. With *p* stages and
# *m* micro-batches per step the idle share is (*p* − 1) / (*m* + *p* − 1). Here each DP rank gets
# 8 / 2 = 4 micro-batches per step, so TP 2 × PP 4 idles 3 / 7 ≈ 43 % of the time and TP 4 × PP 2
# 1 / 5 = 20 %: with so small a global batch, fewer stages waste less (NeMo's recipe, with its global batch
# of 128 and interleaved virtual stages, makes the bubble much smaller).
#
# **Expert parallelism** is the natural split for a mixture of experts: each of the EP GPUs keeps a
# subset of the experts. Tokens are routed to the GPU that holds their expert and back with two
# all-to-all exchanges per MoE layer.
#
# **Sequence parallelism** attacks what tensor parallelism leaves whole: the layer norms and dropouts
# between the split matrices work on the full activations on every TP rank. SP cuts those activations
# along the sequence over the same TP group, turning each all-reduce into a reduce-scatter plus an
# all-gather of the same total size. It only exists together with TP (Megatron refuses SP when
# TP = 1, and requires it when TP > 1 is combined with EP > 1).
#
# **How many GPUs, and how much data parallelism?** Megatron lays the dense part of the model out as
# TP × PP × DP: attention, embeddings and norms are replicated over **DP = GPUs / (TP × PP)** ranks
# that split the global batch. The experts are carved out of those DP ranks: each expert is split over
# TP (expert TP = TP by default) and the EP ranks hold different experts, so the experts are
# replicated over **expert DP = GPUs / (TP × EP × PP)** ranks. "GPUs = TP × EP" is therefore not a
# rule: TP = 2 × EP = 2 on 4 GPUs has DP = 2 for attention (each DP rank gets 8 / 2 = 4 of the 8
# sequences of a step, as 4 micro-batches of 1) and expert DP = 1. Both TP × PP and TP × EP × PP must
# divide the GPU count. The distributed optimizer shards the fp32 master weights and Adam moments over
# the DP ranks (expert DP for the experts), which is why a second data-parallel rank can make a layout
# fit.
#
# **Why LoRA is off.** With LoRA the trainable part is tiny, so the memory that model parallelism is
# meant to divide (gradients and optimizer states of every weight) is not there to divide. The
# checker rejects a model-parallel experiment with LoRA left on, and the commands use the recipe's
# full fine-tune rather than the LoRA recipe with `peft=none` (which would keep LoRA's learning rate,
# 20 × the full fine-tune's, and, for Llama, drop the full fine-tune recipe's distributed optimizer; NeMo's
# Mixtral recipes use the distributed optimizer either way).

# %% tags=["hide-input"]
from workshop_lib.book.claims import plots

nb.show_figure(plots.gpu_layout_diagram(plots.mixtral_layouts(4), "What each of 4 GPUs holds of Mixtral"));

# %% [markdown]
# ## Try a layout: the memory calculator
#
# The calculator below runs the workshop's estimator (`workshop estimate`) in the page, opened on this
# chapter's runs: pick another run of the chapter, or change TP, PP, EP or SP, or LoRA back on, and see what
# each GPU holds, whether it fits an A100-80GB, and the closest run measured on a real GPU.
#
# ```{raw} html
# <iframe class="memory-calculator" title="Memory calculator" loading="lazy"
#         src="../_static/memory-calculator/calculator.html?chapter=2&amp;experiment=model-parallel/llama/tp2-dp2"
#         style="width: 100%; height: 900px; border: 1px solid #ddd;"></iframe>
# ```

# %% [markdown]
# ## Predict, then run: the layouts and what they need
#
# One row per layout: the data-parallel sizes and the batch per DP rank as NeMo resolved them, the
# estimate for NeMo on Ibex's 80 GB A100s (micro-batch 1 × 2048 tokens, the recipe's; SQuAD samples
# are shorter, so this is an upper bound); then, in a second table, what each engine measured on real GPUs.
# `model-parallel/llama/tp2` (the original material's Llama layout) is not part of the chapter: at the
# recipe's maximum length it is predicted at about 78 GiB per GPU, below 80 GB but over the 10 % margin
# `workshop validate` keeps, so validate refuses it on an A100, naming a layout that fits (TP = 2 × DP = 2 on
# 4 GPUs, whose distributed optimizer halves the optimizer states). At SQuAD's lengths (256 tokens per
# micro-batch) the same estimator gives 68.6 GiB, and NeMo's own run in chapter 1 measured a third under its
# estimate, so on an A100 it would likely fit; the chapter keeps the layout that fits at any length. It was
# measured on a 141 GB H200.
#
# The original chapter ran Mixtral with TP = 2 × EP = 2 on 4 GPUs and TP = 4 × EP = 2 on 8. The
# estimator gives about 209 and 105 GiB per GPU: 46.7 B parameters × 18 bytes is about 840 GB of model
# states, more than a whole 8-GPU node of A100s holds. Full fine-tuning of Mixtral needs two nodes:
# the layouts here keep the seed's TP × EP pairs and add pipeline stages across the nodes
# (TP 2 × PP 4 × DP 2 and TP 4 × PP 2 × DP 2 on 16 GPUs, each with EP 2 within DP, about 61 and 55 GiB
# predicted), as NeMo's own recipe does (PP = 4). The alternative that fits one node is chapter 1's: keep LoRA.

# %%
from workshop_lib.book.reference import nemo_views as nemo_reference

nemo_reference.show(2);

# %% [markdown]
# The stand-in's prediction counts Megatron's bytes per parameter; the stand-in itself keeps fp32 weights and
# trains them under autocast, which also holds bf16 copies of the weights for the backward pass and keeps the
# residual stream in fp32, so its peak allocated by PyTorch sits above that prediction. NeMo on an A100 is
# what the fit check judges; the H200 row shows that the layout the check refuses there does run where the GPU
# is larger.

# %% [markdown]
# ## What NeMo will run
#
# Each command as the job script renders it, resolved by NeMo 2.4.1 with its own parser and dry run
# (`make nemo-check`; the NeMo CLI prints the same table with `--dryrun`). The check also refuses a
# `trainer.strategy.*` key that `MegatronStrategy` does not take (the CLI accepts typos there
# silently), parallel sizes that do not divide the GPUs or the batch, and anything Megatron's own
# configuration refuses.

# %%
nemo_reference.show_resolved(2, "model-parallel/mixtral/tp2-pp4-ep2-sp");

# %% [markdown]
# ## The job scripts
#
# Each experiment's script as this profile submits it, folded, with the checker's findings (parallel
# sizes that do not divide the GPU count, Mixtral without EP, SP without TP, LoRA left on, a layout
# predicted not to fit the GPUs).

# %%
nb.show_scripts(selection);

# %% [markdown]
# A Mixtral layout as Ibex runs it with NeMo: the recipe's full fine-tune
# (`mixtral_8x7b(peft_scheme=None)`), every parallel size said explicitly (the recipe's own PP = 4,
# VPP = 8, EP = 8 would otherwise remain), two nodes of 8 GPUs, and `--yes` (not `-y`, which NeMo-Run
# also declares for `--yaml`).

# %%
nb.show_reference_script("model-parallel/mixtral/tp2-pp4-ep2-sp", "ibex");

# %% [markdown]
# ## How many GPUs, and how long on Ibex
#
# Before anything is submitted: how many GPUs this chapter's jobs ask for on Ibex (the Llama layouts you
# submit; Mixtral's two-node runs are the instructor's), how they queue under
# KAUST's limit of 24 GPUs per user in running jobs, and about how long each job runs on an A100. The
# times come from the reference runs (H100/H200), scaled by the datasheet ratios named under the table,
# and the sentence is written from the same numbers. Whatever profile runs here, this is the Ibex plan.

# %% tags=["hide-input"]
nb.show_time_plan(selection);

# %% [markdown]
# ## Submit and wait
#
# Completed runs of the same experiment are reused; only what has not completed is submitted.

# %%
runs = nb.run_experiments(selection, runs_dir, wait_timeout_s)

# %% [markdown]
# ## Results
#
# :::{dropdown} What the tiny profile runs instead of NeMo
# On Ibex the commands use the recipe's own full fine-tune (`--factory "llama31_8b(peft_scheme=None)"`:
# learning rate 5e-6, distributed optimizer); every command has been resolved by NeMo 2.4.1 itself (the NeMo
# 25.07 container's version) with its dry run. On the **tiny profile**, and in reference rows marked as the
# stand-in's, NeMo is replaced by a **PyTorch stand-in** (`workshop_lib.train.parallel`): the same Megatron
# split of every matrix with PyTorch's DTensor (column-parallel Q/K/V and MLP inputs, row-parallel outputs,
# vocabulary-parallel embedding and LM head), with the micro-batch, sequence length and learning rate NeMo
# resolved. It has no pipeline stages, no distributed optimizer and no fused kernels, keeps fp32 weights (16
# bytes per parameter instead of NeMo's 18), and passes sequence parallelism along without applying it. Its
# memory is the stand-in's, not NeMo's.
# :::
#
# The original material's tables: first what was measured on real GPUs (one engine on one card per
# table, NeMo's own runs where NeMo ran it), then this profile's own runs. Ratios compare with the smallest
# layout of each model that ran; two layouts on as many GPUs are compared as layouts, not as scaling.

# %% [markdown]
# ## Results: Llama 3.1 8B, tensor parallel

# %% tags=["hide-input"]
from workshop_lib.book.claims import sentences as claims

reference = nb.reference_results(2)[1]
nb.show_results(selection, ["llama"], runs_dir,
                missing="was not measured yet (the 2-GPU TP 2 run measured on H200s is shown in 'Predict, then run')")
nb.say(claims.nemo_tensor_parallel(reference));

# %% [markdown]
# ## Results: Mixtral 8x7B, tensor × expert parallel

# %% tags=["hide-input"]
nb.show_results(selection, ["mixtral"], runs_dir,
                missing="needs 2 nodes of 8 GPUs: the instructor's run, made before the day (the references ran on one "
                        "machine of at most 4 GPUs)")

# %% [markdown]
# ## Mixtral's parallel factors on 4 GPUs, at reduced depth
#
# The Mixtral layouts above need 16 GPUs: all 32 layers of a full fine-tune do not fit fewer. To still see what
# tensor × expert (+ sequence) parallelism and pipeline × expert parallelism cost, NeMo ran the same factors on
# 4 GPUs with Mixtral's full width and **4 of its 32 layers** (`model.config.num_layers=4`): every all-reduce,
# all-to-all and pipeline transfer has its real size, there are just 8 times fewer of them per step, and one
# GPU's model states fit an 80 GB card with room for the activations (try the layout in the memory calculator above). These rows are
# labelled as reduced depth and are never the 16-GPU layouts' numbers.

# %% tags=["hide-input"]
nb.show_results(selection, ["mixtral-reduced"], runs_dir)
nb.say(claims.nemo_reduced_mixtral(reference));

# %% [markdown]
# ## Read the log yourself
#
# As in chapter 1, find the table's numbers by hand once, in
# `runs/model-parallel/llama/tp4/slurm-<job id>.out`: on Ibex, the `strategy=MegatronStrategy(` entry of
# NeMo's "Resolved Arguments" table (is its `tensor_model_parallel_size` the TP you asked for?), the step
# lines' `train_step_timing in s`, the footer's `Total time`, and GPU 0's `Peak`, `Avg` and `Mode` in the
# memory summary. The cells below pick them out of your run (the tiny profile's stand-in prints no NeMo line;
# its footer and memory summary are the same).

# %% tags=["hide-input"]
nb.show_log_lines("model-parallel/llama/tp4", "tensor_model_parallel_size", runs_dir, limit=1)
nb.show_log_lines("model-parallel/llama/tp4", "train_step_timing", runs_dir)
nb.show_log_lines("model-parallel/llama/tp4", "Total time", runs_dir)
nb.show_log_lines("model-parallel/llama/tp4", "Peak =", runs_dir, limit=4);

# %% [markdown]
# **Reading the tiny results.** A tiny model split over more CPU ranks gets slower: there is almost no
# arithmetic to divide and every layer now waits for collective communication. What carries over to
# real hardware is the bookkeeping: each rank holds 1/TP of the sharded weights, the losses do not
# depend on the layout (the split changes who computes, not what), and each data-parallel rank gets the
# global batch divided by DP (the TP ranks of one group share theirs). On GPUs the interesting numbers are the
# peak memory per GPU against the prediction, and the step time, which TP does not shorten the way
# data parallelism does.

# %% [markdown]
# ## Optional: the class's runs
#
# On the workshop day each participant runs part of the chapter, and the class fills the tables together. This
# cell publishes your completed runs to the class folder (into a folder of your own there: nobody else can change
# or delete what you publish) and shows the chapter's tables filled by everyone's runs. Where the class has no
# folder (working alone, or the book) it says so and does nothing. From a shell:
# `workshop class publish --chapter 2` and `workshop class pool --chapter 2`.

# %% tags=["hide-input"]
nb.show_class_results(selection, runs_dir);

# %% [markdown]
# ## Questions
#
# Answers: {doc}`../book/answers` (section *Chapter 2*).
#
# 1. Why is there no single-GPU run in this chapter, and why does Llama start at TP = 2 × DP = 2 on
#    4 GPUs rather than TP = 2 on 2?
# 2. Why turn LoRA off here, and why use `peft_scheme=None` rather than `peft=none`?
# 3. How many GPUs does a layout need? Is "total GPUs = TP × EP" a rule?
# 4. What is the batch per data-parallel rank for each layout, for attention and for the experts?
# 5. How does the predicted peak memory per GPU change from TP = 2 to 4 to 8 (Llama)?
# 6. How does the step time change with more tensor parallelism?
# 7. Why does sequence parallelism need tensor parallelism?
# 8. Why does full fine-tuning of Mixtral need two nodes, and what does pipeline parallelism add?
#
# ## Where the original material was wrong
#
# - Its "try it yourself" list asked for LoRA runs on 1–8 GPUs, copied from the data-parallel
#   chapter; this chapter has LoRA off.
# - It said tensor parallelism distributes the model's *layers*; TP splits the matrices inside each
#   layer. Whole layers on different GPUs is pipeline parallelism, which the Mixtral layouts now use.
# - It gave Mixtral "~24 B parameters"; the model has about 46.7 B, about 12.9 B active per token.
# - It listed TP = 1 layouts next to Mixtral overrides that switch SP on; SP needs TP ≥ 2, and the
#   checker says so.
# - It presented "total GPUs = TP × EP" as a rule. In Megatron the dense part is TP × PP × DP and the
#   experts come out of the DP ranks: TP 2 × EP 2 on 4 GPUs has DP = 2 for attention, 4 sequences per DP rank.
# - Its Mixtral layouts cannot fit: TP 2 × EP 2 on 4 A100s needs about 209 GiB per GPU, TP 4 × EP 2
#   on 8 about 105 GiB. Its Llama TP 2 on 2 GPUs is predicted at about 78 GiB at the recipe's maximum length:
#   under 80 GB, but over the 10 % margin the checker keeps; at SQuAD's lengths it likely fits.
# - Its `peft=none` override kept the LoRA recipe's learning rate (1e-4, not the full fine-tune's 5e-6)
#   and, for Llama, left out the full fine-tune recipe's distributed optimizer.
#
# Details: {doc}`../book/seed_corrections`.
