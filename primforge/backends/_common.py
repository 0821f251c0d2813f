"""What several backends need, answered once.

The package probe, the error naming the pip extra, the checks at the top of
``make_callable``, the default compute capability, and a backend's artifact folders.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jaxlib

from primforge import _cache
from primforge.utils._suggest import did_you_mean

__all__ = [
    "FALLBACK_COMPUTE_CAPABILITY",
    "MissingPackageError",
    "cache_dir",
    "check_options",
    "check_platform",
    "check_request",
    "compute_capability_of",
    "default_compute_capability",
    "jaxlib_version",
    "local_compute_capability",
    "missing_package",
    "package_installed",
    "scratch_dir",
]


# -- availability -------------------------------------------------------------------------
def package_installed(name: str) -> bool:
    """Whether the package (or module) ``name`` can be found here, without importing it.

    Never raises: a package whose parent fails to import counts as missing.

    Example:
        >>> package_installed('numpy'), package_installed('no_such_package_here')
        (True, False)
    """
    try:
        return importlib.util.find_spec(name) is not None
    except Exception:  # noqa: BLE001 - ImportError, ValueError, or a broken parent package
        return False


class MissingPackageError(ImportError):
    """A backend was asked to build but what it needs is not installed here.

    The message names the backend, what it needs and the command that installs it from a
    checkout of primforge (``pip install -e ".[<extra>]"``).

    Example:
        >>> issubclass(MissingPackageError, ImportError)
        True
    """


def install_hint(extra: str) -> str:
    """The command that installs the pip extra ``extra`` of primforge from its checkout.

    Example:
        >>> print(install_hint('cpu'))
        pip install -e ".[cpu]" (in the primforge checkout)
    """
    return f'pip install -e ".[{extra}]" (in the primforge checkout)'


def missing_package(backend: str, needs: str, extra: str | None,
                    hint: str = "") -> MissingPackageError:
    """The error a backend raises when ``is_available`` says no: names the pip extra.

    Args:
        backend: the backend's ``NAME``.
        needs: what is missing, in words (e.g. "the triton package").
        extra: the backend's ``EXTRA`` (None when no extra provides it).
        hint: further ways to get it, appended to the message.

    Example:
        >>> print(missing_package('warp', 'NVIDIA Warp (warp-lang)', 'warp'))
        the 'warp' backend needs NVIDIA Warp (warp-lang), which is not available here:
        pip install -e ".[warp]" (in the primforge checkout)
    """
    how = install_hint(extra) if extra else "install it"
    if hint:
        how += f" {hint}"
    return MissingPackageError(
        f"the {backend!r} backend needs {needs}, which is not available here: {how}")


# -- the checks at the top of make_callable -----------------------------------------------
def check_platform(backend: str, platforms: Sequence[str], platform: Any, kernel: str) -> None:
    """Raise ``ValueError`` unless ``platform`` is one of the backend's ``platforms``.

    Example:
        >>> check_platform('triton', ('gpu',), 'cpu', 'k')
        Traceback (most recent call last):
        ...
        ValueError: kernel 'k': the 'triton' backend serves ['gpu'], not 'cpu'
    """
    if platform not in platforms:
        raise ValueError(
            f"kernel {kernel!r}: the {backend!r} backend serves {list(platforms)}, not "
            f"{platform!r}")


def check_options(backend: str, kernel: str, options: Mapping[str, Any],
                  accepted: Iterable[str] = ()) -> None:
    """Reject ``make_callable`` options the backend does not take, naming them.

    Every backend accepts ``batch=()`` (no batch levels: nothing to do); a backend that
    does not batch natively rejects a non-empty ``batch`` (its caller vmaps the callable
    instead). ``accepted`` names the options a backend does take.

    Example:
        >>> check_options('jax', 'k', {'batch': ()})
        >>> check_options('jax', 'k', {'tile': 4})
        Traceback (most recent call last):
        ...
        TypeError: kernel 'k': the 'jax' backend's make_callable takes no option 'tile'
        (it takes: batch=())
    """
    accepted = tuple(accepted)
    for key, value in options.items():
        if key in accepted:
            continue
        if key == "batch":
            if not value:
                continue
            raise TypeError(
                f"kernel {kernel!r}: the {backend!r} backend does not batch natively; call "
                f"make_callable without batch= and vmap the callable it returns")
        takes = ", ".join([*accepted, "batch=()"])
        raise TypeError(
            f"kernel {kernel!r}: the {backend!r} backend's make_callable takes no option "
            f"{key!r} (it takes: {takes})")


def check_request(backend: str, platforms: Sequence[str], extra: str | None,
                  available: Callable[[str], bool], *, platform: Any, kernel: str,
                  options: Mapping[str, Any], needs: str, hint: str = "") -> None:
    """The opening checks of every ``make_callable``, in the contract's order.

    The platform (``ValueError``, :func:`check_platform`), then what the backend needs
    (``available(platform)``, else :class:`MissingPackageError` naming ``needs`` and
    ``extra``, with ``hint``), then the options (``TypeError``, :func:`check_options`).

    Example:
        >>> check_request('mine', ('cpu',), None, lambda p: True, platform='cpu',
        ...               kernel='k', options={'batch': ()}, needs='nothing')
        >>> check_request('mine', ('cpu',), 'mine', lambda p: False, platform='cpu',
        ...               kernel='k', options={}, needs='the mine package')
        Traceback (most recent call last):
        ...
        primforge.backends._common.MissingPackageError: the 'mine' backend needs the mine...
    """
    check_platform(backend, platforms, platform, kernel)
    if not available(platform):
        raise missing_package(backend, needs, extra, hint)
    check_options(backend, kernel, options)


# -- GPU target ---------------------------------------------------------------------------
#: The compute capability built for when no GPU is visible: Ampere (sm_80). Code built for
#: it carries PTX, which the driver compiles for any newer GPU when it loads it.
FALLBACK_COMPUTE_CAPABILITY: tuple[int, int] = (8, 0)


def compute_capability_of(devices: Iterable[Any]) -> tuple[int, int] | None:
    """``(major, minor)`` of the first GPU among ``devices`` that reports one, else None.

    Example:
        >>> class Gpu:
        ...     platform, compute_capability = 'gpu', '9.0'
        >>> compute_capability_of([Gpu()]), compute_capability_of([])
        ((9, 0), None)
    """
    for d in devices:
        cc = getattr(d, "compute_capability", None)
        if getattr(d, "platform", None) == "gpu" and cc:
            major, _, minor = str(cc).partition(".")
            return int(major), int(minor or 0)
    return None


def local_compute_capability() -> tuple[int, int] | None:
    """Compute capability of the first GPU JAX sees in this process, or None.

    Example:
        >>> cc = local_compute_capability()
        >>> cc is None or len(cc) == 2
        True
    """
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:  # no GPU backend in this process
        return None
    return compute_capability_of(gpus)


def default_compute_capability() -> tuple[int, int]:
    """What to build GPU code for when the caller names no target.

    The first visible GPU, else :data:`FALLBACK_COMPUTE_CAPABILITY`.

    Example:
        >>> len(default_compute_capability())
        2
    """
    return local_compute_capability() or FALLBACK_COMPUTE_CAPABILITY


# -- versions and folders -----------------------------------------------------------------
def jaxlib_version() -> str:
    """The installed jaxlib's version string (it goes into every compiled artifact's key).

    Example:
        >>> jaxlib_version() == jaxlib.__version__
        True
    """
    return getattr(jaxlib, "__version__", "unknown")


def cache_dir(sub: str) -> str | None:
    """The backend's folder in the on-disk cache, or None when builds run uncached.

    The folder is ``<cache root>/<sub>``, private to the user (see
    :func:`primforge._cache.directory`); None when ``PRIMFORGE_CACHE=0`` or the folder
    cannot be trusted (then with one ``primforge._cache.CacheWarning``).

    Example:
        >>> d = cache_dir('cuda')
        >>> d is None or d.endswith('cuda')
        True
    """
    return _cache.directory(sub)


_SCRATCH: dict[str, str] = {}
_SCRATCH_LOCK = threading.Lock()


def scratch_dir(prefix: str) -> str:
    """A private (0700) folder of this process for artifacts that are not cached.

    One folder per ``prefix`` for the life of the process, removed at exit. Its name
    carries the process id (``<prefix><pid>-<random>``); the first call also removes the
    folders of ``prefix`` left by processes that are gone (killed before their exit
    handlers ran), never one whose process is alive or that another user owns.

    Example:
        >>> import os
        >>> d = scratch_dir('primforge-doc-')
        >>> os.path.isdir(d) and d == scratch_dir('primforge-doc-')
        True
    """
    with _SCRATCH_LOCK:
        path = _SCRATCH.get(prefix)
        if path is None:
            _remove_stale_scratch(prefix)
            path = _SCRATCH[prefix] = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")
            atexit.register(shutil.rmtree, path, True)
        return path


def _remove_stale_scratch(prefix: str) -> None:
    """Remove ``<tmp>/<prefix><pid>-*`` folders of this user whose process is gone."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)-")
    tmp = tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        return
    for entry in names:
        m = pattern.match(entry)
        if m is None or int(m.group(1)) == os.getpid() or _process_alive(int(m.group(1))):
            continue
        path = os.path.join(tmp, entry)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
            continue
        shutil.rmtree(path, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's process: alive
        return True
    return True


#: The batching methods of ``jax.ffi.ffi_call``, accepted by ``vmap_method=``.
VMAP_METHODS = (
    "sequential", "sequential_unrolled", "expand_dims", "broadcast_all", "legacy_vectorized"
)


def check_vmap_method(where: str, vmap_method: Any) -> None:
    """Raise ``ValueError`` unless ``vmap_method`` is None or one of :data:`VMAP_METHODS`.

    Example:
        >>> check_vmap_method('numba_kernel', 'sequential')
        >>> check_vmap_method('numba_kernel', 'sequentail')
        Traceback (most recent call last):
        ...
        ValueError: numba_kernel: 'vmap_method' must be None or one of (...), got 'sequentail'
        (did you mean 'sequential' or 'sequential_unrolled'?)
    """
    if vmap_method is None or vmap_method in VMAP_METHODS:
        return
    raise ValueError(
        f"{where}: 'vmap_method' must be None or one of {VMAP_METHODS}, got "
        f"{vmap_method!r}{did_you_mean(vmap_method, VMAP_METHODS)}"
    )
