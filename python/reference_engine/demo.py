"""Plays a scenario through the Engine (with reuse) and recomputes every request from scratch;
`python3 -m reference_engine.demo [--scale S] [--policy P] [NAME ...]` prints the table."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field

from reference_engine.engine import Engine, Result, reference_run, same_answer
from reference_engine.model import HybridModel
from reference_engine.scenarios import SCENARIOS, Scenario, make


@dataclass
class Report:
    scenario: Scenario
    results: dict[int, Result]
    references: dict[int, Result]
    stats: dict
    identical: dict[int, bool] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def all_identical(self) -> bool:
        return all(self.identical.values()) and len(self.identical) == len(self.scenario.requests)


def run_scenario(s: Scenario, model: HybridModel | None = None) -> Report:
    model = model or HybridModel(s.model)
    t0 = time.perf_counter()
    engine = Engine(model, s.engine, s.failing_submissions, s.fail_at_admission)
    for r in s.requests:
        engine.submit(r)
    results = engine.run()
    stats = engine.cache.stats().to_dict()
    refs = {r.id: reference_run(model, r) for r in s.requests}
    rep = Report(s, results, refs, stats, wall_s=time.perf_counter() - t0)
    for r in s.requests:
        rep.identical[r.id] = r.id in results and same_answer(results[r.id], refs[r.id])
    return rep


def format_table(rep: Report) -> str:
    s = rep.scenario
    lines = [f"{s.name}: {s.description} (policy {s.engine.policy})",
             f"{'request':<16} {'prompt':>7} {'cached':>7} {'on host':>7} {'recomp.':>7} "
             f"{'snaps':>5} {'fails':>5}  identical"]
    for r in s.requests:
        res = rep.results.get(r.id)
        if res is None:
            lines.append(f"{r.label:<16} no result")
            continue
        lines.append(f"{r.label:<16} {len(r.prompt):>7} {res.cached_tokens:>7} "
                     f"{res.host_cached_tokens:>7} {res.recomputed_tokens:>7} "
                     f"{res.snapshots_kept:>5} {res.transfer_failures:>5}  {'yes' if rep.identical[r.id] else 'NO'}"
                     f"{'  ' + res.error if res.error else ''}")
    st = rep.stats
    lines.append(f"promoted {st['bytes_h2d']} B, demoted {st['bytes_d2h']} B, failed copies "
                 f"{st['transfers_failed']}; all identical: "
                 f"{'yes' if rep.all_identical else 'NO'} ({rep.wall_s:.1f} s)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("names", nargs="*", default=list(SCENARIOS))
    ap.add_argument("--scale", type=float, default=0.5)
    ap.add_argument("--policy", default="budgeted")
    a = ap.parse_args(argv)
    ok = True
    for name in a.names:
        rep = run_scenario(make(name, scale=a.scale, policy=a.policy))
        print(format_table(rep) + "\n")
        ok &= rep.all_identical
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
