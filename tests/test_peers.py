"""The peers' adapters against stand-ins of FlashInfer, SGLang v2 and sgl-kernel (tests/peer_standins.py):
each calls its entry point with the arguments production passes, maps the fused outputs back through
the page table or offsets it built, passes checks 1-4 and 6 (SGLang's ragged v2 writes its own copy,
never the replay's logits), and declines what the real kernel cannot do with a reason. cuDNN's indexer
top-k has no stand-in: here only what holds without it (its registration, its declines, its layout
rules); tests/gpu/test_gpu_peers.py runs the real package."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from logitreplay.archive import Case
from logitreplay.replay.verify import Inputs, OutputBuffer, check_output, expected_values
from logitreplay.selectors.base import prepare_for
from logitreplay.selectors.registry import available, build, needs_own_process
from logitreplay.selectors.upstream import Upstream, catalog, cudnn, launches, loading
from tests import peer_standins

CUDA = torch.device("cuda")
# The adapters the stand-ins stand in for: of their packages, and read from (or taking) their versions.
PEERS = sorted(n for n, e in catalog.adapters().items()
               if e.declared.family in ("flashinfer", "sglang", "sgl_kernel common_ops")
               and e.declared.release.refuses(peer_standins.VERSIONS.get(e.declared.release.source.dist)) is None)
MODULES = ("flashinfer", "sglang", "sgl_kernel")


@pytest.fixture(scope="module")
def standins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = peer_standins.write(tmp_path_factory.mktemp("peers"))
    sys.path.insert(0, str(root))
    loading.forget()
    try:
        yield {m: importlib.import_module(m) for m in ("flashinfer.topk", "sglang.kernels.ops.attention.dsv4.topk",
                                                         "sgl_kernel")}
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n.split(".")[0] in MODULES]:
            del sys.modules[name]
        loading.forget()


def _case(rows: int = 6, cols: int = 4096, k: int = 2048, starts: bool = False, stride: int | None = None,
          dtype: torch.dtype = torch.float32) -> Case:
    rng = np.random.default_rng(rows + cols + k)
    lo = (np.arange(rows) * 5 + 1).astype(np.int32) if starts else np.zeros(rows, np.int32)
    ends = np.minimum(lo + np.array([cols, k // 2, k, 3000, 17, cols][:rows]), cols).astype(np.int32)
    values = torch.from_numpy(rng.standard_normal(int((ends - lo).sum())).astype(np.float32)).to(dtype)
    return Case.from_rows("c", values, lo, ends, top_k=k, cols=cols, row_stride=stride)


def _run(name: str, case: Case) -> tuple[list[Any], str | None]:
    """Prepare as the engine does, one launch, checks 1-4 and check 6 on the replay's own inputs."""
    original = Inputs.of(case.padded(poison=1e30, device="cpu"), torch.from_numpy(case.row_starts),
                         torch.from_numpy(case.row_ends))
    inputs = original.copy()
    out = OutputBuffer(case.rows, case.top_k, "cpu")
    prepare_for(build(name), case, inputs.logits, inputs.row_starts, inputs.row_ends, case.top_k, out.view)()
    expected = expected_values(original.logits, original.row_starts, original.row_ends, case.top_k)
    fails = check_output(case, original.logits, original.row_starts, original.row_ends, out, expected)
    changed = inputs.changed(case.case_id, original)
    return fails, None if changed is None else str(changed)


