// deepselect: DeepSeek's DeepSelect top-k (a rising threshold over one pass of the row), our own code.
//
// One block per row. The row is cut into segments of kSeg elements (one warp's share of a round) that
// are visited in a fixed pseudo-random order, a round of one segment per warp at a time. An element
// enters the shared-memory candidate buffer only if it is above the threshold T (T starts as NaN, which
// every comparison below lets through, i.e. "below everything"). When the buffer reaches top_k + kB2
// candidates it is cut back to the top_k largest by the shared-memory radix select of common.cuh, and T
// rises to a lower bound of the k-th largest key. After the last round one more select leaves exactly
// top_k. Every input element is read once; the work besides the read is a few selects of a few thousand
// shared-memory candidates per row, whose count barely depends on the value distribution (the random
// visit order is what keeps sorted or adversarial rows from letting everything in).
//
// Why each piece:
// - Visit order: segment i of the row is visited as number (i * a + c) mod m, with a = P mod m for a
//   prime P > m, so a is coprime with m (a permutation) and costs one modulo per row.
// - Loads: 16-byte, coalesced (a warp reads 512 contiguous bytes per load instruction), the next round
//   in flight in registers while this one is filtered, appended and possibly compacted.
// - Comparisons: `!(x <= T)` is one unordered compare: NaN both as T (start) and as x (every NaN in the
//   row becomes a candidate, so NaN is detected among candidates only, never per element).
// - Appends: a warp-level popcount scan plus one barrier per round places every accepted element; the
//   per-warp totals alternate between two slots so no second barrier is needed before the next round.
// - bf16 keys use the fp32 key of the (exact) fp32 value; its low 16 bits carry no information, so the
//   select resolves 16 bits (two radix passes) instead of 32.
//
// Measured and not used (bench/RESULTS.md): a row split over a thread-block cluster (1.6-2.1x slower:
// every part restarts its threshold and compacts its own first rounds), and more loads in flight (two
// rounds were no faster: the kernel is bound by its selects and barriers, not by load latency), which
// is also why bulk (TMA) copies into shared memory were not pursued.
//
// Entry points, workspace and status: see topk_api.h.

#include "common.cuh"
#include "topk_api.h"

