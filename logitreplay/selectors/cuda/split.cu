// split: a radix select whose rows are split over many blocks, the bundled decode path.
//
// Decode hands the top-k a few rows (batch x next_n) of a very wide matrix (max_model_len columns), each
// row valid only up to its own sequence length. One block per row (native, deepselect, vLLM's
// top_k_per_row_decode) then leaves most of the GPU idle while one block walks 128K elements; production
// decode kernels (vLLM's persistent_topk and cooperative_topk) split a row over many blocks. So does this
// family, balanced by the work that is actually there rather than by the matrix width:
//
// - One launch of as many blocks as can be resident at once (a cooperative launch guarantees it). With
//   up to kSplitRows rows, every block first makes the same plan from the row bounds, read on the device
//   (so one captured graph stays valid when they change): the valid elements of all rows are cut into
//   items of about total / grid elements (at least kMinChunk, at most what the shared-memory key cache
//   holds), a row longer than that into several equal parts. With more rows, each row is one item.
// - Blocks take items in order from a counter in the workspace, split rows' parts first (so that they
//   start together), so a block that finished a short row takes the next item at once. A block loads
//   its item's keys into shared memory once (with several 16-byte loads in flight per thread; a whole
//   row longer than the cache, possible only when rows are many, re-reads the rest), then resolves the
//   k-th largest key digit by digit (fp32 keys: 11, 11 and 10 bits; bf16: 11 and 5), stopping as soon
//   as the threshold digit's bucket is taken whole. The first digit's histogram is built while loading.
// - The parts of a split row add their histograms into the row's slot in the workspace and wait for
//   each other at the slot's arrival counter (no grid-wide barrier: items of other rows go on), then all
//   compute the same threshold. Two last sweeps count and then write every index above the threshold and
//   the first ties reached, with one pair of atomics per item reserving its output slots.
// - The last part to leave a row zeroes its slot, and the last block to leave the launch resets the item
//   counter, so the workspace is back to zero after every launch and the next launch (or graph replay)
//   needs no clearing.
// - Histograms are counted with a run-length combine per thread: rows concentrated in one bin (x + 100,
//   x * 1e-8, ties) cost one shared-memory atomic per run instead of one per element.
//
// Deadlock freedom: items are taken in order, split rows' parts come first, a row's parts are
// consecutive items and number at most the grid, and a block waits only for the other parts of its
// current row (whole rows never wait). The earliest split row still held by some block has all its
// parts taken (else every held item would be one of its parts, more than the grid), so all of them are on
// blocks that are running, and that row completes.
//
// Measured and not used (bench/FIDELITY.md, bench/RESULTS.md): finishing a split row's small threshold
// bucket in its last part after one round, so that parts wait once (up to 1.38x slower on 8-64 rows);
// blocks of 256 threads, 4 per multiprocessor (up to 1.30x slower on 1-64 rows) or of 1024, one per
// multiprocessor with a 192 KiB cache (1.1-1.3x slower); items of up to 2-8 caches' worth of keys,
// re-reading the rest (up to 1.3x slower on 64-128 rows, at most 5% faster on 512); 8 loads in
// flight instead of 4 (no faster); when emitting, a warp vote per key (1.1x slower), one pass with
// shared-memory slot counters (up to 1.18x slower), or staging the item's slots in shared memory to
// store them coalesced (0.97-1.04x: the emit is bound by its passes over the cache, not by its stores).
//
// Entry points, workspace and status: see topk_api.h.
#include <atomic>

#include "common.cuh"
#include "topk_api.h"

// Tunables, each overridable at build time (-DLR_SPLIT_CACHE_KB=... etc.) for the sweep of
// bench/deepselect_tune.py --family split; bench/RESULTS.md has its measurements behind these values.
#ifndef LR_SPLIT_THREADS
#define LR_SPLIT_THREADS 512
#endif
#ifndef LR_SPLIT_BLOCKS
#define LR_SPLIT_BLOCKS 2  // per multiprocessor: the register budget of __launch_bounds__
#endif
#ifndef LR_SPLIT_CACHE_KB
#define LR_SPLIT_CACHE_KB 96  // an item's keys kept in shared memory: the most that leaves 2 blocks per SM
#endif
#ifndef LR_SPLIT_CHUNK_CACHES
#define LR_SPLIT_CHUNK_CACHES 1  // an item's keys, in caches: the rest of a longer item is re-read per round
#endif
#ifndef LR_SPLIT_SHARE_DIV
#define LR_SPLIT_SHARE_DIV 2  // with rows over grid / this, the plan spreads elements over grid / this
#endif
#ifndef LR_SPLIT_UNROLL
#define LR_SPLIT_UNROLL 4  // 16-byte loads in flight per thread while an item is loaded
#endif

