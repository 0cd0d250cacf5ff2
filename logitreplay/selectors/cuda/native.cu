// native: the histogram radix-select of vLLM's top_k_per_row_prefill, reimplemented so that replays
// predict what that production kernel does on the same logits, including where it is slow.
//
// One block of 512 threads per row, with vLLM 0.33's pass structure (half, then 11, 11 and 10 bits):
// - Pass 0 histograms the top 11 bits of every value rounded to fp16 (2048 bins) and finds the bin
//   holding the k-th largest, then sweeps the row again: only when that bin holds <= 2048 elements does
//   the sweep emit every element above it and collect the bin's elements for the final sort; otherwise
//   pass 0 is spent (its sweep still reads the row), and nothing it found is kept.
// - Pass 1 starts over on the fp32 key: it histograms bits 31..21 of *every* element of the row (not only
//   those of pass 0's bin), then emits and collects the same way when its threshold bin fits.
// - Passes 2 and 3 histogram bits 20..10 and 9..0 among the elements whose key matches every fp32 bin
//   fixed so far, each re-reading the row. After pass 3 the threshold bin holds equal keys, and the
//   first ones reached fill the remaining slots.
// A collected threshold bin is finished in shared memory: upstream's rank-counting insertion sort for
// the first 12288 rows, a radix select after (upstream sorts those rows with a block radix sort).
// Selected indices are staged in shared memory and written out in one coalesced sweep at the end.
//
// The deterministic build (common.cuh, -DLR_DETERMINISTIC) keeps the passes and changes where a choice
// among equal keys was made by the order atomics ran in: a collected threshold bin holds every element of
// the row tied at the k-th key (a bin is an interval of keys), so its finish is the radix select with
// the lowest-index ties (the rank-counting finish, whose ties go by buffer position, is not used); a pass
// 3 threshold bin is one key, whose lowest-index elements are taken by an ordered sweep of the row (one
// more read of it, two barriers per 2048 elements: only rows that reach pass 3); then the top_k slots
// are sorted in shared memory (a bitonic network, 66 steps for k = 2048) and written in index order.
//
// Distribution sensitivity is part of the model: values concentrated in a narrow range (x + 100,
// x * 1e-8) land in one or two fp16 bins and then in one or two fp32 bins of pass 1, so whole rows are
// funnelled through shared-memory atomics on one address, up to four times: about ten times slower
// than on spread-out values, as upstream.
//
// Entry points, workspace and status: see topk_api.h.
#include "common.cuh"
#include "native_config.h"
#include "topk_api.h"

