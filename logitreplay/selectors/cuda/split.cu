// split: a radix select whose rows are split over many blocks, the bundled decode path.
//
// Decode hands the top-k a few rows (batch x next_n) of a very wide matrix (max_model_len columns), each
// row valid only up to its own sequence length. One block per row (native, deepselect, vLLM's
// top_k_per_row_decode) then leaves most of the GPU idle while one block walks 128K elements; production
// decode kernels (vLLM's persistent_topk and cooperative_topk) split a row over many blocks. So does this
// family, balanced by the work that is actually there rather than by the matrix width:
//
// - A one-block plan kernel reads the row bounds on the device (so one captured graph stays valid when
//   they change) and cuts the valid elements of all rows into items of `chunk` elements, chunk =
//   max(kMinChunk, total / grid): a row longer than the chunk becomes several items, a shorter one
//   stays whole. Rows that are split get a slot of shared state in the workspace (fewer than `grid` of
//   them by construction: each holds more than total / grid elements).
// - The select kernel runs a grid of co-resident blocks (a cooperative launch guarantees it), each
//   taking items grid apart. A block loads its item's keys into shared memory once (kCache keys; a
//   longer item, possible only when rows are many, re-reads the rest from global memory), then resolves
//   the k-th largest key digit by digit (fp32 keys: 11, 11 and 10 bits; bf16: 11 and 5), stopping as
//   soon as the threshold digit's bucket is taken whole. The first digit's histogram is built while
//   loading. The blocks of a split row add their histograms into the slot and wait for each other at a
//   per-row arrival counter (no grid-wide barrier: items of other rows go on), then all compute the same
//   threshold. A last sweep writes every index above the threshold and the first ties reached, claiming
//   output slots with one atomic per warp.
// - The last block to leave a split row zeroes its slot, so the workspace is back to zero after every
//   launch and the next launch (or graph replay) needs no clearing.
// - Histograms are counted with a run-length combine per thread: rows concentrated in one bin (x + 100,
//   x * 1e-8, ties) cost one shared-memory atomic per run instead of one per element.
//
// Deadlock freedom: items are numbered row by row, so a split row's items are consecutive and sit on
// distinct blocks; a block waits only for the other items of its current row, whose blocks are either on
// that row or still on an earlier item, and the earliest unfinished row always has all its blocks.
//
// Entry points, workspace and status: see topk_api.h. This family needs its whole workspace zeroed once
// (topk_api.h asks for the header only); every launch leaves it zeroed again.
#include <atomic>

#include "common.cuh"
#include "topk_api.h"