namespace {

// ------------------------------------------------------------------------------------------ tunables
// Chosen per (dtype, top_k class) from bench/deepselect_tune.py on an H200 (results in bench/RESULTS.md).
// Each can be overridden at build time (-DLR_DS_THREADS=... etc.) for that sweep, for every class at once.
//   kThreads  threads per block (one block per row)
//   kElems    elements per thread per round (kVecs 16-byte loads: 4 fp32 or 8 bf16 elements each)
//   kB2       candidates appended since the last compaction that trigger the next one
//   kDepth    rounds whose loads are in flight while a round is processed
//   kBlocks   blocks per multiprocessor the register budget is sized for (__launch_bounds__)
// WIDE: rows of at least kWideStride elements (judged by the row stride, since the bounds stay on the
// device), where longer rounds pay; only the classes up to 1024 have a wide variant.
constexpr long long kWideStride = 65536;

template <typename T, int K_MAX, bool WIDE>
struct Config {
#ifdef LR_DS_THREADS
  static constexpr int kThreads = LR_DS_THREADS;
#else
  static constexpr int kThreads = K_MAX >= 4096 ? 512 : 256;
#endif
#ifdef LR_DS_ELEMS
  static constexpr int kElems = LR_DS_ELEMS;
#else
  // 8 beat 16 up to 51200 columns (by 3-20%): a smaller first compaction (the first round is taken
  // whole) and less shared memory, so more blocks per SM; at 102400 columns 16 wins by about 14%.
  static constexpr int kElems = WIDE ? 16 : 8;
#endif
  static constexpr int kVecs = kElems * static_cast<int>(sizeof(T)) / 16;
#ifdef LR_DS_B2
  static constexpr int kB2 = LR_DS_B2;
#else
  static constexpr int kB2 = K_MAX < 1024 ? 1024 : K_MAX;
#endif
#ifdef LR_DS_DEPTH
  static constexpr int kDepth = LR_DS_DEPTH;
#else
  static constexpr int kDepth = 1;
#endif
#ifdef LR_DS_BLOCKS
  static constexpr int kBlocks = LR_DS_BLOCKS;
#else
  // Close to what the shared memory admits (about 34, 41, 64 and 128 KB for the four classes, 49 and
  // 57 KB wide): occupancy pays (5 blocks beat 4 by 7% on 8192 x 8192) even at the price of a few
  // spilled registers (48 registers at 5 blocks of 256 threads).
  static constexpr int kBlocks = WIDE ? (K_MAX <= 512 ? 4 : 3) : K_MAX <= 1024 ? 5 : K_MAX <= 2048 ? 3 : 1;
#endif
};

// A prime above any segment count (fewer than 2^31 / 128): its residue modulo m is coprime with m.
constexpr uint32_t kPermPrime = 2654435761u;

// Inverse of lr::f32_key: the float whose key is `key`.
__device__ __forceinline__ float key_to_f32(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// Element j of a 16-byte vector, as fp32 (j is a constant once the callers' loops are unrolled, so
// the vector stays in registers).
template <typename T>
__device__ __forceinline__ float element(const uint4& v, int j) {
  const uint32_t w = reinterpret_cast<const uint32_t*>(&v)[sizeof(T) == 4 ? j : j / 2];
  if constexpr (sizeof(T) == 4) return __uint_as_float(w);
  return __uint_as_float(j % 2 ? (w & 0xffff0000u) : (w << 16));
}

template <typename T, int K_MAX, bool WIDE>
struct DeepSelect {
  using C = Config<T, K_MAX, WIDE>;
  static constexpr int kThreads = C::kThreads;
  static constexpr int kWarps = kThreads / lr::kWarp;
  static constexpr int kVec = 16 / sizeof(T);                // elements per 16-byte load
  static constexpr int kPerThread = C::kVecs * kVec;         // elements per thread per round
  static constexpr int kSeg = lr::kWarp * kPerThread;        // elements per segment (a warp's share)
  static constexpr int kRound = kWarps * kSeg;               // elements per round
  static constexpr int kCap = K_MAX + C::kB2 + kRound;       // candidates never reach this
  static constexpr int kKeyBits = sizeof(T) == 4 ? 32 : 16;  // key bits that carry information
  static_assert(kPerThread <= 32, "one bit per element of a thread's round in a 32-bit mask");

  struct Smem {
    uint32_t keys[kCap];  // candidates [0, n): order-preserving keys ...
    int idx[kCap];        // ... and their indices relative to the row start
    uint32_t kept_keys[K_MAX];  // a compaction's survivors, copied back to the front
    int kept_idx[K_MAX];
    uint32_t warp_count[2][kWarps];  // accepted elements per warp, alternating rounds
    lr::SelectScratch<kThreads> sel;
  };

  // Cut candidates [0, n) back to the top_k largest (in place, via kept_*); returns the new threshold.
  __device__ static float compact(Smem& s, int n, int top_k) {
    __syncthreads();  // the last round's appends are visible
    const lr::SelectRule rule = lr::smem_select_rule<kThreads, kKeyBits>(s.keys, n, top_k, s.sel);
    if (threadIdx.x == 0) s.sel.emitted = 0;  // published by the apply's first barrier
    lr::smem_select_apply<kThreads>(s.keys, n, rule, s.sel, [&](int i) {
      const uint32_t slot = lr::claim(&s.sel.emitted);
      s.kept_keys[slot] = s.keys[i];
      s.kept_idx[slot] = s.idx[i];
    });
    // The apply ended with a barrier; the next round appends at [top_k, ...) and the next select
    // starts with a barrier, so copying back needs none.
    for (int i = threadIdx.x; i < top_k; i += kThreads) {
      s.keys[i] = s.kept_keys[i];
      s.idx[i] = s.kept_idx[i];
    }
    return key_to_f32(rule.prefix);  // a lower bound of the k-th largest: nothing above it is lost
  }

  // Load this warp's segment `seg` of the row (16-byte vectors at span offsets below `span`).
  __device__ __forceinline__ static void load(uint4 (&v)[C::kVecs], const uint4* base, int seg, int span, int lane) {
#pragma unroll
    for (int q = 0; q < C::kVecs; ++q) {
      const int o = seg * kSeg + (q * lr::kWarp + lane) * kVec;
      v[q] = o < span ? __ldg(base + o / kVec) : make_uint4(0u, 0u, 0u, 0u);
    }
  }

  // Bit e of the result: element e of this thread's share of segment `seg` lies inside the row and
  // is above T.
  __device__ __forceinline__ static uint32_t filter(const uint4 (&v)[C::kVecs], int seg, int head, int span, float t,
                                                    int lane) {
    uint32_t acc = 0;
#pragma unroll
    for (int q = 0; q < C::kVecs; ++q) {
      const int o = seg * kSeg + (q * lr::kWarp + lane) * kVec;
      const int lo = min(max(head - o, 0), kVec), hi = min(max(span - o, 0), kVec);
      const uint32_t inside = (1u << hi) - (1u << lo);  // bits [lo, hi); hi >= lo, both <= 8
      uint32_t above = 0;
#pragma unroll
      for (int j = 0; j < kVec; ++j) above |= static_cast<uint32_t>(!(element<T>(v[q], j) <= t)) << j;
      acc |= (above & inside) << (q * kVec);
    }
    return acc;
  }

  // Append the elements of `acc` at slots pos, pos + 1, ...; returns whether one of them was NaN.
  __device__ __forceinline__ static bool append(Smem& s, const uint4 (&v)[C::kVecs], uint32_t acc, int pos, int seg,
                                                int head, int lane) {
    bool nan = false;
#pragma unroll
    for (int q = 0; q < C::kVecs; ++q) {
      const int rel = seg * kSeg + (q * lr::kWarp + lane) * kVec - head;  // index of element 0 of v[q]
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        if (acc >> (q * kVec + j) & 1u) {
          const float x = element<T>(v[q], j);
          s.keys[pos] = lr::f32_key(x);
          s.idx[pos] = rel + j;
          nan |= x != x;
          ++pos;
        }
      }
    }
    return nan;
  }

  __device__ static void run(const T* __restrict__ logits, long long row_stride, const int* __restrict__ row_starts,
                             const int* __restrict__ row_ends, int top_k, int* __restrict__ out, long long out_stride,
                             LrStatus* status) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Smem& s = *reinterpret_cast<Smem*>(smem_raw);
    const int tid = threadIdx.x, lane = tid % lr::kWarp, warp = tid / lr::kWarp;
    const long long r = blockIdx.x;
    const int start = row_starts[r];
    const int len = row_ends[r] - start;
    int* out_row = out + r * out_stride;
    const T* row = logits + r * row_stride + start;

    if (len <= top_k) {
      lr::copy_short_row<kThreads>(row, len, top_k, out_row, status);
      return;
    }

    // The span starts at the 16-byte boundary at or before the row start: segments are aligned.
    const int head = static_cast<int>((reinterpret_cast<uintptr_t>(row) % 16) / sizeof(T));
    const int span = len + head;
    const uint4* base = reinterpret_cast<const uint4*>(row - head);
    const uint32_t m = static_cast<uint32_t>((span + kSeg - 1) / kSeg);
    const uint32_t a = kPermPrime % m;
    const uint32_t step = static_cast<uint32_t>(static_cast<unsigned long long>(kWarps) * a % m);
    uint32_t seg = static_cast<uint32_t>((static_cast<unsigned long long>(warp) * a + m / 2) % m);
    const int rounds = static_cast<int>((m + kWarps - 1) / kWarps);

    float t = __uint_as_float(0x7fffffffu);  // NaN: every element passes `!(x <= t)`
    int n = 0;                               // candidates in s.keys / s.idx
    bool nan = false;

    // One round: filter this warp's segment, place the accepted elements (one barrier), and compact
    // when the buffer is full (not after the last round: the final select does that).
    auto process = [&](const uint4 (&v)[C::kVecs], int cur_seg, int round) {
      const uint32_t acc = cur_seg >= 0 ? filter(v, cur_seg, head, span, t, lane) : 0u;
      const uint32_t cnt = __popc(acc);
      const uint32_t incl = lr::warp_inclusive_sum(cnt, lane);
      uint32_t* counts = s.warp_count[round & 1];
      if (lane == lr::kWarp - 1) counts[warp] = incl;
      __syncthreads();
      int pos = n + static_cast<int>(incl - cnt), total = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const int c = static_cast<int>(counts[w]);
        pos += w < warp ? c : 0;
        total += c;
      }
      if (acc) nan |= append(s, v, acc, pos, cur_seg, head, lane);
      n += total;
      if (n >= top_k + C::kB2 && round + 1 < rounds) {
        t = compact(s, n, top_k);
        n = top_k;
      }
    };

