"""Model files: the shipped catalog (``data/catalog.toml``), its types, resolution of a
reference to a GGUF path, fetching from the Hub or PyPI, where files live, GGUF headers and
memory/disk estimates. Imports the core at most; never llama_cpp."""
