// split: a radix select whose rows are split over many blocks, the bundled decode path.
//
// Decode hands the top-k a few rows (batch x next_n) of a very wide matrix (max_model_len columns), each
// row valid only up to its own sequence length. One block per row leaves most of the GPU idle while one
// block walks 128K elements, so this kernel splits a row over many blocks, balanced by the work that is
// actually there rather than by the matrix width:
//
// - One launch of as many blocks as can be resident at once (a cooperative launch guarantees it). With
//   up to kSplitRows rows, every block first makes the same plan from the row bounds, read on the device
//   (so one captured graph stays valid when they change): the valid elements of all rows are cut into
//   items of about total / grid elements (at least kMinChunk, at most what the shared-memory key cache
//   holds), a row longer than that into several equal parts (at most the grid). With more rows, each row
//   is one item.
// - Blocks take items in order from a counter in the workspace, split rows' parts first (so that they
//   start together); a block that finished a short row takes the next item at once (its first one
//   before the plan, whose work hides the counter's round trip). A block loads its item's keys into
//   shared memory once (kLoadUnroll 16-byte loads in flight per thread; a whole row longer than the
//   cache, possible only when rows are many, re-reads the rest) and counts their coarse bins on the way:
//   sign, 5 exponent and 5 mantissa bits of magnitudes in [2^-16, 2^16), 32 bins per octave (magnitudes
//   outside fall into the outermost bins). The bin holding the k-th largest key (its bucket) then holds
//   a small fraction of the row on all but concentrated values.
// - A small bucket is listed where that ends the row's select: two sweeps over the cache count, then
//   write, every key above the bucket to the output and the bucket's keys to a list, then
//   - a whole row's list (at most kListed keys, in shared memory) is finished by the shared-memory select
//     of common.cuh, at once;
//   - a split row's, when the plan has more items than the grid has blocks, goes to the row's slot in the
//     workspace (at most kSlotPairs keys in the row) and is finished by the last part to leave while the
//     others take their next items (a wait would idle a block that has other work).
// - Otherwise (one wave of items, nothing else to do) a split row's parts resolve the bucket together,
//   like a large one.
// - A large bucket (x + 100, x * 1e-8, ties; magnitudes outside the window) is resolved 11 bits at a
//   time over the cache (a round per digit, stopping as soon as the threshold digit's bucket is taken
//   whole or holds one key value), then two sweeps emit the keys above it and the first of its keys
//   reached.
// - The parts of a split row add their histograms into the row's slot and wait for each other at the
//   slot's arrival counter (no grid-wide barrier: items of other rows go on), then all compute the same
//   threshold. One pair of atomics per item reserves its output slots and its share of the bucket.
// - The last part to leave a row zeroes its slot, and the block that takes the launch's last number from
//   the item counter (every block takes one past the plan's items) resets it, so the workspace is back to
//   zero after every launch and the next launch (or graph replay) needs no clearing.
// - Histograms are counted with a run-length combine per thread: rows concentrated in one bin (x + 100,
//   x * 1e-8, ties) cost one shared-memory atomic per run instead of one per element.
//
// Deadlock freedom: items are taken in order, split rows' parts come first, a row's parts are
// consecutive items and number at most the grid, and a block waits only for the other parts of its
// current row (whole rows never wait, nor does a row finished by its last part after the first round).
// The earliest split row still held by some block has all its parts taken (else every held item would
// be one of its parts, more than the grid), so all of them are on blocks that are running, and that row
// completes.
//
// The deterministic build (common.cuh, -DLR_DETERMINISTIC) changes where a choice among equal keys was
// made by the order atomics ran in. A listed bucket holds every key of the row tied at the k-th (a bucket
// is an interval of keys), so its finish is the select with the lowest-index ties. A bucket resolved to
// one key value with more keys than the row still needs (ties at the k-th value) is not taken by the
// emit but by an ordered sweep of the item's cached keys (a block scan per 2048 keys), in index order;
// a split row's parts, which hold consecutive ranges of it, first publish their counts of such keys in
// the slot and wait for each other once more, so that each takes its own after the earlier parts'. Then
// the block that finishes a row (a split row's last part to leave) sorts its top_k indices in shared
// memory (the key cache) and writes them back in index order, which bounds top_k by the cache
// (kCacheBytes / 4).
//
// Limit: the plan indexes items with 16 bits (PlanIndex); a launch whose plan could need more is
// refused on the host (kernels.py, from the rows, the columns and the cache). Alternatives measured and
// not kept: bench/RESULTS.md, "Kernel history". Entry points, workspace and status: see topk_api.h.
#include "common.cuh"
#include "split_config.h"
#include "topk_api.h"

