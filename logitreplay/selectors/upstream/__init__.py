"""The adapter kit for production kernels: one module per upstream (vllm.py, flashinfer.py, sglang.py,
cudnn.py, deepselect.py, ...), each class declaring what it was read from (base.py), found and loaded one
way (loading.py), registered by being declared (catalog.py). docs/selectors.md says how to add one.
"""

from logitreplay.selectors.upstream.base import Declared, Release, Upstream
from logitreplay.selectors.upstream.loading import Loaded, Source

__all__ = ["Declared", "Loaded", "Release", "Source", "Upstream"]
