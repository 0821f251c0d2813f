"""``primforge autotune``: tune, show and clear the stored backend choices.

Tuning goes one kernel at a time (progress per kernel); the listing reads the store
read-only and shows the device and JAX version of each choice.
"""

from __future__ import annotations

import json
import os

from primforge import autotune
from primforge.bench import format_seconds
from primforge.cli._common import _out, _platform, _Report, _table


def _stored_details() -> dict[str, dict[str, dict]]:
    """kernel -> platform -> the stored entry: ``backend``, and where the store records
    them, ``device`` (``device_kind`` or ``device``) and ``jax_version``. Read-only; the
    extra fields are read only from a file autotune itself accepted, never through a link.
    """
    details: dict[str, dict[str, dict]] = {
        name: {p: {"backend": b} for p, b in per.items()}
        for name, per in autotune.choices().items()
    }
    if not details:
        return details
    try:
        fd = os.open(autotune.cache_path(), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            raw = json.loads(f.read().decode("utf-8", "replace"))["kernels"]
    except (OSError, ValueError, TypeError, KeyError):
        return details
    for name, per in details.items():
        for p, entry in per.items():
            stored = raw.get(name, {}).get(p) if isinstance(raw, dict) else None
            if not isinstance(stored, dict):
                continue
            device = stored.get("device_kind") or stored.get("device")
            if device:
                entry["device"] = str(device)
            if stored.get("jax_version"):
                entry["jax_version"] = str(stored["jax_version"])
    return details


def _cmd_autotune(args, kernels) -> int:
    path = autotune.cache_path()
    if args.clear:
        autotune.clear(kernels=[k.name for k in kernels] if (args.names or args.tags) else None)
        _out(f"cleared autotune choices in {path}")
        return 0
    if not args.show:
        platform = _platform(args.platform)
        report = _Report(len(kernels), not args.quiet, "tuning")
        tuned = {}
        for kernel in kernels:
            report.kernel(kernel.name, f"on {platform}")
            tuned.update(autotune.tune([kernel], platform=platform, n_warmup=args.n_warmup,
                                       n_runs=args.n_runs, apply=False,
                                       progress=False if args.quiet else None))
        report.finish()
        for name, info in tuned.items():
            t = info["median_s"]
            _out(f"{name} [{platform}]: " + (
                f"{info['backend']} ({format_seconds(t)} geometric-mean median)"
                if info["backend"] else "no backend ran correctly on every config"))
        if not tuned:
            _out("nothing to tune (kernels need a call function, benchmark data and two "
                 "backends on the platform)")
    stored = _stored_details()
    # Every stored choice, also of kernels whose module was not imported; names or tags
    # narrow the list to the selected kernels.
    selected = {k.name for k in kernels} if (args.names or args.tags) else None
    rows = [
        [n, p, e["backend"], e.get("device", "-"), e.get("jax_version", "-")]
        for n, per in sorted(stored.items()) if selected is None or n in selected
        for p, e in sorted(per.items())
    ]
    _out(f"autotune cache: {path}")
    _out(_table(["NAME", "PLATFORM", "BACKEND", "DEVICE", "JAX"], rows) if rows
         else "(no stored choices)")
    if rows and not autotune.enabled():
        _out("use them with PRIMFORGE_AUTOTUNE=1 or primforge.autotune.load()")
    return 0

