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
// - Blocks take items in order from a counter in the workspace, so a block that finished a short row
//   takes the next item at once. A block loads its item's keys into shared memory once (with several
//   16-byte loads in flight per thread; a whole row longer than the cache, possible only when rows are
//   many, re-reads the rest), then resolves the k-th largest key digit by digit (fp32 keys: 11, 11 and
//   10 bits; bf16: 11 and 5), stopping as soon as the threshold digit's bucket is taken whole. The first
//   digit's histogram is built while loading.
// - The parts of a split row add their histograms into the row's slot in the workspace and wait for
//   each other at the slot's arrival counter (no grid-wide barrier: items of other rows go on), then all
//   compute the same threshold. A last sweep writes every index above the threshold and the first ties
//   reached, claiming output slots with one atomic per warp.
// - The last part to leave a row zeroes its slot, and the last block to leave the launch resets the item
//   counter, so the workspace is back to zero after every launch and the next launch (or graph replay)
//   needs no clearing.
// - Histograms are counted with a run-length combine per thread: rows concentrated in one bin (x + 100,
//   x * 1e-8, ties) cost one shared-memory atomic per run instead of one per element.
//
// Deadlock freedom: items are taken in order, a row's parts are consecutive items and number at most the
// grid, and a block waits only for the other parts of its current row. The earliest row still held by
// some block has all its parts taken (else every held item would be one of its parts, more than the
// grid), so all of them are on blocks that are running, and that row completes.
//
// Measured and not used (bench/FIDELITY.md): finishing a split row's small threshold bucket in its last
// part after one round, so that parts wait once (the finishing select then runs after every part has
// left: up to 1.38x slower on 8-64 rows), and blocks of 256 threads, 4 per multiprocessor (up to 1.30x
// slower on 1-64 rows, no faster above).
//
// Entry points, workspace and status: see topk_api.h.
#include <atomic>

#include "common.cuh"
#include "topk_api.h"

namespace {

constexpr int kThreads = 512;
constexpr int kBlocksPerSm = 2;        // the register budget of __launch_bounds__
constexpr int kBins = 2048;            // 11-bit digits; shorter ones use the low bins
constexpr int kCacheBytes = 64 << 10;  // an item's keys kept in shared memory
constexpr int kMinChunk = 4096;        // below this, splitting costs more in barriers than it saves
constexpr int kSplitRows = 1024;       // more rows than this fill the GPU whole: rows are not split
constexpr int kLoadUnroll = 4;         // 16-byte loads in flight per thread while an item is loaded
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
  uint32_t count;            // output slots claimed
  uint32_t ties;             // equal keys taken
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
    int first[kSplitRows + 1];  // the plan: row r's parts are items first[r] .. first[r + 1] - 1
    unsigned long long scratch[kThreads / lr::kWarp];
    lr::ScanScratch<kThreads> scan;
    int items, chunk, item;
    uint32_t count, ties;  // a whole row's output slots and ties taken
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

  // The plan (see the header comment), made by every block alike: s.items, s.chunk and s.first.
  __device__ static void plan(const int* row_starts, const int* row_ends, int rows, int top_k, Smem& s) {
    const int tid = threadIdx.x;
    if (rows > kSplitRows) {
      if (tid == 0) s.items = rows;
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
    const long long share = grid - rows > grid / 2 ? grid - rows : grid / 2;
    long long chunk = (static_cast<long long>(total) + share - 1) / share;
    chunk = chunk < kMinChunk ? kMinChunk : chunk > kCache ? kCache : chunk;
    unsigned long long parts_mine = 0;
    int parts[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const long long p = tid * kPer + j >= rows                ? 0  // no such row: no item
                          : len[j] > top_k && len[j] > chunk ? (len[j] + chunk - 1) / chunk
                                                             : 1;
      parts[j] = static_cast<int>(p < grid ? p : grid);
      parts_mine += parts[j];
    }
    unsigned long long items = 0;
    int at = static_cast<int>(block_exclusive_sum<kThreads>(parts_mine, s.scratch, items));
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int r = tid * kPer + j;
      if (r < rows) s.first[r] = at;
      at += parts[j];
    }
    if (tid == 0) {
      s.first[rows] = static_cast<int>(items);
      s.items = static_cast<int>(items);
    }
    __syncthreads();
  }

  // Every part has added its round-j histogram to the slot: arrive and wait for the others.
  __device__ static void arrive_and_wait(Slot* slot, uint32_t target) {
    __threadfence();  // this thread's histogram atomics are visible before the arrival
    __syncthreads();
    if (threadIdx.x == 0) {
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

    // Emit: every key above the threshold, and the first `need` equal to it (over all parts).
    for_each_key(cache, src, n, [&](uint32_t key, int i) {
      const uint32_t m = key & mask;
      const bool take = m > prefix || (m == prefix && lr::claim(ties) < need);
      if (take) out_row[lr::claim(count)] = lo + i;
    });
    if (!split) return;
    __threadfence();
    __syncthreads();
    if (tid == 0) s.last = atomicAdd(&slot->arrive, 1u) == static_cast<uint32_t>(parts * (rounds + 1) - 1);
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
    if (!whole) {  // the row whose items include i: the last r with first[r] <= i
      int lo = 0, hi = rows;
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (s.first[mid] <= i) lo = mid; else hi = mid;
      }
      row = lo;
      part = i - s.first[row];
      parts = s.first[row + 1] - s.first[row];
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
  // Above 48 KB a kernel must opt in; not a stream operation, so also safe while a graph is captured.
  if (cudaFuncSetAttribute(split_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, kCacheBytes) != cudaSuccess ||
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
