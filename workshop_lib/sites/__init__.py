"""Where the workshop runs: site profiles (ibex, tiny, a GPU workstation...), their schema and reservation,
what a job requires of a site, and `workshop setup` (the plan of steps and running it).

Owns: profiles.py + schema.py, reservation.py, requirements.py (markers, cache and offline variables, the checks a
job script makes before it starts), setup_plan.py and setup_run.py, step_cap.py (the
optimizer steps a run is held to: the smallest cap that is set), site_check.py (run inside the site's own
environment by `python -m workshop_lib.site_check`), nemo_checkpoint.py, lab_settings.py, class_folder.py (where the
class pools its results: $WORKSHOP_CLASS_DIR, else class/ in the staged folder).
May import: core, experiments. This face imports nothing: site_check runs with the standard library only.
"""
