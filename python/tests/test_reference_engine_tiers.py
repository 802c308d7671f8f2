"""The reference engine over the whole stack an engine written in Python can build (host
engine, disk tier, shared tier): a restarted engine resumes from the disk, a second instance
from the shared tier, and every output stays bit-identical to the request recomputed from
scratch. (The CUDA engine in place of the host engine: tests/gpu/python_check.py on a GPU.)"""

import dataclasses

import numpy as np
import pytest

import radixtier as rt
from reference_engine.engine import Engine, EngineConfig, Request, reference_run, same_answer
from reference_engine.model import HybridModel, ModelConfig
from reference_engine.scenarios import continuation, synth


@pytest.fixture(scope="module")
def model():
    return HybridModel(ModelConfig())


def base_config(**changes):
    c = EngineConfig(gpu_pages=48, host_pages=256, gpu_snapshot_slots=4, host_snapshot_slots=16,
                     slice_pages=8, chunk_tokens=64)
    return dataclasses.replace(c, **changes)


def run(engine, *requests):
    for r in requests:
        engine.submit(r)
    return engine.run()


def test_a_restarted_engine_resumes_from_the_disk_bit_identical(model, tmp_path):
    turn1 = synth(7, 150, model.cfg.vocab)
    turn2 = continuation(model, turn1, 6, synth(8, 11, model.cfg.vocab))
    cfg = base_config(disk_dir=str(tmp_path / "disk"))
    first = Engine(model, cfg)
    r1 = run(first, Request(1, turn1, 6))[1]
    assert not r1.error and r1.cached_tokens == 0
    first.close()  # persist: the next engine on the directory serves it all
    del first

    second = Engine(model, cfg)  # a new process: nothing on GPU or host
    assert second.disk_store.recovery.records > 0
    r2 = run(second, Request(2, turn2, 6))[2]
    assert same_answer(r2, reference_run(model, Request(2, turn2, 6)))
    assert r2.cached_tokens >= 144  # turn 1 up to its last inserted page boundary
    st = second.cache.stats()
    assert st.hit_tokens_store > 0 and st.kv_pages_loaded > 0 and st.snapshots_loaded > 0
    second.close()


@pytest.mark.skipif(not rt.HAVE_SHARED, reason="built without radixtier::shared")
def test_a_second_instance_resumes_from_the_shared_tier_bit_identical(model, cluster):
    turn1 = synth(9, 150, model.cfg.vocab)
    turn2 = continuation(model, turn1, 6, synth(10, 11, model.cfg.vocab))
    cfg = base_config(write_policy=rt.WritePolicy.WRITE_THROUGH, shared_seeds=cluster.seeds,
                      shared_options=dict(min_tokens=16, probe_deadline_ms=2000,
                                          fetch_deadline_ms=5000))
    a, b = Engine(model, cfg), Engine(model, cfg)
    assert not run(a, Request(1, turn1, 6))[1].error
    a.cache.drain()  # the write-through copies landed
    a.shared.pump()
    a.shared.flush_publishes()
    assert a.shared.stats().published_keys > 0

    r2 = run(b, Request(2, turn2, 6))[2]  # instance b never saw turn 1
    assert same_answer(r2, reference_run(model, Request(2, turn2, 6)))
    assert r2.shared_tokens >= 144 and r2.cached_tokens == r2.shared_tokens
    assert b.shared.stats().imports == 1
    for e in (a, b):
        e.close()


def test_engine_config_errors(model):
    with pytest.raises(ValueError, match="WRITE_THROUGH"):
        Engine(model, base_config(shared_seeds=["127.0.0.1:1"]))
    with pytest.raises(ValueError, match="model is on cpu"):
        Engine(model, base_config(device="cuda:0"))


class LostDevice:
    """The cache as it answers once its CUDA engine saw a sticky error: health() reports
    DEVICE_LOST (every other call goes to the real cache)."""

    def __init__(self, cache):
        self._cache = cache

    def __getattr__(self, name):
        return getattr(self._cache, name)

    def health(self):
        return type("Health", (), {"ok": False, "code": rt.ErrorCode.DEVICE_LOST,
                                   "message": "cudaErrorIllegalAddress"})()


@pytest.mark.parametrize("lost", [False, True])
def test_a_failed_copy_on_a_lost_device_stops_the_engine(model, lost):
    """After a failed copy the engine checks health(): a healthy engine recomputes what the
    copy was for (bit-identical), a lost device stops it with DeviceLostError."""
    prompt = synth(11, 96, model.cfg.vocab)
    longer = np.concatenate([prompt, synth(12, 5, model.cfg.vocab)])
    engine = Engine(model, base_config(), fail_at_admission={2: [0]})  # request 2's promotion
    assert engine.health().ok
    assert not run(engine, Request(1, prompt, 2))[1].error
    engine.cache.evict(tokens=1 << 20)  # the KV to host: request 2 must promote it
    engine.cache.drain()
    assert engine.cache.peek(longer).load_back
    if lost:
        engine.cache = LostDevice(engine.cache)
        engine.submit(Request(2, longer, 2))
        with pytest.raises(rt.DeviceLostError, match="cudaErrorIllegalAddress"):
            engine.run()
        return
    r2 = run(engine, Request(2, longer, 2))[2]
    assert r2.transfer_failures == 1 and not r2.error
    assert same_answer(r2, reference_run(model, Request(2, longer, 2)))
