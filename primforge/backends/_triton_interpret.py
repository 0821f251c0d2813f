"""Triton's interpreter on NumPy arrays, without torch: the CPU runner of Triton kernels.

Runs in a worker process started with ``TRITON_INTERPRET=1`` when this one has imported
``triton`` already; :class:`HostBuffer` stands in for a torch tensor, and
:func:`install_patches` supplies libdevice and bfloat16 arithmetic the interpreter lacks.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import os
import pickle
import struct
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np

ENV_INTERPRET = "TRITON_INTERPRET"


class _DtypeName:
    """What the interpreter reads as a tensor's dtype: something printing as ``torch.<name>``."""

    def __init__(self, name: str):
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"

    __repr__ = __str__


@functools.cache
def _dtype_name(name: str) -> _DtypeName:
    # One object per dtype for the life of the process: Triton caches what it learns from a
    # tensor's dtype by the dtype object's identity, so a freed one whose address is reused
    # would be read as the dtype of the earlier object.
    return _DtypeName(name)


class HostBuffer:
    """A NumPy array dressed as the torch tensor Triton's interpreter expects.

    The interpreter asks for the data address, a dtype that prints as ``torch.<name>``,
    sizes and strides in elements, and a host copy (the array itself: it is on the host).

    Example:
        >>> b = HostBuffer(np.arange(6, dtype=np.float32).reshape(2, 3))
        >>> str(b.dtype), b.size(), b.stride(), b.data_ptr() == b.array.ctypes.data
        ('torch.float32', (2, 3), (3, 1), True)
    """

    def __init__(self, array: np.ndarray):
        if not array.flags.c_contiguous:
            raise ValueError("HostBuffer needs a C-contiguous array")
        self.array = array
        self.dtype = _dtype_name(np.dtype(array.dtype).name)
        self.shape = array.shape

    def data_ptr(self) -> int:
        return self.array.ctypes.data

    def size(self) -> tuple[int, ...]:
        return self.array.shape

    def stride(self) -> tuple[int, ...]:
        return tuple(s // self.array.itemsize for s in self.array.strides)

    def storage_offset(self) -> int:
        return 0

    def untyped_storage(self) -> HostBuffer:
        return self

    def cpu(self) -> HostBuffer:
        return self

    def new_empty(self, *_, **__) -> HostBuffer:
        return HostBuffer(self.array)

    def set_(self, storage: HostBuffer, offset, size, stride) -> HostBuffer:
        self.array = storage.array
        return self

    def copy_(self, other: HostBuffer) -> HostBuffer:
        if other.array is not self.array:
            np.copyto(self.array, other.array)
        return self


def fresh_output(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """An output buffer with deliberately meaningless contents (NaN, or 0xA5 bytes).

    XLA hands a kernel uninitialised outputs; starting from garbage here makes a kernel
    that forgets to write an element fail its comparison instead of passing by luck.

    Example:
        >>> bool(np.isnan(fresh_output((2,), np.float32)).all())
        True
    """
    dtype = np.dtype(dtype)
    out = np.empty(tuple(shape), dtype)
    if dtype.kind == "f" or dtype.name == "bfloat16":
        out[...] = np.nan
    elif dtype.kind == "b":
        out[...] = True
    else:
        out.view(np.uint8)[...] = 0xA5
    return out


def _libdevice_numpy() -> dict[str, Any]:
    import math

    erf, erfc = np.vectorize(math.erf), np.vectorize(math.erfc)
    lgamma, tgamma = np.vectorize(math.lgamma), np.vectorize(math.gamma)
    return {
        "erf": erf, "erfc": erfc, "lgamma": lgamma, "tgamma": tgamma,
        "exp": np.exp, "exp2": np.exp2, "exp10": lambda x: np.power(10.0, x),
        "expm1": np.expm1, "log": np.log, "log2": np.log2, "log10": np.log10,
        "log1p": np.log1p, "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin,
        "acos": np.arccos, "atan": np.arctan, "atan2": np.arctan2, "sinh": np.sinh,
        "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh, "acosh": np.arccosh,
        "atanh": np.arctanh, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
        "cbrt": np.cbrt, "pow": np.power, "fabs": np.abs, "floor": np.floor,
        "ceil": np.ceil, "trunc": np.trunc, "round": np.round, "rint": np.rint,
        "fmin": np.fmin, "fmax": np.fmax, "fma": lambda a, b, c: a * b + c,
        "hypot": np.hypot, "copysign": np.copysign, "fmod": np.fmod,
    }


def install_patches() -> None:
    """Fill the gaps of Triton's interpreter named in the module notes (idempotent)."""
    from triton.runtime import interpreter as ti

    builder = ti.InterpreterBuilder
    if getattr(builder, "_primforge_patched", False):
        return
    _patch_extern_elementwise(ti)
    _patch_bfloat16(ti)  # after the above: it wraps the new create_extern_elementwise too
    _patch_libdevice_modules(ti)
    builder._primforge_patched = True


def _patch_extern_elementwise(ti) -> None:
    """libdevice calls get NumPy stand-ins (the interpreter has no implementation)."""
    table = _libdevice_numpy()
    bf16 = ti.tl.bfloat16

    def create_extern_elementwise(self, lib_name, lib_path, symbol, args, ret_type, is_pure):
        scalar = getattr(ret_type, "scalar", ret_type)
        name = symbol.removeprefix("__nv_")
        if name not in table and name.endswith("f"):  # the float32 variant: erff, expf...
            name = name[:-1]
        fn = table.get(name)
        if fn is None:
            raise NotImplementedError(
                f"libdevice function {symbol} has no NumPy stand-in in primforge's Triton "
                f"interpreter shim (known: {sorted(table)})")
        data = np.asarray(fn(*(a.data for a in args)))
        if scalar == bf16:  # computed from widened inputs: narrowed by via_float32
            return ti.TensorHandle(data.astype(np.float32), ti.tl.float32)
        return ti.TensorHandle(data.astype(ti._get_np_dtype(scalar)), scalar)

    ti.InterpreterBuilder.create_extern_elementwise = create_extern_elementwise


def _widen(ti, h):
    """A bfloat16 handle (held as its raw upper 16 bits) as float32; (handle, widened)."""
    if isinstance(h, ti.TensorHandle) and h.dtype.scalar == ti.tl.bfloat16:
        return ti.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32),
                               ti.tl.float32), True
    return h, False


