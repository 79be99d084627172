"""Checks before SLURM runs anything: the seeds' pitfalls caught in an experiment or in any job script.

Owns: findings (what a check reports), the experiment rules, the script linter (the script reader, the #SBATCH
reader, the rules on the seeds' own scripts, hand-written launches (launches.py reads where each runs,
launch_rules.py judges them), what a job requests, sbatch's and srun's own semantics of directives, steps and
arrays, the launchers' batch arithmetic, the launcher versions the profile installs), the `nemo llm finetune` parser, one Layout value and one function per pitfall both rule sets share,
and the fit, disk and env-vars checks.
May import: core, experiments, estimate and the site profiles; never what comes downstream (scripts, jobs,
runs, results, book, widgets, cli). This face imports nothing: the memory calculator ships checks modules.
"""
