// Device primitives shared by the bundled top-k kernels (native.cu, deepselect.cu, split.cu), and the
// host-side argument check and shared-memory opt-in of their C interface (declared and documented in
// topk_api.h). Kept in one header, as DeepGEMM does, so that the parts several kernels need
// (order-preserving keys, block histograms and scans, the shared-memory select of a candidate set, slot
// claims, row traversal, -1 tails and short rows, NaN reporting, the deterministic mode's apply, ordered
// take and sort) exist once and behave identically.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

#include "topk_api.h"

// The argument checks of topk_api.h, made by every family's lr_<family>_topk before it launches anything.
inline int lr_check_args(const void* logits, int dtype, long long row_stride, const int* row_starts,
                         const int* row_ends, int rows, int top_k, int max_top_k, const int* out,
                         long long out_stride, const void* workspace, long long workspace_bytes) {
  if ((dtype != LR_F32 && dtype != LR_BF16) || rows < 0 || top_k < 1 || top_k > max_top_k || row_stride < 0 ||
      (rows > 1 && out_stride < top_k))
    return LR_EINVAL;
  if (rows > 0 && (logits == nullptr || row_starts == nullptr || row_ends == nullptr || out == nullptr))
    return LR_EINVAL;
  if (workspace == nullptr || workspace_bytes < static_cast<long long>(sizeof(LrStatus))) return LR_EWORKSPACE;
  return LR_OK;
}

namespace lr {

constexpr int kWarp = 32;

// A fact of the current device that costs a driver call to find, found once per device and remembered
// (devices 0-63): find(device) gives it, 0 when it cannot be found yet (asked again next time). Each
// caller's lambda is a distinct type, so each use has its own memory. Not a stream operation, so also
// safe while a graph is being captured. 0 when the device cannot be queried.
template <typename Find>
int per_device(Find&& find) {
  static std::atomic<int> known[64];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device >= 64) return 0;
  int v = known[device].load();
  if (v == 0 && (v = find(device)) != 0) known[device].store(v);
  return v;
}

// Let `Kernel` use `bytes` of dynamic shared memory on the current device: above 48 KiB a kernel must opt
// in, and the attribute belongs to the (kernel, device) pair. False when the device refuses.
template <auto Kernel>
bool allow_smem(int bytes) {
  return per_device([bytes](int) {
    return cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess ? 1 : 0;
  }) != 0;
}

// The deterministic mode, built with -DLR_DETERMINISTIC (build.py's DET_FLAGS, the `-det` selectors): among
// the candidates tied at a row's k-th value the lowest indices are taken (the index set of a stable sort),
// and every row's output is in ascending index order, so that it is the same run after run whatever order
// the atomics of a launch happen in. -0.0 and +0.0 tie, as values do. The default build has none of its
// code (each use is an `if constexpr`), so its registers and spills are unchanged.
#ifdef LR_DETERMINISTIC
constexpr bool kDeterministic = true;
#else
constexpr bool kDeterministic = false;
#endif

// ------------------------------------------------------------------------------ order-preserving keys
// A larger float maps to a larger unsigned key, so selection by value becomes selection by key and ties
// of values are ties of keys. -0.0 and +0.0 get distinct keys (adjacent), except in the deterministic
// mode, where -0.0 is keyed as +0.0 (x + 0.0f: the one float it changes); NaN maps above +inf (positive
// sign bit) or below -inf (negative), which is why NaN is reported separately.

