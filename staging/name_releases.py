"""Name the releases of the adapters' packages in a folder that holds them without their metadata (the
trimmed packages `.peers` unpacks into /tmp/peers/site), so that bench/peers.py can tell an installed
release from a staged release of the same package (`catalog.columns`): for each adapter's package found
in DIR with no `*.dist-info` of its distribution, import it from DIR and write
`DIST-VERSION.dist-info/METADATA` with the version it reports (`__version__`). The same metadata is what
a report's `environment.peer_versions` reads, so a folder left unnamed records its package as not
installed although its columns ran. Run on the GPU host by bench/peers_gpu.sh (on /tmp/peers/site,
/tmp/peers/sglang and upstream DeepSelect's prebuilt folder), from the project root:

    python3 staging/name_releases.py /tmp/peers/site

Prints one line per package: named, already named, or why not (its import failed).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from logitreplay.selectors.upstream import catalog
from logitreplay.selectors.upstream.loading import dist_key, folder_versions


def name_releases(folder: Path) -> list[str]:
    sys.path.insert(0, str(folder))
    said: list[str] = []
    have = folder_versions(str(folder))
    for top, dist in dict.fromkeys((e.declared.release.source.top, e.declared.release.source.dist)
                                   for e in catalog.adapters().values()):
        if not (folder / top).is_dir():
            continue
        if dist_key(dist) in have:
            said.append(f"{dist}: {have[dist_key(dist)]} (named already)")
            continue
        try:
            version = str(importlib.import_module(top).__version__)
        except Exception as e:  # a package that does not import here is left as it is: its column says why
            said.append(f"{dist}: not named ({type(e).__name__} on import)")
            continue
        info = folder / f"{dist_key(dist)}-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        said.append(f"{dist}: {version}")
    return said


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: python3 staging/name_releases.py DIR (a folder holding the packages)")
    print("\n".join(name_releases(Path(sys.argv[1]))))
