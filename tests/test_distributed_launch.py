"""Tests for primforge.distributed: local processes joined by jax.distributed, and failures.

The JAX runs use 2 processes of 2 CPU devices each; the failure cases that need no JAX use
scripts of a few lines. Every run has a timeout, so no test can hang.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from primforge.distributed import LaunchError, initialize, launch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "distributed_events.py"
LIMIT = 150  # seconds: a bound on any run here, far above what one takes


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("XLA_FLAGS", None)
    for name in ("JAX_COORDINATOR_ADDRESS", "PRIMFORGE_NUM_PROCESSES", "PRIMFORGE_PROCESS_ID",
                 "SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE"):  # the one-process run stays alone
        env.pop(name, None)
    return env


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "rank_script.py"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def _events_reference(npz) -> tuple[np.ndarray, np.ndarray]:
    """The example's two products, computed with NumPy from the inputs it saved."""
    spikes, ind, w, dense = npz["spikes"], npz["indices"], npz["weights"], npz["dense"]
    fixed = np.zeros((ind.shape[0], spikes.size))
    for i in range(ind.shape[0]):
        np.add.at(fixed[i], ind[i], w[i])
    on = spikes.astype(np.float64)
    return fixed @ on, dense.astype(np.float64) @ on


def _run(argv, tmp_path):
    return subprocess.run(argv, cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=LIMIT + 30, check=False)


