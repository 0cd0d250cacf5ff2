"""vLLM's kernels as selectors: found the way vLLM 0.33 (and 0.22) loads them, or from a path; called with
the real schemas; refusing, with a reason, a GPU their library has no code for."""

from __future__ import annotations

import importlib.util
import os
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from logitreplay.archive import Case
from logitreplay.selectors.base import Selector
from logitreplay.selectors.registry import available, build, factory_spec, needs_own_process
from logitreplay.selectors.upstream import catalog, loading, vllm
from tests import vllm_standin

CUDA = torch.device("cuda")


VLLM = sorted(n for n, e in catalog.adapters().items() if e.factory.startswith(vllm.__name__ + ":"))


@pytest.mark.parametrize("name", VLLM)
def test_every_adapter_is_registered(name: str) -> None:
    assert available()[name] == f"{vllm.__name__}:{type(build(name)).__name__}"
    sel = build(name)
    assert isinstance(sel, Selector) and sel.name == name


def test_a_library_path_names_its_column_after_the_build_folder() -> None:
    sel = build("vllm-native@/builds/branch-a/_C_stable_libtorch.abi3.so")
    assert sel.name == "vllm-native@branch-a"
    assert factory_spec("vllm-native@/x/y.so") == f"{vllm.__name__}:VllmPrefill"
    assert factory_spec("native") == available()["native"]


def test_two_sources_of_one_library_need_their_own_processes() -> None:
    assert not needs_own_process(["native", "vllm-native", "vllm-decode", "vllm-auto"])
    assert not needs_own_process(["vllm-native@/a/x.so", "vllm-decode@/a/x.so"])  # one build, one process
    assert needs_own_process(["vllm-native", "vllm-native@/a/x.so"])
    assert needs_own_process(["vllm-native@/a/x.so", "vllm-persistent@/b/x.so"])
    assert not needs_own_process(["vllm-native@/a/x.so", "vllm-deepselect"])  # different libraries


def test_missing_vllm_is_named_with_its_install(monkeypatch: pytest.MonkeyPatch) -> None:
    loading.forget()
    monkeypatch.setattr(importlib.util, "find_spec", lambda module: None)
    try:
        sel = build("vllm-native")
        assert "needs a CUDA device" in (sel.supports(_case(), torch.device("cpu")) or "")
        assert sel.supports(_case(), CUDA) == "not installed (pip install vllm)"
    finally:
        loading.forget()


def test_a_library_path_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    assert loading.find(vllm.C_OPS, str(tmp_path / "nope.so")) == f"no kernel library at {tmp_path / 'nope.so'}"


# ------------------------------------------------------------------------------ architecture probe

def _elf_with_fatbin(path: Path, entries: list[tuple[int, int]]) -> Path:
    """A minimal 64-bit ELF whose `.nv_fatbin` section lists (kind, sm) entries (1 = PTX, 2 = cubin)."""
    body = b"".join(struct.pack("<HHIQIIII", kind, 0x101, 64, 0, 0, 0, 0, sm) + bytes(32) for kind, sm in entries)
    fatbin = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body
    names = b"\0.shstrtab\0.nv_fatbin\0"
    data_off = 64
    names_off = data_off + len(fatbin)
    shoff = (names_off + len(names) + 7) // 8 * 8
    header = bytearray(64)
    header[:5] = b"\x7fELF\x02"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 1)
    sections = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, names_off, len(names), 0, 0, 1, 0),
                struct.pack("<IIQQQQIIQQ", 11, 1, 0, 0, data_off, len(fatbin), 0, 0, 8, 0)]
    blob = bytes(header) + fatbin + names
    path.write_bytes(blob + bytes(shoff - len(blob)) + b"".join(sections))
    return path


def test_a_library_without_code_for_the_gpu_says_so(tmp_path: Path) -> None:
    sm100 = _elf_with_fatbin(tmp_path / "ds.so", [(2, 100), (2, 100)])
    loaded = loading.Loaded("vllm._deepselect_C", str(sm100))
    assert loading.fatbin_archs(str(sm100)) == {("cubin", 100)}
    assert loading.missing_arch(loaded, "vllm._deepselect_C", (9, 0)) == \
        "no sm_90 code in vllm._deepselect_C (it has sm_100)"
    assert loading.missing_arch(loaded, "vllm._deepselect_C", (10, 0)) is None
    assert loading.missing_arch(loaded, "vllm._deepselect_C", (10, 3)) is None  # same family, newer minor


