// deepselect: DeepSeek's DeepSelect top-k (a rising threshold over one pass of the row), our own code.
//
// One block per row. The row is cut into segments of kSeg elements (one warp's share of a round) that
// are visited in a fixed pseudo-random order, a round of one segment per warp at a time. An element
// enters a shared-memory candidate buffer only if it is above the threshold T (T starts as NaN, which
// every comparison below lets through, i.e. "below everything"). When a round's accepted elements would
// not fit, the buffer is first cut back to the top_k largest (a compaction) and T rises to a lower bound
// of the k-th largest key; the round is then filtered again against the new T. After the last round one
// more select leaves exactly top_k. Every input element is read once; the work besides the read is a few
// selects of a few thousand shared-memory candidates per row, whose count barely depends on the value
// distribution (the random visit order is what keeps sorted or adversarial rows from letting everything in).
//
// The per-candidate work of those selects is what the design minimises:
// - Keys: order-preserving, 32 bits for fp32 and 16 for bf16 (half the shared memory and two 8-bit
//   digits instead of four).
// - The first digit's histogram is counted while a candidate is appended (its key is in a register
//   then), so a select starts with the scan of a complete histogram, not with a pass over the buffer.
// - Two buffers: a compaction writes its survivors into the other buffer (counting their first digit
//   for the next select) instead of copying them back, and buffer roles swap.
// - A compaction need not be exact: it stops at the first digit whose threshold bucket can be kept
//   whole within kRoom extra candidates (on normal logits usually the first digit). Only the final
//   select resolves every digit.
// - Survivors are placed by warp ballots (one shared atomic per warp and class, above the bucket or
//   in it) rather than one atomic per element.
// - Barriers: one per round (the placement scan, whose per-warp totals alternate between two slots);
//   a one-digit compaction adds four.
//
// Other pieces:
// - Visit order: segment i of the row is visited as number (i * a + c) mod m, with a = P mod m for a
//   prime P > m, so a is coprime with m (a permutation) and costs one modulo per row.
// - Loads: 16-byte, coalesced (a warp reads 512 contiguous bytes per load instruction), the next kDepth
//   rounds in flight in registers while this one is filtered, appended and possibly compacted.
// - Comparisons: `!(x <= T)`, one unordered compare (one packed bf16x2 compare per pair for bf16): NaN
//   both as T (start) and as x (every NaN in the row becomes a candidate, so NaN is detected among
//   candidates only, never per element).
//
// Measured and not used (bench/RESULTS.md): a row split over a thread-block cluster (1.6-2.1x slower:
// every part restarts its threshold and compacts its own first rounds).
//
// Entry points, workspace and status: see topk_api.h.
#include <atomic>
#include <cstring>
#include <type_traits>

#include "common.cuh"
#include "topk_api.h"

namespace {

// ------------------------------------------------------------------------------------------ tunables
// Chosen per (dtype, top_k class) from bench/deepselect_tune.py on an H200 (results in bench/RESULTS.md).
// Each can be overridden at build time (-DLR_DS_THREADS=... etc.) for that sweep, for every class at once.
//   kThreads    threads per block (one block per row)
//   kElems      elements per thread per round (kVecs 16-byte loads: 4 fp32 or 8 bf16 elements each)
//   kRoom       candidates beyond top_k that a compaction may keep (whole buckets)
//   kDepth      rounds whose loads are in flight while a round is processed
//   kMaxBlocks  blocks per multiprocessor at most; fewer when the shared memory admits fewer
// WIDE: rows of at least kWideStride elements (judged by the row stride, since the bounds stay on the
// device), where more loads in flight pay; only the classes up to 1024 have a wide variant.
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
  static constexpr int kElems = 8;
#endif
  static constexpr int kVecs = kElems * static_cast<int>(sizeof(T)) / 16;
#ifdef LR_DS_ROOM
  static constexpr int kRoom = LR_DS_ROOM;
#else
  static constexpr int kRoom = K_MAX < 1024 ? K_MAX : 1024;
#endif
#ifdef LR_DS_DEPTH
  static constexpr int kDepth = LR_DS_DEPTH;
#else
  static constexpr int kDepth = WIDE || sizeof(T) == 2 ? 2 : 1;
#endif
#ifdef LR_DS_BLOCKS
  static constexpr int kMaxBlocks = LR_DS_BLOCKS;
#else
  static constexpr int kMaxBlocks = 5;
#endif
};

// Shared memory of one H100 / H200 multiprocessor, and what the hardware reserves per block.
constexpr int kSmemPerSm = 228 * 1024;
constexpr int kSmemPerBlockReserved = 1024;

// A prime above any segment count (fewer than 2^31 / 128): its residue modulo m is coprime with m.
constexpr uint32_t kPermPrime = 2654435761u;