def test_example_on_two_processes_equals_numpy_and_one_process(tmp_path):
    """The command line runs the example as 2 processes x 2 devices: each process computes
    its own half of the rows, with no collective, and the values equal NumPy and the
    same script run as one process."""
    two, one = tmp_path / "two", tmp_path / "one"
    r = _run([sys.executable, "-m", "primforge.distributed", "-n", "2",
              "--devices-per-process", "2", "--timeout", str(LIMIT), str(EXAMPLE),
              "--out", str(two)], tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "[0] process 0 of 2" in r.stdout and "[1] process 1 of 2" in r.stdout
    r1 = _run([sys.executable, str(EXAMPLE), "--out", str(one)], tmp_path)
    assert r1.returncode == 0, r1.stdout[-3000:] + r1.stderr[-3000:]

    parts = [np.load(two / f"rank{i}.npz") for i in range(2)]
    single = np.load(one / "rank0.npz")
    assert [int(p["n_processes"]) for p in parts] == [2, 2] and int(single["n_processes"]) == 1
    assert [int(p["n_devices"]) for p in parts] == [4, 4]
    # Same inputs everywhere; each process holds exactly half of the rows, not the same half.
    for key in ("spikes", "indices", "weights", "dense"):
        np.testing.assert_array_equal(parts[0][key], single[key])
        np.testing.assert_array_equal(parts[1][key], single[key])
    held = [p["held"] for p in parts]
    assert held[0].sum() == held[1].sum() == held[0].size // 2
    assert not (held[0] & held[1]).any()
    assert [list(p["collectives"]) for p in parts] == [[], []]

    want_fixed, want_dense = _events_reference(single)
    # The one-process run holds every row; its rows of the two products are the reference
    # for the two-process run: bitwise, since each row is computed on one device either way.
    assert single["held"].all()
    np.testing.assert_allclose(single["fixed"], want_fixed, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(single["dense_out"], want_dense, rtol=1e-5, atol=1e-5)
    for p, h in zip(parts, held):
        np.testing.assert_array_equal(p["fixed"][h], single["fixed"][h])
        np.testing.assert_array_equal(p["dense_out"][h], single["dense_out"][h])
        assert np.isnan(p["fixed"][~h]).all()  # rows of the other process: never seen here


def test_a_failing_rank_stops_the_others_and_is_named(tmp_path):
    """Rank 1 exits with code 3 after joining; rank 0 then waits in a collective that can
    never complete. The launcher stops rank 0 and names rank 1 with its code and output."""
    script = _script(tmp_path, """
        import sys
        import primforge.distributed
        primforge.distributed.initialize()
        import jax, jax.numpy as jnp
        import numpy as np
        from jax.sharding import NamedSharding, PartitionSpec as P

        if jax.process_index() == 1:
            print("rank 1 gives up", flush=True)
            sys.exit(3)
        mesh = jax.make_mesh((jax.device_count(),), ("x",))
        x = jax.make_array_from_callback((8,), NamedSharding(mesh, P("x")),
                                         lambda i: np.ones(8, np.float32)[i])
        print("sum", float(jax.jit(jnp.sum)(x)), flush=True)
        """)
    with pytest.raises(LaunchError) as info:
        launch(script, num_processes=2, devices_per_process=2, timeout=LIMIT, grace=2,
               echo=False, env=_env())
    err = info.value
    assert (err.rank, err.returncode, err.running) == (1, 3, [])
    assert "rank 1 of 2 exited with code 3" in str(err)
    assert "rank 1 gives up" in str(err)
    assert "sum 8.0" not in err.outputs[0]


def test_a_hanging_rank_is_killed_at_the_timeout(tmp_path):
    """Rank 1 ignores SIGTERM and never ends: the timeout stops it (SIGKILL after the grace
    period) and the error names it, and only it, as still running."""
    script = _script(tmp_path, """
        import os, signal, sys, time
        if os.environ["PRIMFORGE_PROCESS_ID"] == "1":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            print("pid", os.getpid(), flush=True)
            time.sleep(600)
        """)
    with pytest.raises(LaunchError) as info:
        launch(script, num_processes=2, timeout=3, grace=0.5, echo=False, env=_env())
    err = info.value
    assert err.rank is None and err.running == [1]
    assert "rank(s) 1 of 2 still running" in str(err)
    pid = int(err.outputs[1].split()[1])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone, not left behind


def test_a_rank_killed_by_a_signal_is_named_with_the_signal(tmp_path):
    script = _script(tmp_path, """
        import os, signal, time
        if os.environ["PRIMFORGE_PROCESS_ID"] == "2":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(600)
        """)
    with pytest.raises(LaunchError, match="rank 2 of 3 was killed by signal SIGKILL") as info:
        launch(script, num_processes=3, timeout=LIMIT, grace=1, echo=False, env=_env())
    assert info.value.returncode == -9


def test_the_command_line_exit_status_and_message(tmp_path):
    fail = _script(tmp_path, """
        import os, sys, time
        if os.environ["PRIMFORGE_PROCESS_ID"] == "1":
            print("bad input", file=sys.stderr)
            sys.exit(7)
        time.sleep(600)
        """)
    r = _run([sys.executable, "-m", "primforge.distributed", "-n", "2", "--timeout",
              str(LIMIT), "--grace", "1", str(fail)], tmp_path)
    assert r.returncode == 1, r.stderr
    assert "rank 1 of 2 exited with code 7" in r.stderr and "bad input" in r.stderr
    ok = tmp_path / "ok.py"
    ok.write_text("import os, sys; print('args', sys.argv[1:], "
                  "os.environ['PRIMFORGE_PROCESS_ID'])\n")
    r = _run([sys.executable, "-m", "primforge.distributed", "-n", "2", str(ok), "-x", "1"],
             tmp_path)
    assert r.returncode == 0, r.stderr
    assert "[0] args ['-x', '1'] 0" in r.stdout and "[1] args ['-x', '1'] 1" in r.stdout


def test_bad_arguments_are_named(tmp_path):
    script = _script(tmp_path, "pass\n")
    with pytest.raises(ValueError, match="num_processes must be a positive integer"):
        launch(script, num_processes=0)
    with pytest.raises(ValueError, match="devices_per_process must be a positive integer"):
        launch(script, devices_per_process=1.5)
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        launch(script, timeout=-1)
    with pytest.raises(FileNotFoundError, match="script: no such file"):
        launch(tmp_path / "missing.py")


def test_rank_environment_and_initialize_outside_a_launch(monkeypatch):
    from primforge.distributed._launch import _rank_env

    env = _rank_env({"XLA_FLAGS": "--xla_foo=1 --xla_force_host_platform_device_count=8"},
                    1234, 3, 2, 4)
    assert env["JAX_COORDINATOR_ADDRESS"] == "127.0.0.1:1234"
    assert (env["PRIMFORGE_NUM_PROCESSES"], env["PRIMFORGE_PROCESS_ID"]) == ("3", "2")
    assert env["XLA_FLAGS"] == "--xla_foo=1 --xla_force_host_platform_device_count=4"
    for name in ("SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE", "JAX_COORDINATOR_ADDRESS",
                 "PRIMFORGE_NUM_PROCESSES"):
        monkeypatch.delenv(name, raising=False)
    assert initialize() is False


def test_an_uncaught_exception_ends_the_rank_with_its_traceback(tmp_path):
    script = _script(tmp_path, """
        import os, time
        if os.environ["PRIMFORGE_PROCESS_ID"] == "0":
            raise KeyError("no such neuron")
        time.sleep(600)
        """)
    with pytest.raises(LaunchError, match="rank 0 of 2 exited with code 1") as info:
        launch(script, num_processes=2, timeout=LIMIT, grace=1, echo=False, env=_env())
    assert "KeyError: 'no such neuron'" in str(info.value)