namespace {

constexpr int kThreads = LR_SPLIT_THREADS;
constexpr int kBlocksPerSm = LR_SPLIT_BLOCKS;
constexpr int kBins = 2048;  // 11-bit digits; shorter ones use the low bins
constexpr int kCacheBytes = LR_SPLIT_CACHE_KB << 10;
constexpr int kChunkCaches = LR_SPLIT_CHUNK_CACHES;
constexpr int kShareDiv = LR_SPLIT_SHARE_DIV;
constexpr int kLoadUnroll = LR_SPLIT_UNROLL;
constexpr int kMinChunk = 4096;   // below this, splitting costs more in barriers than it saves
constexpr int kSplitRows = 1024;  // more rows than this fill the GPU whole: rows are not split
constexpr int kMaxTopK = 1 << 20;      // output goes straight to global memory: no slot staging limit
constexpr int kSlotHist = 5 * 1024;    // words of a slot's histograms: 2048 + 2048 + 1024 (fp32)

// The keys and digits of a dtype: fp32 values use the 32-bit order-preserving key, bf16 values its top
// 16 bits (all the information a bf16 carries), which halves both the cache and the digits to resolve.
template <typename T>
struct Keys;

template <>
struct Keys<float> {
  using Key = uint32_t;
  static constexpr int kRounds = 3;
  __device__ __forceinline__ static uint32_t key(float x) { return lr::f32_key(x); }
  __host__ __device__ static constexpr int shift(int j) { return j == 0 ? 21 : j == 1 ? 10 : 0; }
  __host__ __device__ static constexpr int bits(int j) { return j == 2 ? 10 : 11; }
};

template <>
struct Keys<__nv_bfloat16> {
  using Key = uint16_t;
  static constexpr int kRounds = 2;
  __device__ __forceinline__ static uint32_t key(float x) { return lr::f32_key(x) >> 16; }
  __host__ __device__ static constexpr int shift(int j) { return j == 0 ? 5 : 0; }
  __host__ __device__ static constexpr int bits(int j) { return j == 0 ? 11 : 5; }
};

// The launch's item counter: items taken, and blocks that have left.
struct Work {
  uint32_t next;
  uint32_t done;
  uint32_t reserved[62];
};
static_assert(sizeof(Work) == 256, "the item counter is 256 bytes");

// The state the parts of one split row share, zero between launches.
struct Slot {
  uint32_t hist[kSlotHist];  // the digit histograms of the whole row, round j at j * kBins
  uint32_t arrive;           // arrivals: parts per round passed, plus one per part leaving
  uint32_t count;            // keys above the threshold counted so far
  uint32_t ties;             // keys equal to it counted so far
  uint32_t reserved[61];
};

// Workspace: status header, item counter, one slot per row when rows may be split.
long long workspace_size(int rows) {
  const long long slots = rows <= kSplitRows ? rows : 0;
  return static_cast<long long>(sizeof(LrStatus) + sizeof(Work)) + slots * static_cast<long long>(sizeof(Slot));
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
  V incl = v;
#pragma unroll
  for (int d = 1; d < lr::kWarp; d <<= 1) {
    const V y = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += y;
  }
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

  struct Smem {
    uint32_t hist[kBins];
    // The plan: split rows' parts come first, row r's are items first[r] .. first[r + 1] - 1 (equal
    // bounds for a whole row); whole rows follow, row r is item splits + whole[r] (whole[r + 1] is then
    // whole[r] + 1, equal for a split row).
    int first[kSplitRows + 1];
    int whole[kSplitRows + 1];
    int splits;  // items that are parts of split rows
    unsigned long long scratch[kThreads / lr::kWarp];
    lr::ScanScratch<kThreads> scan;
    int items, item;  // items in the plan; the one this block holds
    uint32_t count, ties;  // a whole row's keys above the threshold and equal to it, counted so far
    uint32_t base, tie_base;  // an item's first output slot for its keys above, its first tie's rank
    int last;              // this block is the last to leave its split row
  };

  __device__ __forceinline__ static uint32_t digit(uint32_t key, int j) {
    return (key >> K::shift(j)) & ((1u << K::bits(j)) - 1u);
  }

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
    constexpr long long kMaxChunk = static_cast<long long>(kChunkCaches) * kCache;
    chunk = chunk < kMinChunk ? kMinChunk : chunk > kMaxChunk ? kMaxChunk : chunk;
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
    unsigned long long splits = 0, wholes = 0;
    int at = static_cast<int>(block_exclusive_sum<kThreads>(split_mine, s.scratch, splits));
    int wat = static_cast<int>(block_exclusive_sum<kThreads>(whole_mine, s.scratch, wholes));
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int r = tid * kPer + j;
      if (r < rows) {
        s.first[r] = at;
        s.whole[r] = wat;
      }
      at += parts[j] > 1 ? parts[j] : 0;
      wat += parts[j] == 1;
    }
    if (tid == 0) {
      s.first[rows] = static_cast<int>(splits);
      s.whole[rows] = static_cast<int>(wholes);
      s.splits = static_cast<int>(splits);
      s.items = static_cast<int>(splits + wholes);
    }
    __syncthreads();
  }

  // Every part has added its round-j histogram to the slot: arrive and wait for the others. One fence by
  // the arriving thread after the barrier covers the whole block's atomics (fences are cumulative).
  __device__ static void arrive_and_wait(Slot* slot, uint32_t target) {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(&slot->arrive, 1u);
      while (*reinterpret_cast<volatile uint32_t*>(&slot->arrive) < target) {
      }
      __threadfence();
    }
    __syncthreads();
  }

  // One item: select the part of row `row`'s top_k that lies in its part `part` of `parts`.
  __device__ static void item(int row, int part, int parts, const T* __restrict__ logits, long long row_stride,
                              const int* __restrict__ row_starts, const int* __restrict__ row_ends, int top_k,
                              int* __restrict__ out, long long out_stride, Slot* slots, LrStatus* status,
                              Smem& s, Key* cache) {
    const int tid = threadIdx.x;
    const int start = row_starts[row];
    const int len = row_ends[row] - start;
    int* out_row = out + row * out_stride;
    const T* row_in = logits + row * row_stride + start;
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

    // Load (keeping keys in the cache) and count the first digit.
    lr::smem_fill<kThreads>(s.hist, kBins, 0u);
    __syncthreads();
    Run run;
    bool nan = false;
    lr::for_each_in_row<kThreads, kLoadUnroll>(src, n, [&](float x, int i) {
      nan |= x != x;
      const uint32_t key = K::key(x);
      if (i < kCache) cache[i] = static_cast<Key>(key);
      run.add(s.hist, digit(key, 0));
    });
    run.flush(s.hist);
    if (__syncthreads_or(nan) && tid == 0) lr::report_nan(status);

    uint32_t mask = 0, prefix = 0, need = static_cast<uint32_t>(top_k);
    int rounds = 0;
    for (int j = 0; j < K::kRounds; ++j) {
      if (j > 0) {
        lr::smem_fill<kThreads>(s.hist, kBins, 0u);
        __syncthreads();
        for_each_key(cache, src, n, [&](uint32_t key, int) {
          if ((key & mask) == prefix) run.add(s.hist, digit(key, j));
        });
        run.flush(s.hist);
        __syncthreads();
      }
      if (split) {  // the whole row's histogram, from every part's
        uint32_t* g = slot->hist + j * kBins;
        for (int b = tid; b < (1 << K::bits(j)); b += kThreads)
          if (s.hist[b]) atomicAdd(&g[b], s.hist[b]);
        arrive_and_wait(slot, static_cast<uint32_t>(parts * (j + 1)));
        for (int b = tid; b < (1 << K::bits(j)); b += kThreads) s.hist[b] = __ldcg(&g[b]);
        __syncthreads();
      }
      const lr::ThresholdBin t = lr::block_threshold_bin<kThreads, kBins>(s.hist, need, s.scan);
      mask |= ((1u << K::bits(j)) - 1u) << K::shift(j);
      prefix |= static_cast<uint32_t>(t.bin) << K::shift(j);
      need -= t.above;
      rounds = j + 1;
      if (need == t.count) break;  // the whole bucket is selected
    }

    // Emit: every key above the threshold, and the first `need` equal to it (over all parts). The row's
    // keys above fill output slots [0, top_k - need), its ties taken the `need` after them. A first pass
    // counts this thread's keys above and equal, two independent atomics reserve the item's share of
    // each, and a second pass writes them where the block's prefix sum puts them. Claiming slots per warp
    // instead would be a round trip to global memory for every warp that takes a key. (Measured slower:
    // a warp vote per key, to make each store instruction write consecutive slots, 1.1x; one pass placing
    // keys by shared-memory counters, one atomic per warp, with the item's counts taken from its
    // histograms, up to 1.18x at k 2048.)
    uint32_t above = 0, equal = 0;
    for_each_key(cache, src, n, [&](uint32_t key, int) {
      const uint32_t m = key & mask;
      above += m > prefix;
      equal += m == prefix;
    });
    unsigned long long both = 0;  // above in the high word, equal in the low one (at most n each: no carry)
    const unsigned long long before = block_exclusive_sum<kThreads>(
        static_cast<unsigned long long>(above) << 32 | equal, s.scratch, both);
    if (tid == 0) {
      s.base = atomicAdd(count, static_cast<uint32_t>(both >> 32));
      s.tie_base = atomicAdd(ties, static_cast<uint32_t>(both));  // equal keys the row's other parts had
    }
    __syncthreads();
    uint32_t at = s.base + static_cast<uint32_t>(before >> 32);  // this thread's next slot for a key above
    uint32_t tie = s.tie_base + static_cast<uint32_t>(before);   // its next equal key's rank in the row
    int* const tie_out = out_row + (static_cast<uint32_t>(top_k) - need);
    for_each_key(cache, src, n, [&](uint32_t key, int i) {
      const uint32_t m = key & mask;
      if (m > prefix) {
        out_row[at++] = lo + i;
      } else if (m == prefix) {
        if (tie < need) tie_out[tie] = lo + i;
        ++tie;
      }
    });
    if (!split) return;
    __syncthreads();
    if (tid == 0) {
      __threadfence();
      s.last = atomicAdd(&slot->arrive, 1u) == static_cast<uint32_t>(parts * (rounds + 1) - 1);
    }
    __syncthreads();
    if (s.last) {  // every other part has left: clear the slot for the next launch
      lr::smem_fill<kThreads>(slot->hist, rounds * kBins < kSlotHist ? rounds * kBins : kSlotHist, 0u);
      if (tid == 0) slot->arrive = slot->count = slot->ties = 0;
    }
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
  S::plan(row_starts, row_ends, rows, top_k, s);
  const bool whole = rows > kSplitRows;
  for (;;) {
    if (threadIdx.x == 0) s.item = static_cast<int>(atomicAdd(&work->next, 1u));
    __syncthreads();
    const int i = s.item;
    if (i >= s.items) break;
    int row = i, part = 0, parts = 1;
    if (!whole) {  // the row whose items include i: the last r whose bound is at most i's place
      const bool split = i < s.splits;
      const int* bound = split ? s.first : s.whole;
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
            cache);
    __syncthreads();  // shared memory is reused by the next item
  }
  if (threadIdx.x == 0) {  // the last block out resets the counter for the next launch
    __threadfence();
    if (atomicAdd(&work->done, 1u) == gridDim.x - 1) {
      work->next = 0;
      work->done = 0;
    }
  }
}