def _narrow(ti, h):
    """A float32 handle back to bfloat16 bits, rounded to nearest even."""
    bits = np.asarray(h.data, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    return ti.TensorHandle(bits, ti.tl.bfloat16)


def _patch_bfloat16(ti) -> None:
    """bfloat16 arithmetic, dots, reductions and scans run in float32, rounded back."""
    builder, bf16 = ti.InterpreterBuilder, ti.tl.bfloat16

    def via_float32(method):
        def wrapped(self, *args, **kwargs):
            args, was = zip(*(_widen(ti, a) for a in args)) if args else ((), ())
            out = method(self, *args, **kwargs)
            if any(was) and isinstance(out, ti.TensorHandle):
                if np.asarray(out.data).dtype == np.float32:
                    return _narrow(ti, out)
                return ti.TensorHandle(out.data, bf16)  # a comparison: keep its quirk
            return out
        return wrapped

    # The arithmetic entry points that compute on the data; the rest only move bits.
    for name in ("binary_op", "unary_op", "ternary_op", "create_fma", "create_erf",
                 "create_rsqrt", "create_extern_elementwise"):
        setattr(builder, name, via_float32(getattr(builder, name)))

    plain_dot = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return plain_dot(self, _widen(ti, a)[0], _widen(ti, b)[0], d, input_precision,
                         max_num_imprecise_acc)

    plain_apply = ti.ReduceScanOpInterface.apply

    def apply(self, input):  # reductions and scans (tl.sum, tl.max, tl.cumsum...)
        if not isinstance(input, tuple):
            return apply(self, (input,))[0]
        was = [t.dtype == bf16 for t in input]
        if not any(was):
            return plain_apply(self, input)
        wide = tuple(ti.tl.core.tensor(_widen(ti, t.handle)[0],
                                       t.type.with_element_ty(ti.tl.float32))
                     if w else t for t, w in zip(input, was))
        outs = plain_apply(self, wide)
        return tuple(ti.tl.core.tensor(_narrow(ti, o.handle), o.type.with_element_ty(bf16))
                     if o.dtype == ti.tl.float32 else o for o in outs)

    ti.ReduceScanOpInterface.apply = apply
    builder.create_dot = create_dot


def _patch_libdevice_modules(ti) -> None:
    """libdevice functions need the interpreter's semantic passed in, like tl.* builtins."""
    import triton.language.extra.cuda.libdevice as cuda_libdevice
    import triton.language.extra.libdevice as generic_libdevice

    scope = ti._LangPatchScope()  # kept: the patch lasts as long as the process
    ti._patch_builtin(cuda_libdevice, ti.interpreter_builder, scope)
    for name in dir(generic_libdevice):
        if not name.startswith("_") and hasattr(cuda_libdevice, name):
            setattr(generic_libdevice, name, getattr(cuda_libdevice, name))


def run_here(fn: Any, grid: tuple[int, ...], constexprs: Mapping[str, Any],
             inputs: Sequence[np.ndarray], outs: Sequence[tuple[tuple[int, ...], str]]):
    """Run an interpreted kernel in this process; returns the output arrays."""
    install_patches()
    ins = [np.ascontiguousarray(a) for a in inputs]
    results = [fresh_output(shape, dtype) for shape, dtype in outs]
    fn[tuple(grid)](*(HostBuffer(a) for a in (*ins, *results)), **dict(constexprs))
    return results


def interpreting_here() -> bool:
    """Whether ``@triton.jit`` kernels of this process are interpreted."""
    try:
        from triton import knobs
    except ImportError:
        return False
    return bool(knobs.runtime.interpret)


# -- the worker ----------------------------------------------------------------------------
def _send(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream):
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the Triton interpreter worker closed its pipe")
    (size,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(size))


def serve() -> None:  # pragma: no cover - runs in the worker process
    """The worker's loop: requests on stdin, results on the original stdout."""
    reply = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what kernels print (tl.device_print) goes to stderr, not the pipe
    requests = sys.stdin.buffer
    while True:
        try:
            request = _receive(requests)
        except EOFError:
            return
        try:
            module = importlib.import_module(request["module"])
            fn = module
            for part in request["qualname"].split("."):
                fn = getattr(fn, part)
            results = run_here(fn, request["grid"], request["constexprs"], request["inputs"],
                               request["outs"])
            _send(reply, ("ok", results))
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            import traceback

            _send(reply, ("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


class _Worker:
    def __init__(self):
        env = dict(os.environ)
        env[ENV_INTERPRET] = "1"
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.process = subprocess.Popen(
            [sys.executable, "-c",
             "from primforge.backends import _triton_interpret as m; m.serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
        )
        self.lock = threading.Lock()

    def call(self, request: dict):
        with self.lock:
            _send(self.process.stdin, request)
            status, payload = _receive(self.process.stdout)
        if status != "ok":
            raise RuntimeError(payload)
        return payload

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()


_WORKER: _Worker | None = None
_WORKER_LOCK = threading.Lock()


def run_in_worker(fn: Any, grid, constexprs, inputs, outs):
    """Run ``fn`` (a module-level ``@triton.jit`` kernel) in the interpreting worker."""
    global _WORKER
    raw = getattr(fn, "fn", fn)
    module, qualname = raw.__module__, raw.__qualname__
    if module == "__main__" or "<locals>" in qualname:
        raise ValueError(
            f"the Triton kernel {qualname!r} is run by Triton's interpreter in a separate "
            f"process (TRITON_INTERPRET=1 must be set before triton is imported), which "
            f"imports it by name: define it at module level in an importable module, or "
            f"start this process with TRITON_INTERPRET=1"
        )
    with _WORKER_LOCK:
        if _WORKER is None or _WORKER.process.poll() is not None:
            _WORKER = _Worker()
            atexit.register(_WORKER.close)
        worker = _WORKER
    request = {"module": module, "qualname": qualname, "grid": tuple(grid),
               "constexprs": dict(constexprs),
               "inputs": [np.ascontiguousarray(a) for a in inputs], "outs": list(outs)}
    return worker.call(request)
