"""Binding overhead: admitting (and releasing) a cached 32k-token prefix through Python costs
at most 2x the same calls made from C++ on the same cache, and an int64 prompt (what
tokenizers return; admit() reads it in place) at most 1.3x the int32 one (docs/performance.md).
`python3 python/tests/test_binding_overhead.py` prints the numbers of one run."""

import time

import numpy as np
import torch

from conftest import Stack, small_config

P, N = 64, 32768


def _cached_world():
    s = Stack(small_config(page_size=P, gpu_pages=1024, host_pages=0, gpu_snapshot_slots=64,
                           host_snapshot_slots=0, page_bytes=64, snapshot_bytes=64))
    c = s.cache
    toks = np.random.default_rng(42).integers(0, 150000, N, dtype=np.int32)
    a = c.admit(toks[:1])
    table = np.zeros(0, dtype=np.int64)
    for done in range(2048, N + 1, 2048):  # chunked prefill, a snapshot at every chunk
        table = np.concatenate([table, c.alloc_pages(a.lock, 2048 // P)])
        c.insert(a.lock, toks[:done], table, c.alloc_snapshot_slot(a.lock))
    c.release(a.lock)
    return c, np.append(toks, 1).astype(np.int32)


def measure(iterations=2000, repeats=7):
    """Best-of-`repeats` microseconds per admit+release: C++ loop, Python with numpy and torch
    prompts of int32 and int64 (interleaved, so machine noise hits all alike)."""
    c, prompt = _cached_world()
    assert c.match(prompt[:-1]).usable_tokens == N
    inputs = {"numpy int32": prompt, "torch int32": torch.from_numpy(prompt),
              "numpy int64": prompt.astype(np.int64),
              "torch int64": torch.from_numpy(prompt.astype(np.int64))}
    best = {"c++": float("inf"), **{k: float("inf") for k in inputs}}
    for _ in range(repeats):
        best["c++"] = min(best["c++"], c._admit_release_loop(prompt, iterations) / iterations)
        for name, p in inputs.items():
            t0 = time.perf_counter()
            for _ in range(iterations):
                a = c.admit(p)
                c.release(a.lock)
            best[name] = min(best[name], (time.perf_counter() - t0) / iterations)
    return {k: v * 1e6 for k, v in best.items()}


def _goals(us):
    return {"numpy int32 <= 2x c++": us["numpy int32"] <= 2.0 * us["c++"],
            "torch int32 <= 2x c++": us["torch int32"] <= 2.0 * us["c++"],
            "numpy int64 <= 1.3x int32": us["numpy int64"] <= 1.3 * us["numpy int32"],
            "torch int64 <= 1.3x int32": us["torch int64"] <= 1.3 * us["torch int32"]}


def test_admit_of_a_cached_32k_prefix_costs_at_most_2x_cpp_and_int64_13x_int32():
    # A timing on a shared machine: up to three measurements, the goals must hold in one
    # (ctest runs this file alone, RUN_SERIAL).
    for _ in range(3):
        us = measure()
        print(" ".join(f"{k}: {v:.2f} us" for k, v in us.items()))
        if all(_goals(us).values()):
            break
    assert all(_goals(us).values()), (_goals(us), us)


if __name__ == "__main__":
    us = measure(iterations=5000, repeats=9)
    for k, v in us.items():
        print(f"{k:>12}: {v:6.2f} us per admit+release")
    print(f"int64 / int32: numpy {us['numpy int64'] / us['numpy int32']:.2f}x, "
          f"torch {us['torch int64'] / us['torch int32']:.2f}x")