// The grid: as many blocks as can be resident at once on the current device (what the cooperative
// launch requires), found once per device and dtype; 0 when the device cannot be queried.
template <typename T>
int grid_blocks() {
  static std::atomic<int> cached[64];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device >= 64) return 0;
  int blocks = cached[device].load();
  if (blocks > 0) return blocks;
  int sms = 0, per_sm = 0;
  if (!lr::allow_smem<split_kernel<T>>(kCacheBytes) ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, split_kernel<T>, kThreads, kCacheBytes) != cudaSuccess)
    return 0;
  blocks = sms * per_sm;
  cached[device].store(blocks);
  return blocks;
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

LR_EXPORT long long lr_split_workspace_bytes(int rows, int, int, int) { return workspace_size(rows > 0 ? rows : 0); }

LR_EXPORT int lr_split_max_top_k(int) { return kMaxTopK; }

LR_EXPORT int lr_split_topk(const void* logits, int dtype, long long row_stride, const int* row_starts,
                            const int* row_ends, int rows, int top_k, int* out, long long out_stride, void* workspace,
                            long long workspace_bytes, cudaStream_t stream) {
  if (int err = lr_check_args(logits, dtype, row_stride, row_starts, row_ends, rows, top_k, kMaxTopK, out, out_stride,
                              workspace, workspace_bytes))
    return err;
  if (rows == 0) return LR_OK;
  if (workspace_bytes < workspace_size(rows)) return LR_EWORKSPACE;
  return dtype == LR_F32 ? launch<float>(logits, row_stride, row_starts, row_ends, rows, top_k, out, out_stride,
                                         workspace, stream)
                         : launch<__nv_bfloat16>(logits, row_stride, row_starts, row_ends, rows, top_k, out,
                                                 out_stride, workspace, stream);
}
