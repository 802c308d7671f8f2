#!/usr/bin/env python3
"""GPU check of the Python binding: the reference engine's model on CUDA, served through
radixtier's CUDA engine, reuse bit-identical to recompute.

What runs (docs/python.md, "The GPU check"):
  1. each scenario (churn, flush, compaction by default; `faults` is the host engine's fault
     injection and is not run here) on Engine(device="cuda"): the model's KV pool and snapshot
     slots are CUDA tensors, the host tier a PinnedHostPool of the same GPU, copies by
     cuda.CudaTransferEngine ordered after torch's current stream; every request is then
     recomputed from scratch on the same GPU (reference_run) and compared bit for bit (output
     tokens, first and final logits);
  2. a restart from the disk tier over the pinned pool: turn 1 on one engine, close()
     (persist), turn 2 on a new engine on the same directory, compared the same way;
  3. the engine's health() stays ok.
The goal is MET when every request is bit-identical, reuse happened (cached tokens > 0; flush
and compaction promote from host; the restart loads from disk) and health() is ok. One line
"GOAL python binding on CUDA ... -> MET" (or "-> MISSED (why)") is printed, the form
tests/gpu/check.sh collects; OUTPUT_DIR (or --out) also gets python_check.json. Exit status:
0 MET, 1 MISSED, 2 cannot run (no CUDA device, a module built without nvcc). check.sh runs it
as `python3 tests/gpu/python_check.py OUTPUT_DIR` within 120 s: the runs stop at --budget-s
(default 90 s; what did not run is MISSED).

Not collected by pytest (no test_ prefix, outside python/tests). On a machine without a GPU
`python3 tests/gpu/python_check.py --help` checks that the script, radixtier and the reference
engine import.

Usage: PYTHONPATH=build/default/python:python /usr/bin/python3 tests/gpu/python_check.py
       [OUTPUT_DIR] [--device cuda:0] [--scale 0.125] [--scenarios churn,flush,compaction]
       [--no-disk] [--budget-s 90] [--build-dir build/default]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ("churn", "flush", "compaction")


def _import_paths(build_dir: str | None) -> None:
    build = Path(build_dir or os.environ.get("RADIXTIER_BUILD_DIR", ROOT / "build" / "default"))
    for p in (ROOT / "python", build / "python"):
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))


def _build_dir_arg(argv) -> str | None:
    for i, a in enumerate(argv):
        if a == "--build-dir" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--build-dir="):
            return a.split("=", 1)[1]
    return None


# Import-checked before the arguments are parsed, so `--help` proves the imports work.
_import_paths(_build_dir_arg(sys.argv[1:]))
import torch  # noqa: E402

import radixtier as rt  # noqa: E402
from reference_engine import scenarios  # noqa: E402
from reference_engine.engine import (Engine, Request, reference_run,  # noqa: E402
                                     same_answer)
from reference_engine.model import HybridModel, ModelConfig  # noqa: E402

GOAL = "python binding on CUDA (reference engine, torch model): reuse bit-identical to recompute"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("output_dir", nargs="?", help="where python_check.json goes (check.sh's "
                    "OUTPUT_DIR)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS),
                    help=f"comma-separated scenarios (default: {','.join(SCENARIOS)})")
    ap.add_argument("--device", default="cuda", help="torch device (default: cuda, the "
                    "current one; cpu: a dry run of this script with the host engine, which "
                    "checks the script, not the goal)")
    ap.add_argument("--scale", type=float, default=0.125,
                    help="token counts relative to the C++ demo (default 0.125)")
    ap.add_argument("--budget-s", type=float, default=90.0,
                    help="start no run after this many seconds (default 90: check.sh allows "
                    "120 in all); what did not run is MISSED")
    ap.add_argument("--policy", default="budgeted", help="snapshot policy (default budgeted)")
    ap.add_argument("--no-disk", action="store_true", help="skip the restart from disk")
    ap.add_argument("--out", help="directory for python_check.json (as OUTPUT_DIR)")
    ap.add_argument("--build-dir", help="the build tree whose python/ holds radixtier "
                    "(default: $RADIXTIER_BUILD_DIR or build/default)")
    a = ap.parse_args(argv)
    a.out = a.out or a.output_dir
    a.names = [n for n in a.scenarios.split(",") if n]
    if not a.names:
        ap.error("--scenarios: none given")
    if a.budget_s <= 0:
        ap.error("--budget-s must be > 0")
    for name in a.names:
        if name not in scenarios.SCENARIOS:
            ap.error(f"unknown scenario {name!r} (known: {', '.join(scenarios.SCENARIOS)})")
        if name == "faults":
            ap.error("'faults' injects failures through the host engine; not on the GPU")
    if a.scale <= 0:
        ap.error("--scale must be > 0")
    if not (a.device.startswith("cuda") or a.device == "cpu"):
        ap.error("--device must be 'cuda', 'cuda:N' or 'cpu' (a dry run)")
    return a


def run_scenario(name: str, model: HybridModel, device: torch.device, scale: float,
                 policy: str) -> dict:
    s = scenarios.make(name, scale=scale, policy=policy, model=model)
    if s.failing_submissions or s.fail_at_admission:
        raise ValueError(f"{name}: fault injection is the host engine's")
    cfg = dataclasses.replace(s.engine, device=str(device))
    t0 = time.perf_counter()
    engine = Engine(model, cfg)
    for r in s.requests:
        engine.submit(r)
    results = engine.run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    stats = engine.cache.stats().to_dict()
    health = engine.cache.health()
    cuda_stats = engine.transfers.stats() if device.type == "cuda" else {}
    refs = {r.id: reference_run(model, r) for r in s.requests}
    identical = {r.label: r.id in results and same_answer(results[r.id], refs[r.id])
                 for r in s.requests}
    errors = {r.label: results[r.id].error for r in s.requests
              if r.id in results and results[r.id].error}
    cached = sum(results[r.id].cached_tokens for r in s.requests if r.id in results)
    row = {"scenario": name, "requests": len(s.requests), "identical": identical,
           "all_identical": all(identical.values()), "errors": errors, "cached_tokens": cached,
           "bytes_h2d": stats["bytes_h2d"], "bytes_d2h": stats["bytes_d2h"],
           "transfers_failed": stats["transfers_failed"], "health_ok": health.ok,
           "health": health.message, "cuda_engine": {k: cuda_stats[k] for k in (
               "batches", "slices", "kernel_launches", "bytes_d2h", "bytes_h2d", "bytes_d2d",
               "failed", "fatal", "last_error") if k in cuda_stats},
           "wall_s": round(time.perf_counter() - t0, 2)}
    # What each scenario is about: reuse, and flush and compaction promote from host.
    row["reuse_ok"] = cached > 0 and (name == "churn" or stats["bytes_h2d"] > 0)
    return row


def run_restart(model: HybridModel, device: torch.device, scale: float) -> dict:
    v = model.cfg.vocab
    turn1 = scenarios.synth(21, max(64, int(600 * scale)), v)
    turn2 = scenarios.continuation(model, turn1, 6, scenarios.synth(22, 11, v))
    base = scenarios.make("churn", scale=scale, model=model).engine
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="radixtier-pycheck-") as d:
        cfg = dataclasses.replace(base, device=str(device), disk_dir=str(Path(d) / "store"))
        first = Engine(model, cfg)
        first.submit(Request(1, turn1, 6))
        r1 = first.run()[1]
        first.close()  # persist through the pinned pool
        del first
        second = Engine(model, cfg)
        second.submit(Request(2, turn2, 6))
        r2 = second.run()[2]
        stats = second.cache.stats().to_dict()
        health = second.cache.health()
        second.close()
        del second
    same = same_answer(r2, reference_run(model, Request(2, turn2, 6)))
    return {"scenario": "restart-from-disk", "requests": 2,
            "identical": {"turn 2": same}, "all_identical": same and not r1.error,
            "errors": {k: v for k, v in (("turn 1", r1.error), ("turn 2", r2.error)) if v},
            "cached_tokens": r2.cached_tokens, "hit_tokens_store": stats["hit_tokens_store"],
            "health_ok": health.ok, "health": health.message,
            "reuse_ok": r2.cached_tokens > 0 and stats["hit_tokens_store"] > 0,
            "wall_s": round(time.perf_counter() - t0, 2)}


def main(argv=None) -> int:
    a = parse_args(argv)
    dry = a.device == "cpu"
    if dry:
        print("DRY RUN on the CPU (host engine): checks this script, not the goal")
    elif not rt.HAVE_CUDA:
        print(f"GOAL {GOAL} -> MISSED (radixtier was built without its CUDA engine: nvcc "
              "not found)")
        return 2
    elif not torch.cuda.is_available():
        print(f"GOAL {GOAL} -> MISSED (torch.cuda is not available: no CUDA device, or a "
              f"CPU-only PyTorch {torch.__version__})")
        return 2
    device = torch.device(a.device)
    if not dry:
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    device_name = "cpu (dry run)" if dry else torch.cuda.get_device_name(device)
    model = HybridModel(ModelConfig()).to(device)
    rows = []
    t0 = time.perf_counter()
    runs = [(n, lambda n=n: run_scenario(n, model, device, a.scale, a.policy))
            for n in a.names]
    if not a.no_disk:
        runs.append(("restart-from-disk", lambda: run_restart(model, device, a.scale)))
    try:
        for name, run in runs:
            if time.perf_counter() - t0 > a.budget_s:
                rows.append({"scenario": name, "all_identical": False, "reuse_ok": False,
                             "health_ok": True, "errors": {
                                 "not run": f"the {a.budget_s:.0f} s budget was spent"}})
            else:
                rows.append(run())
            print(json.dumps(rows[-1]), flush=True)
    except Exception as e:  # an error is a MISSED goal with its reason, not a traceback only
        import traceback

        traceback.print_exc()
        rows.append({"scenario": "error", "all_identical": False, "reuse_ok": False,
                     "health_ok": False, "errors": {"exception": f"{type(e).__name__}: {e}"}})
    met = all(r["all_identical"] and r["reuse_ok"] and r["health_ok"] and not r["errors"]
              for r in rows) and bool(rows)
    requests = sum(r.get("requests", 0) for r in rows)
    why = "" if met else "; ".join(
        f"{r['scenario']}: " + ", ".join(
            [f"not identical: {[k for k, v in r.get('identical', {}).items() if not v]}"]
            * (not r["all_identical"]) + ["no reuse"] * (not r["reuse_ok"])
            + [f"health: {r.get('health')}"] * (not r["health_ok"])
            + [f"errors: {r['errors']}"] * bool(r["errors"]))
        for r in rows if not (r["all_identical"] and r["reuse_ok"] and r["health_ok"]
                              and not r["errors"]))
    summary = (("DRY RUN, not the goal: " if dry else "GOAL ")
               + f"{GOAL} ({device_name}, {len(rows)} runs, {requests} requests, "
               + f"{time.perf_counter() - t0:.0f} s) -> " + ("MET" if met else "MISSED")
               + (f" ({why})" if why else ""))
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "python_check.json").write_text(json.dumps(
            {"goal": GOAL, "met": met, "dry_run": dry, "device": device_name,
             "torch": torch.__version__, "torch_cuda": torch.version.cuda, "rows": rows},
            indent=1))
    print(summary)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
