// The C interface of the bundled top-k kernels, stated once: every kernel family <family> ("native",
// "deepselect", one <family>.cu each) is a torch-free shared library exporting the three entry points of
// LR_TOPK_ENTRY_POINTS below. Each .cu includes this header, so nvcc checks its definitions against these
// prototypes (an extern "C" definition that differs is a compile error, not a mismatch found at load
// time); the Python side binds the same entry points from one table, ENTRY_POINTS in abi.py, which
// tests/test_cuda_build.py compares with this file.
//
// int lr_<family>_topk(logits, dtype, row_stride, row_starts, row_ends, rows, top_k, out, out_stride,
//                      workspace, workspace_bytes, stream)
//   vLLM's top_k_per_row_prefill contract: for row r, write into out[r * out_stride + 0 .. top_k) the
//   indices, relative to row_starts[r], of the top_k largest of
//   logits[r * row_stride + row_starts[r] .. row_ends[r]), in any order; a row shorter than top_k gets
//   every valid index, then -1.
//   - logits: device pointer to rows of `dtype` (LrDtype), row r at element r * row_stride.
//   - row_starts, row_ends: device pointers to `rows` int32 bounds, read on the device only (never on
//     the host), so one launch captured in a CUDA graph stays valid when the bounds change in place.
//   - top_k: 1 .. lr_<family>_max_top_k(dtype); out: device pointer to int32, row r at r * out_stride.
//   - workspace: device memory of at least lr_<family>_workspace_bytes(...) bytes, 256-byte aligned,
//     that the caller zeroes once, whole (e.g. when allocating): a family may keep state there that must
//     start at zero (split's cross-block counters), and every launch leaves that state zeroed again.
//     It starts with an LrStatus header; kernels only OR flags into it (LR_STATUS_NAN: some row held a
//     NaN inside its bounds; the output of such a row is then unspecified but still in range). Reading
//     it is the caller's business (after a synchronize), so the launch itself never syncs.
//   - stream: the CUDA stream to launch on (the caller's current stream).
//   Nothing is allocated, cells outside a row's bounds are never read, and nothing outside
//   out[r * out_stride + 0 .. top_k) is written.
//   Returns LR_OK, or an LrError code: the arguments are checked on the host before launching, then the
//   launch error, if any, is returned. A returned error means nothing was launched or the launch failed.
//
// long long lr_<family>_workspace_bytes(rows, cols, top_k, dtype)
//   The workspace the topk entry point needs for these sizes on the current device (at least
//   sizeof(LrStatus)).
//
// int lr_<family>_max_top_k(dtype)
//   The largest top_k the family selects for `dtype` (a larger one is refused with LR_EINVAL).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#define LR_EXPORT extern "C" __attribute__((visibility("default")))

enum LrError : int {
  LR_OK = 0,
  LR_EINVAL = 1,       // bad argument (dtype, rows < 0, top_k out of range, null pointer, stride)
  LR_EWORKSPACE = 2,   // workspace smaller than lr_<family>_workspace_bytes
  LR_ELAUNCH = 3,      // the kernel launch failed (cudaGetLastError)
};

enum LrDtype : int { LR_F32 = 0, LR_BF16 = 1 };

enum LrStatusFlag : uint32_t { LR_STATUS_NAN = 1u };

struct LrStatus {
  uint32_t flags;
  uint32_t reserved[63];  // pads the header to 256 bytes so what follows stays aligned
};
static_assert(sizeof(LrStatus) == 256, "the status header is 256 bytes");

// The work record of a build with -DLR_WORK_RECORD (the tests' work build, build.py's WORK_FLAGS): one
// LrWork per row at the end of the workspace (lr_<family>_workspace_bytes then counts them), to which
// every launch adds what the row cost: the counters of the family's CPU model in
// logitreplay/selectors/cpu_models.py (NativeWork, DeepSelectWork, SplitWork), in field order. The
// caller zeroes it before the launch it reads. The default build has none of this code.
struct LrWork {
  uint32_t counters[4];
};
static_assert(sizeof(LrWork) == 16, "a work record is 16 bytes");

// The three entry points of one family, declared for every bundled family below.
#define LR_TOPK_ENTRY_POINTS(family)                                                                        \
  LR_EXPORT int lr_##family##_topk(const void* logits, int dtype, long long row_stride, const int* row_starts, \
                                   const int* row_ends, int rows, int top_k, int* out, long long out_stride,  \
                                   void* workspace, long long workspace_bytes, cudaStream_t stream);          \
  LR_EXPORT long long lr_##family##_workspace_bytes(int rows, int cols, int top_k, int dtype);                \
  LR_EXPORT int lr_##family##_max_top_k(int dtype)

LR_TOPK_ENTRY_POINTS(native);
LR_TOPK_ENTRY_POINTS(deepselect);
LR_TOPK_ENTRY_POINTS(split);