    // Loads of the next kDepth rounds are in flight (in registers) while a round is processed. The
    // round loop is unrolled by kDepth so that every buffer has a fixed register home: a buffer is
    // copied out only when its own data is needed, never moved while its load is still in flight.
    uint4 ahead[C::kDepth][C::kVecs];
    int ahead_seg[C::kDepth];
    auto issue = [&](int d, int round) {
      ahead_seg[d] = round * kWarps + warp < static_cast<int>(m) ? static_cast<int>(seg) : -1;
      if (ahead_seg[d] >= 0) load(ahead[d], base, ahead_seg[d], span, lane);
      seg += step;
      if (seg >= m) seg -= m;
    };
#pragma unroll
    for (int d = 0; d < C::kDepth; ++d) issue(d, d);
    for (int round0 = 0; round0 < rounds; round0 += C::kDepth) {
#pragma unroll
      for (int d = 0; d < C::kDepth; ++d) {
        if (round0 + d >= rounds) break;
        uint4 v[C::kVecs];
#pragma unroll
        for (int q = 0; q < C::kVecs; ++q) v[q] = ahead[d][q];
        const int cur_seg = ahead_seg[d];
        issue(d, round0 + d + C::kDepth);
        process(v, cur_seg, round0 + d);
      }
    }

    __syncthreads();  // the last appends are visible
    const lr::SelectRule rule = lr::smem_select_rule<kThreads, kKeyBits>(s.keys, n, top_k, s.sel);
    if (tid == 0) s.sel.emitted = 0;
    lr::smem_select_apply<kThreads>(s.keys, n, rule, s.sel,
                                    [&](int i) { out_row[lr::claim(&s.sel.emitted)] = s.idx[i]; });
    if (__syncthreads_or(nan) && tid == 0) lr::report_nan(status);
  }
};