// The constants: split_config.h. Its tunables can each be overridden at build time (-DLR_SPLIT_<NAME>=v)
// for the sweep of bench/deepselect_tune.py --family split.
namespace {

namespace cfg = split_config;

#ifdef LR_SPLIT_THREADS
constexpr int kThreads = LR_SPLIT_THREADS;
#else
constexpr int kThreads = cfg::kThreads;
#endif
#ifdef LR_SPLIT_BLOCKS
constexpr int kBlocksPerSm = LR_SPLIT_BLOCKS;
#else
constexpr int kBlocksPerSm = cfg::kBlocksPerSm;
#endif
#ifdef LR_SPLIT_CACHE_KB
constexpr int kCacheBytes = LR_SPLIT_CACHE_KB << 10;
#else
constexpr int kCacheBytes = cfg::kCacheBytes;
#endif
#ifdef LR_SPLIT_SHARE_DIV
constexpr int kShareDiv = LR_SPLIT_SHARE_DIV;
#else
constexpr int kShareDiv = cfg::kShareDiv;
#endif
#ifdef LR_SPLIT_UNROLL
constexpr int kLoadUnroll = LR_SPLIT_UNROLL;
#else
constexpr int kLoadUnroll = cfg::kLoadUnroll;
#endif
#ifdef LR_SPLIT_MIN_CHUNK
constexpr int kMinChunk = LR_SPLIT_MIN_CHUNK;
#else
constexpr int kMinChunk = cfg::kMinChunk;
#endif

using cfg::kBins, cfg::kListed, cfg::kSlotPairs, cfg::kSplitRows, cfg::kWindow;
constexpr int kMaxTopK = 1 << 20;      // output goes straight to global memory: no slot staging limit
constexpr int kSortedTopK = kCacheBytes / 4;  // the deterministic build's: a row's indices sorted in the cache
constexpr int kSlotHist = 4 * kBins;   // words of a slot's histograms: the coarse round and up to 3 digits
static_assert(2 * kListed <= kBins, "an item's listed keys and indices fit in its coarse histogram");
static_assert(2 * kSlotPairs <= kSlotHist - kBins, "a split row's listed pairs fit after its coarse histogram");
using PlanIndex = uint16_t;  // the plan's item indices (see Smem::first): at most 65535 items
static_assert(static_cast<PlanIndex>(cfg::kPlanItems + 1) == 0, "kPlanItems is the largest PlanIndex");

// ------------------------------------------------------------------------------------ the coarse bins
// The first digit of every key (see the header comment): a monotone map of the order-preserving 32-bit
// key, so the bins are ordered like the values and each bin is one interval of keys. It is computed from
// the key rather than by rounding to fp16 (native's first pass) so that the sweeps over cached keys need
// no value, and a bin's bounds are known exactly.
// 32 bins per octave of |x| from kWindow (split_config.h: 2^-16) on; smaller magnitudes share the
// innermost bin of their sign, those of 2^16 and more the outermost.
__device__ __forceinline__ uint32_t coarse_bin(uint32_t key) {
  const bool positive = key >> 31;
  const uint32_t magnitude = (positive ? key : ~key) & 0x7FFFFFFFu;  // the bits of |x|
  const uint32_t f = static_cast<uint32_t>(min(max(static_cast<int>(magnitude >> 18) - static_cast<int>(kWindow), 0),
                                               1023));
  return positive ? 1024u + f : 1023u - f;
}

// The keys of coarse bin `bin`: [lo, hi]. Interior bins fix the top 14 key bits; the outermost ones do not.
struct KeyRange {
  uint32_t lo, hi;
};

__device__ __forceinline__ KeyRange coarse_range(uint32_t bin) {
  const uint32_t f = bin >= 1024u ? bin - 1024u : 1023u - bin;
  const uint32_t lo = f == 0 ? 0u : (kWindow + f) << 18;
  const uint32_t hi = f == 1023 ? 0x7FFFFFFFu : ((kWindow + f + 1) << 18) - 1u;
  return bin >= 1024u ? KeyRange{0x80000000u | lo, 0x80000000u | hi} : KeyRange{~hi & 0x7FFFFFFFu, ~lo & 0x7FFFFFFFu};
}

// The keys of a dtype: fp32 values use the 32-bit order-preserving key, bf16 values its top 16 bits (all
// the information a bf16 carries), which halves both the cache and the digits to resolve. `kUnused` is
// how far a key is shifted up to its 32-bit form (the coarse bins' and the shared-memory select's).
template <typename T>
struct Keys;

template <>
struct Keys<float> {
  using Key = uint32_t;
  static constexpr int kUnused = 0;
  __device__ __forceinline__ static uint32_t key(float x) { return lr::f32_key(x); }
};

template <>
struct Keys<__nv_bfloat16> {
  using Key = uint16_t;
  static constexpr int kUnused = 16;
  __device__ __forceinline__ static uint32_t key(float x) { return lr::f32_key(x) >> 16; }
};

// The launch's item counter: items taken (each block takes one more than it holds: the last of those
// takes, number items + grid - 1, resets it for the next launch).
struct Work {
  uint32_t next;
  uint32_t reserved[63];
};
static_assert(sizeof(Work) == 256, "the item counter is 256 bytes");

// The state the parts of one split row share, zero between launches.
struct Slot {
  uint32_t hist[kSlotHist];  // the histograms of the whole row, round j at j * kBins
  uint32_t arrive;           // arrivals: parts per round passed, plus one per part leaving
  uint32_t count;            // keys above the bucket counted so far
  uint32_t ties;             // keys in it counted so far
  uint32_t reserved[61];
};

// Workspace: status header, item counter, one slot per row when rows may be split.
long long workspace_size(int rows) {
  const long long slots = rows <= kSplitRows ? rows : 0;
  return static_cast<long long>(sizeof(LrStatus) + sizeof(Work)) + slots * static_cast<long long>(sizeof(Slot));
}

// The arrivals of a split row's parts, at device scope: a release add after a block barrier publishes the
// whole block's earlier writes, an acquire load (or the acquire half of an acq_rel add) before one makes
// the other parts' visible to the block (the pattern of a grid barrier, lighter than two full fences).
__device__ __forceinline__ void add_release(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t add_acq_rel(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Per-thread run-length combine of histogram increments (see the header comment).
struct Run {
  uint32_t bin = 0, n = 0;
  __device__ __forceinline__ void add(uint32_t* hist, uint32_t b) {
    if (b != bin) {
      flush(hist);
      bin = b;
    }
    ++n;
  }
  __device__ __forceinline__ void flush(uint32_t* hist) {
    if (n) atomicAdd(&hist[bin], n);
    n = 0;
  }
};

// Block-wide exclusive prefix sum (and total) of one value per thread.
template <int THREADS, typename V>
__device__ V block_exclusive_sum(V v, V* warp_scratch, V& total) {
  const int lane = threadIdx.x % lr::kWarp, warp = threadIdx.x / lr::kWarp;
  const V incl = lr::warp_inclusive_sum(v, lane);
  if (lane == lr::kWarp - 1) warp_scratch[warp] = incl;
  __syncthreads();
  V before = 0, sum = 0;
  for (int w = 0; w < THREADS / lr::kWarp; ++w) {
    before += w < warp ? warp_scratch[w] : V(0);
    sum += warp_scratch[w];
  }
  __syncthreads();  // the scratch may be reused right away
  total = sum;
  return before + incl - v;
}

// ---------------------------------------------------------------------------------------- the select

template <typename T>
struct Split {
  using K = Keys<T>;
  using Key = typename K::Key;
  static constexpr int kCache = kCacheBytes / static_cast<int>(sizeof(Key));  // keys cached per item
  static constexpr int kPerVec = 16 / static_cast<int>(sizeof(Key));
  static_assert(2 * kSlotPairs * 4 <= kCacheBytes, "a split row's listed bucket fits the cache");

  struct Smem {
    uint32_t hist[kBins];  // also, while listing, the bucket: kListed keys, then their indices
    // The plan: split rows' parts come first, row r's are items first[r] .. first[r + 1] - 1 (equal
    // bounds for a whole row); whole rows follow, row r is item splits + whole[r] (whole[r + 1] is then
    // whole[r] + 1, equal for a split row). Items number at most rows + grid while the chunk is below
    // the cache's keys, else at most rows x ceil(longest row / kCache): launches where that could pass
    // 65535 items are refused on the host (16-bit indices keep 2 blocks per SM).
    PlanIndex first[kSplitRows + 1];
    PlanIndex whole[kSplitRows + 1];
    int splits;  // items that are parts of split rows
    unsigned long long scratch[kThreads / lr::kWarp];
    lr::ScanScratch<kThreads> scan;
    lr::SelectScratch<kThreads> sel;
    int items, next;  // items in the plan; the next one this block holds
    uint32_t count, ties;  // a whole row's keys above the bucket and in it, counted so far
    uint32_t local;        // this item's keys in the threshold bin of the last round
    uint32_t listed;       // this item's coarse bucket keys listed so far
    uint32_t base, tie_base;  // an item's first output slot for its keys above, its first bucket key's rank
    int last;              // this block is the last to leave its split row
  };

  // f(key, i) for the n keys of an item: the cached ones from shared memory (16 bytes at a time), the
  // rest from `src`.
  template <typename F>
  __device__ __forceinline__ static void for_each_key(const Key* cache, const T* src, int n, F&& f) {
    const int cached = min(n, kCache);
    const int nv = cached / kPerVec;
    const uint4* vec = reinterpret_cast<const uint4*>(cache);
    for (int v = threadIdx.x; v < nv; v += kThreads) {
      const uint4 w = vec[v];
      const Key* e = reinterpret_cast<const Key*>(&w);
#pragma unroll
      for (int j = 0; j < kPerVec; ++j) f(static_cast<uint32_t>(e[j]), v * kPerVec + j);
    }
    for (int i = nv * kPerVec + threadIdx.x; i < cached; i += kThreads) f(static_cast<uint32_t>(cache[i]), i);
    if (n > kCache)
      lr::for_each_in_row<kThreads>(src + kCache, n - kCache, [&](float x, int i) { f(K::key(x), kCache + i); });
  }

  // The keys an item sweeps, f(key, index in the row): its cache (and the rest of a whole row longer than
  // the cache).
  struct Sweep {
    const Key* cache;
    const T* src;
    int n, first;
    template <typename F>
    __device__ __forceinline__ void operator()(F&& f) const {
      for_each_key(cache, src, n, [&](uint32_t key, int i) { f(key, first + i); });
    }
  };

  // The plan (see the header comment), made by every block alike: s.items, s.splits, s.first, s.whole.
  __device__ static void plan(const int* row_starts, const int* row_ends, int rows, int top_k, Smem& s) {
    const int tid = threadIdx.x;
    if (rows > kSplitRows) {
      if (tid == 0) {
        s.items = rows;
        s.splits = 0;
      }
      __syncthreads();
      return;
    }
    constexpr int kPer = (kSplitRows + kThreads - 1) / kThreads;  // rows per thread, consecutive
    int len[kPer];
    unsigned long long mine = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int r = tid * kPer + j;
      len[j] = r < rows ? max(row_ends[r] - row_starts[r], 0) : 0;
      mine += len[j];
    }
    unsigned long long total = 0;
    block_exclusive_sum<kThreads>(mine, s.scratch, total);
    // Rows fewer than half the grid leave the rest of it for their parts: at most grid items in all.
    const long long grid = gridDim.x;
    const long long share = grid - rows > grid / kShareDiv ? grid - rows : grid / kShareDiv;
    long long chunk = (static_cast<long long>(total) + share - 1) / share;
    chunk = chunk < kMinChunk ? kMinChunk : chunk > kCache ? kCache : chunk;
    unsigned long long split_mine = 0, whole_mine = 0;
    int parts[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const long long p = tid * kPer + j >= rows                ? 0  // no such row: no item
                          : len[j] > top_k && len[j] > chunk ? (len[j] + chunk - 1) / chunk
                                                             : 1;
      parts[j] = static_cast<int>(p < grid ? p : grid);
      split_mine += parts[j] > 1 ? parts[j] : 0;
      whole_mine += parts[j] == 1;
    }
    // Split rows first: their parts then start together, in the first wave of blocks, instead of
    // waiting for each other behind whole rows taken in between.
    // One sum of both counts: split parts in the high word, whole rows (at most kSplitRows) in the low one.
    unsigned long long both = 0;
    const unsigned long long before = block_exclusive_sum<kThreads>(split_mine << 32 | whole_mine, s.scratch, both);
    const unsigned long long splits = both >> 32, wholes = both & 0xFFFFFFFFu;
    int at = static_cast<int>(before >> 32);
    int wat = static_cast<int>(before & 0xFFFFFFFFu);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int r = tid * kPer + j;
      if (r < rows) {
        s.first[r] = static_cast<PlanIndex>(at);
        s.whole[r] = static_cast<PlanIndex>(wat);
      }
      at += parts[j] > 1 ? parts[j] : 0;
      wat += parts[j] == 1;
    }
    if (tid == 0) {
      s.first[rows] = static_cast<PlanIndex>(splits);
      s.whole[rows] = static_cast<PlanIndex>(wholes);
      s.splits = static_cast<int>(splits);
      s.items = static_cast<int>(splits + wholes);
    }
    __syncthreads();
  }

  // Every part has added its round-j histogram to the slot: arrive and wait for the others.
  __device__ static void arrive_and_wait(Slot* slot, uint32_t target) {
    __syncthreads();
    if (threadIdx.x == 0) {
      add_release(&slot->arrive, 1u);
      while (load_acquire(&slot->arrive) < target) {
      }
    }
    __syncthreads();
  }

  // The two sweeps of an emit: every key above `hi` to the output (from the row's counter `count`), and
  // every key in [lo, hi] to bucket(key, index, rank), its rank among the row's bucket keys reached (from
  // `ties`). A first sweep counts this thread's keys of each kind, two independent atomics reserve the
  // item's share of each, and the second writes them where the block's prefix sum puts them. Claiming
  // slots per warp instead would be a round trip to global memory for every warp that takes a key. Ends
  // with a barrier.
  template <typename Bucket>
  __device__ static void emit(const Sweep& sweep, uint32_t lo, uint32_t hi, uint32_t* count, uint32_t* ties,
                              int* out_row, Smem& s, Bucket&& bucket) {
    uint32_t above = 0, at_least = 0;
    sweep([&](uint32_t key, int) {
      above += key > hi;
      at_least += key >= lo;
    });
    unsigned long long both = 0;  // above in the high word, in the bucket in the low one (at most n each)
    const unsigned long long before = block_exclusive_sum<kThreads>(
        static_cast<unsigned long long>(above) << 32 | (at_least - above), s.scratch, both);
    if (threadIdx.x == 0) {
      s.base = atomicAdd(count, static_cast<uint32_t>(both >> 32));
      s.tie_base = atomicAdd(ties, static_cast<uint32_t>(both));  // bucket keys the row's other parts had
    }
    __syncthreads();
    uint32_t at = s.base + static_cast<uint32_t>(before >> 32);  // this thread's next slot for a key above
    uint32_t rank = s.tie_base + static_cast<uint32_t>(before);  // its next bucket key's rank in the row
    sweep([&](uint32_t key, int i) {
      if (key > hi)
        out_row[at++] = i;
      else if (key >= lo)
        bucket(key, i, rank++);
    });
    __syncthreads();
  }

  // Finish a listed bucket: the `need` largest of its m keys (32-bit form, in shared memory, each key's
  // index PAIRS words after it) go to slots 0 .. need - 1 of `out`, in any order.
  template <int PAIRS>
  __device__ static void finish(const uint32_t* keys, uint32_t m, uint32_t need, int* out, Smem& s) {
    __syncthreads();  // the keys are in place
    const lr::SelectRule rule = lr::smem_select_rule<kThreads, 32 - K::kUnused>(
        keys, static_cast<int>(m), static_cast<int>(need), s.sel);
    if (threadIdx.x == 0) s.sel.emitted = 0;  // published by the apply's first barrier
    lr::smem_select_apply<kThreads>(
        keys, [&](int i) { return keys[PAIRS + i]; }, static_cast<int>(m), rule, s.sel,
        [&](int i) { out[lr::claim(&s.sel.emitted)] = static_cast<int>(keys[PAIRS + i]); });
  }

  // The deterministic build's last step of a row (header comment): its top_k indices, written by this
  // block or (a split row's) by all its parts, sorted in `buf` (shared memory) and written back.
  __device__ static void sort_row(int* out_row, int top_k, int* buf) {
    __syncthreads();  // this block's writes of the row are done
    for (int i = threadIdx.x; i < top_k; i += kThreads) buf[i] = __ldcg(out_row + i);
    lr::block_sort_ascending<kThreads>(buf, top_k);
    for (int i = threadIdx.x; i < top_k; i += kThreads) out_row[i] = buf[i];
  }

  // The deterministic build's choice among the keys equal to `key` (header comment): the lowest-index
  // `need` of an item's n keys key_at(i), i in [0, n), the item starting at `first` in the row, to
  // tail[0 .. need).
  template <typename KeyAt>
  __device__ static void take_lowest(int n, uint32_t key, uint32_t need, int first, int* tail, Smem& s,
                                     KeyAt&& key_at) {
    lr::ordered_take<kThreads, 4>(
        n, need, s.scan, [&](int i) { return key_at(i) == key; },
        [&](int i, uint32_t rank) { tail[rank] = first + i; });
  }

  // The threshold bin of this item's round-j histogram (s.hist, complete), over the whole row: a split
  // row's parts add theirs to the slot and wait for each other first. s.local gets this item's own keys
  // in that bin (published by the caller's next barrier).
  __device__ static lr::ThresholdBin threshold(int j, int bins, uint32_t need, Slot* slot, int parts, Smem& s) {
    constexpr int kMine = kBins / kThreads;
    uint32_t mine[kMine];
    if (slot != nullptr) {
      uint32_t* g = slot->hist + j * kBins;
#pragma unroll
      for (int q = 0; q < kMine; ++q) {
        const int b = threadIdx.x + q * kThreads;
        mine[q] = b < bins ? s.hist[b] : 0u;
        if (mine[q]) atomicAdd(&g[b], mine[q]);
      }
      arrive_and_wait(slot, static_cast<uint32_t>(parts * (j + 1)));
      for (int b = threadIdx.x; b < bins; b += kThreads) s.hist[b] = __ldcg(&g[b]);
      __syncthreads();
    }
    const lr::ThresholdBin t = lr::block_threshold_bin<kThreads, kBins>(s.hist, need, s.scan);
    if (slot == nullptr) {
      if (threadIdx.x == 0) s.local = t.count;
    } else {
#pragma unroll
      for (int q = 0; q < kMine; ++q)
        if (threadIdx.x + q * kThreads == t.bin) s.local = mine[q];
    }
    return t;
  }

  // One item: select the part of row `row`'s top_k that lies in its part `part` of `parts`.
  __device__ static void item(int row, int part, int parts, const T* __restrict__ logits, long long row_stride,
                              const int* __restrict__ row_starts, const int* __restrict__ row_ends, int top_k,
                              int* __restrict__ out, long long out_stride, Slot* slots, LrStatus* status,
                              Smem& s, Key* cache, LrWork* record) {
    const int tid = threadIdx.x;
    const int start = row_starts[row];
    const int len = row_ends[row] - start;
    int* out_row = out + row * out_stride;
    const T* row_in = logits + row * row_stride + start;
    if constexpr (lr::kWorkRecord) {
      if (tid == 0) lr::add_work(record + row, 0, 1);  // a part
    }
    if (len <= top_k) {
      lr::copy_short_row<kThreads, kLoadUnroll>(row_in, len, top_k, out_row, status);
      return;
    }
    // Equal parts, 16-element aligned within the row.
    const int each = ((len + parts - 1) / parts + 15) / 16 * 16;
    const int lo = part * each;
    const int n = max(min(each, len - lo), 0);
    const T* src = row_in + lo;
    const bool split = parts > 1;
    Slot* slot = split ? slots + row : nullptr;
    uint32_t* count = split ? &slot->count : &s.count;
    uint32_t* ties = split ? &slot->ties : &s.ties;
    if (tid == 0) s.count = s.ties = 0;  // published by the barriers below

    // Load (keeping keys in the cache) and count the coarse bins.
    lr::smem_fill<kThreads>(s.hist, kBins, 0u);
    __syncthreads();
    Run run;
    bool nan = false;
    lr::for_each_in_row<kThreads, kLoadUnroll>(src, n, [&](float x, int i) {
      nan |= x != x;
      const uint32_t key = K::key(x);
      if (i < kCache) cache[i] = static_cast<Key>(key);
      run.add(s.hist, coarse_bin(key << K::kUnused));
    });
    run.flush(s.hist);
    if (__syncthreads_or(nan) && tid == 0) lr::report_nan(status);

    // The bucket: the keys [b_lo, b_hi] that hold the row's k-th largest, `need` of them selected.
    lr::ThresholdBin t = threshold(0, kBins, static_cast<uint32_t>(top_k), slot, parts, s);
    const KeyRange range = coarse_range(static_cast<uint32_t>(t.bin));
    uint32_t b_lo = range.lo >> K::kUnused, b_hi = range.hi >> K::kUnused;
    uint32_t need = static_cast<uint32_t>(top_k) - t.above;
    int* tail = out_row + (static_cast<uint32_t>(top_k) - need);
    Sweep sweep{cache, src, n, lo};
    // How a small bucket is finished (see the header comment): listed, by this block or by a split row's
    // last part alone (when blocks have other items to take), or by all its parts together, digit by digit.
    const bool alone = split && s.items > static_cast<int>(gridDim.x);
    uint32_t* const list = alone ? slot->hist + kBins : nullptr;  // keys (32-bit form), then indices
    if (tid == 0) s.listed = 0;
    __syncthreads();  // s.local, s.listed
    const bool listed = need < t.count && (alone ? t.count <= kSlotPairs : !split && s.local <= kListed);
    if (listed) {
      // List the bucket's keys, emitting the keys above it.
      emit(sweep, b_lo, b_hi, count, alone ? ties : &s.listed, out_row, s, [&](uint32_t key, int i, uint32_t rank) {
        if (alone) {
          list[rank] = key << K::kUnused;
          list[kSlotPairs + rank] = static_cast<uint32_t>(i);
        } else {
          s.hist[rank] = key << K::kUnused;
          s.hist[kListed + rank] = static_cast<uint32_t>(i);
        }
      });
      if (!split) {
        if constexpr (lr::kWorkRecord) {
          if (tid == 0) lr::add_work(record + row, 1, 0, 1);
        }
        finish<kListed>(s.hist, t.count, need, tail, s);
        if constexpr (lr::kDeterministic) sort_row(out_row, top_k, reinterpret_cast<int*>(cache));
        return;
      }
    }
    int rounds = 1;
    // Resolve the bucket: its keys share every bit above `top`, the rest is resolved 11 bits a round.
    uint32_t in_bucket = listed && alone ? need : t.count;
    for (; need < in_bucket && b_lo != b_hi; ++rounds) {
      const int top = 32 - __clz(b_lo ^ b_hi);
      const int bits = min(11, top), shift = top - bits;
      lr::smem_fill<kThreads>(s.hist, kBins, 0u);
      __syncthreads();
      sweep([&](uint32_t key, int) {
        if (key - b_lo <= b_hi - b_lo) run.add(s.hist, (key >> shift) & ((1u << bits) - 1u));
      });
      run.flush(s.hist);
      __syncthreads();
      t = threshold(rounds, 1 << bits, need, slot, parts, s);
      const uint32_t prefix = (b_lo >> top << top) | static_cast<uint32_t>(t.bin) << shift;  // top < 32
      b_lo = max(b_lo, prefix);
      b_hi = min(b_hi, prefix | ((1u << shift) - 1u));
      need -= t.above;
      in_bucket = t.count;
    }
    if constexpr (lr::kWorkRecord) {
      if (tid == 0) lr::add_work(record + row, part == 0 ? rounds : 0, 0, listed);
    }
    // Emit: every key above the bucket to slots [0, top_k - need), the first `need` of its keys reached to
    // the slots after.
    tail = out_row + (static_cast<uint32_t>(top_k) - need);
    // Keys equal to the k-th with more of them than needed (b_lo == b_hi then): the deterministic build
    // takes them in index order below instead.
    const bool choose = lr::kDeterministic && need < in_bucket;
    if (!(listed && alone))
      emit(sweep, b_lo, b_hi, count, ties, out_row, s, [&](uint32_t, int i, uint32_t rank) {
        if (rank < need && !choose) tail[rank] = i;
      });
    if constexpr (lr::kDeterministic) {
      if (choose) {
        uint32_t before = 0;  // the keys equal to the k-th in the parts before this one
        if (split) {
          // Round 0's histogram words are free: every part read them before the last round.
          if (tid == 0) slot->hist[part] = s.local;  // this part's keys in the last round's bin: equal ones
          arrive_and_wait(slot, static_cast<uint32_t>(parts * (rounds + 1)));
          unsigned long long mine = 0, total = 0;
          for (int q = tid; q < part; q += kThreads) mine += __ldcg(&slot->hist[q]);
          block_exclusive_sum<kThreads>(mine, s.scratch, total);
          before = static_cast<uint32_t>(total);
        }
        if (before < need)
          take_lowest(n, b_lo, need - before, lo, tail + before, s,
                      [&](int i) { return i < kCache ? static_cast<uint32_t>(cache[i]) : K::key(lr::to_f32(src[i])); });
      }
    }
    if (!split) {
      if constexpr (lr::kDeterministic) sort_row(out_row, top_k, reinterpret_cast<int*>(cache));
      return;
    }
    // A part leaving: one arrival per round passed, one more for the deterministic build's tie counts.
    const int arrivals = rounds + 1 + (choose ? 1 : 0);
    if (tid == 0)  // the last part sees the other parts' list entries
      s.last = add_acq_rel(&slot->arrive, 1u) == static_cast<uint32_t>(parts * arrivals - 1);
    __syncthreads();
    if (!s.last) return;
    // Every other part has left: finish the row's list, if it has one, and clear the slot for the next
    // launch.
    if (listed && alone) {
      auto* keys = reinterpret_cast<uint32_t*>(cache);
      for (int j = tid; j < static_cast<int>(t.count); j += kThreads) {
        keys[j] = __ldcg(&list[j]);
        keys[kSlotPairs + j] = __ldcg(&list[kSlotPairs + j]);
      }
      finish<kSlotPairs>(keys, t.count, need, tail, s);
      lr::smem_fill<kThreads>(list + kSlotPairs, static_cast<int>(t.count), 0u);
    }
    if constexpr (lr::kDeterministic) sort_row(out_row, top_k, reinterpret_cast<int*>(cache));
    lr::smem_fill<kThreads>(slot->hist, rounds * kBins + (listed && alone ? static_cast<int>(t.count) : 0), 0u);
    if (tid == 0) slot->arrive = slot->count = slot->ties = 0;
  }
};

template <typename T>
__global__ __launch_bounds__(kThreads, kBlocksPerSm) void split_kernel(
    const T* __restrict__ logits, long long row_stride, const int* __restrict__ row_starts,
    const int* __restrict__ row_ends, int rows, int top_k, int* __restrict__ out, long long out_stride,
    Work* work, Slot* slots, LrStatus* status) {
  using S = Split<T>;
  __shared__ typename S::Smem s;
  extern __shared__ __align__(16) unsigned char cache_raw[];
  auto* cache = reinterpret_cast<typename S::Key*>(cache_raw);
  // The block's first item is taken before the plan, so that the counter's round trip overlaps it.
  if (threadIdx.x == 0) s.next = static_cast<int>(atomicAdd(&work->next, 1u));
  S::plan(row_starts, row_ends, rows, top_k, s);  // ends with a barrier: s.next is published
  const bool whole = rows > kSplitRows;
  LrWork* const record = reinterpret_cast<LrWork*>(slots + (whole ? 0 : rows));  // LR_WORK_RECORD builds only
  for (;;) {
    const int i = s.next;
    if (i >= s.items) {  // the last block to take resets the counter for the next launch
      if (threadIdx.x == 0 && i == s.items + static_cast<int>(gridDim.x) - 1) work->next = 0;
      break;
    }
    int row = i, part = 0, parts = 1;
    if (!whole) {  // the row whose items include i: the last r whose bound is at most i's place
      const bool split = i < s.splits;
      const PlanIndex* bound = split ? s.first : s.whole;
      const int at = split ? i : i - s.splits;
      int lo = 0, hi = rows;
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (bound[mid] <= at) lo = mid; else hi = mid;
      }
      row = lo;
      part = split ? at - bound[row] : 0;
      parts = split ? bound[row + 1] - bound[row] : 1;
    }
    S::item(row, part, parts, logits, row_stride, row_starts, row_ends, top_k, out, out_stride, slots, status, s,
            cache, record);
    __syncthreads();  // shared memory is reused by the next item
    if (threadIdx.x == 0) s.next = static_cast<int>(atomicAdd(&work->next, 1u));
    __syncthreads();
  }
}

