"""`radixtier sim` and `radixtier report` on bad input: a clear message and exit status 2, before
anything runs (found by a probe: crashes, hangs and budgets that wrapped to zero)."""

import json
import pathlib
import subprocess

import pytest

import radixtier as rt

CLI = pathlib.Path(rt.__file__).resolve().parents[2] / "bin" / "radixtier"
ROOT = pathlib.Path(__file__).resolve().parents[2]
TRACE = ROOT / "tests" / "data" / "mooncake_synthetic_trace.jsonl"
MODEL = ROOT / "tests" / "data" / "hybrid-64l-config.json"

pytestmark = pytest.mark.skipif(not CLI.exists(), reason="no radixtier CLI")


def run(*args, timeout=60):
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def line(ts, n, out=8):
    return json.dumps({"timestamp": ts, "input_length": n, "output_length": out,
                       "hash_ids": list(range(-(-n // 512)))})


def sim_trace(path, *more):
    return run("sim", "--scenario", "trace", "--trace", path, "--hardware", "h200-gen5", *more)


@pytest.mark.parametrize("lines, message", [
    ([line(5, 600), line(3, 600)], 'line 2: "timestamp" 3 is before'),
    ([line(0, 100, out=2**64 - 1)], "a request holds at most"),
    ([json.dumps({"timestamp": 0, "input_length": 2**64 - 1, "output_length": 1,
                  "hash_ids": []})], "a request holds at most"),
    ([json.dumps({"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []})],
     "at least 1 token"),
    ([], "the trace has no requests"),
])
def test_bad_traces_name_the_line(tmp_path, lines, message):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(x + "\n" for x in lines))
    r = sim_trace(path)
    assert r.returncode == 2 and message in r.stderr, r.stderr


@pytest.mark.parametrize("option, message", [
    (["--decode-step-s", "inf"], "not a finite number"),
    (["--decode-step-s", "1e300"], "is more than 60"),
    (["--host-gib", "1e12"], "is more than 65536"),
    (["--shared-gib", "inf"], "not a finite number"),
    (["--instances", "100000"], "not in [1, 1024]"),
    (["--gpu-kv-tokens", str(2**38)], "not in [1, 2147483648]"),
    (["--forward-tokens", "100"], "multiple of the scenario's chunk"),
    (["--sglang-memory-ratio", "inf"], "not a finite number"),
    (["--instances", "1024", "--gpu-kv-tokens", str(2**31)], "more than 2^34 tokens in all"),
    (["--policy", "interval:63"], "--policy interval:63: snapshot policy"),
    (["--cache", "sglang-like", "--sglang-chunk", "1"], "--sglang-chunk 1: must be a multiple"),
])
def test_bad_options_are_refused_before_the_run(option, message):
    r = sim_trace(TRACE, "--trace-limit", "20", *option)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_a_trace_that_is_a_directory_or_missing(tmp_path):
    r = sim_trace(tmp_path)
    assert r.returncode == 2 and "is a directory" in r.stderr
    r = run("report", "--out", tmp_path / "rep", "--trace", tmp_path / "none.jsonl", "--jobs", "1",
            "--no-policies", "--disk-gib", "0")
    assert r.returncode == 2 and "cannot open trace file" in r.stderr
    assert not (tmp_path / "rep" / "results.md").exists(), "nothing ran"


def test_a_model_whose_geometry_divides_by_zero(tmp_path):
    config = json.loads(MODEL.read_text())
    config.pop("head_dim", None)
    config.update(hidden_size=4, num_attention_heads=8)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    r = run("sim", "--scenario", "churn", "--model", path)
    assert r.returncode == 2 and "head_dim 0" in r.stderr, r.stderr


@pytest.mark.parametrize("option", [["--router", "round-robin"], ["--trace-limit", "5"],
                                    ["--gpu-kv-tokens", "65536"], ["--hash-only-prompts"]])
def test_trace_options_given_to_another_scenario_are_an_error(option):
    r = run("sim", "--scenario", "churn", *option)
    assert r.returncode == 2 and "only the trace scenario reads it" in r.stderr, r.stderr
