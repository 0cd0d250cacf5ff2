// deepselect's constants, the one copy: deepselect.cu includes this file and the CPU model
// (cpu_models.py) reads it through kernel_config.py. Literals only, so that both read the same values
// without evaluating anything; bench/deepselect_tune.py overrides some at build time (deepselect.cu's
// LR_DS_* macros, for every class at once).
#pragma once

#include <cstdint>

namespace deepselect_config {

// The configuration of one top_k class (one instantiation of the kernel):
//   k_max    the largest top_k it serves: a launch takes the first class whose k_max is at least its
//            top_k (the last class takes every larger one, up to its own k_max)
//   threads  threads per block (one block per row)
//   elems    elements per thread per round (16-byte loads of 4 fp32 or 8 bf16 elements)
//   b2       candidates appended since the last compaction that trigger the next one
//   blocks   blocks per multiprocessor the register budget is sized for (__launch_bounds__): close to
//            what the shared memory admits (about 34, 41, 64 and 128 KB for the four classes, 49 and
//            57 KB wide), since occupancy pays even at the price of a few spilled registers
struct Class { int k_max, threads, elems, b2, blocks; };

// Chosen per class from bench/deepselect_tune.py on an H200 (bench/RESULTS.md). 8 elements per thread:
// fewer elements per round to rank for the first threshold, less shared memory, so more blocks per SM.
constexpr Class kClasses[] = {
    {512, 256, 8, 1024, 5},
    {1024, 256, 8, 1024, 5},
    {2048, 256, 8, 2048, 3},
    {4096, 512, 8, 4096, 1},
};

// The wide variants, for rows of at least kWideStride elements (judged by the row stride, since the
// bounds stay on the device), where longer rounds pay. A class without one serves every row itself.
constexpr Class kWideClasses[] = {
    {512, 256, 16, 1024, 4},
    {1024, 256, 16, 1024, 3},
};
constexpr long long kWideStride = 16384;

// The re-bet of free rounds: rows of at least kRebetRounds rounds, after round rounds / kRebetDiv.
constexpr int kRebetRounds = 16;
constexpr int kRebetDiv = 8;

// keep_rank's margin: the rank mu + kRankSigmas * sqrt(mu) + kRankExtra, chosen on simulated rows of
// normal, tied, constant, sorted and trending values.
constexpr int kRankSigmas = 4;
constexpr int kRankExtra = 16;

// A prime above any segment count (fewer than 2^31 / 128): its residue modulo m is coprime with m.
constexpr uint32_t kPermPrime = 2654435761u;

// Key bits the first threshold resolves, and those the selects resolve (all that carry information):
// fp32 keys, and bf16 values keyed as their (exact) fp32 value, whose low 16 bits are zero.
constexpr int kFirstBitsF32 = 24;
constexpr int kFirstBitsBf16 = 16;
constexpr int kKeyBitsF32 = 32;
constexpr int kKeyBitsBf16 = 16;

}  // namespace deepselect_config
