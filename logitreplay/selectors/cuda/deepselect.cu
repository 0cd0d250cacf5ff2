// deepselect: DeepSeek's DeepSelect top-k (a rising threshold over one pass of the row), our own code.
//
// One block per row. The row is cut into segments of kSeg elements (one warp's share of a round) that
// are visited in a fixed pseudo-random order, a round of one segment per warp at a time. An element
// enters the shared-memory candidate buffer only if it passes the threshold T (T starts as NaN, which
// every comparison below lets through, i.e. "below everything"). After the last round one select
// leaves exactly top_k. Every input element is read once per pass.
//
// Where T comes from, in the order a row meets it:
// 1. The first round's own registers, when it holds at least r elements of the row: the block's radix
//    select (common.cuh) finds the round's key of rank r without the round being written anywhere, and
//    T becomes that key (elements at or above it enter). r is not top_k but `keep_rank`: about as many
//    of the row's top_k as the round is likely to hold, plus a wide margin. That is a bet that T is
//    still at or below the row's k-th value.
// 2. With the bet placed, the later rounds add few candidates (about r per round's worth of the row),
//    so they run free: no barrier per round, one shared atomic per warp. A long row (kRebetRounds rounds
//    or more; the narrow variant of a class with a wide one serves none) stops once, after round
//    rounds / kRebetDiv, at one barrier, between two runs of the rounds' loop: when its buffer is on course
//    for more than half its capacity (a first round's rank-r key can let in far more than r per round:
//    k = 2048 on the longest rows, flooded bins), it is cut back there by a speculative compaction, the
//    same bet placed on the rounds seen so far, whose margin is then much smaller against mu; when it
//    already overflowed, the pass ends there instead of reading on for nothing. At the end the bet is
//    checked: if fewer than top_k candidates remain, or the buffer overflowed, the row is redone
//    exactly (r = top_k and a barrier per round), a second and last pass over the row. Spread scores
//    never need one, k = 2048 on the longest rows and flooded bins included; long rows with heavy ties
//    at the k-th value and ordered rows sometimes do (bench/deepselect_bets.py: the CPU model's count,
//    by distribution).
// 3. In the exact pass (and rows the first step does not apply to), the classic rule: when the buffer
//    reaches top_k + kB2 candidates it is cut back by the shared-memory select, and T rises to a lower
//    bound of the k-th largest key (or, speculating, of the keep_rank-th).
// The work besides the read is then one radix select over the first round's registers and one select of
// about top_k + a margin candidates per row, whose count barely depends on the value distribution (the
// random visit order keeps sorted or adversarial rows from letting everything in).
//
// Why each piece:
// - Visit order: segment i of the row is visited as number (i * a + c) mod m, with a = P mod m for a
//   prime P > m, so a is coprime with m (a permutation) and costs one modulo per row.
// - Loads: 16-byte, coalesced (a warp reads 512 contiguous bytes per load instruction), the next round
//   in flight in registers while this one is filtered and appended.
// - Comparisons: `!(x <= T)` is one unordered compare: NaN both as T (start) and as x (every NaN in the
//   row becomes a candidate, so NaN is detected among candidates only, never per element).
// - Appends: a warp-level popcount scan, then either one barrier per round (the per-warp totals
//   alternate between two slots, so no second barrier is needed before the next round) or, in free
//   rounds, one shared atomic per warp.
// - bf16 keys use the fp32 key of the (exact) fp32 value; its low 16 bits carry no information, so the
//   selects resolve 16 bits (two radix passes) instead of 32.
//
// The code follows these phases, one device function each, called in this order by `run`: short rows
// (copied whole), then a pass (`read`): the first bet (`first_bet`), the free rounds (`free_rounds`, the
// re-bet `rebet` between their two runs) or the synchronous ones (`rounds`); the redo (a second, exact
// pass, from `run`); and the final select (`final_select`).
//
// The deterministic build (common.cuh, -DLR_DETERMINISTIC) keeps every candidate tied at the k-th key
// in the buffer, so that the final select can take the lowest-index ones: every threshold lets the keys
// equal to it in (at_or_above, where the default build raises it past an exact k-th key), and a
// compaction keeps the lowest-index ties (a tie it drops has a higher index than the ones it keeps, which
// still outnumber the ties the row needs in the end). The final select's indices are then sorted in
// `kept_idx` and written in index order. The cost falls on rows tied at the k-th value: their ties keep
// entering, so the free rounds overflow and the row is redone, and the exact pass compacts once per kB2
// tied elements it meets (a ReLU plateau of zeros: about the row's length / kB2 compactions).
//
// Alternatives measured and not kept: bench/RESULTS.md, "Kernel history".
//
// Entry points, workspace and status: see topk_api.h.