__device__ __forceinline__ uint32_t f32_key(float x) {
  if constexpr (kDeterministic) x += 0.0f;
  const uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float to_f32(float x) { return x; }
// bf16 -> fp32 is exact (the low 16 bits are zero), so bf16 input reuses the fp32 keys and passes.
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

// 16-bit key of a bf16 value (same order as f32_key of its fp32 value, half the bits).
__device__ __forceinline__ uint16_t bf16_key(__nv_bfloat16 x) {
  const uint16_t b = __bfloat16_as_ushort(x);
  return (b & 0x8000u) ? static_cast<uint16_t>(~b) : static_cast<uint16_t>(b | 0x8000u);
}

// The 11-bit bin of native's first pass: the value rounded to fp16, top 11 bits of its ordered key
// (sign, 5 exponent, 5 mantissa bits: 32 bins per octave). fp16 rounding is monotone, so the bins are
// consistent with the fp32 order; values concentrated in a narrow range (x + 100, x * 1e-8) fall into
// very few bins, which is exactly what makes this pass distribution-sensitive.
__device__ __forceinline__ uint32_t half_bin11(float x) {
  if constexpr (kDeterministic) x += 0.0f;  // -0.0 in +0.0's bin, as f32_key keys it
  const uint16_t b = __half_as_ushort(__float2half_rn(x));
  const uint16_t k = (b & 0x8000u) ? static_cast<uint16_t>(~b) : static_cast<uint16_t>(b | 0x8000u);
  return k >> 5;
}

// Reserve `g.size()` consecutive slots of `counter` (shared or global memory) for the threads calling
// together; returns this thread's slot. One atomic per coalesced group instead of one per thread, which
// is what keeps many equal keys (ties, concentrated rows) from serializing on one address.
__device__ __forceinline__ uint32_t claim(uint32_t* counter) {
  const cooperative_groups::coalesced_group g = cooperative_groups::coalesced_threads();
  uint32_t base = 0;
  if (g.thread_rank() == 0) base = atomicAdd(counter, g.size());
  return g.shfl(base, 0) + g.thread_rank();
}

// ---------------------------------------------------------------------------------- status reporting

__device__ __forceinline__ void report_nan(LrStatus* status) {
  if (status != nullptr) atomicOr(&status->flags, LR_STATUS_NAN);
}

// The work record of topk_api.h: built in with -DLR_WORK_RECORD only, so the default build pays nothing.
#ifdef LR_WORK_RECORD
constexpr bool kWorkRecord = true;
#else
constexpr bool kWorkRecord = false;
#endif

// The workspace bytes of the work record of `rows` rows (0 unless built in).
inline long long work_bytes(int rows) { return kWorkRecord ? static_cast<long long>(rows) * sizeof(LrWork) : 0; }

// The record of a family whose workspace is the status header alone: the rows follow it.
__device__ __forceinline__ LrWork* status_work(LrStatus* status) { return reinterpret_cast<LrWork*>(status + 1); }

// Add a row's counts (by one thread per row, or per part of a row) to its record.
__device__ __forceinline__ void add_work(LrWork* w, int c0, int c1 = 0, int c2 = 0, int c3 = 0) {
  const int c[4] = {c0, c1, c2, c3};
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (c[i]) atomicAdd(&w->counters[i], static_cast<uint32_t>(c[i]));
}

// -------------------------------------------------------------------------------------------- output

// Slots [from, top_k) of an output row get -1 (rows shorter than top_k).
template <int THREADS>
__device__ __forceinline__ void write_tail(int* out_row, int from, int top_k) {
  for (int i = from + static_cast<int>(threadIdx.x); i < top_k; i += THREADS) out_row[i] = -1;
}

// ------------------------------------------------------------------------------------- row traversal

// Calls f(float x, int i) for every element i in [0, len) of `row` (any alignment), spread over the
// block's THREADS threads, with 16-byte vector loads for the aligned body, UNROLL of them issued before
// any is used (more loads in flight for kernels that, like split, read a row once and are bound by load
// latency). Rows start at arbitrary columns (multi-request chunks), so a scalar head reaches the first
// 16-byte boundary.
template <int THREADS, int UNROLL = 1, typename T, typename F>
__device__ __forceinline__ void for_each_in_row(const T* __restrict__ row, int len, F&& f) {
  constexpr int kVec = 16 / sizeof(T);
  const int tid = threadIdx.x;
  const int misalign = static_cast<int>((reinterpret_cast<uintptr_t>(row) % 16) / sizeof(T));
  const int head = min(len, misalign ? kVec - misalign : 0);
  if (tid < head) f(to_f32(row[tid]), tid);
  const int nvec = (len - head) / kVec;
  const uint4* body = reinterpret_cast<const uint4*>(row + head);
  for (int v0 = tid; v0 < nvec; v0 += THREADS * UNROLL) {
    uint4 w[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int v = v0 + u * THREADS;
      w[u] = v < nvec ? __ldg(body + v) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int v = v0 + u * THREADS;
      if (v >= nvec) break;
      const T* e = reinterpret_cast<const T*>(&w[u]);
#pragma unroll
      for (int j = 0; j < kVec; ++j) f(to_f32(e[j]), head + v * kVec + j);
    }
  }
  for (int i = head + nvec * kVec + tid; i < len; i += THREADS) f(to_f32(row[i]), i);
}

// A row of at most top_k elements needs no select: every valid index, then -1. Its NaN is still reported
// (a selecting kernel finds NaN among its candidates; here every element is one).
template <int THREADS, int UNROLL = 1, typename T>
__device__ __forceinline__ void copy_short_row(const T* __restrict__ row, int len, int top_k, int* out_row,
                                               LrStatus* status) {
  const int n = max(len, 0);
  for (int i = threadIdx.x; i < n; i += THREADS) out_row[i] = i;
  write_tail<THREADS>(out_row, n, top_k);
  bool nan = false;
  for_each_in_row<THREADS, UNROLL>(row, n, [&](float x, int) { nan |= x != x; });
  if (__syncthreads_or(nan) && threadIdx.x == 0) report_nan(status);
}

// ------------------------------------------------------------------- block histograms and the scan

template <int THREADS>
__device__ __forceinline__ void smem_fill(uint32_t* p, int n, uint32_t v) {
  for (int i = threadIdx.x; i < n; i += THREADS) p[i] = v;
}

// Where the `need`-th largest element falls in a histogram: the bin t with
// above < need <= above + count, where `above` counts the elements in bins > t.
struct ThresholdBin {
  int bin;          // -1 when the histogram holds fewer than `need` elements
  uint32_t above;   // elements in bins above `bin`: all of them are selected
  uint32_t count;   // elements in `bin`: `need - above` of them are selected
};

// Inclusive prefix sum over the warp of one value per lane: `lane` (this thread's, threadIdx.x % 32) gets
// the sum of lanes 0 .. lane.
template <typename V>
__device__ __forceinline__ V warp_inclusive_sum(V v, int lane) {
#pragma unroll
  for (int d = 1; d < kWarp; d <<= 1) {
    const V y = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += y;
  }
  return v;
}

// Scratch for block_threshold_bin: one word per warp plus the result.
template <int THREADS>
struct ScanScratch {
  uint32_t warp_total[THREADS / kWarp];
  ThresholdBin result;
};

// Block-wide exclusive prefix sum of `hist` from the top bin down, and the threshold bin for `need`.
// `hist` must be complete (caller synced); every thread returns the same result. Thread t owns
// ceil(BINS / THREADS) consecutive bins counted from the top, so the scan is one register pass, one
// warp shuffle scan and one pass over the per-warp totals.
template <int THREADS, int BINS>
__device__ ThresholdBin block_threshold_bin(const uint32_t* hist, uint32_t need, ScanScratch<THREADS>& s) {
  static_assert(THREADS % kWarp == 0, "whole warps");
  constexpr int kItems = (BINS + THREADS - 1) / THREADS;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  uint32_t cnt[kItems];
  uint32_t local = 0;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int r = tid * kItems + j;  // rank from the top
    cnt[j] = r < BINS ? hist[BINS - 1 - r] : 0u;
    local += cnt[j];
  }
  const uint32_t incl = warp_inclusive_sum(local, lane);
  if (tid == 0) s.result = ThresholdBin{-1, 0u, 0u};
  if (lane == kWarp - 1) s.warp_total[warp] = incl;
  __syncthreads();
  uint32_t above = incl - local;
  for (int w = 0; w < warp; ++w) above += s.warp_total[w];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int r = tid * kItems + j;
    if (r < BINS && above < need && above + cnt[j] >= need) s.result = ThresholdBin{BINS - 1 - r, above, cnt[j]};
    above += cnt[j];
  }
  __syncthreads();
  return s.result;
}

