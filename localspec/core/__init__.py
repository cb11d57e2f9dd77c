"""The core: events, parameters, sampling, verification, text, stats, drafters, controller
and engine, and a request's checks (``preflight``). Pure Python and numpy: no I/O, no
llama_cpp, no UI. It imports nothing of localspec but ``localspec.errors``."""