namespace {

constexpr int kThreads = 512;
constexpr int kBlocksPerSm = 2;        // the register budget of __launch_bounds__
constexpr int kBins = 2048;            // 11-bit digits; shorter ones use the low bins
constexpr int kCache = 16384;          // keys of an item kept in shared memory
constexpr int kMinChunk = 4096;        // below this, splitting costs more in barriers than it saves
constexpr int kPlanThreads = 1024;
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

// What the plan kernel leaves for the select kernel.
struct Plan {
  int items;
  int chunk;
  int reserved[62];  // keeps the item table 256-byte aligned
};
static_assert(sizeof(Plan) == 256, "the plan header is 256 bytes");

struct Item {
  int row;
  int part;   // which chunk of the row
  int parts;  // how many chunks the row has (1: the row is whole)
  int slot;   // the split row's shared state, -1 for a whole row
};

// The state the blocks of one split row share, zero between launches.
struct Slot {
  uint32_t hist[kSlotHist];  // the digit histograms of the whole row, round j at j * kBins
  uint32_t arrive;           // arrivals: parts per round passed, plus one per part leaving
  uint32_t count;            // output slots claimed
  uint32_t ties;             // equal keys taken
  uint32_t reserved[61];
};

struct Layout {
  long long items_at, slots_at, bytes;
};

// Workspace: status header, plan, item table (at most rows + grid items), slots (fewer than grid, and at
// most one per row).
Layout layout(int rows, int grid) {
  const long long items = static_cast<long long>(rows) + grid;
  const long long items_at = sizeof(LrStatus) + sizeof(Plan);
  const long long slots_at = (items_at + items * static_cast<long long>(sizeof(Item)) + 255) / 256 * 256;
  const long long slots = rows < grid ? rows : grid;
  return Layout{items_at, slots_at, slots_at + slots * static_cast<long long>(sizeof(Slot))};
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

// ------------------------------------------------------------------------------------------ the plan

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

__device__ __forceinline__ int row_len(const int* starts, const int* ends, int r) {
  const int len = ends[r] - starts[r];
  return len > 0 ? len : 0;
}

__global__ __launch_bounds__(kPlanThreads) void plan_kernel(const int* __restrict__ row_starts,
                                                            const int* __restrict__ row_ends, int rows, int top_k,
                                                            int grid, Plan* plan, Item* items) {
  __shared__ unsigned long long scratch[kPlanThreads / lr::kWarp];
  unsigned long long mine = 0;
  for (int r = threadIdx.x; r < rows; r += kPlanThreads) mine += row_len(row_starts, row_ends, r);
  unsigned long long total_len = 0;
  block_exclusive_sum<kPlanThreads>(mine, scratch, total_len);
  long long chunk = (static_cast<long long>(total_len) + grid - 1) / grid;
  chunk = (chunk + 15) / 16 * 16;
  if (chunk < kMinChunk) chunk = kMinChunk;
  // Item and slot counts are scanned together: parts in the high 32 bits, split rows in the low 32.
  unsigned long long carry = 0;
  for (int r0 = 0; r0 < rows; r0 += kPlanThreads) {
    const int r = r0 + static_cast<int>(threadIdx.x);
    int parts = 0;
    if (r < rows) {
      const int len = row_len(row_starts, row_ends, r);
      parts = len > top_k && len > chunk ? static_cast<int>((len + chunk - 1) / chunk) : 1;
    }
    const unsigned long long v = (static_cast<unsigned long long>(parts) << 32) | (parts > 1 ? 1u : 0u);
    unsigned long long tile = 0;
    const unsigned long long at = carry + block_exclusive_sum<kPlanThreads>(v, scratch, tile);
    const int first = static_cast<int>(at >> 32), slot = static_cast<int>(at & 0xffffffffu);
    for (int p = 0; p < parts; ++p) items[first + p] = Item{r, p, parts, parts > 1 ? slot : -1};
    carry += tile;
  }
  if (threadIdx.x == 0) *plan = Plan{static_cast<int>(carry >> 32), static_cast<int>(chunk), {}};
}

// ---------------------------------------------------------------------------------------- the select

template <typename T>
struct Split {
  using K = Keys<T>;
  using Key = typename K::Key;
  static constexpr int kSmemCache = kCache * static_cast<int>(sizeof(Key));

  struct Smem {
    uint32_t hist[kBins];
    lr::ScanScratch<kThreads> scan;
    uint32_t count, ties;  // a whole row's output slots and ties taken
    int last;              // this block is the last to leave its split row
  };

  __device__ __forceinline__ static uint32_t digit(uint32_t key, int j) {
    return (key >> K::shift(j)) & ((1u << K::bits(j)) - 1u);
  }

  // f(key, i) for the n keys of an item: the cached ones from shared memory, the rest from `src`.
  template <typename F>
  __device__ __forceinline__ static void for_each_key(const Key* cache, const T* src, int n, F&& f) {
    const int cached = min(n, kCache);
    for (int i = threadIdx.x; i < cached; i += kThreads) f(static_cast<uint32_t>(cache[i]), i);
    if (n > kCache)
      lr::for_each_in_row<kThreads>(src + kCache, n - kCache, [&](float x, int i) { f(K::key(x), kCache + i); });
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

  // One item: select the part of the row's top_k that lies in this item's chunk.
  __device__ static void item(const Item it, int chunk, const T* __restrict__ logits, long long row_stride,
                              const int* __restrict__ row_starts, const int* __restrict__ row_ends, int top_k,
                              int* __restrict__ out, long long out_stride, Slot* slots, LrStatus* status,
                              Smem& s, Key* cache) {
    const int tid = threadIdx.x;
    const int start = row_starts[it.row];
    const int len = row_ends[it.row] - start;
    int* out_row = out + it.row * out_stride;
    const T* row = logits + it.row * row_stride + start;
    if (len <= top_k) {  // every valid index, then -1; still look for NaN
      const int n = max(len, 0);
      for (int i = tid; i < n; i += kThreads) out_row[i] = i;
      lr::write_tail<kThreads>(out_row, n, top_k);
      bool nan = false;
      lr::for_each_in_row<kThreads>(row, n, [&](float x, int) { nan |= x != x; });
      if (__syncthreads_or(nan) && tid == 0) lr::report_nan(status);
      return;
    }
    const int lo = it.part * chunk;
    const int n = min(chunk, len - lo);
    const T* src = row + lo;
    const bool split = it.parts > 1;
    Slot* slot = split ? slots + it.slot : nullptr;
    uint32_t* count = split ? &slot->count : &s.count;
    uint32_t* ties = split ? &slot->ties : &s.ties;
    if (tid == 0) s.count = s.ties = 0;  // published by the barriers below

    // Load (keeping keys in the cache) and count the first digit.
    lr::smem_fill<kThreads>(s.hist, kBins, 0u);
    __syncthreads();
    Run run;
    bool nan = false;
    lr::for_each_in_row<kThreads>(src, n, [&](float x, int i) {
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
        arrive_and_wait(slot, static_cast<uint32_t>(it.parts * (j + 1)));
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
    __threadfence();
    __syncthreads();
    if (!split) return;
    if (tid == 0) s.last = atomicAdd(&slot->arrive, 1u) == static_cast<uint32_t>(it.parts * (rounds + 1) - 1);
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
    const int* __restrict__ row_ends, int top_k, int* __restrict__ out, long long out_stride,
    const Plan* plan, const Item* items, Slot* slots, LrStatus* status) {
  using S = Split<T>;
  __shared__ typename S::Smem s;
  extern __shared__ __align__(16) unsigned char cache_raw[];
  auto* cache = reinterpret_cast<typename S::Key*>(cache_raw);
  const int n_items = plan->items, chunk = plan->chunk;
  for (int i = blockIdx.x; i < n_items; i += gridDim.x) {
    S::item(items[i], chunk, logits, row_stride, row_starts, row_ends, top_k, out, out_stride, slots, status, s,
            cache);
    __syncthreads();  // shared memory is reused by the next item
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
  if (cudaFuncSetAttribute(split_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, Split<T>::kSmemCache) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, split_kernel<T>, kThreads, Split<T>::kSmemCache) !=
          cudaSuccess)
    return 0;
  blocks = sms * per_sm;
  cached[device].store(blocks);
  return blocks;
}

int grid_for(int dtype) { return dtype == LR_F32 ? grid_blocks<float>() : grid_blocks<__nv_bfloat16>(); }

template <typename T>
int launch(const void* logits, long long row_stride, const int* row_starts, const int* row_ends, int rows, int top_k,
           int* out, long long out_stride, void* workspace, int grid, cudaStream_t stream) {
  const Layout l = layout(rows, grid);
  auto* base = static_cast<unsigned char*>(workspace);
  auto* status = static_cast<LrStatus*>(workspace);
  auto* plan = reinterpret_cast<Plan*>(base + sizeof(LrStatus));
  auto* items = reinterpret_cast<Item*>(base + l.items_at);
  auto* slots = reinterpret_cast<Slot*>(base + l.slots_at);
  plan_kernel<<<1, kPlanThreads, 0, stream>>>(row_starts, row_ends, rows, top_k, grid, plan, items);
  if (cudaGetLastError() != cudaSuccess) return LR_ELAUNCH;
  const T* typed = static_cast<const T*>(logits);
  void* args[] = {&typed, &row_stride, &row_starts, &row_ends, &top_k, &out, &out_stride,
                  &plan, &items, &slots, &status};
  const cudaError_t e = cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(split_kernel<T>), dim3(grid),
                                                    dim3(kThreads), args, Split<T>::kSmemCache, stream);
  return e == cudaSuccess && cudaGetLastError() == cudaSuccess ? LR_OK : LR_ELAUNCH;
}

}  // namespace

LR_EXPORT long long lr_split_workspace_bytes(int rows, int, int, int dtype) {
  const int grid = grid_for(dtype);
  return grid > 0 && rows >= 0 ? layout(rows, grid).bytes : static_cast<long long>(sizeof(LrStatus));
}

LR_EXPORT int lr_split_max_top_k(int) { return kMaxTopK; }

LR_EXPORT int lr_split_topk(const void* logits, int dtype, long long row_stride, const int* row_starts,
                            const int* row_ends, int rows, int top_k, int* out, long long out_stride, void* workspace,
                            long long workspace_bytes, cudaStream_t stream) {
  if (int err = lr_check_args(logits, dtype, row_stride, row_starts, row_ends, rows, top_k, kMaxTopK, out, out_stride,
                              workspace, workspace_bytes))
    return err;
  if (rows == 0) return LR_OK;
  const int grid = grid_for(dtype);
  if (grid <= 0) return LR_ELAUNCH;
  if (workspace_bytes < layout(rows, grid).bytes) return LR_EWORKSPACE;
  return dtype == LR_F32 ? launch<float>(logits, row_stride, row_starts, row_ends, rows, top_k, out, out_stride,
                                         workspace, grid, stream)
                         : launch<__nv_bfloat16>(logits, row_stride, row_starts, row_ends, rows, top_k, out,
                                                 out_stride, workspace, grid, stream);
}
