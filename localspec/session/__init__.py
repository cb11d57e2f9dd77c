"""A loaded target/draft pair (``session``), its chat template and the measurement of this
machine's costs (``calibrate``). Builds on core, backend and models; every front end
(cli, tui, bench, serve) goes through it."""
