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


# --- stream_wait at admission: the scheduler's thread does not wait for promotions ------------

class Recorder:
    """The real cache, with the calls the engine makes to it recorded in order. `late_failure`:
    the first poll(lock) after a stream_wait answers FAILED, as a device copy that failed after
    the forward started on its stream would (the host engine itself waits on the host)."""

    def __init__(self, cache, late_failure=False):
        self._cache = cache
        self.calls = []
        self.late_failure = late_failure

    def __getattr__(self, name):
        attr = getattr(self._cache, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.calls.append(name)
            return attr(*args, **kwargs)
        return call

    def poll(self, lock=None):
        self.calls.append("poll")
        if lock is not None and self.late_failure and "stream_wait" in self.calls:
            self.late_failure = False
            return rt.TransferState.FAILED
        return self._cache.poll(lock)


def promoting_engine(model, **changes):
    """An engine whose next request (`longer`) must promote `prompt`'s KV from host. Its copies
    run when waited for (MANUAL): with the worker thread a promotion could land before admit()
    returned, and the admission would have nothing to stream-wait for."""
    prompt = synth(21, 96, model.cfg.vocab)
    longer = np.concatenate([prompt, synth(22, 40, model.cfg.vocab)])
    changes.setdefault("engine_mode", rt.HostTransferEngine.Mode.MANUAL)
    engine = Engine(model, base_config(**changes))
    assert not run(engine, Request(1, prompt, 2))[1].error
    engine.cache.evict(tokens=1 << 20)  # the KV to host
    engine.cache.drain()
    assert engine.cache.peek(longer).load_back
    return engine, Request(2, longer, 2)


def test_a_promoting_admission_uses_stream_wait_and_confirms_before_it_commits(model):
    engine, req = promoting_engine(model)
    engine.cache = rec = Recorder(engine.cache)
    r2 = run(engine, req)[2]
    assert not r2.error and r2.transfer_failures == 0 and r2.admissions == 1
    assert r2.host_cached_tokens > 0
    assert same_answer(r2, reference_run(model, req))
    calls = rec.calls
    assert "stream_wait" in calls and "wait" not in calls[:calls.index("stream_wait")]
    # The prefix is confirmed (poll) before the request's first insert.
    assert calls.index("poll", calls.index("stream_wait")) < calls.index("insert")


def test_stream_wait_off_waits_at_admission(model):
    engine, req = promoting_engine(model, stream_wait=False)
    engine.cache = rec = Recorder(engine.cache)
    r2 = run(engine, req)[2]
    assert same_answer(r2, reference_run(model, req)) and r2.host_cached_tokens > 0
    assert "stream_wait" not in rec.calls and "wait" in rec.calls


def test_a_copy_that_fails_after_the_forward_started_is_discarded_and_recomputed(model):
    """poll(lock) says FAILED at the first commit: what the forward computed from the prefix is
    dropped, nothing is inserted from it, and the request is admitted again, bit-identical."""
    engine, req = promoting_engine(model)
    engine.cache = rec = Recorder(engine.cache, late_failure=True)
    r2 = run(engine, req)[2]
    assert not r2.error and r2.transfer_failures == 1 and r2.admissions == 2
    assert same_answer(r2, reference_run(model, req))
    calls = rec.calls
    first_poll = calls.index("poll", calls.index("stream_wait"))
    assert "insert" not in calls[:first_poll]
    assert calls[first_poll + 1:].index("release") < calls[first_poll + 1:].index("admit")
    assert engine.cache.check_invariants() == ""
