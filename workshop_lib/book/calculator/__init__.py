"""The book's memory calculator: the workshop's own estimator, run in the reader's browser by Pyodide.

``page`` is what the page calls (form values in, numbers, fit verdicts, linter messages and the closest
measured run out); it imports only the standard library and the modules in ``bundle.PAGE_MODULES``, which
the book ships as they are. ``measured_runs`` and ``bundle`` run when the book is built (CPython): they turn
book/reference/*.json into the page's list of measured runs and lay out the page's files.
``sphinx_extension`` hooks the bundle into the Jupyter Book build. Nothing here is imported at package load.
"""
