"""fusionplan-cache export / import: a round trip carries every file and perf entry; an archive
for another architecture or version, a damaged one, or one naming a path outside the cache is
refused with the reason and leaves the cache as it was; four processes import at once."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

import fusionplan as fp
from fusionplan.core.caches import LruCache
from fusionplan.runtime import cache_archive, codegen
from fusionplan.runtime.codegen import interpreter_active
from fusionplan.runtime.perfdb import PerfDB
from fusionplan.tools.cachecli import main as cache_main

from .util import check_against_reference, poisoned, random_args, shape_plan


def _use_cache(monkeypatch, root: Path) -> Path:
    monkeypatch.setenv("FUSIONPLAN_CACHE_DIR", str(root))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(root / "triton"))
    return root


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def filled(tmp_path, monkeypatch):
    """A cache with generated kernels (a plan compiled through the interpreter where it is on),
    Triton files, a launch record and perf database entries; returns its directory."""
    root = _use_cache(monkeypatch, tmp_path / "source")
    # modules another test loaded are not written again: this cache gets its own files
    monkeypatch.setattr(codegen, "_modules", LruCache("kernel modules", None, process=False))
    if interpreter_active():
        monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")
        plan, _ = shape_plan("1x1", "CBA", torch.float32, "NHWC")
        plan.compile(fp.Handle())
        monkeypatch.delenv("FUSIONPLAN_BACKEND")
    for name, text in (
        ("triton/ab12/kernel.json", "{}"),
        ("triton/ab12/kernel.cubin", "\x7fELF"),
        ("launch/k.json", "{}"),
    ):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "triton" / "tmp.pid_1_2").mkdir()
    (root / "triton" / "tmp.pid_1_2" / "half-written.cubin").write_text("x")  # Triton still writing it
    db = PerfDB()
    db.put("triton-conv", ("sig", 1), "NVIDIA H200 sm_90", {"block_m": 64}, 0.5)
    db.put("find", ("sig", 2), "NVIDIA H200 sm_90", {"solver": "cudnn", "times": {"cudnn": 0.1}}, 0.1)
    return root


def test_round_trip_carries_every_file_and_entry(filled, tmp_path, monkeypatch):
    archive = tmp_path / "cache.tar.gz"
    exported = cache_archive.export_cache(archive)
    source_files = {k: v for k, v in _tree(filled).items() if not k.startswith(("perfdb", "triton/tmp."))}
    assert exported.files == len(source_files) and exported.perfdb_rows == 2
    if interpreter_active():
        assert any(name.startswith("kernels/") for name in source_files)
    source_rows = PerfDB().rows()

    target = _use_cache(monkeypatch, tmp_path / "target")
    imported = cache_archive.import_cache(archive)
    assert imported.files == exported.files and imported.perfdb_rows == 2
    assert {k: v for k, v in _tree(target).items() if not k.startswith("perfdb")} == source_files
    assert PerfDB().rows() == source_rows
    assert PerfDB().get("find", ("sig", 2), "NVIDIA H200 sm_90") == {"solver": "cudnn", "times": {"cudnn": 0.1}}
    again = cache_archive.import_cache(archive)  # importing twice changes nothing
    assert again.files == imported.files and len(PerfDB().rows()) == 2
    if interpreter_active():  # the imported kernels serve a plan
        monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")
        plan, x = shape_plan("1x1", "CBA", torch.float32, "NHWC")
        handle = fp.Handle()
        plan.compile(handle)
        check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, "NHWC"))


def _rewritten(archive: Path, out: Path, change) -> Path:
    """``archive`` with ``change(members)`` applied to its {name: bytes} members."""
    with tarfile.open(archive, "r:gz") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    change(members)
    with tarfile.open(out, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


def _manifest_with(**fields):
    def change(members):
        manifest = json.loads(members["manifest.json"])
        manifest.update(fields)
        members["manifest.json"] = json.dumps(manifest).encode()

    return change


def _flip_a_byte(members):
    name = next(n for n in members if n.startswith("triton/"))
    members[name] = members[name][:-1] + bytes([members[name][-1] ^ 1])


def _add_outside(members):
    members["../outside.txt"] = b"x"
    manifest = json.loads(members["manifest.json"])
    manifest["files"]["../outside.txt"] = cache_archive._sha256(b"x")
    members["manifest.json"] = json.dumps(manifest).encode()


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (_manifest_with(architecture="sm_80"), "made for architecture sm_80"),
        (_manifest_with(triton="2.0.0"), "made for triton 2.0.0"),
        (_manifest_with(fusionplan="0.0.1"), "made for fusionplan 0.0.1"),
        (_manifest_with(format=99), "not a fusionplan cache archive"),
        (_flip_a_byte, "does not match its checksum"),
        (_add_outside, "outside the cache's folders"),
        (lambda members: members.pop("manifest.json"), "no readable manifest"),
        (lambda members: members.pop("perfdb.json"), "differ from its manifest"),
    ],
    ids=["architecture", "triton", "fusionplan", "format", "damaged-file", "path-outside", "no-manifest", "missing"],
)
def test_a_mismatched_or_damaged_archive_is_refused_and_changes_nothing(filled, tmp_path, monkeypatch, change, words):
    archive = tmp_path / "cache.tar.gz"
    cache_archive.export_cache(archive)
    bad = _rewritten(archive, tmp_path / "bad.tar.gz", change)
    target = _use_cache(monkeypatch, tmp_path / "target")
    (target / "kernels").mkdir(parents=True)
    (target / "kernels" / "mine.py").write_text("# the user's")
    PerfDB().put("triton-conv", ("own",), "dev", {"k": 1})
    before, rows = _tree(target), PerfDB().rows()
    with pytest.raises(fp.BadParmError, match=words):
        cache_archive.import_cache(bad)
    assert _tree(target) == before and PerfDB().rows() == rows
    assert not (tmp_path / "outside.txt").exists()


@pytest.mark.parametrize("damage", ["truncated", "not-gzip", "missing"])
def test_an_unreadable_archive_is_a_clear_error(filled, tmp_path, monkeypatch, damage, capsys):
    archive = tmp_path / "cache.tar.gz"
    cache_archive.export_cache(archive)
    if damage == "truncated":
        archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    elif damage == "not-gzip":
        archive.write_text("not an archive")
    else:
        archive = tmp_path / "nowhere.tar.gz"
    target = _use_cache(monkeypatch, tmp_path / "target")
    with pytest.raises(fp.BadParmError, match="cannot be read"):
        cache_archive.import_cache(archive)
    assert not target.exists() or _tree(target) == {}
    assert cache_main(["import", str(archive)]) == 2
    assert "cannot be read" in capsys.readouterr().err


def test_the_command_exports_and_imports(filled, tmp_path, monkeypatch, capsys):
    archive = tmp_path / "out" / "cache.tar.gz"
    assert cache_main(["export", str(archive)]) == 0
    assert "exported to" in capsys.readouterr().out and archive.is_file()
    _use_cache(monkeypatch, tmp_path / "target")
    assert cache_main(["import", str(archive)]) == 0
    out = capsys.readouterr().out
    assert "imported from" in out and "2 perf database entries" in out


IMPORTER = """
import sys
from fusionplan.runtime import cache_archive
summary = cache_archive.import_cache(sys.argv[1])
print("ok", summary.files, summary.perfdb_rows)
"""


def test_four_processes_import_into_one_cache_at_once(filled, tmp_path, monkeypatch):
    archive = tmp_path / "cache.tar.gz"
    exported = cache_archive.export_cache(archive)
    target = _use_cache(monkeypatch, tmp_path / "target")
    env = {**os.environ, "FUSIONPLAN_CACHE_DIR": str(target), "TRITON_CACHE_DIR": str(target / "triton")}
    procs = [
        subprocess.Popen([sys.executable, "-c", IMPORTER, str(archive)], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs) and all(o.startswith("ok") for o in outs), outs
    files = {k for k in _tree(target) if not k.startswith("perfdb")}
    assert len(files) == exported.files and not any(".tmp" in f for f in files)
    assert len(PerfDB().rows()) == 2
