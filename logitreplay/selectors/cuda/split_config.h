// split's constants, the one copy: split.cu includes this file and the CPU model (cpu_models.py) reads
// it through kernel_config.py. Literals only, so that both read the same values without evaluating
// anything (split.cu checks the relations between them); bench/deepselect_tune.py --family split
// overrides the tunables at build time (split.cu's LR_SPLIT_* macros). bench/RESULTS.md has the
// measurements behind the defaults.
#pragma once

#include <cstdint>

namespace split_config {

// Tunables.
constexpr int kThreads = 512;
constexpr int kBlocksPerSm = 2;  // the register budget of __launch_bounds__
constexpr int kCacheBytes = 98304;  // 96 KiB of an item's keys in shared memory: the most that leaves 2 blocks per SM
constexpr int kShareDiv = 2;  // with rows over grid / this, the plan spreads elements over grid / this
constexpr int kLoadUnroll = 4;  // 16-byte loads in flight per thread while an item is loaded
constexpr int kMinChunk = 2048;  // the fewest keys in an item of a split row: fewer cost more in barriers

constexpr int kBins = 2048;       // 11-bit digits; shorter ones use the low bins
constexpr int kSplitRows = 1024;  // more rows than this fill the GPU whole: rows are not split
constexpr int kListed = 1024;     // an item's coarse bucket keys listed in its histogram's words: keys, then indices
constexpr int kSlotPairs = 3072;  // a split row's, in its slot's histogram words after the coarse histogram
constexpr int kPlanItems = 65535;  // the items the plan indexes: its indices are 16 bits (PlanIndex)
// The coarse bins' window: the (exponent, top 5 mantissa bits) of 2^-16, (127 - 16) << 5; 32 bins per
// octave of |x| in [2^-16, 2^16).
constexpr uint32_t kWindow = 3552;

}  // namespace split_config
