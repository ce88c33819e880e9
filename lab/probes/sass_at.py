"""The SASS instructions at the offsets that a compute-sanitizer report names ("at KERNEL+0xOFFSET
in FILE:LINE"), read from the compiled kernels in Triton's cache.

    python lab/probes/sass_at.py REPORT TRITON_CACHE_DIR

A generated source file compiles to several cubins (one per specialization). The cubin a report
means is taken to be the one whose instructions at all the named offsets access shared memory;
the others are left out.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

HIT = re.compile(r"at (\w+)\+0x([0-9a-f]+) in (fusionplan_gen_\w+\.py):(\d+)")
SHARED_ACCESS = re.compile(r"\b(LDS|STS|LDSM|STSM|ATOMS|SYNCS)\b")


def cuobjdump() -> str:
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.exists() else "cuobjdump"


def cubins_by_source(cache: Path, names: set[str]) -> dict[str, list[Path]]:
    """The cubins compiled from each generated file of ``names`` (named in the PTX's file table)."""
    found: dict[str, list[Path]] = {name: [] for name in names}
    for ptx in cache.rglob("*.ptx"):
        text = ptx.read_text(errors="ignore")
        for name in names:
            if name in text:
                found[name].append(ptx.with_suffix(".cubin"))
    return found


def instructions_at(cubin: Path, offsets: set[int]) -> dict[int, str | None]:
    sass = subprocess.run([cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True).stdout
    found: dict[int, str | None] = dict.fromkeys(offsets)
    for match in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass):
        offset = int(match.group(1), 16)
        if offset in found:
            found[offset] = match.group(2).strip()
    return found


def main(report: str, cache: str) -> None:
    hits: dict[str, set[int]] = {}
    for _kernel, offset, name, _line in HIT.findall(Path(report).read_text(errors="ignore")):
        hits.setdefault(name, set()).add(int(offset, 16))
    for name, cubins in sorted(cubins_by_source(Path(cache), set(hits)).items()):
        shown = set()
        for cubin in cubins:
            found = instructions_at(cubin, hits[name])
            key = tuple(sorted(found.items()))
            if key in shown or not all(i and SHARED_ACCESS.search(i) for i in found.values()):
                continue
            shown.add(key)
            print(name)
            for offset, instruction in sorted(found.items()):
                print(f"    {offset:#x} {instruction}")
        if not shown:
            print(f"{name}: no cubin of {len(cubins)} has shared-memory accesses at {sorted(map(hex, hits[name]))}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
