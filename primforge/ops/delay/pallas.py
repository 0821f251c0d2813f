"""The delayed products have no Pallas kernel yet: on the GPU they run the ``jax`` reference.

:func:`generator` is registered as the opt-in 'pallas' backend on the GPU so that asking for
it says so, naming the backend that works.
"""

from __future__ import annotations

__all__ = ["generator"]


def generator(binary: bool):
    """The 'pallas' generator of a delayed product: it raises ``NotImplementedError``.

    Example:
        >>> generator(True)()  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        NotImplementedError: binary_delayed_csrmv: no 'pallas' kernel yet; use backend='jax' ...
    """

    def generate(**_):
        who = "binary_delayed_csrmv" if binary else "delayed_csrmv"
        raise NotImplementedError(f"{who}: no 'pallas' kernel yet; use backend='jax' (the "
                                  f"default on the GPU)")

    return generate
