"""tests/gpu/python_check.py (the binding's GPU check) stays runnable: its imports and
arguments here, and its whole logic as a dry run on the host engine (a GPU run is the goal:
docs/python.md, "The GPU check")."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tests" / "gpu" / "python_check.py"


def check(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=600)


def test_help_and_bad_arguments():
    r = check("--help")
    assert r.returncode == 0 and "--device" in r.stdout and "output_dir" in r.stdout
    for bad, why in ((["--scenarios", "faults"], "host engine"),
                     (["--scenarios", "nope"], "unknown scenario"), (["--scale", "0"], "--scale"),
                     (["--device", "mps"], "--device"), (["--budget-s", "0"], "--budget-s"),
                     (["a", "b"], "unrecognized")):
        r = check(*bad)
        assert r.returncode == 2 and why in r.stderr, (bad, r.stderr)


def test_dry_run_on_the_host_engine(tmp_path):
    # As tests/gpu/check.sh runs it: the output directory as the one positional argument.
    r = check(str(tmp_path), "--device", "cpu", "--scale", "0.1", "--scenarios", "churn,flush")
    assert r.returncode == 0, r.stdout + r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("DRY RUN, not the goal:") and last.endswith("-> MET")
    report = json.loads((tmp_path / "python_check.json").read_text())
    assert report["met"] and report["dry_run"]
    assert [row["scenario"] for row in report["rows"]] == ["churn", "flush", "restart-from-disk"]
    assert all(row["all_identical"] and row["reuse_ok"] for row in report["rows"])


def test_without_a_gpu_the_goal_cannot_run():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the GPU run is tests/gpu/python_check.py itself")
    r = check("--scale", "0.1", "--scenarios", "churn")
    assert r.returncode == 2 and r.stdout.startswith("GOAL ") and "-> MISSED" in r.stdout