namespace {

// The constants (block size, bins, the finish's limits): native_config.h.
using native_config::kBins, native_config::kFinal, native_config::kMaxTopK, native_config::kRankRows,
    native_config::kThreads;

struct Smem {
  union {
    uint32_t hist[kBins];  // live from a pass's clear to its threshold search
    struct {
      uint32_t keys[kFinal];
      int idx[kFinal];
    } cand;  // filled by the emit sweep of the pass whose threshold bin fits, after the histogram is dead
  } u;
  lr::ScanScratch<kThreads> scan;
  lr::SelectScratch<kThreads> sel;
  uint32_t found;    // output slots written so far
  uint32_t cand_n;   // candidates collected for the final select
  uint32_t ties;     // slots taken by equal keys in the last pass
};

// What pass P sees of a value: whether it takes part (passes 0 and 1 take every value; passes 2 and 3
// those whose fp32 key matches the bins fixed by the passes before, held in `pattern`) and its bin.
template <int P>
struct Pass {
  static constexpr int kBinsP = P == 3 ? 1024 : kBins;
  __device__ __forceinline__ static bool match(float x, uint32_t pattern) {
    if constexpr (P < 2) {
      return true;
    } else {
      constexpr int shift = P == 2 ? 21 : 10;
      return ((lr::f32_key(x) ^ pattern) >> shift) == 0;
    }
  }
  __device__ __forceinline__ static uint32_t bin(float x) {
    if constexpr (P == 0) return lr::half_bin11(x);
    const uint32_t key = lr::f32_key(x);
    if constexpr (P == 1) return key >> 21;
    if constexpr (P == 2) return (key >> 10) & 0x7ffu;
    return key & 0x3ffu;
  }
};

// One histogram pass over the row. Returns the threshold bin; when its count is <= kFinal (P < 3) the
// elements above it are in `slots` and the bin's elements in s.u.cand, else the next pass must refine it
// (pass 0 then leaves nothing behind: pass 1 starts over).
template <int P, typename T>
__device__ lr::ThresholdBin histogram_pass(const T* row, int len, int top_k, int* slots, uint32_t pattern,
                                           bool by_value, Smem& s, LrStatus* status) {
  lr::smem_fill<kThreads>(s.u.hist, Pass<P>::kBinsP, 0u);
  __syncthreads();
  bool nan = false;
  lr::for_each_in_row<kThreads>(row, len, [&](float x, int) {
    if constexpr (P == 0) nan |= x != x;
    if (Pass<P>::match(x, pattern)) atomicAdd(&s.u.hist[Pass<P>::bin(x)], 1u);
  });
  if constexpr (P == 0) {
    if (__syncthreads_or(nan) && threadIdx.x == 0) lr::report_nan(status);
  } else {
    __syncthreads();
  }
  const uint32_t need = static_cast<uint32_t>(top_k) - s.found;
  const lr::ThresholdBin t = lr::block_threshold_bin<kThreads, Pass<P>::kBinsP>(s.u.hist, need, s.scan);
  const bool collect = P < 3 && t.count <= kFinal;
  // Pass 0 keeps its emits only when its bin fits (pass 1 starts over otherwise), yet, as upstream, its
  // sweep over the row runs either way.
  const bool keep = P != 0 || collect;
  const uint32_t tb = static_cast<uint32_t>(t.bin);
  const uint32_t take_equal = need - t.above;  // used by the last pass only
  lr::for_each_in_row<kThreads>(row, len, [&](float x, int i) {
    if (!Pass<P>::match(x, pattern)) return;
    const uint32_t b = Pass<P>::bin(x);
    if (b > tb) {
      if (keep) slots[atomicAdd(&s.found, 1u)] = i;
    } else if (b == tb) {
      if constexpr (P == 3) {
        // (the deterministic build takes them in index order below)
        if (!lr::kDeterministic && atomicAdd(&s.ties, 1u) < take_equal) slots[atomicAdd(&s.found, 1u)] = i;
      } else if (collect) {
        const uint32_t c = atomicAdd(&s.cand_n, 1u);
        s.u.cand.keys[c] = by_value ? __float_as_uint(x) : lr::f32_key(x);
        s.u.cand.idx[c] = i;
      }
    }
  });
  __syncthreads();
  if constexpr (P == 3 && lr::kDeterministic) {
    // The lowest-index take_equal elements of the threshold key, after the top_k - take_equal slots above.
    const int at = top_k - static_cast<int>(take_equal);
    lr::ordered_take<kThreads, 4>(
        len, take_equal, s.scan,
        [&](int i) {
          const float x = lr::to_f32(row[i]);
          return Pass<3>::match(x, pattern) && Pass<3>::bin(x) == tb;
        },
        [&](int i, uint32_t rank) { slots[at + static_cast<int>(rank)] = i; });
  }
  return t;
}

// The threshold bin's candidates are in shared memory: fill the slots still open among them.
__device__ void finish_candidates(long long r, int top_k, int* slots, Smem& s) {
  const int n = static_cast<int>(s.cand_n);
  const int base = static_cast<int>(s.found);
  const int m = top_k - base;
  if (!lr::kDeterministic && r < kRankRows) {
    // Upstream's insertion sort: each candidate's rank among all candidates, counted with float compares
    // (ties by position), as upstream counts it: n^2 / threads compares, cheap for the few candidates of
    // spread-out values, and the main cost of concentrated rows whose threshold bin holds up to 2048.
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const float v = __uint_as_float(s.u.cand.keys[i]);
      int rank = 0;
      for (int j = 0; j < n; ++j) {
        const float o = __uint_as_float(s.u.cand.keys[j]);
        if (v < o || (v == o && i < j)) ++rank;
      }
      if (rank < m) slots[base + rank] = s.u.cand.idx[i];
    }
    return;
  }
  // Later rows (every row in the deterministic build): upstream sorts with a block radix sort; the shared
  // radix select does the same O(n) work. The bin holds every element tied at the k-th key.
  const lr::SelectRule rule = lr::smem_select_rule<kThreads>(s.u.cand.keys, n, m, s.sel);
  lr::smem_select_apply<kThreads>(
      s.u.cand.keys, [&](int i) { return s.u.cand.idx[i]; }, n, rule, s.sel,
      [&](int i) { slots[atomicAdd(&s.found, 1u)] = s.u.cand.idx[i]; });
}