// The grid: as many blocks as can be resident at once on the current device (what the cooperative
// launch requires), found once per device and dtype; 0 when the device cannot be queried.
template <typename T>
int grid_blocks() {
  return lr::per_device([](int device) {
    int sms = 0, per_sm = 0;
    if (!lr::allow_smem<split_kernel<T>>(kCacheBytes) ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, split_kernel<T>, kThreads, kCacheBytes) != cudaSuccess)
      return 0;
    return sms * per_sm;
  });
}

template <typename T>
int launch(const void* logits, long long row_stride, const int* row_starts, const int* row_ends, int rows, int top_k,
           int* out, long long out_stride, void* workspace, cudaStream_t stream) {
  const int grid = grid_blocks<T>();
  if (grid <= 0) return LR_ELAUNCH;
  auto* base = static_cast<unsigned char*>(workspace);
  auto* status = static_cast<LrStatus*>(workspace);
  auto* work = reinterpret_cast<Work*>(base + sizeof(LrStatus));
  auto* slots = reinterpret_cast<Slot*>(base + sizeof(LrStatus) + sizeof(Work));
  const T* typed = static_cast<const T*>(logits);
  void* args[] = {&typed, &row_stride, &row_starts, &row_ends, &rows, &top_k, &out, &out_stride,
                  &work, &slots, &status};
  const cudaError_t e = cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(split_kernel<T>), dim3(grid),
                                                    dim3(kThreads), args, kCacheBytes, stream);
  return e == cudaSuccess && cudaGetLastError() == cudaSuccess ? LR_OK : LR_ELAUNCH;
}

}  // namespace

LR_EXPORT long long lr_split_workspace_bytes(int rows, int, int, int) {
  return workspace_size(rows > 0 ? rows : 0) + lr::work_bytes(rows > 0 ? rows : 0);
}

LR_EXPORT int lr_split_max_top_k(int) { return lr::kDeterministic ? kSortedTopK : kMaxTopK; }

LR_EXPORT int lr_split_topk(const void* logits, int dtype, long long row_stride, const int* row_starts,
                            const int* row_ends, int rows, int top_k, int* out, long long out_stride, void* workspace,
                            long long workspace_bytes, cudaStream_t stream) {
  if (int err = lr_check_args(logits, dtype, row_stride, row_starts, row_ends, rows, top_k, lr_split_max_top_k(dtype),
                              out, out_stride, workspace, workspace_bytes))
    return err;
  if (rows == 0) return LR_OK;
  if (workspace_bytes < workspace_size(rows)) return LR_EWORKSPACE;
  return dtype == LR_F32 ? launch<float>(logits, row_stride, row_starts, row_ends, rows, top_k, out, out_stride,
                                         workspace, stream)
                         : launch<__nv_bfloat16>(logits, row_stride, row_starts, row_ends, rows, top_k, out,
                                                 out_stride, workspace, stream);
}
