"""The kernels step: every non-reference backend of every registered operator, checked
against its ``jax`` backend (forward, ``jax.grad``, ``jax.vmap``) on its benchmark cases.
"""

from __future__ import annotations

import fnmatch
import time

import jax
import jax.numpy as jnp
import numpy as np

from primforge.backends import get_backend
from primforge.bench import compare_outputs
from primforge.registry import list_kernels, load_modules

REFERENCE = "jax"
_UNTRACEABLE = (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
                jax.errors.TracerBoolConversionError, jax.errors.TracerIntegerConversionError)


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray))


class _Case:
    """One benchmark case of one kernel, as a function of its array inputs."""

    def __init__(self, kernel, platform: str, config):
        leaves, treedef = jax.tree.flatten(config.args)
        self.dynamic = [i for i, x in enumerate(leaves) if _is_array(x)]
        self.inputs = [jnp.asarray(leaves[i]) for i in self.dynamic]
        self.kernel, self.platform, self.name = kernel, platform, config.name
        self._leaves, self._treedef, self._kwargs = leaves, treedef, dict(config.kwargs)

    def fn(self, backend: str):
        def f(*arrays):
            full = list(self._leaves)
            for i, a in zip(self.dynamic, arrays):
                full[i] = a
            args = jax.tree.unflatten(self._treedef, full)
            return self.kernel.call(*args, backend=backend, **self._kwargs)

        return f

    def run(self, backend: str, transform: str):
        """The output of ``transform`` ('forward', 'grad', 'vmap') through ``backend``."""
        f = self.fn(backend)
        with self.kernel.use_backend(self.platform, backend):
            if transform == "forward":
                try:
                    return jax.device_get(jax.jit(f)(*self.inputs))
                except _UNTRACEABLE:  # a call function that needs concrete values
                    return jax.device_get(f(*self.inputs))
            if transform == "grad":
                return jax.device_get(self._grad(f))
            return jax.device_get(self._vmap(f))

    def float_inputs(self) -> list[int]:
        return [j for j, a in enumerate(self.inputs) if jnp.issubdtype(a.dtype, jnp.floating)]

    def _grad(self, f):
        floats = self.float_inputs()
        if not floats:
            raise NotImplementedError("no floating-point input to differentiate")
        shapes = jax.eval_shape(f, *self.inputs)
        rng = np.random.default_rng(0)
        cots = [rng.standard_normal(s.shape).astype(s.dtype) if jnp.issubdtype(
            s.dtype, jnp.floating) else None for s in jax.tree.leaves(shapes)]
        if all(c is None for c in cots):
            raise NotImplementedError("no floating-point output")

        def loss(*fl):
            args = list(self.inputs)
            for j, v in zip(floats, fl):
                args[j] = v
            outs = jax.tree.leaves(f(*args))
            return sum(jnp.sum(o * c) for o, c in zip(outs, cots) if c is not None)

        return jax.jit(jax.grad(loss, argnums=tuple(range(len(floats)))))(
            *[self.inputs[j] for j in floats])

    def _vmap(self, f):
        candidates = [j for j, a in enumerate(self.inputs)
                      if jnp.issubdtype(a.dtype, jnp.floating) or a.dtype == jnp.bool_]
        if not candidates:
            raise NotImplementedError("no float or bool input to batch")
        j = candidates[-1]
        a = self.inputs[j]
        other = jnp.flip(a, 0) if a.ndim else a
        batch = jnp.stack([a, other])

        def one(v):
            args = list(self.inputs)
            args[j] = v
            return f(*args)

        return jax.jit(jax.vmap(one))(batch)


def _tolerance(reference) -> float:
    biggest = max((float(np.max(np.abs(np.asarray(x, np.float64)))) for x in
                   jax.tree.leaves(reference) if np.size(x) and np.asarray(x).dtype.kind in
                   "fc"), default=1.0)
    return 1e-3 * max(1.0, biggest)


