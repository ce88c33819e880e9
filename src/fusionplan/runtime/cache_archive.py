"""A cache a deployment can carry: the generated kernels, Triton's compiled kernels, the launch
records and the perf database's entries in one versioned archive (``fusionplan-cache export`` /
``import``).

The archive is a gzipped tar: ``manifest.json`` (the format, the fusionplan and Triton versions,
the GPU architecture, every file's SHA-256), ``perfdb.json`` (the perf database's rows) and the
files under ``kernels/``, ``launch/`` and ``triton/``. Import checks the whole archive first (its
manifest, its versions, its architecture, every member's name and checksum) and refuses it with
BadParmError naming what does not match, before anything in the cache changes; then it puts each
file in place atomically (a file of the same name is replaced by the same content: the names are
content hashes), so that several processes may import into one cache at once.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import torch

from fusionplan.core.errors import BadParmError
from fusionplan.core.version import __version__, triton_version
from fusionplan.runtime.codegen import cache_dir, triton_cache_dir
from fusionplan.runtime.perfdb import default_db

FORMAT = 1
#: the cache's folders an archive carries, by their names in the archive
FOLDERS = ("kernels", "launch", "triton")


@dataclass(frozen=True)
class ArchiveSummary:
    files: int
    perfdb_rows: int
    manifest: dict


def architecture() -> str:
    """The GPU architecture compiled kernels are for (sm_XY), or 'none' without a CUDA GPU."""
    if not torch.cuda.is_available():
        return "none"
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def _folder(name: str) -> Path:
    """Where the cache keeps a folder: Triton's cache where Triton has it (ours unless the user moved it)."""
    return triton_cache_dir() if name == "triton" else cache_dir() / name


def _in_progress(relative: Path) -> bool:
    """A file being written (ours end in .tmp, Triton's sit in tmp.* folders): not part of a cache."""
    return relative.name.endswith(".tmp") or any(part.startswith("tmp.") for part in relative.parts)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def export_cache(path: str | Path) -> ArchiveSummary:
    """Write the cache's kernels, launch records, Triton kernels and perf database to ``path``."""
    files: dict[str, bytes] = {}
    for name in FOLDERS:
        root = _folder(name)
        if root.is_dir():
            for f in sorted(p for p in root.rglob("*") if p.is_file() and not _in_progress(p.relative_to(root))):
                files[f"{name}/{f.relative_to(root).as_posix()}"] = f.read_bytes()
    rows = default_db().rows()
    files["perfdb.json"] = json.dumps(rows).encode()
    manifest = {
        "format": FORMAT,
        "fusionplan": __version__,
        "triton": triton_version(),
        "architecture": architecture(),
        "files": {member: _sha256(data) for member, data in files.items()},
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for member, data in [("manifest.json", json.dumps(manifest, indent=1).encode()), *files.items()]:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, path)
    return ArchiveSummary(len(files) - 1, len(rows), manifest)


def import_cache(path: str | Path) -> ArchiveSummary:
    """Put an exported archive's files and perf entries into this cache; BadParmError (and the
    cache unchanged) for an archive that is damaged or made for another architecture or version."""
    members, rows, manifest = _read_checked(Path(path))
    for member, data in members.items():
        if member == "perfdb.json":
            continue
        folder, rest = member.split("/", 1)
        target = _folder(folder) / rest
        if target.is_file() and target.read_bytes() == data:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_bytes_atomic(target, data)
    default_db().put_rows(rows)
    return ArchiveSummary(len(members) - 1, len(rows), manifest)


def _write_bytes_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_checked(path: Path) -> tuple[dict[str, bytes], list[list], dict]:
    """Every member of the archive, checked against its manifest and against this machine; the perf
    database's rows; the manifest."""
    try:
        with tarfile.open(path, "r:gz") as tar:
            members = {}
            for info in tar.getmembers():
                if not info.isfile():
                    raise BadParmError(f"cache archive {path}: {info.name!r} is not a plain file")
                extracted = tar.extractfile(info)
                members[info.name] = extracted.read() if extracted is not None else b""
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise BadParmError(f"cache archive {path} cannot be read: {type(exc).__name__}: {exc}") from exc
    try:
        manifest = json.loads(members.pop("manifest.json"))
    except (KeyError, ValueError) as exc:
        raise BadParmError(f"cache archive {path} has no readable manifest.json") from exc
    _check_manifest(path, manifest)
    listed = manifest["files"]
    if set(listed) != set(members):
        raise BadParmError(f"cache archive {path}: its files differ from its manifest's list")
    for member, data in members.items():
        _check_name(path, member)
        if _sha256(data) != listed[member]:
            raise BadParmError(f"cache archive {path}: {member} does not match its checksum (damaged)")
    try:
        rows = json.loads(members["perfdb.json"])
    except ValueError as exc:
        raise BadParmError(f"cache archive {path}: perfdb.json is not JSON") from exc
    if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == 8 for r in rows):
        raise BadParmError(f"cache archive {path}: perfdb.json is not a list of perf database rows")
    return members, rows, manifest


def _check_manifest(path: Path, manifest: object) -> None:
    listed = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(listed, dict) or manifest.get("format") != FORMAT:
        raise BadParmError(f"cache archive {path}: not a fusionplan cache archive of format {FORMAT}")
    here = {"fusionplan": __version__, "triton": triton_version(), "architecture": architecture()}
    for key, value in here.items():
        if manifest.get(key) != value:
            raise BadParmError(f"cache archive {path} was made for {key} {manifest.get(key)}; this machine has {value}")


def _check_name(path: Path, member: str) -> None:
    if member == "perfdb.json":
        return
    parts = PurePosixPath(member).parts
    if len(parts) < 2 or parts[0] not in FOLDERS or ".." in parts or PurePosixPath(member).is_absolute():
        raise BadParmError(f"cache archive {path}: member {member!r} is outside the cache's folders")


__all__ = ["ArchiveSummary", "architecture", "export_cache", "import_cache"]
