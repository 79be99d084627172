"""Developer tool: chapters 1-2's `nemo llm finetune` commands checked by NeMo 2.4.1 itself (`make nemo-check`).

Owns: environment.py (NeMo's own virtual environment, built once), check.py (render each NeMo experiment's script,
dry-run its command in that environment, write the resolved recipes to book/reference/nemo/), resolve.py (runs
inside NeMo's environment), onnx_alias.py. The library reads the resolved recipes through core.reference, never
through this tool.
May import: everything of the library; nothing imports it.
"""
