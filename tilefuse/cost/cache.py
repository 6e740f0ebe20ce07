"""A persistent cache of measured kernel times, so a schedule is timed once per machine setup.

An entry is keyed by the schedule, the target and the versions of everything that shapes the
generated code or its speed (torch, Triton, tilefuse, Python, CUDA, the device): upgrading any of
them, or moving to another GPU, gives new keys, so stale times are never reused.  Each entry is one
small JSON file, ``<directory>/<key[:2]>/<key>.json``, written atomically, so concurrent processes
(several compiles, pytest-xdist) can share the cache without locks: a reader sees either a whole
entry or none.  The cache is an optimisation only: anything wrong with it (a corrupt file, a
read-only or missing directory) costs a re-measurement, never an exception.
"""
from __future__ import annotations

import contextlib
import copy
import datetime
import hashlib
import json
import math
import numbers
import os
import platform
import re
import tempfile
import warnings
from pathlib import Path
from typing import Mapping, Sequence

from ..paths import cache_root

# Keys become file names: letters, digits, '_' and '-' only, so no key can leave the directory.
_KEY = re.compile(r"[0-9A-Za-z_-]{2,128}")


def library_versions() -> dict[str, str]:
    """The versions a measured time depends on; part of every entry's key."""
    import torch
    import triton

    import tilefuse
    cuda = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "tilefuse": tilefuse.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda or "none",
        "device": torch.cuda.get_device_name() if cuda else "none",
    }


def entry_key(schedule_key: str, target: str, versions: Mapping[str, str]) -> str:
    """sha256 hex digest of the schedule, the target and the versions (in sorted order)."""
    payload = json.dumps([schedule_key, target, sorted((str(k), str(v)) for k, v in versions.items())])
    return hashlib.sha256(payload.encode()).hexdigest()


def _finite(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _valid_time(x) -> bool:
    return _finite(x) and x > 0


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(f"invalid tuning-cache key {key!r}: expected 2-128 letters, digits, '_' or '-'")


class TuningCache:
    """Measured kernel times (seconds) by key (see ``entry_key``), kept on disk across runs.

    If the directory cannot be used, this instance warns once and keeps entries in memory, so
    tuning still works, just without persistence.
    """

    def __init__(self, directory: str | Path | None = None):
        self.directory = Path(directory).expanduser() if directory is not None else cache_root() / "tuning"
        self._memory: dict[str, dict] | None = None  # set when the directory is unusable
        self._versions: dict[str, str] | None = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if not os.access(self.directory, os.W_OK | os.X_OK):
                raise PermissionError("not writable")
        except OSError as e:
            self._fall_back(e)

    def _fall_back(self, error: OSError) -> None:
        if self._memory is None:
            reason = getattr(error, "strerror", None) or str(error)
            warnings.warn(f"tilefuse tuning cache: cannot use directory {self.directory} ({reason}); "
                          "measured times are kept in memory for this run only", RuntimeWarning, stacklevel=3)
            self._memory = {}

    def path(self, key: str) -> Path:
        """The file holding the entry ``key``."""
        _check_key(key)
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> float | None:
        """The measured time in seconds, or None if there is no valid entry."""
        entry = self.get_entry(key)
        return None if entry is None else float(entry["seconds"])

    def get_entry(self, key: str) -> dict | None:
        """The whole entry (key, schedule, target, versions, seconds, samples, written_at), or None.

        A file that is not a valid entry for ``key`` is removed (best effort) and reported as absent,
        so the next ``put`` writes a good one in its place.
        """
        path = self.path(key)
        if self._memory is not None:
            entry = self._memory.get(key)
            return None if entry is None else copy.deepcopy(entry)
        try:
            with open(path, "rb") as f:
                ident = os.fstat(f.fileno())
                data = f.read()
        except OSError:  # absent or unreadable: a miss
            return None
        try:
            entry = json.loads(data.decode("utf-8"))
        except ValueError:  # invalid UTF-8 or JSON (UnicodeDecodeError is a ValueError)
            entry = None
        if _valid_entry(entry, key):
            return entry
        _remove_if_same(path, ident)
        return None

    def put(self, key: str, seconds: float, *, schedule: str = "", target: str = "",
            samples: Sequence[float] = ()) -> None:
        """Record ``seconds`` for ``key``, replacing any previous entry.

        The file is written under a temporary name in the same directory, synced, then renamed over
        the entry, so no reader (or crash) ever sees a partial file.
        """
        path = self.path(key)
        if not _valid_time(seconds):
            raise ValueError(f"measured time must be a finite number of seconds > 0, got {seconds!r}")
        samples = list(samples)
        if not all(_finite(s) for s in samples):
            raise ValueError(f"samples must be finite numbers of seconds, got {samples!r}")
        if self._versions is None:
            self._versions = library_versions()
        entry = {
            "key": key, "schedule": schedule, "target": target, "versions": dict(self._versions),
            "seconds": float(seconds), "samples": [float(s) for s in samples],
            "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        if self._memory is None:
            try:
                _write_atomically(path, json.dumps(entry, indent=1).encode("utf-8"))
                return
            except OSError as e:  # e.g. the directory was removed or the disk is full
                self._fall_back(e)
        self._memory[key] = entry


def _valid_entry(entry, key: str) -> bool:
    if not (isinstance(entry, dict) and entry.get("key") == key and _valid_time(entry.get("seconds"))):
        return False
    samples = entry.get("samples", [])
    return isinstance(samples, list) and all(_finite(s) for s in samples)


def _remove_if_same(path: Path, ident: os.stat_result) -> None:
    """Remove the bad file just read, unless a concurrent ``put`` has already replaced it."""
    with contextlib.suppress(OSError):
        now = os.stat(path)
        if (now.st_ino, now.st_dev) == (ident.st_ino, ident.st_dev):
            os.remove(path)


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