// ------------------------------------------------------------- shared-memory select of a candidate set

// The top `m` of n candidate keys, as a rule: every key with (key & mask) > prefix is selected, plus the
// first `ties` keys (in any order) with (key & mask) == prefix. `mask` keeps the top bits fixed so far
// (all 32 when the m-th key was resolved exactly), so `prefix` is a lower bound of the m-th largest key
// and exact when mask == ~0u: a safe threshold to raise to. `count` is how many keys have
// (key & mask) == prefix (ties <= count).
struct SelectRule {
  uint32_t mask;
  uint32_t prefix;
  uint32_t ties;
  uint32_t count;

  // How many keys are at or above the threshold (key & mask) >= prefix, for a rule of the m largest.
  __device__ int not_below(int m) const { return m - static_cast<int>(ties) + static_cast<int>(count); }
};

template <int THREADS>
struct SelectScratch {
  uint32_t hist[256];
  ScanScratch<THREADS> scan;
  SelectRule rule;
  uint32_t tie_taken;
  uint32_t emitted;
};

// The selection rule for the `m` largest of a key set spread over the block, by up to four 8-bit radix
// passes that stop early once the threshold digit's bucket is taken whole. `for_each_key(f)` calls
// f(key) for each of this thread's keys (the set holds at least m keys). KEY_BITS < 32 says only the top
// KEY_BITS bits are resolved (16 for the fp32 keys of bf16 values; for other keys `prefix` is then a
// lower bound of the m-th key, and keys equal in those bits are taken as ties). A barrier comes before
// the first key is read and another ends it, so the keys may be placed just before and `s` reused after.
template <int THREADS, int KEY_BITS = 32, typename ForEachKey>
__device__ SelectRule radix_select_rule(ForEachKey&& for_each_key, int m, SelectScratch<THREADS>& s) {
  static_assert(KEY_BITS % 8 == 0 && KEY_BITS >= 8 && KEY_BITS <= 32, "whole 8-bit digits");
  uint32_t mask = 0, prefix = 0, need = static_cast<uint32_t>(m), count = 0;
  for (int shift = 24; shift >= 32 - KEY_BITS; shift -= 8) {
    smem_fill<THREADS>(s.hist, 256, 0u);
    __syncthreads();
    for_each_key([&](uint32_t key) {
      if ((key & mask) == prefix) atomicAdd(&s.hist[(key >> shift) & 255u], 1u);
    });
    __syncthreads();
    const ThresholdBin t = block_threshold_bin<THREADS, 256>(s.hist, need, s.scan);
    mask |= 255u << shift;
    prefix |= static_cast<uint32_t>(t.bin) << shift;
    need -= t.above;
    count = t.count;
    if (need == count) break;  // the whole bucket is selected: no need to resolve it further
  }
  return SelectRule{mask, prefix, need, count};
}

