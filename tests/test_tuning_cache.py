"""The persistent tuning cache: keys, file format, validation and healing, concurrency, fallbacks."""
import datetime
import json
import math
import multiprocessing
import os
import re
import shutil
import warnings

import pytest
import torch

import tilefuse
from tilefuse.cost.cache import TuningCache, entry_key, library_versions
from tilefuse.paths import cache_root

VERSIONS = {"torch": "2.13.0", "triton": "3.9.0", "tilefuse": "0.1.0", "python": "3.11.7",
            "cuda": "12.8", "device": "NVIDIA H200"}


def key(name: str = "sched", target: str = "h200") -> str:
    return entry_key(name, target, VERSIONS)


# --- versions and keys -------------------------------------------------------------------------

def test_library_versions_names_everything_a_time_depends_on():
    v = library_versions()
    assert set(v) == {"torch", "triton", "tilefuse", "python", "cuda", "device"}
    assert all(isinstance(x, str) and x for x in v.values())
    assert v["torch"] == torch.__version__ and v["tilefuse"] == tilefuse.__version__
    assert v == library_versions()
    if not torch.cuda.is_available():
        assert v["device"] == "none"


def test_entry_key_changes_with_schedule_target_and_versions():
    k = key()
    assert re.fullmatch(r"[0-9a-f]{64}", k)
    assert k == entry_key("sched", "h200", dict(reversed(list(VERSIONS.items()))))  # order-free
    others = {key("other"), key(target="h100"), entry_key("sched", "h200", {**VERSIONS, "triton": "3.6.0"}),
              entry_key("sched", "h200", {**VERSIONS, "device": "NVIDIA H100 80GB HBM3"}),
              entry_key("sched", "h200", {k: v for k, v in VERSIONS.items() if k != "cuda"})}
    assert k not in others and len(others) == 5


# --- round trip and file format ----------------------------------------------------------------

def test_put_get_round_trip_and_file_format(tmp_path):
    cache = TuningCache(tmp_path)
    k = key()
    assert cache.get(k) is None and cache.get_entry(k) is None
    cache.put(k, 1.25e-5, schedule="xblock=128", target="h200", samples=[1.3e-5, 1.25e-5, 1.2e-5])
    assert cache.get(k) == 1.25e-5
    path = tmp_path / k[:2] / f"{k}.json"
    assert cache.path(k) == path and path.is_file()
    on_disk = json.loads(path.read_text("utf-8"))
    assert on_disk == cache.get_entry(k)
    assert set(on_disk) == {"key", "schedule", "target", "versions", "seconds", "samples", "written_at"}
    assert on_disk["key"] == k and on_disk["schedule"] == "xblock=128" and on_disk["target"] == "h200"
    assert on_disk["samples"] == [1.3e-5, 1.25e-5, 1.2e-5]
    assert on_disk["versions"] == library_versions()
    assert datetime.datetime.fromisoformat(on_disk["written_at"]).tzinfo is not None
    # A new instance (another process, a later run) reads it back; a put replaces it.
    assert TuningCache(tmp_path).get(k) == 1.25e-5
    cache.put(k, 2e-5)
    assert TuningCache(tmp_path).get(k) == 2e-5
    assert cache.get(key("other")) is None


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -math.inf, 0, 0.0, -1e-3, True])
def test_put_rejects_times_that_are_not_positive_and_finite(tmp_path, seconds):
    cache = TuningCache(tmp_path)
    with pytest.raises(ValueError, match="finite number of seconds"):
        cache.put(key(), seconds)
    assert cache.get(key()) is None and list(tmp_path.rglob("*")) == []


def test_put_rejects_non_finite_samples(tmp_path):
    with pytest.raises(ValueError, match="samples"):
        TuningCache(tmp_path).put(key(), 1e-3, samples=[1e-3, math.nan])
    assert list(tmp_path.rglob("*")) == []


@pytest.mark.parametrize("bad", ["../escape", "a/b", "", "x", "k" * 129])
def test_keys_that_are_not_plain_names_are_refused(tmp_path, bad):
    cache = TuningCache(tmp_path)
    with pytest.raises(ValueError, match="invalid tuning-cache key"):
        cache.get(bad)
    with pytest.raises(ValueError, match="invalid tuning-cache key"):
        cache.put(bad, 1e-3)


# --- corrupt entries are ignored and healed ----------------------------------------------------

def _rewrite(field, value):
    def corrupt(data: bytes, k: str) -> bytes:
        entry = json.loads(data)
        entry[field] = value
        return json.dumps(entry).encode()
    return corrupt


