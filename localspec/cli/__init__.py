"""The ``localspec`` command line: ``app`` (the typer app and ``main``), ``common`` (exit
codes, error rendering, shared options) and one module per command group."""
