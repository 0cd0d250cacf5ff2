"""The bundled CUDA kernels. `build` compiles and caches them for the exact architecture, `abi` binds
the C interface declared once in `topk_api.h`, `kernels` wraps them as selectors. Kernel authors
(the tuning scripts in bench/) use `build` and `abi` directly; nothing here runs nvcc at import."""

from logitreplay.selectors.cuda import abi, build

__all__ = ["abi", "build"]
