"""A loaded target/draft pair and what needs one: which pair to load (``pair``), loading it
(``open``), its prompts (``prompts``, ``chat_template``), the session around the engine
(``session``), the measurement of this machine's costs and their cache (``calibrate``,
``costcache``), where each model runs (``placement``) and the checks of ``doctor``. Builds
on core, backend, models and storage; every front end (cli, tui, bench, serve) goes
through it."""
