"""Which lossless codec the archive uses: Zstd level 1 vs Blosc lz4 + bitshuffle on control-suite values.

Run: python bench/codecs.py   (prints ratio and encode/decode throughput per codec and distribution)
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
from zarr.codecs import BloscCodec, ZstdCodec
from zarr.core.array_spec import ArrayConfig, ArraySpec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.buffer.cpu import Buffer
from zarr.core.dtype import Float32

from logitreplay.datasets import synth

CODECS = {
    "zstd-1": ZstdCodec(level=1),
    "blosc-lz4-bitshuffle": BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle", typesize=4),
}


def measure(codec, data: np.ndarray) -> tuple[float, float, float]:
    spec = ArraySpec(shape=data.shape, dtype=Float32(), fill_value=0, config=ArrayConfig.from_dict({}),
                     prototype=default_buffer_prototype())
    codec = codec.evolve_from_array_spec(spec)
    raw = Buffer.from_bytes(data.tobytes())
    t0 = time.perf_counter()
    enc = asyncio.run(codec._encode_single(raw, spec))
    t1 = time.perf_counter()
    asyncio.run(codec._decode_single(enc, spec))
    t2 = time.perf_counter()
    mb = data.nbytes / 1e6
    return data.nbytes / len(enc.to_bytes()), mb / (t1 - t0), mb / (t2 - t1)


def main() -> None:
    picks = {r.distribution: r for r in synth.recipes("stress", "full") if r.dtype == "float32"}
    picks["normal"] = synth.recipes("seed-controls", "full")[0]
    print(f"{'distribution':<14}{'codec':<24}{'ratio':>7}{'enc MB/s':>10}{'dec MB/s':>10}")
    for dist, recipe in sorted(picks.items()):
        values = synth.generate(recipe).values[: 1 << 22]  # one archive chunk
        for name, codec in CODECS.items():
            ratio, enc, dec = measure(codec, values)
            print(f"{dist:<14}{name:<24}{ratio:>7.3f}{enc:>10.0f}{dec:>10.0f}")


if __name__ == "__main__":
    main()
