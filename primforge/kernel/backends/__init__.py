"""The former address of :mod:`primforge.backends`, kept for code written against it.

Every name of :mod:`primforge.backends` is here, and so are its backend modules, under both
addresses as the same module objects: ``from primforge.kernel.backends import numba`` and
``from primforge.kernel.backends.triton import triton_kernel`` still work. New code imports
:mod:`primforge.backends`.
"""

import importlib
import sys

from primforge import backends as _backends
from primforge.backends import *

__all__ = list(_backends.__all__)

for _path in _backends.KNOWN_BACKENDS.values():
    _short = _path.rsplit(".", 1)[1]
    globals()[_short] = sys.modules[f"{__name__}.{_short}"] = importlib.import_module(_path)
del _path, _short
