"""The `primforge` command, end to end in subprocesses (plus quick in-process error paths)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from primforge.bench import BenchmarkResult
from primforge.cli import main

TESTS = Path(__file__).parent
CONSOLE_SCRIPT = Path(sys.executable).with_name("primforge")


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Demo kernels importable; autotune reads a private cache, not the user's."""
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setenv("PRIMFORGE_CACHE_DIR", str(tmp_path / "in_process_cache"))
    monkeypatch.delenv("PRIMFORGE_AUTOTUNE", raising=False)


def run(*args, cache_dir, script=False, **env):
    full = {k: v for k, v in os.environ.items() if k != "PRIMFORGE_AUTOTUNE"}
    full.update(PYTHONPATH=str(TESTS), PRIMFORGE_CACHE_DIR=str(cache_dir), JAX_PLATFORMS="cpu",
                **env)
    cmd = [str(CONSOLE_SCRIPT)] if script else [sys.executable, "-m", "primforge"]
    return subprocess.run([*cmd, *args, "--import", "pf_cli_demo"], env=full,
                          capture_output=True, text=True, timeout=300, check=False)


def listed(capsys, *args):
    assert main(["list", "--json", "--import", "pf_cli_demo", *args]) == 0
    return [k["name"] for k in json.loads(capsys.readouterr().out)]


def test_list_filters_by_tags_all_and_any(capsys):
    assert listed(capsys, "--tags", "pf_demo,pf_broken") == ["pf_demo_wrong"]
    assert listed(capsys, "--tags", "pf_demo", "--tags", "pf_broken") == ["pf_demo_wrong"]
    assert listed(capsys, "--tags", "pf_broken,pf_other", "--match", "any") == [
        "pf_demo_plain", "pf_demo_wrong"]
    assert listed(capsys, "pf_demo_scale", "pf_demo_plain") == ["pf_demo_scale", "pf_demo_plain"]


def test_unknown_names_tags_and_modules_list_what_exists(capsys):
    assert main(["info", "pf_nope", "--import", "pf_cli_demo"]) == 2
    err = capsys.readouterr().err
    assert "no kernel named 'pf_nope'" in err and "pf_demo_scale" in err
    assert main(["bench", "--tags", "pf_zzz", "--import", "pf_cli_demo"]) == 2
    err = capsys.readouterr().err
    assert "unknown tag 'pf_zzz'" in err and "pf_elementwise" in err
    assert main(["list", "--import", "pf_no_such_module"]) == 2
    assert "could not import kernel module 'pf_no_such_module'" in capsys.readouterr().err
    assert main(["bench", "pf_demo_scale", "--output", "x.txt", "--import", "pf_cli_demo"]) == 2
    assert "expected a file ending in .json or .csv" in capsys.readouterr().err
    assert main(["check", "pf_demo_scale", "--platform", "mars", "--import", "pf_cli_demo"]) == 2
    assert "unknown platform 'mars'" in capsys.readouterr().err


@pytest.mark.skipif(not CONSOLE_SCRIPT.exists(),
                    reason="the primforge console script is installed with the package")
