"""Private parts of :mod:`primforge.testing` (compiling for a GPU that is not there).

Design: :mod:`primforge.testing` keeps what depends on the machine (is the CUDA plugin
installed, where is ptxas, the compile-only topology) and :func:`~primforge.testing.compile_for_gpu`
itself; the pieces here depend only on their arguments:

- ``results``: what a compile gives back (:class:`GpuKernel`, :class:`GpuCompileResult`) and
  the two errors;
- ``dump``: reading XLA's dump folder (the thunk sequence: every launch with its grid, block
  and shared memory; the PTX files) and naming the kernel an error message mentions;
- ``lowered``: the custom calls of a lowered module, the kernel names they carry, and ptxas
  run on the PTX that custom calls hand the driver themselves.
"""