template <typename T, int K_MAX, bool WIDE>
__global__ __launch_bounds__(DeepSelect<T, K_MAX, WIDE>::kThreads, Config<T, K_MAX, WIDE>::kBlocks) void
deepselect_kernel(const T* __restrict__ logits, long long row_stride, const int* __restrict__ row_starts,
                  const int* __restrict__ row_ends, int top_k, int* __restrict__ out, long long out_stride,
                  LrStatus* status) {
  DeepSelect<T, K_MAX, WIDE>::run(logits, row_stride, row_starts, row_ends, top_k, out, out_stride, status);
}

template <typename T, int K_MAX, bool WIDE = false>
int launch(const void* logits, long long row_stride, const int* row_starts, const int* row_ends, int rows, int top_k,
           int* out, long long out_stride, LrStatus* status, cudaStream_t stream) {
  using D = DeepSelect<T, K_MAX, WIDE>;
  constexpr int kSmem = static_cast<int>(sizeof(typename D::Smem));
  if (!lr::allow_smem<deepselect_kernel<T, K_MAX, WIDE>>(kSmem)) return LR_ELAUNCH;
  deepselect_kernel<T, K_MAX, WIDE><<<rows, D::kThreads, kSmem, stream>>>(
      static_cast<const T*>(logits), row_stride, row_starts, row_ends, top_k, out, out_stride, status);
  return cudaGetLastError() == cudaSuccess ? LR_OK : LR_ELAUNCH;
}

template <typename T>
int launch_for_k(const void* logits, long long row_stride, const int* row_starts, const int* row_ends, int rows,
                 int top_k, int* out, long long out_stride, LrStatus* status, cudaStream_t stream) {
  const bool wide = row_stride >= kWideStride;
  if (top_k <= 512)
    return (wide ? launch<T, 512, true> : launch<T, 512, false>)(logits, row_stride, row_starts, row_ends, rows,
                                                                  top_k, out, out_stride, status, stream);
  if (top_k <= 1024)
    return (wide ? launch<T, 1024, true> : launch<T, 1024, false>)(logits, row_stride, row_starts, row_ends, rows,
                                                                    top_k, out, out_stride, status, stream);
  if (top_k <= 2048)
    return launch<T, 2048>(logits, row_stride, row_starts, row_ends, rows, top_k, out, out_stride, status, stream);
  return launch<T, 4096>(logits, row_stride, row_starts, row_ends, rows, top_k, out, out_stride, status, stream);
}

constexpr int kMaxTopK = 4096;  // candidate buffers live in shared memory

}  // namespace

LR_EXPORT long long lr_deepselect_workspace_bytes(int, int, int, int) { return sizeof(LrStatus); }

LR_EXPORT int lr_deepselect_max_top_k(int) { return kMaxTopK; }

LR_EXPORT int lr_deepselect_topk(const void* logits, int dtype, long long row_stride, const int* row_starts,
                                 const int* row_ends, int rows, int top_k, int* out, long long out_stride,
                                 void* workspace, long long workspace_bytes, cudaStream_t stream) {
  if (int err = lr_check_args(logits, dtype, row_stride, row_starts, row_ends, rows, top_k, kMaxTopK, out, out_stride,
                              workspace, workspace_bytes))
    return err;
  if (rows == 0) return LR_OK;
  auto* status = static_cast<LrStatus*>(workspace);
  return dtype == LR_F32
             ? launch_for_k<float>(logits, row_stride, row_starts, row_ends, rows, top_k, out, out_stride, status,
                                   stream)
             : launch_for_k<__nv_bfloat16>(logits, row_stride, row_starts, row_ends, rows, top_k, out, out_stride,
                                           status, stream);
}