// Find the selection rule for the `m` largest of keys[0 .. n) (shared memory, 1 <= m <= n). Up to
// THREADS candidates are ranked directly (one compare loop per thread, no barriers); larger sets take
// radix_select_rule's passes.
template <int THREADS, int KEY_BITS = 32>
__device__ SelectRule smem_select_rule(const uint32_t* keys, int n, int m, SelectScratch<THREADS>& s) {
  const int tid = threadIdx.x;
  if (n <= THREADS) {
    if (tid < n) {
      const uint32_t key = keys[tid];
      int gt = 0, eq = 0;
      for (int j = 0; j < n; ++j) {
        const uint32_t o = keys[j];
        gt += o > key;
        eq += o == key;
      }
      if (gt < m && gt + eq >= m)
        s.rule = SelectRule{~0u, key, static_cast<uint32_t>(m - gt), static_cast<uint32_t>(eq)};
    }
    __syncthreads();
    return s.rule;
  }
  return radix_select_rule<THREADS, KEY_BITS>(
      [&](auto&& f) {
        for (int i = tid; i < n; i += THREADS) f(keys[i]);
      },
      m, s);
}

// Apply a rule: calls sink(i) once for each selected candidate i (exactly m calls in all). Each caller
// places the result itself (an output slot, a compacted buffer), so the rule is computed once for both
// kernels' uses. Resets and uses s.tie_taken; ends with a barrier.
template <int THREADS, typename Sink>
__device__ void smem_select_apply(const uint32_t* keys, int n, SelectRule rule, SelectScratch<THREADS>& s,
                                  Sink&& sink) {
  if (threadIdx.x == 0) s.tie_taken = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += THREADS) {
    const uint32_t k = keys[i] & rule.mask;
    if (k > rule.prefix || (k == rule.prefix && atomicAdd(&s.tie_taken, 1u) < rule.ties)) sink(i);
  }
  __syncthreads();
}

// ---------------------------------------------------------------------------------- deterministic mode