#include <iterator>

#include "common.cuh"
#include "deepselect_config.h"
#include "topk_api.h"

namespace {

namespace cfg = deepselect_config;

// ------------------------------------------------------------------------------------------ tunables
// Per top_k class, from deepselect_config.h (its kClasses and kWideClasses: what each field means, and
// why). Each can be overridden at build time (-DLR_DS_<NAME>=v) for the sweep of bench/deepselect_tune.py,
// for every class at once: kThreads, kElems, kB2, kBlocks and kWideStride.
#ifdef LR_DS_WIDE_STRIDE
constexpr long long kWideStride = LR_DS_WIDE_STRIDE;
#else
constexpr long long kWideStride = cfg::kWideStride;
#endif

// Class K_MAX's row of deepselect_config.h: in kWideClasses for its wide variant.
template <int K_MAX, bool WIDE>
constexpr cfg::Class class_config() {
  if constexpr (WIDE) {
    for (const cfg::Class& c : cfg::kWideClasses)
      if (c.k_max == K_MAX) return c;
  } else {
    for (const cfg::Class& c : cfg::kClasses)
      if (c.k_max == K_MAX) return c;
  }
  return cfg::Class{};
}

// Whether class k_max has a wide variant, which rows of kWideStride or more elements take (launch_class).
constexpr bool has_wide(int k_max) {
  for (const cfg::Class& c : cfg::kWideClasses)
    if (c.k_max == k_max) return true;
  return false;
}

template <typename T, int K_MAX, bool WIDE>
struct Config {
  static constexpr cfg::Class kClass = class_config<K_MAX, WIDE>();
  static_assert(kClass.k_max == K_MAX, "a class of deepselect_config.h");
#ifdef LR_DS_THREADS
  static constexpr int kThreads = LR_DS_THREADS;
#else
  static constexpr int kThreads = kClass.threads;
#endif
#ifdef LR_DS_ELEMS
  static constexpr int kElems = LR_DS_ELEMS;
#else
  static constexpr int kElems = kClass.elems;
#endif
  static constexpr int kVecs = kElems * static_cast<int>(sizeof(T)) / 16;
#ifdef LR_DS_B2
  static constexpr int kB2 = LR_DS_B2;
#else
  static constexpr int kB2 = kClass.b2;
#endif
#ifdef LR_DS_BLOCKS
  static constexpr int kBlocks = LR_DS_BLOCKS;
#else
  static constexpr int kBlocks = kClass.blocks;
#endif
};

// The speculative rank of a compaction after `seen` of a row's `len` elements: of the row's top_k, about
// mu = top_k * seen / len lie in what was seen (hypergeometric, standard deviation below sqrt(mu)), so
// the rank-r key of the candidates, with r kRankSigmas deviations and kRankExtra above mu, is with
// overwhelming probability still at or below the row's k-th largest: a much higher threshold than the
// k-th of what was seen, which is what the exact rule uses.
__device__ __forceinline__ int keep_rank(int top_k, int seen, int len) {
  const float mu = static_cast<float>(top_k) * static_cast<float>(seen) / static_cast<float>(len);
  constexpr float kSigmas = cfg::kRankSigmas, kExtra = cfg::kRankExtra;
  return min(top_k, static_cast<int>(ceilf(mu + kSigmas * sqrtf(mu) + kExtra)));
}

// The re-bet of free rounds (see the header): rows of at least kRebetRounds rounds, after round
// rounds / kRebetDiv. The visit order's prime: kPermPrime.
using cfg::kPermPrime, cfg::kRebetDiv, cfg::kRebetRounds;

// Inverse of lr::f32_key: the float whose key is `key`.
__device__ __forceinline__ float key_to_f32(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// The threshold t under which `!(x <= t)` lets in exactly the values whose key is at least `key`: the
// float just below it (below +0.0's key is -0.0's, an equal float, so that one is skipped too); NaN, i.e.
// everything, for the two smallest keys.
__device__ __forceinline__ float at_or_above(uint32_t key) {
  return key_to_f32(key - 1u - (key == 0x80000000u ? 1u : 0u));
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
  static constexpr int kKeyBits = sizeof(T) == 4 ? cfg::kKeyBitsF32 : cfg::kKeyBitsBf16;  // that carry information
  static constexpr int kFirstBits = sizeof(T) == 4 ? cfg::kFirstBitsF32 : cfg::kFirstBitsBf16;  // the first threshold's
  static_assert(kPerThread <= 32, "one bit per element of a thread's round in a 32-bit mask");
  // Whether a row of this variant can reach the re-bet: the narrow variant of a class with a wide one
  // serves rows shorter than kWideStride only (at most kWideStride / kRound + 1 rounds), and compiled
  // without it, its free rounds keep the registers they had before the re-bet existed. The CPU model
  // applies the same rule to the same config (cpu_models._rebets); tests/test_kernel_constants.py
  // evaluates this line, and free_rounds' first `end`, against it.
  static constexpr bool kRebets = WIDE || !has_wide(K_MAX) || kWideStride / kRound + 1 >= kRebetRounds;

  struct Smem {
    uint32_t keys[kCap];  // candidates [0, n): order-preserving keys ...
    int idx[kCap];        // ... and their indices relative to the row start
    uint32_t kept_keys[K_MAX];  // a compaction's survivors, copied back to the front
    int kept_idx[K_MAX];
    uint32_t warp_count[2][kWarps];  // accepted elements per warp, alternating rounds
    uint32_t count;                  // candidates placed by free rounds
    lr::SelectScratch<kThreads> sel;
  };

  // Where a row lies and in which order its segments are visited (see "Visit order"): the same in every
  // thread.
  struct Span {
    const uint4* base;  // the span's 16-byte vectors, from the boundary at or before the row start
    int head;           // cells of the span before the row start
    int span;           // cells of the span: head + the row's length
    uint32_t m;         // segments: segment i is visited as number (i * a + m / 2) mod m, a = kPermPrime mod m
    uint32_t first;     // this warp's segment in the first round: (warp * a + m / 2) mod m
    uint32_t step;      // kWarps * a mod m: from a warp's segment in one round to its next
    int rounds;
    int first_valid;    // the row's elements in the first round (when rounds > 1)
  };

  // This warp's segment of the next round, loaded into registers while the current round is processed;
  // copied out only when its own data is needed, never moved while its load is still in flight.
  struct Ahead {
    uint4 v[C::kVecs];
    int seg;        // the segment `v` holds, -1 once the row has none left for this warp
    uint32_t next;  // the segment the next load reads
  };

  // One pass's threshold and candidates (the same in every thread of the block).
  struct Pass {
    bool spec;      // speculating: compactions keep keep_rank candidates, not top_k
    float t;        // elements x with !(x <= t) enter; NaN at first, which lets everything in
    float t_later;  // the threshold from the second round on
    int n;          // candidates in s.keys / s.idx (synchronous rounds; free rounds count in s.count)
  };

  // What both passes add up: NaN among the candidates, and the work record's counts (LR_WORK_RECORD
  // builds only).
  struct Tally {
    bool nan = false;
    int compactions = 0, appended = 0, firsts = 0;
  };

  // Cut candidates [0, n) back (in place, via kept_*) around the key of rank `rank` (keep_rank, or top_k
  // itself); sets the threshold t and returns how many candidates are kept:
  // - exact (rank == top_k, or at least top_k keys are at or above the rank-th, which is then also the
  //   k-th): the top_k are kept, and later elements enter only above t = that key (its ties are not
  //   needed). Nothing of the answer is lost.
  // - speculative: every candidate at or above the rank-th key is kept (fewer than top_k), and later
  //   elements enter at or above it. The answer is then right exactly when at least top_k candidates
  //   remain after the last round (all at or above the last threshold, and nothing above it was
  //   dropped); `run` checks that and redoes the row without speculation otherwise.
  __device__ static int compact(Smem& s, int n, int rank, int top_k, float& t) {
    __syncthreads();  // the last round's appends are visible
    lr::SelectRule rule = lr::smem_select_rule<kThreads, kKeyBits>(s.keys, n, rank, s.sel);
    const int not_below = rule.not_below(rank);
    const bool exact = not_below >= top_k;
    const int keep = exact ? top_k : not_below;
    rule.ties += static_cast<uint32_t>(keep - rank);  // <= rule.count: more of the prefix bucket
    if (threadIdx.x == 0) s.sel.emitted = 0;  // published by the apply's first barrier
    lr::smem_select_apply<kThreads>(s.keys, [&](int i) { return s.idx[i]; }, n, rule, s.sel, [&](int i) {
      const uint32_t slot = lr::claim(&s.sel.emitted);
      s.kept_keys[slot] = s.keys[i];
      s.kept_idx[slot] = s.idx[i];
    });
    // The apply ended with a barrier; the next round appends at [top_k, ...) and the next select
    // starts with a barrier, so copying back needs none.
    for (int i = threadIdx.x; i < keep; i += kThreads) {
      s.keys[i] = s.kept_keys[i];
      s.idx[i] = s.kept_idx[i];
    }
    // Exact: a lower bound of the k-th largest key. Speculative (and the deterministic build's, whose
    // ties must keep entering): the prefix's own value enters too.
    t = fmaxf(t, exact && !lr::kDeterministic ? key_to_f32(rule.prefix) : at_or_above(rule.prefix));
    return keep;
  }

  // Load this warp's segment `seg` of the row (16-byte vectors at span offsets below `span`). One
  // pointer per thread, the vectors at constant offsets from it: the loads' addresses cost no registers
  // of their own.
  __device__ __forceinline__ static void load(uint4 (&v)[C::kVecs], const uint4* base, int seg, int span, int lane) {
    const int o = seg * kSeg + lane * kVec;  // span offset of this thread's first vector
    const uint4* p = base + o / kVec;
#pragma unroll
    for (int q = 0; q < C::kVecs; ++q)
      v[q] = o + q * lr::kWarp * kVec < span ? __ldg(p + q * lr::kWarp) : make_uint4(0u, 0u, 0u, 0u);
  }

  // Bit e of the result: element e of this thread's share of segment `seg` lies inside the row.
  __device__ __forceinline__ static uint32_t inside(int seg, int head, int span, int lane) {
    uint32_t acc = 0;
#pragma unroll
    for (int q = 0; q < C::kVecs; ++q) {
      const int o = seg * kSeg + (q * lr::kWarp + lane) * kVec;
      const int lo = min(max(head - o, 0), kVec), hi = min(max(span - o, 0), kVec);
      acc |= ((1u << hi) - (1u << lo)) << (q * kVec);  // bits [lo, hi); hi >= lo, both <= 8
    }
    return acc;
  }

  // Bit e of the result: element e of this thread's share is above t (or NaN, or t is NaN).
  __device__ __forceinline__ static uint32_t above(const uint4 (&v)[C::kVecs], float t) {
    uint32_t acc = 0;
#pragma unroll
    for (int e = 0; e < kPerThread; ++e) acc |= static_cast<uint32_t>(!(element<T>(v[e / kVec], e % kVec) <= t)) << e;
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

  // The span of a row (the segments are aligned to 16 bytes, the first holding `head` cells before the
  // row) and its visit order: one modulo per row.
  __device__ __forceinline__ static Span span_of(const T* row, int len) {
    Span sp;
    sp.head = static_cast<int>((reinterpret_cast<uintptr_t>(row) % 16) / sizeof(T));
    sp.span = len + sp.head;
    sp.base = reinterpret_cast<const uint4*>(row - sp.head);
    sp.m = static_cast<uint32_t>((sp.span + kSeg - 1) / kSeg);
    // In 32 bits, since a 64-bit modulo is a call, whose live registers the whole kernel then pays for:
    // a < m <= 2^31 / kSeg <= 2^24 and warp < kWarps <= 32, so warp * a + m / 2 < 2^30.
    static_assert(kSeg >= 128 && kWarps <= 32, "the visit order's arithmetic fits 32 bits");
    const uint32_t a = kPermPrime % sp.m;
    const uint32_t warp = threadIdx.x / lr::kWarp;
    sp.first = (warp * a + sp.m / 2) % sp.m;
    sp.step = static_cast<uint32_t>(kWarps) * a % sp.m;
    sp.rounds = static_cast<int>((sp.m + kWarps - 1) / kWarps);
    // The first round's kWarps segments are distinct when rounds > 1: whole segments but the span's first
    // (`head` cells before the row) and its last (up to `span`). A loop, not unrolled: needed once per
    // pass, its kWarps steps unrolled took registers the rounds need (ptxas: spills in the k2048 classes).
    sp.first_valid = 0;
#pragma unroll 1
    for (uint32_t w = 0, g = sp.m / 2; w < kWarps; ++w, g = g + a < sp.m ? g + a : g + a - sp.m)
      sp.first_valid += min(sp.span - static_cast<int>(g) * kSeg, kSeg) - (g == 0 ? sp.head : 0);
    return sp;
  }

  // This warp's first segment, the first round's in flight (a pass starts here).
  __device__ __forceinline__ static void start(Ahead& ah, const Span& sp) {
    ah.next = sp.first;
    issue(ah, sp, 0);
  }

  // Put round `round`'s load of this warp in flight, if the row has a segment left for it.
  __device__ __forceinline__ static void issue(Ahead& ah, const Span& sp, int round) {
    const int warp = threadIdx.x / lr::kWarp, lane = threadIdx.x % lr::kWarp;
    ah.seg = round * kWarps + warp < static_cast<int>(sp.m) ? static_cast<int>(ah.next) : -1;
    if (ah.seg >= 0) load(ah.v, sp.base, ah.seg, sp.span, lane);
    ah.next += sp.step;
    if (ah.next >= sp.m) ah.next -= sp.m;
  }

  // One round: filter this warp's segment and place the accepted elements. A free round places them with
  // one shared atomic per warp and no barrier; a synchronous one with one barrier, and it compacts when
  // the buffer is full (not after the last round: the final select does that).
  template <bool FREE>
  __device__ __forceinline__ static void round(Smem& s, const Span& sp, Pass& p, Tally& tally,
                                               const uint4 (&v)[C::kVecs], int seg, int round, int top_k) {
    const int lane = threadIdx.x % lr::kWarp, warp = threadIdx.x / lr::kWarp;
    const uint32_t valid = seg >= 0 ? inside(seg, sp.head, sp.span, lane) : 0u;
    const uint32_t acc = valid & above(v, p.t);
    if (round == 0) p.t = p.t_later;
    const uint32_t cnt = __popc(acc);
    const uint32_t incl = lr::warp_inclusive_sum(cnt, lane);
    if constexpr (FREE) {
      // The threshold no longer moves, so no compaction follows. A warp whose elements would not fit in
      // the buffer places none; the count then tells the pass to be redone exactly.
      const uint32_t total = __shfl_sync(~0u, incl, lr::kWarp - 1);
      uint32_t base = 0;
      if (lane == lr::kWarp - 1 && total) base = atomicAdd(&s.count, total);
      base = __shfl_sync(~0u, base, lr::kWarp - 1);
      if (acc && base + total <= kCap)
        tally.nan |= append(s, v, acc, static_cast<int>(base + incl - cnt), seg, sp.head, lane);
    } else {
      // The per-warp totals alternate between two slots, so no second barrier is needed before the next
      // round.
      uint32_t* counts = s.warp_count[round & 1];
      if (lane == lr::kWarp - 1) counts[warp] = incl;
      __syncthreads();
      int pos = p.n + static_cast<int>(incl - cnt), total = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const int c = static_cast<int>(counts[w]);
        pos += w < warp ? c : 0;
        total += c;
      }
      if (acc) tally.nan |= append(s, v, acc, pos, seg, sp.head, lane);
      p.n += total;
      if constexpr (lr::kWorkRecord) tally.appended += total;
      if (p.n >= top_k + C::kB2 && round + 1 < sp.rounds) {
        const int rank = p.spec ? keep_rank(top_k, min((round + 1) * kRound, sp.span), sp.span) : top_k;
        p.n = compact(s, p.n, rank, top_k, p.t);
        if constexpr (lr::kWorkRecord) ++tally.compactions;
      }
    }
  }

  // Rounds [begin, end), the next one's load in flight while one is processed (round `begin`'s is already
  // in flight; none is put in flight after the last, so nothing is in flight past `end`). Compiled once
  // per kind of round, so that each gets its own registers.
  template <bool FREE>
  __device__ __forceinline__ static void rounds(Smem& s, const Span& sp, Ahead& ah, Pass& p, Tally& tally,
                                                int begin, int end, int top_k) {
    for (int r = begin; r < end; ++r) {
      uint4 v[C::kVecs];
#pragma unroll
      for (int q = 0; q < C::kVecs; ++q) v[q] = ah.v[q];
      const int seg = ah.seg;
      if (r + 1 < end) issue(ah, sp, r + 1);
      round<FREE>(s, sp, p, tally, v, seg, r, top_k);
    }
  }

  // The first bet: the first threshold from the first round's own registers, when it holds at least r
  // elements of the row, instead of taking that round whole and compacting it: the round's rank-r key,
  // to kFirstBits bits (a lower bound). With r = top_k that threshold loses nothing; with the
  // speculative rank it is the bet of a speculative compaction, and the rounds can then run free: with a
  // threshold that close to the row's k-th value later rounds add few candidates, so the buffer takes
  // them all without a compaction, and a row where it would not is redone exactly. Done before the round
  // loop, whose registers it would otherwise crowd. Returns whether the rounds run free.
  __device__ static bool first_bet(Smem& s, const Span& sp, const Ahead& ah, Pass& p, Tally& tally, int top_k) {
    const int rank = p.spec ? keep_rank(top_k, kRound, sp.span) : top_k;
    if (sp.rounds <= 1 || rank > sp.first_valid) return false;  // too few of the row's elements to rank
    if (threadIdx.x == 0) s.count = 0;  // published by the select's first barrier
    const uint32_t valid = inside(ah.seg, sp.head, sp.span, threadIdx.x % lr::kWarp);
    const lr::SelectRule rule = lr::radix_select_rule<kThreads, kFirstBits>(
        [&](auto&& f) {
#pragma unroll
          for (int e = 0; e < kPerThread; ++e)
            if (valid >> e & 1u) f(lr::f32_key(element<T>(ah.v[e / kVec], e % kVec)));
        },
        rank, s.sel);
    p.t = p.t_later = at_or_above(rule.prefix);
    // At least top_k of the round's keys at or above the prefix (ties, constant rows): it is then the
    // round's k-th key too, nothing is bet, and as after an exact compaction no later element equal to
    // it is needed, so later rounds do not take the ties in.
    if (!lr::kDeterministic && rule.not_below(rank) >= top_k) p.t_later = key_to_f32(rule.prefix);
    if constexpr (lr::kWorkRecord) ++tally.firsts;
    return p.spec;
  }

  // The re-bet after free round `round` (see the header): the threshold from then on, and whether the
  // buffer already overflowed (the pass then stops there). Called between two runs of the free rounds'
  // loop with no load in flight, so that its compaction's registers are not taken from the loop's:
  // inside the loop, it made the loop spill. s.count is the same in every thread after the barrier, so
  // the whole block decides alike.
  struct Rebet {
    float t;
    int dropped;     // candidates the compaction dropped (the work record)
    bool compacted;  // whether it compacted (the work record)
    bool overflow;
  };
  __device__ __forceinline__ static Rebet rebet(Smem& s, int round, int rounds, int span, int top_k, float t) {
    __syncthreads();  // every warp's appends and count of rounds [0, round]
    const uint32_t c = s.count;
    if (c > static_cast<uint32_t>(kCap)) return {t, 0, false, true};
    const int rank = keep_rank(top_k, min((round + 1) * kRound, span), span);
    if (static_cast<long long>(c) * rounds <= static_cast<long long>(round + 1) * (kCap / 2) ||
        static_cast<int>(c) <= rank)
      return {t, 0, false, false};  // on course for at most half the buffer: the bet stands
    const int keep = compact(s, static_cast<int>(c), rank, top_k, t);
    if (threadIdx.x == 0) s.count = static_cast<uint32_t>(keep);
    __syncthreads();  // later appends go after the kept candidates
    return {t, static_cast<int>(c) - keep, true, false};
  }

  // The free rounds, and the count of candidates they placed (above kCap: the buffer overflowed). A long
  // row stops once, for the re-bet, between two runs of the same loop: the row decides once whether it
  // stops, and the loop holds nothing of the re-bet (nor a load in flight across it).
  __device__ static int free_rounds(Smem& s, const Span& sp, Ahead& ah, Pass& p, Tally& tally, int top_k) {
    int begin = 0, end = kRebets && sp.rounds >= kRebetRounds ? sp.rounds / kRebetDiv + 1 : sp.rounds;
    for (;;) {
      rounds<true>(s, sp, ah, p, tally, begin, end, top_k);
      if (end == sp.rounds) break;
      const Rebet re = rebet(s, end - 1, sp.rounds, sp.span, top_k, p.t);
      p.t = re.t;
      if constexpr (lr::kWorkRecord) {
        tally.appended += re.dropped;  // the end adds the final count, the kept candidates included
        tally.compactions += re.compacted;
      }
      if (re.overflow) break;
      issue(ah, sp, end);
      begin = end;
      end = sp.rounds;
    }
    __syncthreads();  // every warp's candidates and count
    if constexpr (lr::kWorkRecord) tally.appended += static_cast<int>(s.count);
    return static_cast<int>(min(s.count, static_cast<uint32_t>(kCap) + 1u));
  }

  // One pass over the row, speculating or exact; returns its candidates' count (above kCap: overflowed).
  __device__ static int read(Smem& s, const T* row, int len, bool spec, Tally& tally, int top_k) {
    const Span sp = span_of(row, len);
    const float everything = __uint_as_float(0x7fffffffu);  // NaN: every element passes `!(x <= t)`
    Pass p{spec, everything, everything, 0};
    Ahead ah;
    start(ah, sp);
    if (first_bet(s, sp, ah, p, tally, top_k)) return free_rounds(s, sp, ah, p, tally, top_k);
    rounds<false>(s, sp, ah, p, tally, 0, sp.rounds, top_k);
    return p.n;
  }

  // The final select: the top_k of the n candidates, their indices written to the row's output (in the
  // order the apply emits them; the deterministic build's the lowest-index ties, sorted in kept_idx).
  __device__ static void final_select(Smem& s, int n, int top_k, int* out_row) {
    __syncthreads();  // the last appends are visible
    const lr::SelectRule rule = lr::smem_select_rule<kThreads, kKeyBits>(s.keys, n, top_k, s.sel);
    if (threadIdx.x == 0) s.sel.emitted = 0;
    if constexpr (lr::kDeterministic) {
      lr::smem_select_apply<kThreads>(s.keys, [&](int i) { return s.idx[i]; }, n, rule, s.sel,
                                      [&](int i) { s.kept_idx[lr::claim(&s.sel.emitted)] = s.idx[i]; });
      lr::block_sort_ascending<kThreads>(s.kept_idx, top_k);
      for (int i = threadIdx.x; i < top_k; i += kThreads) out_row[i] = s.kept_idx[i];
    } else {
      lr::smem_select_apply<kThreads>(s.keys, n, rule, s.sel,
                                      [&](int i) { out_row[lr::claim(&s.sel.emitted)] = s.idx[i]; });
    }
  }

  __device__ static void run(const T* __restrict__ logits, long long row_stride, const int* __restrict__ row_starts,
                             const int* __restrict__ row_ends, int top_k, int* __restrict__ out, long long out_stride,
                             LrStatus* status) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Smem& s = *reinterpret_cast<Smem*>(smem_raw);
    const long long r = blockIdx.x;
    const int start = row_starts[r];
    const int len = row_ends[r] - start;
    const T* row = logits + r * row_stride + start;

    // Short rows: nothing to select, every element is in the answer.
    if (len <= top_k) {
      lr::copy_short_row<kThreads>(row, len, top_k, out + r * out_stride, status);
      return;
    }

    // One pass over the row, speculating. The redo: a pass that ends with fewer than top_k candidates
    // (the bet lost: the row has fewer than top_k elements at or above the last threshold) or with more
    // than the buffer holds (free rounds only) is followed by an exact one, which neither bets nor
    // overflows and so is the last. n is the same in every thread, so the whole block decides alike.
    Tally tally;
    int n = 0, pass = 0;
    for (; pass < 2; ++pass) {
      n = read(s, row, len, pass == 0, tally, top_k);
      if (n >= top_k && n <= kCap) break;
      __syncthreads();  // every thread is done with this pass's counts and candidates
    }
    if constexpr (lr::kWorkRecord) {
      if (threadIdx.x == 0)
        lr::add_work(lr::status_work(status) + r, tally.compactions, tally.appended, pass, tally.firsts);
    }

    final_select(s, n, top_k, out + r * out_stride);
    if (__syncthreads_or(tally.nan) && threadIdx.x == 0) lr::report_nan(status);
  }
};

template <typename T, int K_MAX, bool WIDE>
__global__ __launch_bounds__(DeepSelect<T, K_MAX, WIDE>::kThreads, Config<T, K_MAX, WIDE>::kBlocks) void
deepselect_kernel(const T* __restrict__ logits, long long row_stride, const int* __restrict__ row_starts,
                  const int* __restrict__ row_ends, int top_k, int* __restrict__ out, long long out_stride,
                  LrStatus* status) {
  DeepSelect<T, K_MAX, WIDE>::run(logits, row_stride, row_starts, row_ends, top_k, out, out_stride, status);
}

template <typename T, int K_MAX, bool WIDE>
int launch(const void* logits, long long row_stride, const int* row_starts, const int* row_ends, int rows, int top_k,
           int* out, long long out_stride, LrStatus* status, cudaStream_t stream) {
  using D = DeepSelect<T, K_MAX, WIDE>;
  constexpr int kSmem = static_cast<int>(sizeof(typename D::Smem));
  if (!lr::allow_smem<deepselect_kernel<T, K_MAX, WIDE>>(kSmem)) return LR_ELAUNCH;
  deepselect_kernel<T, K_MAX, WIDE><<<rows, D::kThreads, kSmem, stream>>>(
      static_cast<const T*>(logits), row_stride, row_starts, row_ends, top_k, out, out_stride, status);
  return cudaGetLastError() == cudaSuccess ? LR_OK : LR_ELAUNCH;
}

// One top_k class: its wide variant for rows of at least kWideStride elements where it has one. The
// CPU model makes the same choice (cpu_models._wide); tests/test_kernel_constants.py evaluates these
// two conditions against it.
template <typename T, int K_MAX>
int launch_class(const void* logits, long long row_stride, const int* row_starts, const int* row_ends, int rows,
                 int top_k, int* out, long long out_stride, LrStatus* status, cudaStream_t stream) {
  if constexpr (has_wide(K_MAX)) {
    if (row_stride >= kWideStride)
      return launch<T, K_MAX, true>(logits, row_stride, row_starts, row_ends, rows, top_k, out, out_stride, status,
                                    stream);
  }
  return launch<T, K_MAX, false>(logits, row_stride, row_starts, row_ends, rows, top_k, out, out_stride, status,
                                 stream);
}

// The launch of the first class from the I-th of kClasses on whose k_max is at least top_k (the last
// class takes every larger top_k).
template <typename T, size_t I = 0>
int launch_for_k(const void* logits, long long row_stride, const int* row_starts, const int* row_ends, int rows,
                 int top_k, int* out, long long out_stride, LrStatus* status, cudaStream_t stream) {
  constexpr int kMax = cfg::kClasses[I].k_max;
  if constexpr (I + 1 < std::size(cfg::kClasses)) {
    if (top_k > kMax)
      return launch_for_k<T, I + 1>(logits, row_stride, row_starts, row_ends, rows, top_k, out, out_stride, status,
                                    stream);
  }
  return launch_class<T, kMax>(logits, row_stride, row_starts, row_ends, rows, top_k, out, out_stride, status,
                               stream);
}

// Candidate buffers live in shared memory: the last class's k_max is the most a launch selects.
constexpr int kMaxTopK = cfg::kClasses[std::size(cfg::kClasses) - 1].k_max;

}  // namespace

LR_EXPORT long long lr_deepselect_workspace_bytes(int rows, int, int, int) {
  return sizeof(LrStatus) + lr::work_bytes(rows);
}

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
