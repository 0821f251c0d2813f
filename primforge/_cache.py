"""The on-disk cache every backend shares: a private folder, verified entries, safe fallbacks.

One root (``$PRIMFORGE_CACHE_DIR`` or ``$XDG_CACHE_HOME/primforge``), one sub-folder per
user of it; ``PRIMFORGE_CACHE=0`` turns it off. An entry's key is the caller's business:
it must cover everything that decides the bytes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import tempfile
import threading
import warnings

__all__ = [
    "ENV_DIR",
    "ENV_SWITCH",
    "CacheWarning",
    "checked_folder",
    "directory",
    "enabled",
    "read_bytes",
    "root",
    "verified_path",
    "write_bytes",
]

ENV_DIR = "PRIMFORGE_CACHE_DIR"
ENV_SWITCH = "PRIMFORGE_CACHE"
_DIGEST_SUFFIX = ".sha256"


class CacheWarning(UserWarning):
    """A cache folder or entry could not be trusted or written; primforge ran uncached.

    Example:
        >>> issubclass(CacheWarning, UserWarning)
        True
    """


_WARNED: set[tuple[str, str]] = set()
_LOCK = threading.Lock()


def _warn_once(path: str, reason: str) -> None:
    with _LOCK:
        if (path, reason) in _WARNED:
            return
        _WARNED.add((path, reason))
    warnings.warn(f"primforge cache {path}: {reason}", CacheWarning, stacklevel=3)


def enabled() -> bool:
    """Whether disk caches are on (``PRIMFORGE_CACHE`` is not ``0``/``false``/``no``/``off``).

    Example:
        >>> isinstance(enabled(), bool)
        True
    """
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


# A relative PRIMFORGE_CACHE_DIR -> the absolute path it named when first used.
_RESOLVED: dict[str, str] = {}


def root() -> str:
    """The cache root: ``$PRIMFORGE_CACHE_DIR``, else ``$XDG_CACHE_HOME/primforge``.

    A relative ``PRIMFORGE_CACHE_DIR`` (or one starting with ``~``) is made absolute once,
    when first used, against the working directory of that moment: a later ``os.chdir``
    does not move the cache.

    Example:
        >>> os.path.isabs(root())
        True
    """
    env = os.environ.get(ENV_DIR)
    if env:
        if not os.path.isabs(env):
            env = _RESOLVED.setdefault(env, os.path.abspath(os.path.expanduser(env)))
        return env
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "primforge")


def _private_dir(path: str) -> str | None:
    """``path`` as a private directory (created ``0700`` if missing), or the reason it is not."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        return f"cannot be created or read ({e.strerror or e})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link; refusing to follow it"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def directory(sub: str) -> str | None:
    """The private cache folder ``<root>/<sub>``, or ``None`` to run uncached.

    ``None`` when caching is switched off, or (with one :class:`CacheWarning`) when the
    root or the folder is a symlink, is owned by another user, is writable by others, or
    can't be created.

    Args:
        sub: the sub-folder name, e.g. ``"numba"``.

    Example:
        >>> import tempfile, os
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     os.environ[ENV_DIR] = tmp
        ...     d = directory("demo")
        ...     ok = d is not None and d.startswith(tmp)
        ...     del os.environ[ENV_DIR]
        >>> ok
        True
    """
    if not enabled():
        return None
    base = root()
    for path in (base, os.path.join(base, sub)):
        reason = _private_dir(path)
        if reason is not None:
            _warn_once(path, reason + "; running without a disk cache")
            return None
    return os.path.join(base, sub)


def checked_folder(path: str) -> str | None:
    """``path`` when it is (made, ``0700``, if missing) a private folder of this user.

    Like :func:`directory` for a folder given by path (a file the user named, or the root
    itself): ``None`` with one :class:`CacheWarning` when it is a symlink, owned by another
    user, writable by others, or can't be created.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     checked_folder(tmp) == tmp
        True
    """
    reason = _private_dir(path)
    if reason is not None:
        _warn_once(path, reason + "; not using it")
        return None
    return path


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _atomic_write(folder: str, name: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix="-" + name[:40])
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, os.path.join(folder, name))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_bytes(folder: str, name: str, data: bytes, *, digest: bool = True) -> bool:
    """Store ``data`` as entry ``name`` in ``folder`` (atomic, ``0600``, digest beside it).

    Args:
        folder: a folder from :func:`directory` or :func:`checked_folder`.
        name: the entry's file name.
        data: its bytes.
        digest: record the digest beside it (``False`` for a plain file that is parsed,
            never run, such as a JSON settings file: still atomic and ``0600``).

    Returns:
        Whether it was stored; a full disk or read-only folder gives one warning and
        ``False`` (the caller goes on with the data it has).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     write_bytes(d, "x.bin", b"abc"), read_bytes(d, "x.bin")
        (True, b'abc')
    """
    try:
        _atomic_write(folder, name, data)
        if digest:
            _atomic_write(folder, name + _DIGEST_SUFFIX, _digest(data).encode())
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT):
            _warn_once(folder, f"cannot write ({e.strerror}); results are not cached")
            return False
        raise
    return True


def _read_nofollow(path: str) -> bytes:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _discard(folder: str, name: str) -> None:
    for n in (name, name + _DIGEST_SUFFIX):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, n))


def read_bytes(folder: str, name: str) -> bytes | None:
    """Entry ``name`` of ``folder`` when its digest checks out, else ``None``.

    A missing entry reads as ``None`` silently; one that is there but unreadable, a
    symlink, or does not match its digest gives one :class:`CacheWarning`, is removed,
    and reads as ``None`` (the caller rebuilds it).

    Example:
        >>> import tempfile, os
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = write_bytes(d, "x.bin", b"abc")
        ...     with open(os.path.join(d, "x.bin"), "wb") as f:
        ...         _ = f.write(b"abd")
        ...     import warnings
        ...     with warnings.catch_warnings():
        ...         warnings.simplefilter("ignore")
        ...         read_bytes(d, "x.bin") is None
        True
    """
    path = os.path.join(folder, name)
    if not os.path.lexists(path):
        return None
    try:
        data = _read_nofollow(path)
        recorded = _read_nofollow(path + _DIGEST_SUFFIX).decode("ascii", "replace").strip()
    except OSError as e:
        reason = f"entry {name} is unreadable ({e.strerror or e})"
    else:
        if recorded == _digest(data):
            return data
        reason = f"entry {name} does not match its recorded digest"
    _warn_once(folder, reason + "; rebuilding it")
    _discard(folder, name)
    return None


def verified_path(folder: str, name: str) -> str | None:
    """Path of entry ``name`` when it is a regular file whose digest checks out, else ``None``.

    For artifacts that must be opened by path (a shared library for ``dlopen``). The folder
    is private to the user, so the file can't change between this check and its use by
    anyone but the user.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = write_bytes(d, "lib.so", b"\\x7fELF")
        ...     verified_path(d, "lib.so") is not None, verified_path(d, "other.so")
        (True, None)
    """
    return os.path.join(folder, name) if read_bytes(folder, name) is not None else None