template <typename T>
__global__ __launch_bounds__(kThreads) void native_topk_kernel(const T* __restrict__ logits, long long row_stride,
                                                               const int* __restrict__ row_starts,
                                                               const int* __restrict__ row_ends, int top_k,
                                                               int* __restrict__ out, long long out_stride,
                                                               LrStatus* status) {
  __shared__ Smem s;
  extern __shared__ int slots[];  // top_k output slots
  const long long r = blockIdx.x;
  const int start = row_starts[r];
  const int len = row_ends[r] - start;
  int* out_row = out + r * out_stride;
  if (len <= top_k) {  // every valid index, then -1
    for (int i = threadIdx.x; i < len; i += kThreads) out_row[i] = i;
    lr::write_tail<kThreads>(out_row, len > 0 ? len : 0, top_k);
    return;
  }
  const T* row = logits + r * row_stride + start;
  if (threadIdx.x == 0) {
    s.found = 0;
    s.cand_n = 0;
    s.ties = 0;
  }
  // The first pass's clear is followed by a barrier, which also publishes these counters. Candidates are
  // kept as float values for the rank-counting finish, as order-preserving keys for the radix select.
  const bool by_value = !lr::kDeterministic && r < kRankRows;
  const lr::ThresholdBin t0 = histogram_pass<0>(row, len, top_k, slots, 0u, by_value, s, status);
  bool collected = t0.count <= kFinal;
  int passes = 1;
  uint32_t last = t0.count;  // the work record's: the last pass's threshold bin
  if (!collected) {
    const lr::ThresholdBin t1 = histogram_pass<1>(row, len, top_k, slots, 0u, by_value, s, status);
    collected = t1.count <= kFinal;
    passes = 2;
    last = t1.count;
    if (!collected) {
      const uint32_t p1 = static_cast<uint32_t>(t1.bin) << 21;
      const lr::ThresholdBin t2 = histogram_pass<2>(row, len, top_k, slots, p1, by_value, s, status);
      collected = t2.count <= kFinal;
      passes = 3;
      last = t2.count;
      if (!collected) {
        passes = 4;
        last = histogram_pass<3>(row, len, top_k, slots, p1 | (static_cast<uint32_t>(t2.bin) << 10), by_value, s,
                                 status).count;
      }
    }
  }
  if constexpr (lr::kWorkRecord) {
    if (threadIdx.x == 0) lr::add_work(lr::status_work(status) + r, passes, static_cast<int>(last));
  }
  if (collected) finish_candidates(r, top_k, slots, s);
  if constexpr (lr::kDeterministic) lr::block_sort_ascending<kThreads>(slots, top_k);  // ends with a barrier
  __syncthreads();
  for (int i = threadIdx.x; i < top_k; i += kThreads) out_row[i] = slots[i];
}

// The output slots' dynamic shared memory, up to kMaxTopK of them.
template <typename T>
bool allow_slots() {
  return lr::allow_smem<native_topk_kernel<T>>(kMaxTopK * static_cast<int>(sizeof(int)));
}

}  // namespace

LR_EXPORT long long lr_native_workspace_bytes(int rows, int, int, int) {
  return sizeof(LrStatus) + lr::work_bytes(rows);
}

// Bounded by the output slots staged in shared memory.
LR_EXPORT int lr_native_max_top_k(int) { return kMaxTopK; }

LR_EXPORT int lr_native_topk(const void* logits, int dtype, long long row_stride, const int* row_starts,
                             const int* row_ends, int rows, int top_k, int* out, long long out_stride,
                             void* workspace, long long workspace_bytes, cudaStream_t stream) {
  if (int err = lr_check_args(logits, dtype, row_stride, row_starts, row_ends, rows, top_k, kMaxTopK, out, out_stride,
                              workspace, workspace_bytes))
    return err;
  if (rows == 0) return LR_OK;
  auto* status = static_cast<LrStatus*>(workspace);
  const size_t smem = static_cast<size_t>(top_k) * sizeof(int);
  if (dtype == LR_F32) {
    if (!allow_slots<float>()) return LR_ELAUNCH;
    native_topk_kernel<float><<<rows, kThreads, smem, stream>>>(static_cast<const float*>(logits), row_stride,
                                                                row_starts, row_ends, top_k, out, out_stride, status);
  } else {
    if (!allow_slots<__nv_bfloat16>()) return LR_ELAUNCH;
    native_topk_kernel<__nv_bfloat16><<<rows, kThreads, smem, stream>>>(
        static_cast<const __nv_bfloat16*>(logits), row_stride, row_starts, row_ends, top_k, out, out_stride, status);
  }
  return cudaGetLastError() == cudaSuccess ? LR_OK : LR_ELAUNCH;
}
