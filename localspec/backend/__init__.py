"""llama.cpp behind the core's model contract: loading and evaluating GGUF models
(``llama``, the only module that imports llama_cpp at import time), vocabulary compatibility,
requantization and llama.cpp's own binaries. Imports the core at most."""
