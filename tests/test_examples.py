"""The README's demo and the examples run and agree with jax.numpy."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_quickstart_runs_and_matches_jax_numpy():
    """The script asserts every comparison itself (a wrong kernel result, the event-driven
    product included, exits non-zero); here: it ran both halves and fits on one screen."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "all results match jax.numpy" in lines[-1]
    assert "made 1 kernel call" in out.stdout
    # The event-driven half: a CSR product beside its dense twin, then both timed.
    assert "W = ops.fixed_prob(" in out.stdout
    assert "spikes @ W matches the dense spikes @ W.todense()" in out.stdout
    assert re.search(r"event-driven spikes @ W: [\d.]+ ms, dense: [\d.]+ ms \(\d+x", out.stdout)
    assert len(lines) <= 25


def test_readme_commands_match_ci():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmd = ('python -m pip install -e ".[test,gpu-compile]" && '
                "JAX_PLATFORMS=cpu python -m pytest -n auto")
    assert test_cmd in readme.split("## What it looks like")[0]
    assert ci.rstrip().splitlines()[-1] == test_cmd  # CI's last command is the README's


def test_coba_delayed_matches_a_numpy_simulation_with_delays():
    """examples/coba_delayed.py against a float64 NumPy twin written from the model: arrivals
    by absolute step (no ring buffer), the example's connectivity, delays and initial state."""
    import numpy as np
    from _scripts import load_script

    mod = load_script("examples/coba_delayed.py", "coba_delayed_example")
    n, prob, duration = 1000, 0.08, 0.1  # 80 inputs per neuron, as in the full network
    net, d_exc, d_inh = mod.build(n, prob, seed=3)
    got = mod.simulate(net, d_exc, d_inh, duration)["counts"]

    steps, ne = round(duration / 1e-4), net.n_exc
    syn = []
    for w, d, offset in ((net.w_exc, d_exc, 0), (net.w_inh, d_inh, ne)):
        rows = np.repeat(np.arange(w.shape[0]), np.diff(np.asarray(w.indptr)))
        syn.append((rows + offset, np.asarray(w.indices), float(np.asarray(w.data)[0]), d))
    v, ge, gi = (np.asarray(x, np.float64) for x in (net.v0, net.ge0, net.gi0))
    arrive = np.zeros((2, steps + mod.MAX_DELAY_STEPS + 1, n))
    last = np.full(n, -(10**9))
    want = np.zeros((steps, 2), np.int64)
    for t in range(steps):
        integrating = (t - last) * 0.1 >= 5.0 - 1e-9  # 5 ms refractory period
        dv = (-60.0 - v) + ge * (0.0 - v) + gi * (-80.0 - v)
        v = np.where(integrating, v + 0.1 * dv / 20.0, v)
        spike = integrating & (v > -50.0)
        for pop, (src, dst, w, d) in enumerate(syn):
            fired = spike[src]
            np.add.at(arrive[pop], (t + d[fired], dst[fired]), w)
        ge = ge - 0.1 * ge / 5.0 + arrive[0, t]
        gi = gi - 0.1 * gi / 10.0 + arrive[1, t]
        v[spike] = -60.0
        last[spike] = t
        want[t] = spike[:ne].sum(), spike[ne:].sum()
    assert want[:, 0].sum() / ne / duration > 5.0  # sustained activity
    # float32 against float64: spike for spike at the start, then rates.
    np.testing.assert_array_equal(got[:300], want[:300])
    for pop, size in ((0, ne), (1, n - ne)):
        have, ref = got[:, pop].sum() / size, want[:, pop].sum() / size
        assert abs(have - ref) <= 0.05 * ref + 0.05, (pop, have, ref)
