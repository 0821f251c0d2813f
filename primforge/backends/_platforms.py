"""Platform names: JAX's ('cuda', 'rocm') mapped to primforge's ('cpu', 'gpu', 'tpu').

They live in the backends layer, the lowest that needs them; the registry, the benchmark
runner, autotune, the CLI and the kernel's selection use the same functions.
"""

from __future__ import annotations

from primforge.utils._suggest import did_you_mean

__all__ = ["PLATFORMS", "PLATFORM_ALIASES", "canonical_platform"]

#: primforge's platform names.
PLATFORMS = ("cpu", "gpu", "tpu")

#: Every accepted platform name -> primforge's name for it.
PLATFORM_ALIASES = {"cuda": "gpu", "rocm": "gpu", "gpu": "gpu", "cpu": "cpu", "tpu": "tpu"}


def canonical_platform(platform: str) -> str:
    """Map JAX platform names ('cuda', 'rocm') to primforge's ('gpu').

    Raises:
        ValueError: for a name that is no platform, naming the accepted ones.

    Example:
        >>> canonical_platform('cuda')
        'gpu'
        >>> canonical_platform('mars')
        Traceback (most recent call last):
        ...
        ValueError: unknown platform 'mars': expected one of 'cpu', 'gpu', 'tpu'
        >>> canonical_platform('gpuu')
        Traceback (most recent call last):
        ...
        ValueError: unknown platform 'gpuu' (did you mean 'gpu'?): expected one of 'cpu',
        'gpu', 'tpu'
    """
    try:
        return PLATFORM_ALIASES[platform]
    except KeyError:
        raise ValueError(
            f"unknown platform {platform!r}{did_you_mean(platform, PLATFORM_ALIASES)}: "
            f"expected one of 'cpu', 'gpu', 'tpu'"
        ) from None
