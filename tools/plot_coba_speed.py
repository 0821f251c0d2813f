"""Plot the measured COBA timings (``benchmarks/reference/coba_cpu.json``) for the docs.

Run from the repository root: ``python tools/plot_coba_speed.py``; it rewrites
``docs/img/coba_speed.png``. The numbers are those of the Performance page's COBA table.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# The JAX contenders pinned to one core (taskset), as Brian2's standalone binary runs on one.
SHOWN = {
    "primforge fused x10 pinned": ("primforge, fused kernel", "tab:blue"),
    "primforge plain pinned": ("primforge, jax.numpy + ops", "tab:cyan"),
    "brian2 cpp_standalone": ("Brian2, C++ standalone", "tab:green"),
    "brainevent pinned": ("brainevent", "tab:orange"),
}


def main() -> None:
    table = json.loads((ROOT / "benchmarks/reference/coba_cpu.json").read_text())["table"]
    scales = sorted({row["scale"] for row in table})
    fig, ax = plt.subplots(figsize=(7, 3.2))
    width = 0.8 / len(SHOWN)
    for k, (name, (label, color)) in enumerate(SHOWN.items()):
        times = [next(r["cpu_s_per_sim_s"] for r in table
                      if r["scale"] == s and r["contender"] == name) for s in scales]
        ax.bar(np.arange(len(scales)) + (k - 1.5) * width, times, width, label=label, color=color)
    ax.set_yscale("log")
    ax.set_xticks(range(len(scales)),
                  [f"{s}x ({4000 * s:,} neurons)" for s in scales])
    ax.set_ylabel("CPU s per simulated s (log)")
    ax.set_title("COBA network on one CPU core (CPU time, lower is faster)")
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "img" / "coba_speed.png", dpi=110)


if __name__ == "__main__":
    main()
