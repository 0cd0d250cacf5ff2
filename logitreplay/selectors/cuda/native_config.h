// native's constants, the one copy: native.cu includes this file and the CPU model (cpu_models.py)
// reads it through kernel_config.py. Literals only, so that both read the same values without
// evaluating anything.
#pragma once

namespace native_config {

constexpr int kThreads = 512;
constexpr int kBins = 2048;   // 11-bit passes; the last pass uses the low 1024
constexpr int kFinal = 2048;  // a threshold bin this small is finished in shared memory
// Upstream launches rows below this index with the insertion-sort finish, the rest with a radix sort.
constexpr long long kRankRows = 12288;
// Output slots live in dynamic shared memory (as upstream's): 4 bytes per slot, 64 KiB at most.
constexpr int kMaxTopK = 16384;

}  // namespace native_config
