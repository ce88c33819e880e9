"""The perf database: the best tuning configuration per (solver, plan signature, device, versions).

Like MIOpen's perf-db/find-db, it makes NORMAL find mode pay for its benchmarking once: the
winner is stored in a SQLite file under the cache directory (``fusionplan.runtime.codegen.cache_dir()``)
and later processes reuse it. Several processes may read and write it at once (SQLite's locking,
WAL journal, a busy timeout). A corrupted or unreadable file is logged, moved aside and rebuilt:
never a crash, never a wrong configuration (a stored configuration that fails validation is
ignored and replaced).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from fusionplan.core.version import __version__, triton_version
from fusionplan.runtime.codegen import cache_dir

logger = logging.getLogger("fusionplan")

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS perf (
    solver TEXT NOT NULL,
    signature TEXT NOT NULL,          -- sha256 of everything that changes the generated code
    device TEXT NOT NULL,             -- device name and compute capability
    versions TEXT NOT NULL,           -- fusionplan and Triton versions
    config TEXT NOT NULL,             -- JSON of the winning configuration
    time_ms REAL,
    described TEXT,                   -- the readable signature, for people
    created REAL NOT NULL,
    PRIMARY KEY (solver, signature, device, versions)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def signature_digest(signature: Any) -> str:
    """A stable digest of a plan signature (tuples of ints, strings, enums, bools)."""
    return hashlib.sha256(repr(signature).encode()).hexdigest()


def versions() -> str:
    return f"fusionplan {__version__}; triton {triton_version()}"


class PerfDB:
    """A SQLite file of tuning results; every method survives a damaged file by rebuilding it."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else cache_dir() / "perfdb.sqlite"
        self._lock = threading.Lock()
        self.generation = 0  # bumped by clear: what a reader keeps in memory from before is stale

    # -- connection and recovery ------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if row is None:
                conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif row[0] != str(SCHEMA_VERSION):
                raise sqlite3.DatabaseError(f"schema version {row[0]}, expected {SCHEMA_VERSION}")
            conn.execute("PRAGMA quick_check").fetchone()
        except BaseException:
            conn.close()
            raise
        return conn

    def _run(self, action):
        """Run ``action(connection)``; on a damaged database, move it aside, rebuild, retry once."""
        with self._lock:
            for attempt in (1, 2):
                try:
                    conn = self._connect()
                    try:
                        return action(conn)
                    finally:
                        conn.close()
                except sqlite3.OperationalError as exc:
                    if "locked" in str(exc) or "busy" in str(exc):
                        if attempt == 2:
                            logger.warning("perf database %s busy: %s; going on without it", self.path, exc)
                            return None
                        time.sleep(0.1)
                        continue
                    self._quarantine(exc)
                except sqlite3.DatabaseError as exc:
                    if attempt == 2:
                        logger.warning("perf database %s unusable: %s; going on without it", self.path, exc)
                        return None
                    self._quarantine(exc)
            return None

    def _quarantine(self, exc: Exception) -> None:
        stamp = f"{int(time.time())}-{os.getpid()}"
        logger.warning("perf database %s is damaged (%s); moving it aside and rebuilding", self.path, exc)
        for suffix in ("", "-wal", "-shm"):
            victim = Path(str(self.path) + suffix)
            if victim.exists():
                try:
                    os.replace(victim, Path(f"{victim}.corrupt-{stamp}"))
                except OSError:
                    victim.unlink(missing_ok=True)

    # -- the table ---------------------------------------------------------------------------------
    def get(self, solver: str, signature: Any, device: str) -> dict | None:
        """The stored configuration for this solver, signature, device and versions, or None."""
        key = (solver, signature_digest(signature), device, versions())

        def read(conn: sqlite3.Connection) -> dict | None:
            row = conn.execute(
                "SELECT config FROM perf WHERE solver=? AND signature=? AND device=? AND versions=?", key
            ).fetchone()
            if row is None:
                return None
            try:
                value = json.loads(row[0])
            except ValueError:
                logger.warning("perf database entry for %s is not JSON; ignoring it", solver)
                return None
            return value if isinstance(value, dict) else None

        return self._run(read)

    def put(self, solver: str, signature: Any, device: str, config: dict, time_ms: float | None = None) -> None:
        row = (
            solver,
            signature_digest(signature),
            device,
            versions(),
            json.dumps(config, sort_keys=True),
            time_ms,
            repr(signature)[:2000],
            time.time(),
        )
        self._run(lambda conn: conn.execute("INSERT OR REPLACE INTO perf VALUES (?,?,?,?,?,?,?,?)", row))

    def rows(self) -> list[list]:
        """Every entry as its eight columns (an exported cache carries them)."""
        found = self._run(lambda conn: conn.execute("SELECT * FROM perf ORDER BY created").fetchall())
        return [list(row) for row in found or []]

    def put_rows(self, rows: list[list]) -> None:
        """Entries as ``rows`` gives them (an imported cache's), in one transaction."""

        def insert(conn: sqlite3.Connection) -> None:
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany("INSERT OR REPLACE INTO perf VALUES (?,?,?,?,?,?,?,?)", [tuple(r) for r in rows])

        if rows:
            self._run(insert)

    def count(self) -> int:
        return self._run(lambda conn: conn.execute("SELECT COUNT(*) FROM perf").fetchone()[0]) or 0

    def clear(self) -> None:
        self._run(lambda conn: conn.execute("DELETE FROM perf"))
        self.generation += 1


_default: PerfDB | None = None
_default_lock = threading.Lock()


def default_db() -> PerfDB:
    """The process's perf database at the current cache directory."""
    global _default
    with _default_lock:
        path = cache_dir() / "perfdb.sqlite"
        if _default is None or _default.path != path:
            _default = PerfDB(path)
        return _default
