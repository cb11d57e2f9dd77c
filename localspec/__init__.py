"""localspec: local speculative decoding over GGUF models with llama-cpp-python.

Layers, each importing only from the ones before it (``tests/test_layers.py`` enforces it):

- ``errors``: typed errors with hints, usable everywhere;
- ``core``: events, params, sampling, verify, text, stats, drafting (the drafters and
  their registry), controller, engine, replay;
- ``backend`` (llama.cpp) and ``models`` (catalog, fetching, files), side by side;
- ``session``: a loaded pair, its chat template and cost calibration;
- front ends: ``bench``, ``tui``, then ``cli`` (which mounts them all).
"""

__version__ = "0.1.0"
