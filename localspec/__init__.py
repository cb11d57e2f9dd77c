"""localspec: local speculative decoding over GGUF models with llama-cpp-python.

The package is split into a pure core (events, sampling, verify, stats, drafters,
controller, engine) that never touches a terminal, and front ends (cli, tui, bench)
that consume the engine's event stream.
"""

__version__ = "0.1.0"
