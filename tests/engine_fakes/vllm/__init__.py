"""vLLM: the loader that runs the released indexer modules, and the fakes at their edges (see loader.py)."""
