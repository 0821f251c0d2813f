"""The former address of :mod:`primforge.backends`, kept for code written against it.

Every name of :mod:`primforge.backends` is here, and so are its backend modules, under both
addresses as the same module objects: ``from primforge.kernel.backends import numba`` and
``from primforge.kernel.backends.triton import triton_kernel`` still work. New code imports
:mod:`primforge.backends`.
"""

import sys

from primforge.backends import *  # noqa: F403 - the whole registry, re-exported
from primforge.backends import __all__  # noqa: F401
from primforge.backends import cuda, jax, numba, numba_cuda, pallas, triton, warp

for _module in (cuda, jax, numba, numba_cuda, pallas, triton, warp):
    sys.modules[f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}"] = _module
del _module
