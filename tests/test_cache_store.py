"""The shared disk cache: private folders, verified entries, safe fallbacks."""

import os
import stat
import warnings

import pytest

from primforge import _cache


@pytest.fixture
def root(tmp_path, monkeypatch):
    r = tmp_path / "cache"
    monkeypatch.setenv(_cache.ENV_DIR, str(r))
    monkeypatch.delenv(_cache.ENV_SWITCH, raising=False)
    _cache._WARNED.clear()
    return r


def test_folder_is_created_private(root):
    d = _cache.directory("numba")
    assert d == str(root / "numba")
    for p in (root, root / "numba"):
        assert stat.S_IMODE(os.lstat(p).st_mode) == 0o700


def test_switch_off_disables_every_cache(root, monkeypatch):
    for off in ("0", "false", "OFF", "no"):
        monkeypatch.setenv(_cache.ENV_SWITCH, off)
        assert _cache.directory("numba") is None
    assert not root.exists()


def test_world_writable_root_is_refused_with_one_warning(root):
    root.mkdir(mode=0o700)
    os.chmod(root, 0o777)
    with pytest.warns(_cache.CacheWarning, match="writable by other users"):
        assert _cache.directory("numba") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _cache.directory("numba") is None  # no second warning


def test_symlinked_folder_is_refused(root, tmp_path):
    root.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, root / "numba")
    with pytest.warns(_cache.CacheWarning, match="symbolic link"):
        assert _cache.directory("numba") is None


def test_folder_owned_by_another_user_is_refused(root, monkeypatch):
    root.mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: os.lstat(root).st_uid + 1)
    with pytest.warns(_cache.CacheWarning, match="owned by uid"):
        assert _cache.directory("numba") is None


def test_entries_round_trip_private_and_atomic(root):
    d = _cache.directory("x")
    assert _cache.write_bytes(d, "a.bin", b"payload")
    assert _cache.read_bytes(d, "a.bin") == b"payload"
    assert stat.S_IMODE(os.lstat(os.path.join(d, "a.bin")).st_mode) == 0o600
    assert not [n for n in os.listdir(d) if n.startswith(".tmp-")]


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p.write_bytes(p.read_bytes()[:3]),  # truncated
        lambda p: p.write_bytes(b"\xff\xfe garbage"),  # replaced
        lambda p: (p.parent / (p.name + ".sha256")).unlink(),  # digest lost
    ],
    ids=["truncated", "garbage", "no-digest"],
)
def test_damaged_entry_reads_as_absent_once_and_is_removed(root, damage):
    d = _cache.directory("x")
    _cache.write_bytes(d, "a.bin", b"payload-bytes")
    damage(root / "x" / "a.bin")
    with pytest.warns(_cache.CacheWarning, match="a.bin"):
        assert _cache.read_bytes(d, "a.bin") is None
    assert not (root / "x" / "a.bin").exists()
    assert _cache.write_bytes(d, "a.bin", b"payload-bytes")
    assert _cache.read_bytes(d, "a.bin") == b"payload-bytes"


def test_symlinked_entry_is_not_followed(root, tmp_path):
    d = _cache.directory("x")
    victim = tmp_path / "victim"
    victim.write_bytes(b"secret")
    os.symlink(victim, os.path.join(d, "a.bin"))
    _cache.write_bytes(str(tmp_path), "unrelated", b"")  # digest file for nothing
    with pytest.warns(_cache.CacheWarning):
        assert _cache.read_bytes(d, "a.bin") is None
    assert victim.read_bytes() == b"secret"
    # writing over the symlink replaces the link, never the victim's content
    _cache.write_bytes(d, "a.bin", b"new")
    assert victim.read_bytes() == b"secret"
    assert _cache.read_bytes(d, "a.bin") == b"new"


def test_read_only_folder_writes_fail_quietly(root):
    if os.getuid() == 0:
        # root ignores permission bits; simulate the error a read-only mount gives
        d = _cache.directory("x")

        def fail(*a, **k):
            raise OSError(30, "Read-only file system")

        import tempfile

        orig = tempfile.mkstemp
        tempfile.mkstemp = fail
        try:
            with pytest.warns(_cache.CacheWarning, match="cannot write"):
                assert _cache.write_bytes(d, "a.bin", b"x") is False
        finally:
            tempfile.mkstemp = orig
    else:
        d = _cache.directory("x")
        os.chmod(d, 0o500)
        try:
            with pytest.warns(_cache.CacheWarning, match="cannot write"):
                assert _cache.write_bytes(d, "a.bin", b"x") is False
        finally:
            os.chmod(d, 0o700)


def test_verified_path(root):
    d = _cache.directory("x")
    assert _cache.verified_path(d, "lib.so") is None
    _cache.write_bytes(d, "lib.so", b"\x7fELF...")
    assert _cache.verified_path(d, "lib.so") == os.path.join(d, "lib.so")


def test_relative_cache_dir_is_resolved_once(tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.setenv(_cache.ENV_DIR, "rel-cache")
    monkeypatch.setattr(_cache, "_RESOLVED", {}, raising=False)
    monkeypatch.chdir(first)
    assert _cache.root() == str(first / "rel-cache")
    folder = _cache.directory("sub")
    monkeypatch.chdir(second)  # the cache does not follow the working directory
    assert _cache.root() == str(first / "rel-cache")
    assert _cache.directory("sub") == folder
    assert not (second / "rel-cache").exists()