// Order-preserving keys of BITS-bit float encodings (fp32, bf16): the bits of a value ("raw") map to a
// key whose unsigned order is the value order (lr::f32_key, lr::bf16_key); NaN maps outside +-inf.
template <int BITS>
struct Enc {
  using Key = std::conditional_t<BITS == 32, uint32_t, uint16_t>;
  static constexpr uint32_t kAll = BITS == 32 ? ~0u : 0xffffu;
  static constexpr uint32_t kSign = 1u << (BITS - 1);
  static constexpr uint32_t kInf = BITS == 32 ? 0x7f800000u : 0x7f80u;
  static constexpr uint32_t kNaN = kAll & ~kSign;  // the starting threshold: below everything
  __device__ __forceinline__ static uint32_t key(uint32_t raw) { return (raw & kSign) ? ~raw & kAll : raw | kSign; }
  __device__ __forceinline__ static uint32_t raw(uint32_t key) { return (key & kSign) ? key & ~kSign : ~key & kAll; }
  __device__ __forceinline__ static bool nan(uint32_t raw) { return (raw & ~kSign) > kInf; }
};

// The bits of element j of a 16-bit vector (j is a constant once the callers' loops are unrolled, so the
// vector stays in registers).
template <typename T>
__device__ __forceinline__ uint32_t raw_element(const uint4& v, int j) {
  const uint32_t w = reinterpret_cast<const uint32_t*>(&v)[sizeof(T) == 4 ? j : j / 2];
  if constexpr (sizeof(T) == 4) return w;
  return j % 2 ? w >> 16 : w & 0xffffu;
}

// Bit j: element j of the vector is above the threshold t (given as raw bits), or either is NaN.
__device__ __forceinline__ uint32_t above(const uint4& v, uint32_t t, float) {
  const float tf = __uint_as_float(t);
  uint32_t bits = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) bits |= static_cast<uint32_t>(!(__uint_as_float(raw_element<float>(v, j)) <= tf)) << j;
  return bits;
}

__device__ __forceinline__ __nv_bfloat162 as_bf162(uint32_t w) {
  __nv_bfloat162 r;
  memcpy(&r, &w, sizeof(r));
  return r;
}

// bf16: one packed unordered compare per pair of elements; each half of its result is all ones or zero.
__device__ __forceinline__ uint32_t above(const uint4& v, uint32_t t, __nv_bfloat16) {
  const __nv_bfloat162 t2 = as_bf162(t * 0x10001u);
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t bits = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t g = __hgtu2_mask(as_bf162(w[i]), t2);
    bits |= ((g & 1u) | (g >> 15 & 2u)) << (2 * i);
  }
  return bits;
}

template <typename T, int K_MAX, bool WIDE>
struct DeepSelect {
  using C = Config<T, K_MAX, WIDE>;
  using E = Enc<8 * sizeof(T)>;
  using Key = typename E::Key;
  static constexpr int kThreads = C::kThreads;
  static constexpr int kWarps = kThreads / lr::kWarp;
  static constexpr int kVec = 16 / sizeof(T);                // elements per 16-byte load
  static constexpr int kPerThread = C::kVecs * kVec;         // elements per thread per round
  static constexpr int kSeg = lr::kWarp * kPerThread;        // elements per segment (a warp's share)
  static constexpr int kRound = kWarps * kSeg;               // elements per round
  static constexpr int kCap = K_MAX + C::kRoom + kRound;     // a compacted buffer plus one round
  static constexpr int kTop = 8 * sizeof(T) - 8;             // shift of a key's first digit
  static_assert(kPerThread <= 32, "one bit per element of a thread's round in a 32-bit mask");
  static_assert(kCap % 2 == 0, "16-bit keys fill whole words");

  struct Smem {
    int idx[2][kCap];         // candidates of buffer b: indices relative to the row start ...
    uint32_t hist[2][256];    // ... the histogram of their keys' first digit ...
    uint32_t lo[2][256];      // (a select's later digits, alternating)
    uint32_t warp_count[2][kWarps];  // accepted elements per warp, alternating placements
    uint32_t taken[2];        // slots an apply has handed out: above the threshold bucket, in it
    lr::ScanScratch<kThreads> scan;
    Key keys[2][kCap];        // ... and their keys
  };
  static constexpr int kBlocks =
      C::kMaxBlocks < kSmemPerSm / (static_cast<int>(sizeof(Smem)) + kSmemPerBlockReserved)
          ? C::kMaxBlocks
          : kSmemPerSm / (static_cast<int>(sizeof(Smem)) + kSmemPerBlockReserved);
  static_assert(kBlocks >= 1, "the buffers fit in one multiprocessor's shared memory");

  // Which candidates a select keeps: every key with (key & mask) > prefix (`greater` of them) and the
  // first `ties` with (key & mask) == prefix. prefix is a lower bound of the kept keys, so its value
  // is a safe threshold.
  struct Rule {
    uint32_t mask, prefix, greater, ties;
  };