CORRUPTIONS = {
    "trailing 0xFF byte": lambda data, k: data + b"\xff",
    "invalid UTF-8 inside": lambda data, k: data.replace(b'"target"', b'"t\xc3\x28"'),
    "truncated JSON": lambda data, k: data[: len(data) // 2],
    "empty file": lambda data, k: b"",
    "not an object": lambda data, k: b"[1, 2]",
    "another entry's key": _rewrite("key", "0" * 64),
    "key missing": lambda data, k: json.dumps({x: y for x, y in json.loads(data).items() if x != "key"}).encode(),
    "seconds NaN": lambda data, k: re.sub(rb'"seconds": [^,]+', b'"seconds": NaN', data),
    "seconds Infinity": lambda data, k: re.sub(rb'"seconds": [^,]+', b'"seconds": Infinity', data),
    "seconds negative": _rewrite("seconds", -1e-3),
    "seconds zero": _rewrite("seconds", 0),
    "seconds a string": _rewrite("seconds", "0.001"),
    "seconds missing": lambda data, k: json.dumps({x: y for x, y in json.loads(data).items()
                                                   if x != "seconds"}).encode(),
    "samples not a list": _rewrite("samples", "fast"),
}


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_corrupt_entry_reads_as_absent_is_removed_and_healed_by_put(tmp_path, corrupt):
    cache = TuningCache(tmp_path)
    k = key()
    cache.put(k, 1e-3, samples=[1e-3])
    path = cache.path(k)
    path.write_bytes(corrupt(path.read_bytes(), k))
    assert cache.get(k) is None
    assert cache.get_entry(k) is None
    assert not path.exists()                      # removed, best effort
    cache.put(k, 2e-3)
    assert cache.get(k) == 2e-3 and TuningCache(tmp_path).get(k) == 2e-3


def test_unreadable_entry_reads_as_absent(tmp_path):
    cache = TuningCache(tmp_path)
    k = key()
    cache.path(k).parent.mkdir(parents=True)
    cache.path(k).mkdir()                         # a directory where the file should be
    assert cache.get(k) is None


# --- concurrent writers --------------------------------------------------------------------------

N_WRITES = 120
N_WORKERS = 3


def _shared_value(worker: int, i: int) -> float:
    return (worker * N_WRITES + i + 1) * 1e-6


def _hammer(directory: str, worker: int, barrier) -> None:
    """Child process: write one shared key and many own keys, reading the shared key back."""
    cache = TuningCache(directory)
    shared = key("shared")
    allowed = {_shared_value(w, i) for w in range(N_WORKERS) for i in range(N_WRITES)}
    barrier.wait()
    for i in range(N_WRITES):
        cache.put(shared, _shared_value(worker, i), schedule="shared", samples=[_shared_value(worker, i)] * 8)
        cache.put(key(f"w{worker}-{i}"), (i + 1) * 1e-3, schedule=f"w{worker}-{i}")
        got = cache.get(shared)
        if got not in allowed:
            raise AssertionError(f"worker {worker} read {got!r} for the shared key after write {i}")


def test_concurrent_writers_leave_only_whole_entries(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(N_WORKERS)
    procs = [ctx.Process(target=_hammer, args=(str(tmp_path), w, barrier)) for w in range(N_WORKERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * N_WORKERS

    cache = TuningCache(tmp_path)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert all(p.suffix == ".json" and p.parent.name == p.stem[:2] and p.parent.parent == tmp_path
               for p in files), "temporary files were left behind"
    assert len(files) == N_WORKERS * N_WRITES + 1
    assert cache.get(key("shared")) in {_shared_value(w, N_WRITES - 1) for w in range(N_WORKERS)}
    for w in range(N_WORKERS):
        for i in range(N_WRITES):
            entry = cache.get_entry(key(f"w{w}-{i}"))
            assert entry is not None and entry["seconds"] == (i + 1) * 1e-3 and entry["schedule"] == f"w{w}-{i}"


# --- unusable directories ------------------------------------------------------------------------

def _assert_memory_fallback(cache, forbidden):
    with warnings.catch_warnings(record=True) as later:
        warnings.simplefilter("always")
        cache.put(key(), 3e-3, samples=[3e-3])
        cache.put(key("b"), 4e-3)
        assert cache.get(key()) == 3e-3 and cache.get(key("b")) == 4e-3
        assert cache.get_entry(key())["samples"] == [3e-3]
        assert cache.get(key("absent")) is None
    assert later == [], "the warning must be given once per cache"
    assert list(forbidden.rglob("*.json")) == []


@pytest.mark.parametrize("where", ["file", "under a file"])
def test_directory_that_is_a_file_warns_once_and_falls_back_to_memory(tmp_path, where):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    directory = blocker if where == "file" else blocker / "tuning"
    with pytest.warns(RuntimeWarning, match=re.escape(str(directory))) as record:
        cache = TuningCache(directory)
    assert len(record) == 1 and "\n" not in str(record[0].message)
    _assert_memory_fallback(cache, tmp_path)
    assert blocker.read_text() == "not a directory"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root can write anywhere")
def test_read_only_directory_warns_once_and_falls_back_to_memory(tmp_path):
    directory = tmp_path / "ro"
    directory.mkdir()
    directory.chmod(0o500)
    try:
        with pytest.warns(RuntimeWarning, match=re.escape(str(directory))):
            cache = TuningCache(directory)
        _assert_memory_fallback(cache, directory)
    finally:
        directory.chmod(0o700)


def test_directory_lost_after_start_warns_once_and_falls_back_to_memory(tmp_path):
    directory = tmp_path / "tuning"
    cache = TuningCache(directory)
    cache.put(key("before"), 1e-3)
    shutil.rmtree(directory)
    directory.write_text("replaced by a file")
    with pytest.warns(RuntimeWarning, match=re.escape(str(directory))) as record:
        cache.put(key(), 3e-3)
    assert len(record) == 1
    assert cache.get(key()) == 3e-3 and cache.get(key("before")) is None
    _assert_memory_fallback(cache, tmp_path)


# --- where the cache lives -----------------------------------------------------------------------

def test_cache_dir_environment_variable_is_honoured(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(tmp_path / "root"))
    cache = TuningCache()
    assert cache.directory == tmp_path / "root" / "tuning"
    cache.put(key(), 1e-3)
    assert (tmp_path / "root" / "tuning" / key()[:2] / f"{key()}.json").is_file()


def test_default_cache_dir_is_under_home_and_matches_the_kernel_cache(tmp_path, monkeypatch):
    from tilefuse.codegen.triton import launch
    monkeypatch.delenv("TILEFUSE_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_root() == launch.cache_dir() == tmp_path / ".cache" / "tilefuse"
    assert TuningCache().directory == tmp_path / ".cache" / "tilefuse" / "tuning"
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", "~/elsewhere")
    assert cache_root() == launch.cache_dir() == tmp_path / "elsewhere"