def select(platform: str, patterns: list[str] | None, backends: list[str] | None):
    """``[(kernel, [backend, ...], reason)]`` for every registered kernel matching
    ``patterns``; ``reason`` says why a kernel has no backend to check."""
    load_modules()
    chosen = []
    from primforge.ops._operator import forms_of  # each form of an operator's kernel

    for kernel in (f for k in list_kernels() for f in forms_of(k)):
        if patterns and not any(fnmatch.fnmatch(kernel.name, p) for p in patterns):
            continue
        names = [b for b in kernel.available_backends(platform) if b != REFERENCE]
        reason = None
        if REFERENCE not in kernel.available_backends(platform):
            names, reason = [], f"no '{REFERENCE}' reference backend on {platform}"
        elif not names:
            reason = f"no {platform} backend besides '{REFERENCE}'"
        elif not kernel.has_call() or not kernel.has_benchmark_data():
            names, reason = [], "no call function or benchmark data to build cases from"
        if backends is not None:
            names = [b for b in names if b in backends]
        chosen.append((kernel, names, reason))
    return chosen


def _check(emit, case: _Case, backend: str, transform: str, refs: dict) -> None:
    record = {"kind": "kernel", "kernel": case.kernel.name, "backend": backend,
              "check": transform, "case": case.name}
    t0 = time.perf_counter()
    try:
        key = (case.name, transform)
        if key not in refs:
            try:
                refs[key] = ("ok", case.run(REFERENCE, transform))
            except Exception as e:  # noqa: BLE001 - the transform does not apply here
                refs[key] = ("n/a", f"not with the jax reference: {type(e).__name__}: {e}"[:800])
        state, ref = refs[key]
        if state == "n/a":
            record.update(status="n/a", message=ref)
        else:
            got = case.run(backend, transform)
            tol = _tolerance(ref)
            ok, diff, what = compare_outputs(ref, got, rtol=1e-3, atol=tol)
            record.update(status="pass" if ok else "fail", max_diff=diff, message=what)
    except Exception as e:  # noqa: BLE001 - recorded, the run goes on
        record.update(status="error", message=f"{type(e).__name__}: {e}"[:1500])
    record["seconds"] = round(time.perf_counter() - t0, 3)
    emit(record)


def check_all(emit, *, platform: str, patterns: list[str] | None,
              backends: list[str] | None, max_cases: int) -> None:
    """Run the checks, emitting one record per (kernel, backend, check, case)."""
    chosen = select(platform, patterns, backends)
    work = []
    for kernel, names, reason in chosen:
        usable = []
        for b in names:
            module = get_backend(b)
            if b in _known() and not module.is_available(platform):
                emit({"kind": "kernel_skip", "kernel": kernel.name, "backend": b,
                      "reason": f"backend '{b}' is not available on {platform} here"})
            else:
                usable.append(b)
        if reason or not usable:
            emit({"kind": "kernel_skip", "kernel": kernel.name, "backend": None,
                  "reason": reason or "no available backend to check"})
            continue
        configs = kernel.benchmark_data(platform=platform)[:max_cases]
        work.append((kernel, usable, [_Case(kernel, platform, c) for c in configs]))
    emit({"kind": "kernel_plan", "kernels": len(work),
          "pairs": sum(len(u) for _, u, _ in work)})
    refs: dict = {}
    for kernel, usable, cases in work:  # first pass: every pair, every transform
        for b in usable:
            for transform in ("forward", "grad", "vmap"):
                _check(emit, cases[0], b, transform, refs.setdefault(kernel.name, {}))
    for kernel, usable, cases in work:  # second pass: the other sizes, forward
        for case in cases[1:]:
            for b in usable:
                _check(emit, case, b, "forward", refs.setdefault(kernel.name, {}))


def _known() -> set[str]:
    from primforge.backends import KNOWN_BACKENDS

    return set(KNOWN_BACKENDS)
