"""The SASS instructions at given offsets of the compiled kernels whose source file a report names
(compute-sanitizer's "at KERNEL+0xOFFSET in FILE:LINE"), read from Triton's kernel cache.

    python bench/probes/sass_at.py REPORT TRITON_CACHE_DIR [CONTEXT]
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

HIT = re.compile(r"at (\w+)\+0x([0-9a-f]+) in (fusionplan_gen_\w+\.py):(\d+)")


def cuobjdump() -> str:
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.exists() else "cuobjdump"


def cubins_of(source_name: str, cache: Path) -> list[Path]:
    """The cubins compiled from the generated file ``source_name`` (its name is in the PTX's file table)."""
    return [ptx.with_suffix(".cubin") for ptx in cache.rglob("*.ptx") if source_name in ptx.read_text(errors="ignore")]


def main(report: str, cache: str, context: int = 6) -> None:
    hits: dict[str, set[int]] = {}
    for _kernel, offset, name, _line in HIT.findall(Path(report).read_text(errors="ignore")):
        hits.setdefault(name, set()).add(int(offset, 16))
    for name, offsets in sorted(hits.items()):
        for cubin in cubins_of(name, Path(cache)):
            sass = subprocess.run([cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True).stdout
            lines = sass.splitlines()
            print(f"== {name} ({cubin.parent.name}): offsets {[hex(o) for o in sorted(offsets)]}")
            for offset in sorted(offsets):
                at = next((i for i, line in enumerate(lines) if f"/*{offset:04x}*/" in line), None)
                if at is None:
                    print(f"  {offset:#x}: not found")
                    continue
                print(f"  -- {offset:#x}")
                print("\n".join(lines[max(0, at - context) : at + context + 1]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:4]))
