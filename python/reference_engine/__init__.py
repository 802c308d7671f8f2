"""The Python reference engine: a small hybrid PyTorch model served through radixtier.

    model.py      HybridModel: Gated DeltaNet + GQA attention, per-token, bit-reproducible
    engine.py     Engine: the model in the cache's arenas + a minimal scheduler; reference_run
    scenarios.py  the demo's scenarios (churn, flush, compaction, agent, faults)
    demo.py       run_scenario(): with reuse vs recomputed, bit for bit; `python3 -m
                  reference_engine.demo` prints the table
"""