def test_list_and_info_show_backends_and_defaults(tmp_path):
    proc = run("list", "--tags", "pf_demo", cache_dir=tmp_path, script=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:4] == ["NAME", "TAGS", "PLATFORM", "DEFAULT"]
    row = next(line for line in lines if line.startswith("pf_demo_scale")).split()
    assert row[2:6] == ["cpu", "jax", "jax*", "alt"]
    proc = run("info", "pf_demo_wrong", cache_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "cpu: backends jax, wrong; default jax" in proc.stdout
    assert "tags: pf_broken, pf_demo" in proc.stdout


def test_check_catches_the_wrong_backend(tmp_path, capsys):
    proc = run("check", "--tags", "pf_demo", cache_dir=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "PASS  pf_demo_scale" in proc.stdout
    assert "FAIL  pf_demo_wrong" in proc.stdout
    assert "[n=16] wrong: differs from jax" in proc.stdout
    # The passing case in this process (the failing one above is the end-to-end run).
    code = main(["check", "--tags", "pf_elementwise", "--import", "pf_cli_demo"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "1 of 1 kernel(s) passed on cpu" in out


def test_bench_writes_json_csv_and_png(tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    proc = run("bench", "--tags", "pf_demo", "--n-runs", "3", "--n-warmup", "1",
               "--output", str(out), "--plot", str(png), cache_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    res = BenchmarkResult.load(out)
    assert res.kernels == ["pf_demo_scale", "pf_demo_wrong"]
    assert len(res) == 2 * 2 * 2 and all(r.n_runs == 3 and r.success for r in res)
    assert [(r.config, r.backend) for r in res.mismatches()] == [
        ("n=16", "wrong"), ("n=256", "wrong")]
    assert "MISMATCH vs jax" in proc.stdout and "speedup" in proc.stdout
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000

    # CSV output, in this process (the JSON and PNG above are the end-to-end run).
    csv_out = tmp_path / "r.csv"
    code = main(["bench", "pf_demo_scale", "--backends", "alt", "--n-runs", "2",
                 "--output", str(csv_out), "--import", "pf_cli_demo"])
    assert code == 0, capsys.readouterr().err
    res = BenchmarkResult.load(csv_out)
    assert res.backends == ["alt"] and all(r.matches_reference for r in res)


def test_autotune_choice_survives_into_the_next_process(tmp_path, monkeypatch, capsys):
    # The tuning and the listings that must see its choice are separate processes; the
    # listing before it and --show / --clear after it run here, on the same cache folder.
    monkeypatch.setenv("PRIMFORGE_CACHE_DIR", str(tmp_path))

    def here(*args):
        code = main([*args, "--import", "pf_cli_demo"])
        return subprocess.CompletedProcess(args, code, capsys.readouterr().out, "")

    proc = here("list", "pf_demo_flaky")
    row = next(line for line in proc.stdout.splitlines() if line.startswith("pf_demo_flaky"))
    assert row.split()[2:4] == ["cpu", "broken"] and row.split()[-1] == "-"
    proc = run("autotune", "pf_demo_flaky", "--n-runs", "2", cache_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "pf_demo_flaky [cpu]: jax" in proc.stdout
    assert json.loads((tmp_path / "autotune.json").read_text())["kernels"]["pf_demo_flaky"]
    # a new process: the choice shows; with PRIMFORGE_AUTOTUNE it is the default too
    proc = run("list", "pf_demo_flaky", cache_dir=tmp_path)
    row = next(line for line in proc.stdout.splitlines() if line.startswith("pf_demo_flaky"))
    assert row.split()[2:4] == ["cpu", "broken"] and row.split()[-1] == "jax"
    proc = run("list", "pf_demo_flaky", cache_dir=tmp_path, PRIMFORGE_AUTOTUNE="1")
    row = next(line for line in proc.stdout.splitlines() if line.startswith("pf_demo_flaky"))
    assert row.split()[2:4] == ["cpu", "jax"] and row.split()[-1] == "jax"
    proc = here("autotune", "--show")
    assert "pf_demo_flaky  cpu       jax" in proc.stdout
    proc = here("autotune", "--clear")
    assert proc.returncode == 0 and not (tmp_path / "autotune.json").exists()


def test_parser_requires_a_command(capsys):
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2


def test_list_and_info_show_stored_autotune_choices(tmp_path, capsys):
    """The CLI adds the stored choices to the registry's summary; a damaged store shows none."""
    cache = tmp_path / "in_process_cache"
    cache.mkdir(mode=0o700)
    (cache / "autotune.json").write_text(json.dumps(
        {"kernels": {"pf_demo_scale": {"cpu": {"backend": "alt"}}}}))
    assert main(["list", "--json", "pf_demo_scale", "--import", "pf_cli_demo"]) == 0
    [summary] = json.loads(capsys.readouterr().out)
    assert summary["tuned"] == {"cpu": "alt"} and summary["has_call"]
    assert main(["info", "pf_demo_scale", "--import", "pf_cli_demo"]) == 0
    assert "(autotuned: alt)" in capsys.readouterr().out
    (cache / "autotune.json").write_text("{damaged")
    assert main(["list", "--json", "pf_demo_scale", "--import", "pf_cli_demo"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["tuned"] == {}


def test_a_unique_short_name_finds_the_kernel_and_an_ambiguous_one_lists_the_choices(capsys):
    import primforge

    primforge.XLACustomKernel("pf_short.alpha.unique_tail", "One of ``two`` kernels.")
    primforge.XLACustomKernel("pf_short.alpha.shared_tail")
    primforge.XLACustomKernel("pf_short.beta.shared_tail")
    assert listed(capsys, "unique_tail") == ["pf_short.alpha.unique_tail"]
    assert listed(capsys, "alpha.unique_tail") == ["pf_short.alpha.unique_tail"]
    assert main(["info", "unique_tail"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pf_short.alpha.unique_tail\n")
    # The docstring's reStructuredText literals are shown as terminal text.
    assert "  One of `two` kernels." in out and "``" not in out
    assert main(["info", "shared_tail"]) == 2
    err = capsys.readouterr().err
    assert ("'shared_tail' is the end of several kernel names: "
            "'pf_short.alpha.shared_tail', 'pf_short.beta.shared_tail'; give one in full") in err
    # A part of a name that is not a whole dotted component finds nothing.
    assert main(["info", "que_tail"]) == 2
    assert "no kernel named 'que_tail'" in capsys.readouterr().err
