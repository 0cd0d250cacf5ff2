"""A stand-in `vllm` package for the adapters' discovery tests: the module layouts of vLLM 0.33 and 0.22,
each registering torch.library ops under the real namespaces with the real schemas (read from the 0.33
binaries), implemented on CPU with the real kernels' output contract (a contiguous (rows, topK) block,
`outIndices + row * topK`; DeepSelect's 32-byte aligned output rows), so a wrong call fails here as it
would on the GPU.

Ops live for the life of a process, so every layout is tried in a fresh interpreter (`run`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.vllm_schemas import SCHEMA_DS, SCHEMAS_C

_REGISTER_C = '''
import torch

def _select(logits, starts, ends, out, k):
    assert out.is_contiguous() and out.stride(0) == k, "writes outIndices + row * topK"
    for r in range(logits.shape[0]):
        s, e = int(starts[r]), int(ends[r])
        n = max(0, min(k, e - s))
        out[r].fill_(-1)
        if n:
            out[r, :n] = torch.topk(logits[r, s:e], n).indices.to(torch.int32)

def _ends(seq_lens, next_n, rows):
    lens = seq_lens.reshape(-1)
    if lens.numel() == rows:
        return lens.clamp(min=0)
    r = torch.arange(rows)
    return (lens[r // next_n] - next_n + 1 + r % next_n).clamp(min=0)

def prefill(logits, starts, ends, indices, rows, s0, s1, k):
    assert (rows, s0, s1) == (logits.shape[0], *logits.stride())
    _select(logits, starts, ends, indices, k)

def decode(logits, next_n, seq_lens, indices, rows, s0, s1, k):
    assert (rows, s0, s1) == (logits.shape[0], *logits.stride())
    _select(logits, torch.zeros(rows, dtype=torch.int32), _ends(seq_lens, next_n, rows), indices, k)

def fast(logits, lengths, output, workspace, k, max_seq_len):
    assert k in (512, 1024, 2048) or __import__("os").environ.get("STANDIN_ANY_K"), "supports k=512, 1024 or 2048"
    assert workspace.dtype == torch.uint8 and workspace.numel() >= 1 << 20, "workspace buffer too small"
    assert lengths.is_contiguous() and lengths.numel() == logits.shape[0], "lengths size mismatch"
    assert int(lengths.max()) <= max_seq_len
    _select(logits, torch.zeros(logits.shape[0], dtype=torch.int32), lengths.reshape(-1), output, k)

LIB = torch.library.Library("_C", "FRAGMENT")
for name, schema in SCHEMAS.items():
    LIB.define(schema)
LIB.impl("top_k_per_row_prefill", prefill, "CPU")
LIB.impl("top_k_per_row_decode", decode, "CPU")
LIB.impl("persistent_topk", fast, "CPU")
LIB.impl("cooperative_topk", fast, "CPU")
'''

_REGISTER_DS = '''
import torch

def topk(inp, k, begin, end, sorted_value, sorted_index, output_value, output_index, offset, fill, vfill, ret, abort):
    assert begin is None, "`begin` is not supported currently"
    assert end.dtype == torch.int32 and end.shape == (inp.shape[0],), "end must have shape (batch_size)"
    assert (output_index.stride(0) * 4) % 32 == 0 and output_index.stride(1) == 1, "output_index 32B rows"
    assert (inp.stride(0) * inp.element_size()) % 1024 == 0, ": stride_input_batch must be 16B-aligned"
    for r in range(inp.shape[0]):
        e = int(end[r])
        n = max(0, min(k, e))
        output_index[r].fill_(fill)
        if n:
            output_index[r, :n] = torch.topk(inp[r, :e].float(), n).indices.to(torch.int32)

def alignment():
    return 1024, 32

LIB = torch.library.Library("deep_select", "DEF")
LIB.define(SCHEMA)
LIB.define("get_alignment_requirement() -> (int, int)")
LIB.impl("topk", topk, "CPU")
LIB.impl("get_alignment_requirement", alignment, "CompositeExplicitAutograd")
'''


def register_c() -> str:
    return f"SCHEMAS = {SCHEMAS_C!r}\n" + _REGISTER_C


def register_deepselect() -> str:
    return f"SCHEMA = {SCHEMA_DS!r}\n" + _REGISTER_DS


def make_vllm(root: Path, layout: str) -> Path:
    """Write a stand-in `vllm` package under `root`: layout "0.33" (ops in `_C_stable_libtorch`, DeepSelect
    in `_deepselect_C`), "0.22" (ops in `_C`; `_C_stable_libtorch` registers none of them) or "broken"
    (`_C_stable_libtorch` fails to import, as a build against another torch does)."""
    pkg = root / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f'__version__ = "{layout}"\n')
    if layout == "0.33":
        (pkg / "_C_stable_libtorch.py").write_text(register_c())
        (pkg / "_deepselect_C.py").write_text(register_deepselect())
    elif layout == "0.22":
        (pkg / "_C_stable_libtorch.py").write_text("import torch\n")
        (pkg / "_C.py").write_text(register_c())
    elif layout == "broken":
        (pkg / "_C_stable_libtorch.py").write_text(
            'raise ImportError("_C_stable_libtorch.abi3.so: undefined symbol: _ZN3c104cuda9SetDevice")\n')
    else:
        raise ValueError(layout)
    return root


def run(script: str, sys_path: Path | None = None, env: dict[str, str] | None = None) -> object:
    """Run `script` in a fresh interpreter (with `sys_path` first on the path); it prints one JSON line."""
    prelude = f"import sys; sys.path.insert(0, {str(sys_path)!r})\n" if sys_path else ""
    proc = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=120, env=env)
    if proc.returncode != 0:
        raise AssertionError(f"stand-in script failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