  // The rule keeping the m largest of buffer b (n candidates, its first-digit histogram complete and
  // visible), or up to `room` more when a bucket can be kept whole. Needs s.lo[0] zeroed; every thread
  // returns the same rule.
  __device__ static Rule rule(Smem& s, int b, int n, int m, int room) {
    const Key* keys = s.keys[b];
    lr::ThresholdBin t = lr::block_threshold_bin<kThreads, 256>(s.hist[b], m, s.scan);
    int shift = kTop;
    uint32_t mask = 255u << shift, prefix = static_cast<uint32_t>(t.bin) << shift, greater = t.above;
    uint32_t need = m - t.above;
    const uint32_t keep_max = m + room;
    for (int c = 0; greater + t.count > keep_max && shift > 0; c ^= 1) {
      shift -= 8;
      lr::smem_fill<kThreads>(s.lo[c ^ 1], 256, 0u);  // for the next digit (last read by the scan above)
      for (int i = threadIdx.x; i < n; i += kThreads) {
        const uint32_t k = keys[i];
        if ((k & mask) == prefix) atomicAdd(&s.lo[c][(k >> shift) & 255u], 1u);
      }
      __syncthreads();
      t = lr::block_threshold_bin<kThreads, 256>(s.lo[c], need, s.scan);
      mask |= 255u << shift;
      prefix |= static_cast<uint32_t>(t.bin) << shift;
      greater += t.above;
      need -= t.above;
    }
    return Rule{mask, prefix, greater, greater + t.count <= keep_max ? t.count : need};
  }

  // Calls sink(slot, i, key) for each candidate i of buffer b the rule keeps, slots 0 .. greater + ties
  // (each once). Needs s.taken zeroed; ends with a barrier.
  template <typename Sink>
  __device__ static void apply(Smem& s, int b, int n, const Rule& r, Sink&& sink) {
    const Key* keys = s.keys[b];
    const int lane = threadIdx.x % lr::kWarp;
    const uint32_t lower = (1u << lane) - 1u;
    for (int base = static_cast<int>(threadIdx.x) - lane; base < n; base += kThreads) {  // whole warps
      const int i = base + lane;
      const uint32_t k = i < n ? keys[i] : 0u;
      const uint32_t gt = __ballot_sync(~0u, i < n && (k & r.mask) > r.prefix);
      const uint32_t eq = __ballot_sync(~0u, i < n && (k & r.mask) == r.prefix);
      uint32_t g0 = 0, e0 = 0;
      if (lane == 0) {
        if (gt) g0 = atomicAdd(&s.taken[0], __popc(gt));
        if (eq) e0 = atomicAdd(&s.taken[1], __popc(eq));
      }
      g0 = __shfl_sync(~0u, g0, 0);
      e0 = __shfl_sync(~0u, e0, 0);
      if (gt >> lane & 1u) {
        sink(g0 + __popc(gt & lower), i, k);
      } else if (eq >> lane & 1u) {
        const uint32_t rank = e0 + __popc(eq & lower);
        if (rank < r.ties) sink(r.greater + rank, i, k);
      }
    }
    __syncthreads();
  }

