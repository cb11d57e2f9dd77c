"""The ``localspec`` command line: ``app`` (the typer app and ``main``), ``common`` (exit
codes, error rendering, shared options) and one module per command group."""

import time

# When the command line started (the first of its modules imported): time-to-answer figures
# (``complete --json``'s ``timing``) count from here.
STARTED = time.perf_counter()
