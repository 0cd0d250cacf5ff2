"""Stand-in SGLang 0.5.23 (see tests/sglang0523/__init__.py)."""

from sglang.version import __version__

__all__ = ["__version__"]