// smem_select_apply where candidate i's index in the row is index(i) (distinct): in the deterministic mode
// the tied candidates taken ((key & mask) == prefix) are the `ties` of lowest index, else (and wherever
// all of them are taken) it is smem_select_apply itself. The lowest ones are found by a radix select of
// the largest ~index among the tied candidates alone, so rows without a choice pay nothing more. Exact
// only when every candidate tied at the m-th key is among keys[0 .. n): each caller states why. sink(i)
// is still called in any order; starts and ends with a barrier, as smem_select_apply.
template <int THREADS, typename Index, typename Sink>
__device__ void smem_select_apply(const uint32_t* keys, Index&& index, int n, SelectRule rule,
                                  SelectScratch<THREADS>& s, Sink&& sink) {
  if constexpr (!kDeterministic) {
    smem_select_apply<THREADS>(keys, n, rule, s, sink);
  } else {
    __syncthreads();  // publishes what the caller set up for its sink (a slot counter)
    if (rule.ties == rule.count) {  // every tied candidate is taken: no choice to make
      for (int i = threadIdx.x; i < n; i += THREADS)
        if ((keys[i] & rule.mask) >= rule.prefix) sink(i);
      __syncthreads();
      return;
    }
    // The `ties` largest of ~index over the tied candidates: their (~index & mask) is at least the
    // prefix found (unique indices: resolved to one, or stopped where a whole digit bucket is taken).
    const SelectRule low = radix_select_rule<THREADS>(
        [&](auto&& f) {
          for (int i = threadIdx.x; i < n; i += THREADS)
            if ((keys[i] & rule.mask) == rule.prefix) f(~static_cast<uint32_t>(index(i)));
        },
        static_cast<int>(rule.ties), s);
    for (int i = threadIdx.x; i < n; i += THREADS) {
      const uint32_t k = keys[i] & rule.mask;
      if (k > rule.prefix || (k == rule.prefix && (~static_cast<uint32_t>(index(i)) & low.mask) >= low.prefix))
        sink(i);
    }
    __syncthreads();
  }
}

// Calls take(i, rank) for the first `limit` indices i of [0, n), in ascending order, for which pred(i)
// holds, rank being i's place among them (0, 1, ...): the same in every run. A block-wide scan per tile
// of THREADS * PER indices (thread t tests PER consecutive ones), stopping after the tile that reaches the
// limit: two barriers a tile. Every thread of the block calls it alike; `s` is free before and after.
template <int THREADS, int PER, typename Pred, typename Take>
__device__ void ordered_take(int n, uint32_t limit, ScanScratch<THREADS>& s, Pred&& pred, Take&& take) {
  static_assert(PER >= 1 && PER <= 32, "one bit per index of a thread's share");
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  uint32_t base = 0;
  for (int tile = 0; tile < n && base < limit; tile += THREADS * PER) {
    const int first = tile + static_cast<int>(threadIdx.x) * PER;
    uint32_t bits = 0;
#pragma unroll
    for (int j = 0; j < PER; ++j)
      if (first + j < n && pred(first + j)) bits |= 1u << j;
    const uint32_t cnt = __popc(bits);
    const uint32_t incl = warp_inclusive_sum(cnt, lane);
    if (lane == kWarp - 1) s.warp_total[warp] = incl;
    __syncthreads();
    uint32_t rank = base + incl - cnt, total = 0;
    for (int w = 0; w < THREADS / kWarp; ++w) {
      rank += w < warp ? s.warp_total[w] : 0u;
      total += s.warp_total[w];
    }
    __syncthreads();  // the totals may be overwritten by the next tile
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      if (bits >> j & 1u) {
        if (rank < limit) take(first + j, rank);
        ++rank;
      }
    }
    base += total;
  }
}

// Sort a[0 .. n) (shared memory, distinct or not) ascending: a bitonic network over the next power of two,
// the places from n on read as +infinity (every compare puts the smaller value first, so a compare with a
// place past n never swaps and is skipped). Starts and ends with a barrier; every thread calls it alike.
template <int THREADS>
__device__ void block_sort_ascending(int* a, int n) {
  int p = 1;
  while (p < n) p <<= 1;
  __syncthreads();
  for (int size = 2; size <= p; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < p / 2; t += THREADS) {
        const int lo = t / stride * 2 * stride + t % stride;
        // The first compare of each merge pairs a place with its mirror in the block of `size`, the
        // later ones with the place `stride` above.
        const int hi = stride == size / 2 ? lo / size * size + size - 1 - lo % size : lo + stride;
        if (hi < n && a[hi] < a[lo]) {
          const int v = a[lo];
          a[lo] = a[hi];
          a[hi] = v;
        }
      }
      __syncthreads();
    }
  }
}

}  // namespace lr