def _calls(standins: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    calls: list[tuple[str, dict[str, Any]]] = []
    for mod in standins.values():
        calls += mod.CALLS
        mod.CALLS.clear()
    return calls


@pytest.mark.parametrize("name", PEERS)
def test_each_peer_passes_the_checks_on_a_decode_case(name: str, standins: dict[str, Any]) -> None:
    assert _run(name, _case()) == ([], None)
    assert _calls(standins)  # the stand-in of its package was called


@pytest.mark.parametrize("name", [n for n in PEERS if "paged" not in n and n != "flashinfer"])
def test_peers_that_take_row_starts_pass_on_a_multi_request_chunk(name: str, standins: dict[str, Any]) -> None:
    assert _run(name, _case(starts=True)) == ([], None)


def test_sglang_ragged_v2_masks_its_own_copy_of_the_scores(standins: dict[str, Any]) -> None:
    _calls(standins)
    case = _case(starts=True)
    assert _run("sglang-ragged-v2", case) == ([], None)  # check 6: the replay's logits are untouched
    [(entry, args)] = _calls(standins)
    assert entry == "topk_transform_ragged_v2"
    scores = args["scores"]
    assert bool(torch.isinf(scores[1, 4:6]).all())  # row 1 starts at column 6: columns 4-5 masked, upstream's way
    assert torch.equal(args["row_starts"], torch.from_numpy(case.row_starts))


@pytest.mark.parametrize(("name", "algo"), [("flashinfer-ragged", "default"), ("flashinfer-ragged-cub", "cub"),
                                            ("flashinfer-paged", "default"), ("flashinfer-topk-cub", "cub"),
                                            ("flashinfer", None)])
def test_flashinfer_is_called_graph_safe_on_the_backend_named(name: str, algo: str | None,
                                                               standins: dict[str, Any]) -> None:
    _calls(standins)
    _run(name, _case())
    [(_, args)] = _calls(standins)
    assert args["algo"] == algo
    assert args["dsa_graph_safe"] is (name != "flashinfer")  # vLLM's call passes no flag; SGLang's does
    assert args["deterministic"] is False  # as SGLang and vLLM call it


def test_sglang_paged_v2_plans_over_the_lengths_it_selects_with(standins: dict[str, Any]) -> None:
    _calls(standins)
    _run("sglang-paged-v2", _case())
    (plan, p), (entry, t) = _calls(standins)
    assert (plan, entry) == ("plan_topk_v2", "topk_transform_paged_v2")
    assert t["page_size"] == 64 and t["metadata"].shape == (7, 2)


def test_sgl_kernel_passes_row_starts_as_sglang_does(standins: dict[str, Any]) -> None:
    _calls(standins)
    _run("sgl-fast-topk", _case())
    _run("sgl-fast-topk", _case(starts=True))
    _run("sgl-fast-topk-paged", _case())
    decode, chunk, paged = _calls(standins)
    assert decode[1]["row_starts"] is None and chunk[1]["row_starts"] is not None  # None in decode
    assert torch.equal(paged[1]["cu_seqlens_q"], torch.arange(7, dtype=torch.int32))  # one query row per request


@pytest.mark.parametrize(("name", "case", "reason"), [
    ("flashinfer", _case(stride=4096 + 64), "raises 'input must be contiguous'"),
    ("flashinfer", _case(starts=True), "takes row ends only"),
    ("flashinfer-ragged", _case(k=4096), "FilteredTopK) takes k <= 2048"),
    ("flashinfer-ragged-cub", _case(cols=(1 << 21) + 8, rows=1, k=8), "takes at most 2097152"),
    ("flashinfer-paged", _case(starts=True), "decode form"),
    ("sglang-ragged-v2", _case(k=4096), "0 < k <= 2048"),
    ("sglang-ragged-v2", _case(stride=4097), "not a multiple of 4"),
    ("sglang-paged-v2", _case(dtype=torch.bfloat16), "float32 logits only"),
    ("sgl-fast-topk", _case(k=512), "exactly top_k = 2048"),
    ("sgl-fast-topk-paged", _case(starts=True), "decode form"),
])
def test_limits_decline_with_the_reason(name: str, case: Case, reason: str, standins: dict[str, Any],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert reason in (build(name).supports(case, CUDA) or "")
    assert build(name).supports(_case(), CUDA) is None  # the stand-in is found, and a plain case is taken


@pytest.mark.parametrize("name", PEERS)
def test_each_peer_declines_what_its_declaration_says_it_does_not_take(name: str, standins: dict[str, Any],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    declared, sel = catalog.adapters()[name].declared, build(name)
    for dtype in (torch.float32, torch.bfloat16):  # the dtypes a case holds
        taken = str(dtype).removeprefix("torch.") in declared.dtypes
        assert (sel.supports(_case(dtype=dtype), CUDA) is None) == taken, dtype
    low, high = declared.k
    if high is not None:
        assert sel.supports(_case(k=high * 2), CUDA) is not None
    assert (sel.supports(_case(starts=True), CUDA) is None) == ("starts" in declared.layouts)
    assert (sel.supports(_case(stride=4096 + 64), CUDA) is None) == ("padded" in declared.layouts)


def test_a_peer_refuses_a_version_it_was_not_read_from(standins: dict[str, Any],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(sys.modules["flashinfer"], "__version__", "0.7.5")
    loading.forget()
    try:
        assert build("flashinfer-ragged").supports(_case(), CUDA) == (
            "flashinfer-python 0.7.5 is not a version this adapter knows: it was read from 0.7.2.post1 and takes "
            "0.7.2 <= version < 0.7.5")
    finally:
        monkeypatch.undo()
        loading.forget()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert build("flashinfer-ragged").supports(_case(), CUDA) is None  # the stand-in's own 0.7.2.post1


def test_versions_compare_by_their_numbers() -> None:
    from logitreplay.selectors.upstream.base import release_numbers

    assert release_numbers("0.7.2.post1") == (0, 7, 2, 1) and release_numbers("v0.4.10") == (0, 4, 10)
    assert release_numbers("2.11.0+cu130") == (2, 11, 0) and release_numbers("0.34.0rc1") == (0, 34, 0)
    assert release_numbers("0.4.10") > release_numbers("0.4.6")


def test_a_peer_from_a_folder_is_named_after_it_and_a_second_copy_is_refused(standins: dict[str, Any],
                                                                             tmp_path: Path) -> None:
    root = next(p for p in sys.path if (Path(p) / "flashinfer" / "topk.py").is_file())
    sel = build(f"flashinfer-ragged@{root}")
    assert isinstance(sel, Upstream)
    assert sel.name == f"flashinfer-ragged@{Path(root).name}"
    found = sel.find()
    assert not isinstance(found, str) and found.source == root
    other = peer_standins.write(tmp_path / "other")
    assert "already imported flashinfer from" in str(build(f"flashinfer@{other}").find())
    assert needs_own_process(["flashinfer-ragged", f"flashinfer-paged@{other}"])
    assert not needs_own_process(["flashinfer-ragged", "sgl-fast-topk", "vllm-native"])


@pytest.mark.parametrize("layout", launches.LAYOUTS)
@pytest.mark.parametrize("page_size", [1, 64])
def test_a_page_table_maps_back_to_the_columns_it_was_given(layout: str, page_size: int) -> None:
    rows, cols = 3, 300
    table = launches.page_table(rows, cols, page_size, layout, torch.device("cpu"))
    local = torch.tensor([[0, 299, 64, -1], [5, 6, 200, 1], [-1, -1, 130, 299]], dtype=torch.int32)
    pages = table.table[torch.arange(rows)[:, None], (local // page_size).clamp(min=0)]
    slots = torch.where(local < 0, -1, pages * page_size + local % page_size)
    out = torch.empty_like(local)
    launches.mapper(table, out)(slots)
    assert torch.equal(out, local)
    assert (layout == "identity") == bool((table.table.flatten().diff() == 1).all())


def test_deepselect_upstream_built_for_sm100_only_says_so_on_hopper(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_vllm_adapters import _elf_with_fatbin

    pkg = tmp_path / "deep_select"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def get_stride_requirement():\n    return (1024, 32)\n")
    _elf_with_fatbin(pkg / "deep_select_cuda.cpython-312-x86_64-linux-gnu.so", [(2, 100), (2, 103)])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    loading.forget()
    try:
        sel = build(f"deepselect-upstream@{tmp_path}")
        assert sel.supports(_case(), CUDA) == "no sm_90 code in deep_select (it has sm_100, sm_103)"
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
        assert sel.supports(_case(starts=True), CUDA) == \
            "takes a per-row end only: rows starting past column 0 (multi-request chunks) are not supported"
    finally:
        sys.modules.pop("deep_select", None)
        sys.path.remove(str(tmp_path))
        loading.forget()


def _coarse_bin(values: np.ndarray) -> np.ndarray:
    """sgl-kernel's first-pass bin: the top 8 bits of the order key of each value's float16."""
    bits = values.astype(np.float16).view(np.uint16).astype(np.uint32)
    key = np.where(bits & 0x8000, ~bits & 0xFFFF, bits | 0x8000)
    return key >> 8


def test_the_probe_puts_exactly_c_candidates_in_the_kth_values_coarse_bin() -> None:
    spec = importlib.util.spec_from_file_location("peers_bench", Path(__file__).parents[1] / "bench" / "peers.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for case, count in zip(bench.probe_cases(), bench.PROBE_COUNTS, strict=True):
        logits = case.padded(device="cpu").numpy()
        for row in logits:
            kth = np.sort(row)[-case.top_k]
            assert int((_coarse_bin(row) == _coarse_bin(np.array([kth]))[0]).sum()) == count
            if count <= 4097:  # distinct across the buffer's limit: a dropped candidate changes the answer
                assert len(np.unique(row[row > 0])) == count


CUDNN = cudnn.CudnnIndexerTopK.name


def test_cudnn_indexer_topk_is_registered_and_says_what_it_lacks() -> None:
    assert available()[CUDNN] == "logitreplay.selectors.upstream.cudnn:CudnnIndexerTopK"
    assert catalog.families()[CUDNN] == "cudnn"
    sel = build(CUDNN)
    assert sel.supports(_case(), torch.device("cpu")) == "an upstream CUDA kernel: needs a CUDA device"
    if importlib.util.find_spec("cudnn") is None:
        assert sel.supports(_case(), CUDA) == "not installed (pip install nvidia-cudnn-frontend[cutedsl])"
    assert build(f"{CUDNN}@/no/such/folder").supports(_case(), CUDA) == \
        "no folder /no/such/folder to import cudnn.deepseek_sparse_attention.indexer_top_k from"


@pytest.mark.parametrize(("case", "capability", "reason"), [
    (_case(), (8, 9), "IndexerTopK requires SM90+ (check_support); this GPU is sm_89"),
    (_case(k=4096), (9, 0), "top_k 4096: IndexerTopK takes 0 < k <= 2048"),
    (_case(starts=True), (9, 0), "takes row lengths only (its row_start is 0): rows starting past column 0"),
    (_case(stride=4096 + 64), (9, 0), "row stride 4160 > 4096 columns: IndexerTopK takes contiguous rows only"),
    (_case(rows=1, stride=4096 + 64), (9, 0), "row stride 4160 > 4096 columns"),  # its check reads the stride
    (_case(rows=0), (9, 0), "no rows or no columns"),
])
def test_cudnn_indexer_topk_declines_what_the_kernel_does_not_take(case: Case, capability: tuple[int, int],
                                                                   reason: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert reason in (build(CUDNN).limits(case, CUDA) or "")


@pytest.mark.parametrize("case", [_case(), _case(dtype=torch.bfloat16), _case(k=1, cols=100), _case(rows=3, cols=1000, k=2048)])
def test_cudnn_indexer_topk_takes_contiguous_rows_from_column_0(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert build(CUDNN).limits(case, CUDA) is None  # k may exceed the width


def _empty_rows(rows: int, cols: int, dtype: torch.dtype = torch.float32) -> Case:
    return Case.from_rows("wide", torch.zeros(0, dtype=dtype), np.zeros(rows, np.int32), np.zeros(rows, np.int32),
                          top_k=8, cols=cols)


def test_cudnn_scratch_is_sized_and_bounded_as_upstream_sizes_it() -> None:
    assert cudnn.scratch_bytes(_case(rows=4, cols=4096)) == 4 * 2 * 4096 * 4  # two int32 words per float32
    assert cudnn.scratch_bytes(_case(rows=3, cols=1001, dtype=torch.bfloat16)) == 12032  # 3003 words, 128 B up
    # launch_topk_kernel splits rows so the int32 scratch index fits, 8 float32 rows a step at least
    assert cudnn.scratch_chunk_limit(_empty_rows(9, 1 << 27)) is None
    assert "one aligned chunk of 8 rows overflows" in (cudnn.scratch_chunk_limit(_empty_rows(9, (1 << 27) + 1)) or "")
    assert cudnn.scratch_chunk_limit(_empty_rows(1, (1 << 27) + 1)) is None  # fits one launch unsplit
    assert "of 16 rows" in (cudnn.scratch_chunk_limit(_empty_rows(20, (1 << 27) + 1, torch.bfloat16)) or "")


def test_cutlass_dsl_packages_go_on_the_path_as_its_pth_line_puts_them(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("cutlass") is not None or importlib.util.find_spec("nvidia_cutlass_dsl") is not None:
        pytest.skip("nvidia-cutlass-dsl is installed here")
    dsl = tmp_path / "nvidia_cutlass_dsl" / "dsl_packages"
    (dsl / "cutlass").mkdir(parents=True)
    (dsl / "cutlass" / "__init__.py").write_text("")
    monkeypatch.setattr(sys, "path", list(sys.path))
    cudnn.cutlass_on_path(str(tmp_path))  # NAME@DIR: the folder pip installed into
    assert sys.path[0] == str(dsl)
    sys.path.remove(str(dsl))
    importlib.invalidate_caches()
    sys.path.insert(0, str(tmp_path))  # PYTHONPATH=DIR: found through the namespace package
    cudnn.cutlass_on_path()
    spec = importlib.util.find_spec("cutlass")
    assert spec is not None and spec.origin == str(dsl / "cutlass" / "__init__.py")
