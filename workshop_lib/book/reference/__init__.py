"""The views of the measurements on real GPUs that a chapter shows first (book/reference/*.json): a chapter's
reference tables with their provenance caption (chapter_views.py), NeMo's layout beside the prediction and the
measurements for chapters 1-2 (nemo_views.py), and the engine-scaling and recipe-benchmark views
(benchmark_views.py).

May import book.pages, book.measurements, book.tables and every package below book; claims, the calculator's
measured runs and the chapter facade import it, never the other way round. This face imports nothing.
"""
