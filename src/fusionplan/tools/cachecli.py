"""fusionplan-cache: see and clear fusionplan's caches.

    fusionplan-cache info              # where the caches are, their sizes, perf database entries
    fusionplan-cache clear             # everything: generated kernels, Triton's compiled kernels, perf database
    fusionplan-cache clear --perfdb    # only the perf database (tuning results)
    fusionplan-cache export FILE       # kernels, Triton's kernels, launch records, perf entries: one archive
    fusionplan-cache import FILE       # into this cache (same GPU architecture, Triton, fusionplan)

The cache directory is $FUSIONPLAN_CACHE_DIR, else $XDG_CACHE_HOME/fusionplan, else ~/.cache/fusionplan.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from fusionplan.core.errors import FusionPlanError
from fusionplan.runtime.cache_archive import export_cache, import_cache
from fusionplan.runtime.codegen import cache_dir
from fusionplan.runtime.perfdb import default_db


def _size(path: Path) -> tuple[int, int]:
    """(files, bytes) under ``path``."""
    if not path.exists():
        return 0, 0
    files = [p for p in path.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def info() -> str:
    root = cache_dir()
    lines = [f"cache directory: {root}"]
    for name, what in (
        ("kernels", "generated Triton sources"),
        ("triton", "Triton's compiled kernels"),
        ("launch", "launch records (where Triton's cache holds each kernel)"),
    ):
        files, nbytes = _size(root / name)
        lines.append(f"  {name}/: {what}: {files} files, {nbytes / 2**20:.1f} MiB")
    db = default_db()
    lines.append(f"  {db.path.name}: perf database: {db.count()} tuned configurations")
    return "\n".join(lines)


def clear(kernels: bool, perfdb: bool, triton: bool) -> list[str]:
    root = cache_dir()
    done = []
    if kernels and (root / "kernels").exists():
        shutil.rmtree(root / "kernels")
        done.append("generated kernels")
    if triton and (root / "triton").exists():
        shutil.rmtree(root / "triton")
        done.append("Triton's compiled kernels")
    if triton and (root / "launch").exists():  # they point into Triton's cache
        shutil.rmtree(root / "launch")
        done.append("launch records")
    if perfdb:
        default_db().clear()
        done.append("perf database")
    return done


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fusionplan-cache",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="show where the caches are and what they hold")
    clear_parser = sub.add_parser("clear", help="delete cached kernels and tuning results (all unless narrowed)")
    clear_parser.add_argument("--kernels", action="store_true", help="only the generated Triton sources")
    clear_parser.add_argument("--triton", action="store_true", help="only Triton's compiled kernels")
    clear_parser.add_argument("--perfdb", action="store_true", help="only the perf database")
    for name, what in (("export", "write the cache to an archive"), ("import", "add an exported archive to the cache")):
        sub.add_parser(name, help=what).add_argument("file", help="the archive (.tar.gz)")
    opts = parser.parse_args(argv)
    if opts.command == "info":
        print(info())
        return 0
    if opts.command in ("export", "import"):
        return _archive(opts.command, opts.file)
    narrowed = opts.kernels or opts.triton or opts.perfdb
    done = clear(opts.kernels or not narrowed, opts.perfdb or not narrowed, opts.triton or not narrowed)
    print("cleared: " + (", ".join(done) if done else "nothing (the caches were empty)"))
    return 0


def _archive(command: str, file: str) -> int:
    try:
        summary = (export_cache if command == "export" else import_cache)(file)
    except FusionPlanError as exc:
        print(f"fusionplan-cache: {exc}", file=sys.stderr)
        return 2
    m = summary.manifest
    done = "exported to" if command == "export" else "imported from"
    print(
        f"{done} {file}: {summary.files} files, {summary.perfdb_rows} perf database entries "
        f"(fusionplan {m['fusionplan']}, triton {m['triton']}, {m['architecture']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
