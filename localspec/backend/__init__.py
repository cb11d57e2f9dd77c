"""llama.cpp behind the core's model contract: loading and evaluating GGUF models
(``llama``, its vocabulary side in ``vocab``), vocabulary compatibility, devices, RPC
workers, requantization and llama.cpp's own binaries. Importing a module here never
initialises llama.cpp: ``runtime.ensure_backend`` does, at the first use that needs it.
``rpc`` imports llama_cpp only when called, as ``localspec --help`` imports it. Imports the
core at most."""
