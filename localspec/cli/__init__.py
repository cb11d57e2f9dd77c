"""The ``localspec`` command line: ``app`` (the typer app and ``main``), ``common`` (exit
codes, error rendering, shared options) and one module per command group."""

import time

# When the command line started (the first of its modules imported): time-to-answer figures
# (``complete --json``'s ``timing``) count from here.
STARTED = time.perf_counter()


class Process:
    """What a command knows of the process it runs in. ``ends_with_command``: the console
    entry point ends the process as soon as this command returns (``app.main``, for a
    one-shot command), so what it loaded need not be freed piece by piece first."""

    ends_with_command = False


PROCESS = Process()