def test_cubins_of_another_major_do_not_count_but_older_ptx_does(tmp_path: Path) -> None:
    lib = _elf_with_fatbin(tmp_path / "c.so", [(2, 80), (2, 120), (1, 80)])
    ptx = loading.Loaded("x", str(lib))
    assert loading.missing_arch(ptx, "lib", (9, 0)) is None  # PTX for sm_80 JIT-compiles for sm_90
    no_ptx = loading.Loaded("x", str(_elf_with_fatbin(tmp_path / "d.so", [(2, 80), (2, 120)])))
    assert loading.missing_arch(no_ptx, "lib", (9, 0)) == "no sm_90 code in lib (it has sm_80, sm_120)"


def test_a_file_that_is_not_an_elf_claims_nothing(tmp_path: Path) -> None:
    (tmp_path / "lib.py").write_text("x = 1\n")
    assert loading.fatbin_archs(str(tmp_path / "lib.py")) is None
    assert loading.missing_arch(loading.Loaded("m", str(tmp_path / "lib.py")), "m", (9, 0)) is None


# ------------------------------------------------------------------------- decode facts and auto

def _case(rows: int = 4, cols: int = 256, top_k: int = 16, attrs: dict | None = None) -> Case:
    ends = np.array([cols - 3 * i for i in range(rows)], np.int32)
    values = np.random.default_rng(0).standard_normal(int(ends.sum())).astype(np.float32)
    return Case.from_rows("c", values, np.zeros(rows, np.int32), ends, top_k=top_k, cols=cols, attrs=attrs)


def test_decode_call_without_recorded_facts_is_one_request_per_row() -> None:
    case = _case()
    assert vllm.decode_call(case) == vllm.DecodeCall(4, 1, 256)


class _Facts:
    batch, next_n, max_seq_len = 2, 2, 100  # max_seq_len below a row end is raised to it


def test_decode_call_uses_the_case_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    case = _case()
    monkeypatch.setattr(Case, "decode", property(lambda self: _Facts()), raising=False)
    assert vllm.decode_call(case) == vllm.DecodeCall(2, 2, 256)


def test_auto_follows_vllm_033s_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    auto = vllm.VllmAuto()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    # The adapter reads only `case.kind`: mark decode cases without building their full facts.
    monkeypatch.setattr(Case, "kind", property(lambda self: self.attrs.get("as", "prefill")), raising=False)
    decode = {"as": "decode"}
    assert auto.chosen(_case(64, 256, 512, decode), CUDA).op == "cooperative_topk"
    assert auto.chosen(_case(65, 256, 512, decode), CUDA).op == "persistent_topk"
    assert auto.chosen(_case(8, 256, 256, decode), CUDA).op == "top_k_per_row_decode"
    assert auto.chosen(_case(8, 256, 512), CUDA).op == "top_k_per_row_prefill"  # a prefill case
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (12, 0))
    assert auto.chosen(_case(8, 256, 512, decode), CUDA).op == "persistent_topk"  # no cooperative on SM 12.x


# ------------------------------------------------------------ module layouts (fresh interpreters)

_DISCOVER = """
import json, torch
from logitreplay.selectors.upstream import loading, vllm
got = loading.find(vllm.C_OPS)
ds = loading.find(vllm.DEEPSELECT)
print(json.dumps([got if isinstance(got, str) else got.source, ds if isinstance(ds, str) else ds.source]))
"""


@pytest.mark.slow
@pytest.mark.parametrize(("layout", "expected"), [
    ("0.33", ["vllm._C_stable_libtorch", "vllm._deepselect_C"]),
    ("0.22", ["vllm._C", "the installed vllm registers no torch.ops.deep_select.topk (looked in vllm._deepselect_C)"]),
])
def test_ops_are_found_where_each_vllm_version_registers_them(tmp_path: Path, layout: str,
                                                              expected: list[str]) -> None:
    assert vllm_standin.run(_DISCOVER, vllm_standin.make_vllm(tmp_path, layout)) == expected