  // Cut buffer b (n candidates, n > top_k) back to top_k plus at most kRoom into buffer b ^ 1; b and n
  // become the new buffer and count. Returns the new threshold (raw bits): nothing above it is lost.
  // Called right after a barrier that follows the last appends.
  __device__ static uint32_t compact(Smem& s, int& b, int& n, int top_k) {
    const Rule r = rule(s, b, n, top_k, C::kRoom);
    const int to = b ^ 1;
    Key* keys = s.keys[to];
    int* idx = s.idx[to];
    const int* from = s.idx[b];
    uint32_t* hist = s.hist[to];
    apply(s, b, n, r, [&](uint32_t slot, int i, uint32_t k) {
      keys[slot] = static_cast<Key>(k);
      idx[slot] = from[i];
      atomicAdd(&hist[k >> kTop], 1u);
    });
    // Ready for the next compaction; the placement scan that follows every compaction publishes this.
    lr::smem_fill<kThreads>(s.hist[b], 256, 0u);
    lr::smem_fill<kThreads>(s.lo[0], 256, 0u);
    if (threadIdx.x < 2) s.taken[threadIdx.x] = 0;
    b = to;
    n = static_cast<int>(r.greater + r.ties);
    return E::raw(r.prefix);
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
  // is above the threshold t (raw bits).
  __device__ __forceinline__ static uint32_t filter(const uint4 (&v)[C::kVecs], int seg, int head, int span, uint32_t t,
                                                    int lane) {
    uint32_t acc = 0;
#pragma unroll
    for (int q = 0; q < C::kVecs; ++q) {
      const int o = seg * kSeg + (q * lr::kWarp + lane) * kVec;
      const int lo = min(max(head - o, 0), kVec), hi = min(max(span - o, 0), kVec);
      const uint32_t inside = (1u << hi) - (1u << lo);  // bits [lo, hi); hi >= lo, both <= 8
      acc |= (above(v[q], t, T{}) & inside) << (q * kVec);
    }
    return acc;
  }

  // Append the elements of `acc` to buffer b at slots pos, pos + 1, ..., counting their first digits;
  // returns whether one of them was NaN.
  __device__ __forceinline__ static bool append(Smem& s, int b, const uint4 (&v)[C::kVecs], uint32_t acc, int pos,
                                                int seg, int head, int lane) {
    Key* keys = s.keys[b];
    int* idx = s.idx[b];
    uint32_t* hist = s.hist[b];
    bool nan = false;
#pragma unroll
    for (int q = 0; q < C::kVecs; ++q) {
      const int rel = seg * kSeg + (q * lr::kWarp + lane) * kVec - head;  // index of element 0 of v[q]
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        if (acc >> (q * kVec + j) & 1u) {
          const uint32_t x = raw_element<T>(v[q], j);
          const uint32_t k = E::key(x);
          keys[pos] = static_cast<Key>(k);
          idx[pos] = rel + j;
          atomicAdd(&hist[k >> kTop], 1u);
          nan |= E::nan(x);
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

    // Both first-digit histograms, the first later-digit one and the apply counters start at zero
    // (published by the first placement scan).
    lr::smem_fill<kThreads>(&s.hist[0][0], 2 * 256, 0u);
    lr::smem_fill<kThreads>(s.lo[0], 256, 0u);
    if (tid < 2) s.taken[tid] = 0;

    uint32_t t = E::kNaN;  // the threshold, raw bits: every element passes `!(x <= t)`
    int b = 0;             // the buffer in use ...
    int n = 0;             // ... and its candidates
    int placements = 0;    // placement scans so far (their per-warp totals alternate slots)
    bool nan = false;

    // Where this warp's accepted elements go in a placement: one barrier.
    auto place = [&](uint32_t acc, int& pos, int& total) {
      const uint32_t cnt = __popc(acc);
      uint32_t incl = cnt;  // inclusive scan of the counts over the warp
#pragma unroll
      for (int off = 1; off < lr::kWarp; off <<= 1) {
        const uint32_t y = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += y;
      }
      uint32_t* counts = s.warp_count[placements++ & 1];
      if (lane == lr::kWarp - 1) counts[warp] = incl;
      __syncthreads();
      pos = n + static_cast<int>(incl - cnt);
      total = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const int c = static_cast<int>(counts[w]);
        pos += w < warp ? c : 0;
        total += c;
      }
    };

    // One round: filter this warp's segment and place its accepted elements; when they would not fit,
    // compact first and filter again against the risen threshold (after a compaction n <= top_k + kRoom,
    // so a whole round fits).
    auto process = [&](const uint4 (&v)[C::kVecs], int cur_seg) {
      uint32_t acc = cur_seg >= 0 ? filter(v, cur_seg, head, span, t, lane) : 0u;
      int pos, total;
      place(acc, pos, total);
      if (n + total > kCap) {
        t = compact(s, b, n, top_k);
        if (acc) acc = filter(v, cur_seg, head, span, t, lane);
        place(acc, pos, total);
      }
      if (acc) nan |= append(s, b, v, acc, pos, cur_seg, head, lane);
      n += total;
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
        process(v, cur_seg);
      }
    }

    __syncthreads();  // the last appends are visible
    const Rule rule_k = rule(s, b, n, top_k, 0);
    const int* idx = s.idx[b];
    apply(s, b, n, rule_k, [&](uint32_t slot, int i, uint32_t) { out_row[slot] = idx[i]; });
    if (__syncthreads_or(nan) && tid == 0) lr::report_nan(status);
  }
};

template <typename T, int K_MAX, bool WIDE>
__global__ __launch_bounds__(DeepSelect<T, K_MAX, WIDE>::kThreads, DeepSelect<T, K_MAX, WIDE>::kBlocks) void
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
  // Above 48 KB a kernel must opt in, once per device; not a stream operation, so it is also safe
  // while a graph is being captured (and is done by the first, uncaptured, call in practice).
  static std::atomic<uint64_t> opted_in{0};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return LR_ELAUNCH;
  const uint64_t bit = 1ull << (device % 64);
  if (!(opted_in.load() & bit)) {
    if (cudaFuncSetAttribute(deepselect_kernel<T, K_MAX, WIDE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSmem) != cudaSuccess)
      return LR_ELAUNCH;
    opted_in.fetch_or(bit);
  }
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
