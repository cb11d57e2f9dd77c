"""Model files: the shipped catalog (``data/catalog.toml``), its types, resolution of a
reference to a GGUF path, fetching from the Hub or PyPI, where files live, GGUF headers and
memory/disk estimates, and drafts derived from a target's own layers (``derive``,
``selfdraft``). Imports the core, and the backend only to measure derived drafts; never
llama_cpp itself."""