@pytest.mark.slow
def test_a_broken_build_says_why_it_does_not_import(tmp_path: Path) -> None:
    got, _ = vllm_standin.run(_DISCOVER, vllm_standin.make_vllm(tmp_path, "broken"))  # type: ignore[misc]
    assert got.startswith("vllm._C_stable_libtorch does not import (ImportError: ")
    assert "undefined symbol" in got


_CALLS = """
import json, numpy as np, torch
from logitreplay.archive import Case
from logitreplay.replay.verify import OutputBuffer, check_output, expected_values
from logitreplay.selectors.upstream import vllm
from logitreplay.selectors.base import prepare_for

rows, cols = 6, 512
ends = np.array([512, 200, 17, 5, 256, 130], np.int32)
values = np.random.default_rng(1).standard_normal(int(ends.sum())).astype(np.float32)
out = {}
for name, k, dtype in [("vllm-native", 16, torch.float32), ("vllm-decode", 16, torch.float32),
                       ("vllm-persistent", 512, torch.float32), ("vllm-cooperative", 512, torch.float32),
                       ("vllm-deepselect", 16, torch.float32), ("vllm-deepselect", 16, torch.bfloat16)]:
    case = Case.from_rows("c", torch.from_numpy(values).to(dtype), np.zeros(rows, np.int32), ends, top_k=k,
                          cols=cols)
    sel = vllm.__dict__[{"vllm-native": "VllmPrefill", "vllm-decode": "VllmDecode",
                         "vllm-persistent": "VllmPersistent", "vllm-cooperative": "VllmCooperative",
                         "vllm-deepselect": "VllmDeepSelect"}[name]]()
    logits = case.padded(device="cpu")
    starts, ends_t = torch.from_numpy(case.row_starts), torch.from_numpy(case.row_ends)
    buf = OutputBuffer(rows, k, "cpu")
    prepare_for(sel, case, logits, starts, ends_t, k, buf.view)()  # as the engine prepares: given the case
    fails = check_output(case, logits, starts, ends_t, buf, expected_values(logits, starts, ends_t, k))
    out[f"{name}/{dtype}"] = [str(f) for f in fails] + [f"staging {sel.staging_bytes(case)}"]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_each_adapter_calls_its_op_with_the_real_schema_and_passes_checks_1_to_4(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), *sys.path])}
    got = vllm_standin.run(_CALLS, vllm_standin.make_vllm(tmp_path, "0.33"), env)
    assert got == {
        "vllm-native/torch.float32": ["staging 384"],
        "vllm-decode/torch.float32": ["staging 384"],
        "vllm-persistent/torch.float32": ["staging 12288"],
        "vllm-cooperative/torch.float32": ["staging 12288"],
        # The most it copies: an aligned view (here (16 + 16) * 4 = 128 bytes apart) is written directly.
        "vllm-deepselect/torch.float32": ["staging 384"],
        "vllm-deepselect/torch.bfloat16": ["staging 384"],
    }


_PATHS = """
import json, torch
from logitreplay.selectors.upstream import loading, vllm
standin = open(LIB).read()
torch.ops.load_library = lambda path: exec(standin, {})  # the library's static registration
a = loading.find(vllm.C_OPS, LIB)
again = loading.find(vllm.C_OPS, LIB)
other = loading.find(vllm.C_OPS, OTHER)
print(json.dumps([a.source == LIB, again == a, other]))
"""


@pytest.mark.slow
def test_a_library_from_a_path_is_loaded_once_and_a_second_build_is_refused(tmp_path: Path) -> None:
    lib = tmp_path / "a" / "_C_stable_libtorch.abi3.so"
    lib.parent.mkdir()
    lib.write_text(vllm_standin.register_c())
    other = tmp_path / "b.so"
    other.write_text("")
    script = f"LIB, OTHER = {str(lib)!r}, {str(other)!r}\n" + _PATHS
    first, same, refused = vllm_standin.run(script)  # type: ignore[misc]
    assert first and same
    assert refused == (f"this process already holds vllm._C_stable_libtorch from {lib}; a second build of the "
                       "same ops cannot be loaded beside it (run it in a process of its own: --isolate)")
