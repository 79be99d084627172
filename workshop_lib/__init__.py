"""Fine-tuning workshop library: the chapters' experiments as SLURM jobs, their results as tables.

The packages, in the order of the flow (experiment -> checks -> script -> job -> run -> results -> book). A package
imports only packages listed above it (tests/test_import_loops.py checks it, and that there is no import loop):

    core/         words both sides share, standard library only: errors, paths, the run folder's file names,
                  vocabulary (engines, recipes, the custom GPT's shape), the reference folder's readers
    train/        job side: the entry points torchrun runs inside jobs; imports core only, imported by nobody
    experiments/  every chapter's runs as data: the chapter registry (CHAPTER_SPECS, the one list of chapters),
                  the Experiment value, its id and content hash (and the rule that keeps hashes stable)
    estimate/     predictions before a run: parameters, memory per GPU, FLOPs, whether it fits
    sites/        where it runs: site profiles, reservation, what a job requires, `workshop setup`
    checks/       findings about an experiment or a job script (the seeds' pitfalls, the linter, fit, disk)
    scripts/      job scripts rendered from slurm/templates
    jobs/         jobs on a scheduler (SLURM or the local executor), one watcher per process, why a job failed
    runs/         a run's folder, record and job: submit or reuse, status, explanations
    results/      what runs left, parsed (one module per log format) into a chapter's table
    class_plan/   the class day: who makes which run, the day's jobs packed on a reservation's node shapes,
                  the reservation that fits
    book/         what a chapter shows: tables, figures, claims, the memory calculator, and the notebooks' API
                  (`from workshop_lib.book.chapter import facade as nb`)
    widgets/      the experiment builder and the job monitor (ipywidgets, with HTML fallbacks); the one import
                  upward is book.chapter.facade showing the live monitor, and widgets never import it
    cli/          the `workshop` command and `make demo`
    nemo_check/   developer tool: NeMo's own dry runs of chapters 1-2, written to book/reference/nemo/
    site_check.py `python -m workshop_lib.site_check`, run inside a site's environment by the setup steps
"""

# The layers, bottom first; tests/test_import_loops.py reads this list.
LAYERS = ("core", "experiments", "estimate", "sites", "checks", "scripts", "jobs", "runs", "results", "class_plan", "book",
          "widgets", "cli", "nemo_check")
