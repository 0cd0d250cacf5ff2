"""SGLang: the loader that runs the released modules, and the fakes at their edges (see loader.py)."""
