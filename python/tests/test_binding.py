"""The binding: config validation, Status -> exceptions, every CacheBackend call, ids as
arrays, the GIL released during C++ calls, one cache shared by threads."""

import copy
import gc
import os
import pickle
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import radixtier as rt
from conftest import Stack, small_config


# --- CacheConfig ---------------------------------------------------------------------------
def test_config_is_validated_and_names_the_field():
    with pytest.raises(rt.InvalidArgumentError, match="gpu_pages"):
        rt.CacheConfig(gpu_pages=0, gpu_snapshot_slots=1, page_bytes=1, snapshot_bytes=1)
    with pytest.raises(rt.InvalidArgumentError, match="page_size: -1"):
        small_config(page_size=-1)
    with pytest.raises(rt.InvalidArgumentError, match="write_policy"):
        small_config(host_pages=0, write_policy=rt.WritePolicy.WRITE_THROUGH)


def test_config_is_immutable_and_replace_validates():
    c = small_config()
    with pytest.raises(AttributeError):
        c.gpu_pages = 3
    d = c.replace(gpu_pages=99)
    assert d.gpu_pages == 99 and c.gpu_pages == 16 and d.page_size == c.page_size
    assert c == c.replace() and c != d
    with pytest.raises(rt.InvalidArgumentError):
        c.replace(slice_pages=0)
    with pytest.raises(TypeError, match="unknown field"):
        c.replace(pages=1)
    assert c.to_dict()["page_bytes"] == 64 and c.slice_bytes == 2 * 64


def test_config_is_hashable_copyable_and_picklable():
    # What an engine needs to hand its config to the processes of its tensor-parallel ranks.
    c = small_config(write_policy=rt.WritePolicy.WRITE_THROUGH, host_pin_share=0.25)
    assert hash(c) == hash(c.replace()) and len({c, c.replace(), c.replace(gpu_pages=99)}) == 2
    for twin in (copy.copy(c), copy.deepcopy(c), pickle.loads(pickle.dumps(c))):
        assert twin == c and twin.to_dict() == c.to_dict() and twin is not c
    bad = pickle.dumps(c).replace(b"slice_pages", b"slice_pagez")
    with pytest.raises(TypeError):
        pickle.loads(bad)  # an unknown field is refused on the way back in, as by replace()


# --- errors --------------------------------------------------------------------------------
def test_comparing_with_another_type_is_false_not_an_error():
    c = small_config()
    assert (c == 5) is False and c != "a config" and c == small_config()


def test_errors_carry_the_status_message_and_code(stack):
    with pytest.raises(rt.NotFoundError, match=r"lock#7 is unknown") as e:
        stack.cache.release(7)
    assert e.value.code == rt.ErrorCode.NOT_FOUND
    assert isinstance(e.value, rt.Error) and isinstance(e.value, LookupError)
    assert issubclass(rt.InvalidArgumentError, ValueError)
    assert issubclass(rt.Error, RuntimeError)
    for cls, code in [(rt.OutOfMemoryError, rt.ErrorCode.OUT_OF_MEMORY),
                      (rt.TransferFailedError, rt.ErrorCode.TRANSFER_FAILED),
                      (rt.FailedPreconditionError, rt.ErrorCode.FAILED_PRECONDITION),
                      (rt.PendingError, rt.ErrorCode.PENDING)]:
        assert issubclass(cls, rt.Error) and cls.code == code


def test_bad_input_leaves_the_cache_unchanged(stack):
    a = stack.cache.admit([1, 2, 3, 4, 5])
    pages = stack.cache.alloc_pages(a.lock, 1)
    b = stack.cache.admit([9, 9, 9, 9, 9])
    before = (stack.cache.occupancy().gpu_pages_free, stack.cache.stats().to_dict(),
              stack.cache.check_invariants())
    with pytest.raises(rt.InvalidArgumentError, match="not page-aligned|page"):
        stack.cache.insert(a.lock, [1, 2, 3], pages)
    with pytest.raises(rt.InvalidArgumentError, match=r"pages\[0\] = -1"):
        stack.cache.free_pages(a.lock, [-1])
    with pytest.raises(rt.InvalidArgumentError, match="lock = -2"):
        stack.cache.release(-2)
    with pytest.raises(rt.InvalidArgumentError, match="belongs to request"):
        stack.cache.free_pages(b.lock, pages)  # rule 9: another request's page
    assert (stack.cache.occupancy().gpu_pages_free, stack.cache.stats().to_dict(),
            stack.cache.check_invariants()) == before
    stack.cache.release(a.lock)
    stack.cache.release(b.lock)


def test_engine_must_match_the_config():
    s = Stack()
    s.cache = None  # one cache per engine: this test builds its own over s.engine
    with pytest.raises(rt.InvalidArgumentError, match="page_bytes is 128"):
        rt.PrefixCache(s.config.replace(page_bytes=128), s.engine)
    with pytest.raises(rt.InvalidArgumentError, match="gpu_pages is 17"):
        rt.PrefixCache(s.config.replace(gpu_pages=17), s.engine)
    with pytest.raises(TypeError, match="HostTransferEngine"):
        rt.PrefixCache(s.config, object())


# --- the CacheBackend interface ------------------------------------------------------------
def test_request_lifecycle_through_every_call(stack):
    c = stack.cache
    prompt = np.arange(1, 14, dtype=np.int32)  # 13 tokens: 3 pages + 1
    a = c.admit(prompt)
    assert isinstance(a.lock, int) and a.cached_tokens == 0 and not a.promoting
    assert c.poll(a.lock) == rt.TransferState.DONE
    c.wait(a.lock)
    assert len(c.path_pages(a.lock)) == 0
    pages = c.alloc_pages(a.lock, 3)
    assert pages.dtype == np.int64 and pages.shape == (3,)
    slot = c.alloc_snapshot_slot(a.lock)
    spare = c.alloc_snapshot_slot(a.lock)
    c.free_snapshot_slot(a.lock, spare)
    r = c.insert(a.lock, prompt[:12], pages, slot)
    assert r.snapshot_taken and r.not_taken.dtype == np.int64 and len(r.not_taken) == 0
    c.release(a.lock)

    b = c.admit(prompt)
    assert b.cached_tokens == 12 and b.gpu_tokens == 12 and b.kv_tokens == 12
    assert np.array_equal(c.path_pages(b.lock), pages)
    # The request's own live slot, filled from the cached snapshot's GPU pages (issue 21) by a
    # device copy that may still be in flight: wait() (or stream_wait()) before reading it.
    assert c.wait(b.lock) == 12
    live = c.path_snapshot(b.lock)
    assert isinstance(live, int) and 0 <= live < 4
    mine = c.alloc_pages(b.lock, 3)
    r = c.insert(b.lock, prompt[:12], mine)  # the tree has these: all handed back
    assert sorted(r.not_taken) == sorted(mine) and not r.snapshot_taken
    c.free_pages(b.lock, r.not_taken)
    c.release(b.lock)

    m = c.match(prompt[:12])
    assert m.usable_tokens == 12 and m.kv_tokens == 12 and m.snapshot_on_gpu
    st = c.stats()
    assert st.admissions == 2 and st.snapshots_inserted == 1 and st.to_dict()["admissions"] == 2
    occ = c.occupancy()
    # 3 KV pages and the snapshot's 1 page (32 bytes in 64-byte pages); every live slot free.
    assert occ.gpu_pages_free == 16 - 3 - 1 and occ.gpu_slots_free == 4 and occ.nodes >= 1
    nodes = c.inspect(prompt[:12])
    assert sum(n.tokens for n in nodes) == 12 and nodes[-1].boundary == 12
    assert nodes[-1].snapshot == rt.Residency.GPU and all(n.locks == 0 for n in nodes)
    assert all(n.kv_copy == rt.Copy.NONE for n in nodes)
    # Results read as what they are, and as dicts.
    # (promoting: the copy into the live slot may still have been in flight at admission)
    assert repr(b) == (f"Admission(lock={b.lock}, cached_tokens=12, gpu_tokens=12, host_tokens=0, "
                       f"snapshot_from_host=False, promoting={b.promoting}, kv_tokens=12)")
    assert b.to_dict() == dict(lock=b.lock, cached_tokens=12, gpu_tokens=12, host_tokens=0,
                               snapshot_from_host=False, promoting=b.promoting, kv_tokens=12)
    assert repr(st).startswith("CacheStats(admissions=2, requested_tokens=")
    assert "snapshots_inserted=1" in repr(st) and "bytes_d2h" not in repr(st)  # zeros summed up
    assert repr(st).endswith(f"; the other {sum(v == 0 for v in st.to_dict().values())} are 0)")
    counters = [k for k in dir(st) if not k.startswith("_") and k != "to_dict"]
    assert st.to_dict()["bytes_d2h"] == 0 and sorted(st.to_dict()) == sorted(counters)
    assert st.to_dict()["staged_loads"] == 0 and st.to_dict()["store_load_misses"] == 0
    assert repr(m).startswith("MatchResult(usable_tokens=12, kv_tokens=12,")
    assert "kv=Residency.GPU" in repr(nodes[-1]) and nodes[-1].to_dict()["boundary"] == 12
    assert repr(r) == f"InsertResult(not_taken={r.not_taken!r}, snapshot_taken=False)"
    sizes = c.sizes().to_dict()
    assert set(sizes) == {"gpu", "host", "store"} and sizes["gpu"]["kv_pages_locked"] == 0
    assert repr(occ) == (f"Occupancy(gpu_pages_free=12, host_pages_free={occ.host_pages_free}, "
                         f"gpu_slots_free=4, host_slots_free={occ.host_slots_free}, "
                         f"nodes={occ.nodes})")
    c.poll()
    c.drain()
    c.drop_host()
    c.flush()  # nothing is pinned: every copy goes
    assert c.match(prompt[:12]).usable_tokens == 0 and c.inspect(prompt[:12]) == []
    assert c.check_invariants() == ""
    assert c.in_flight == 0 and c.page_size == 4 and c.config == stack.config
    assert c.engine is stack.engine


def test_demote_promote_and_failed_promotion_degrades(stack):
    c = stack.cache
    conv = np.arange(100, 132, dtype=np.int32)  # 8 pages
    stack.serve(conv)
    # Push it to host: fill the GPU with other requests' pages.
    stack.serve(np.arange(500, 532, dtype=np.int32))
    stack.serve(np.arange(700, 732, dtype=np.int32))
    m = c.match(conv)
    assert m.usable_tokens == 32 and m.host_tokens > 0
    a = c.admit(np.append(conv, 1))
    assert a.host_tokens > 0
    c.wait(a.lock)
    c.release(a.lock)
    assert c.stats().kv_pages_promoted > 0

    assert c.check_invariants() == ""


def test_failed_promotion_degrades_to_recompute():
    s = Stack(mode=rt.HostTransferEngine.Mode.MANUAL)  # copies run when waited for
    c = s.cache
    conv = np.arange(100, 132, dtype=np.int32)
    s.serve(conv)
    s.serve(np.arange(500, 532, dtype=np.int32))
    s.serve(np.arange(700, 732, dtype=np.int32))
    # The demotions the watermark step started land (as between a scheduler's steps).
    for t in s.engine.pending():
        s.engine.complete(t)
    c.poll()
    assert c.match(conv).host_tokens > 0
    a = c.admit(np.append(conv, 1))
    assert a.promoting and c.poll(a.lock) == rt.TransferState.PENDING
    for t in s.engine.pending():  # the promotion (and anything else still queued) fails
        s.engine.fail_ticket(t)
    assert c.wait(a.lock) < 32  # rule 7: the request resumes below the failed copy
    assert c.poll(a.lock) == rt.TransferState.DONE
    c.release(a.lock)
    # The failed copy kept the intact host copy (issue 15 item 5): the next admission promotes
    # it again and gets the same bytes.
    assert c.match(conv).usable_tokens == 32 and c.match(conv).host_tokens > 0
    b = c.admit(np.append(conv, 1))
    assert b.cached_tokens == 32 and b.promoting
    assert c.wait(b.lock) == 32
    c.release(b.lock)
    assert c.stats().transfers_failed >= 1 and c.check_invariants() == ""


def _host_leaf(s):
    """Serves 16 tokens with snapshots at 8 and 16, then pushes the last 8 to host."""
    c = s.cache
    p = np.arange(1, 17, dtype=np.int32)
    for end in (8, 16):
        s.serve(p[:end])
    side = c.admit(np.array([-1], dtype=np.int32))
    free = c.occupancy().gpu_pages_free
    c.free_pages(side.lock, c.alloc_pages(side.lock, free + 2))
    c.release(side.lock)
    return np.append(p, 0).astype(np.int32)


def test_peek_reports_host_hits_and_the_load_back_threshold():
    s = Stack(mode=rt.HostTransferEngine.Mode.MANUAL)
    c = s.cache
    prompt = _host_leaf(s)
    def state():
        o = c.occupancy()
        return c.stats().to_dict(), (o.gpu_pages_free, o.host_pages_free, o.gpu_slots_free)

    before = state()
    pending = s.engine.pending()  # the watermark step's demotions, left in flight
    m = c.peek(prompt)
    assert (m.usable_tokens, m.host_tokens, m.gpu_usable_tokens) == (16, 8, 8)
    assert m.resume_tokens == 16 and m.load_back
    assert state() == before and s.engine.pending() == pending
    # Above the host part's 8 tokens the admission resumes at the GPU boundary, copying nothing.
    t = Stack(small_config(load_back_min_tokens=12), mode=rt.HostTransferEngine.Mode.MANUAL)
    prompt = _host_leaf(t)
    assert t.cache.peek(prompt).resume_tokens == 8 and not t.cache.peek(prompt).load_back
    h2d = t.cache.stats().bytes_h2d
    a = t.cache.admit(prompt)
    assert a.cached_tokens == 8 and a.host_tokens == 0 and t.cache.wait(a.lock) == 8
    assert t.cache.stats().bytes_h2d == h2d  # nothing came from host
    t.cache.release(a.lock)
    with pytest.raises(rt.InvalidArgumentError, match="load_back_min_tokens"):
        small_config(load_back_min_tokens=16 * 4 + 1)
    assert t.cache.check_invariants() == ""


def test_evict_and_sizes():
    s = Stack(mode=rt.HostTransferEngine.Mode.MANUAL)
    c = s.cache
    s.serve(np.arange(1, 9, dtype=np.int32))
    sz = c.sizes()
    assert sz.gpu.kv_pages_evictable == 2 and sz.gpu.snapshots_evictable == 1
    assert sz.host.kv_pages_evictable == 0 and sz.host.bytes_evictable == 0
    freed = c.evict(tokens=8, snapshots=1, tier=rt.Tier.GPU)
    assert freed.kv_pages == 2 and freed.snapshots == 1
    assert freed.bytes == 2 * 64 + 64  # the snapshot's 32 bytes take one 64-byte GPU page
    assert c.sizes().gpu.kv_pages_evictable == 0 and c.sizes().host.kv_pages_evictable == 2
    freed = c.evict(tokens=100, tier=rt.Tier.HOST)
    assert freed.kv_pages == 2 and c.sizes().host.kv_pages_evictable == 0
    assert c.evict().kv_pages == 0
    assert c.check_invariants() == ""


def test_snapshot_cap_per_path():
    s = Stack(small_config(max_snapshots_per_path=2), mode=rt.HostTransferEngine.Mode.MANUAL)
    c = s.cache
    p = np.arange(1, 25, dtype=np.int32)
    for end in (8, 16, 24):
        s.serve(p[:end])
    c.drain()  # the snapshots' copies into GPU pages land (a manual engine runs them now)
    kept = [n.snapshot != rt.Residency.NONE for n in c.inspect(p)]
    assert sum(kept) == 2 and c.stats().snapshots_dropped == 1
    assert c.config.max_snapshots_per_path == 2
    with pytest.raises(rt.InvalidArgumentError, match="max_snapshots_per_path"):
        small_config(max_snapshots_per_path=1000)
    assert c.check_invariants() == ""


def test_out_of_memory_is_an_exception(stack):
    a = stack.cache.admit([1, 2])
    b = stack.cache.admit([3, 4])
    stack.cache.alloc_pages(a.lock, 10)  # held by a running request: not evictable
    with pytest.raises(rt.OutOfMemoryError):
        stack.cache.alloc_pages(b.lock, 10)
    with pytest.raises(rt.InvalidArgumentError, match="17 pages asked"):
        stack.cache.alloc_pages(b.lock, 17)
    stack.cache.release(a.lock)
    stack.cache.release(b.lock)


# --- ids as arrays -------------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda x: np.asarray(x, dtype=np.int32),
    lambda x: np.asarray(x, dtype=np.int64),
    lambda x: np.asarray(x, dtype=np.uint16),
    lambda x: torch.tensor(x, dtype=torch.int32),
    lambda x: torch.tensor(x, dtype=torch.int64),
    lambda x: list(x),
    lambda x: np.repeat(np.asarray(x, dtype=np.int64), 2)[::2],  # strided view
    lambda x: torch.tensor(x, dtype=torch.int64).repeat_interleave(2)[::2],
])
def test_tokens_and_ids_accept_arrays_tensors_and_lists(stack, make):
    tokens = [5, 6, 7, 8, 9, 10, 11, 12]
    a = stack.cache.admit(make(tokens + [1]))
    pages = stack.cache.alloc_pages(a.lock, 2)
    r = stack.cache.insert(a.lock, make(tokens), make(pages.tolist()))
    assert len(r.not_taken) == 0
    stack.cache.release(a.lock)
    assert stack.cache.match(make(tokens)).kv_tokens == 8


def test_int64_prompts_are_admitted_in_place_as_int32_ones(stack):
    # admit() reads a contiguous int64 prompt natively (no conversion pass): the same
    # admission as int32, and a token outside int32 refused with nothing changed.
    tokens = np.arange(100, 116, dtype=np.int32)
    stack.serve(tokens, snapshot=True)
    prompt = np.append(tokens, 1).astype(np.int32)
    for make in (lambda x: x.astype(np.int64), lambda x: torch.from_numpy(x.astype(np.int64))):
        a = stack.cache.admit(prompt)
        stack.cache.release(a.lock)
        b = stack.cache.admit(make(prompt))
        stack.cache.release(b.lock)
        # (promoting: whether the copy into the live slot is still in flight, a race)
        assert ({**a.to_dict(), "lock": 0, "promoting": 0}
                == {**b.to_dict(), "lock": 0, "promoting": 0})
        assert b.cached_tokens == 16
    stack.cache.drain()  # the released requests' copies into their live slots landed
    before = (stack.cache.stats().to_dict(), stack.cache.occupancy().to_dict())
    for at in (3, 16):  # inside the cached prefix, and after it
        bad = prompt.astype(np.int64)
        bad[at] = 2**31 + int(bad[at])
        with pytest.raises(rt.InvalidArgumentError, match=rf"prompt\[{at}\] = .* 32-bit token"):
            stack.cache.admit(bad)
    assert (stack.cache.stats().to_dict(), stack.cache.occupancy().to_dict()) == before


def test_bad_arrays_are_rejected(stack):
    a = stack.cache.admit([1, 2])
    with pytest.raises(rt.InvalidArgumentError, match="integer"):
        stack.cache.free_pages(a.lock, np.zeros(2, dtype=np.float32))
    with pytest.raises(rt.InvalidArgumentError, match="1-D"):
        stack.cache.free_pages(a.lock, np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(rt.InvalidArgumentError, match="torch.int32 or torch.int64"):
        stack.cache.admit(torch.zeros(3, dtype=torch.float32))
    with pytest.raises(rt.InvalidArgumentError, match="does not fit a 32-bit token"):
        stack.cache.admit(np.array([1, 2**40], dtype=np.int64))
    with pytest.raises(rt.InvalidArgumentError, match=r"pages\[1\] = 4294967295"):
        stack.cache.free_pages(a.lock, np.array([0, 2**32 - 1], dtype=np.uint32))
    with pytest.raises(rt.InvalidArgumentError, match=r"pages\[0\] = -3"):
        stack.cache.free_pages(a.lock, torch.tensor([-3]))
    with pytest.raises(TypeError):
        stack.cache.admit("abc")
    # Off the host: a meta tensor has no memory at all (its data_ptr is 0).
    with pytest.raises(rt.InvalidArgumentError, match="a meta tensor"):
        stack.cache.match(torch.empty(5, dtype=torch.int32, device="meta"))
    # Sequences: each element an int of 64 bits, named otherwise (not a cast's RuntimeError).
    with pytest.raises(rt.InvalidArgumentError, match=r"prompt\[0\]: expected an int, got float"):
        stack.cache.admit([1.5, 2])
    with pytest.raises(rt.InvalidArgumentError, match=r"\[0\] = 1180591620717411303424 does not"):
        stack.cache.admit([2**70, 1])
    with pytest.raises(rt.InvalidArgumentError, match="= 18446744073709551615 does not fit"):
        stack.cache.admit(np.array([2**64 - 1, 1], dtype=np.uint64))
    with pytest.raises(rt.InvalidArgumentError, match="stream = -5"):
        stack.cache.admit([1, 2], stream=-5)
    b = stack.cache.admit([1, 2], stream=np.int64(7))  # any integer type; the host ignores it
    stack.cache.release(b.lock)
    for not_tokens in (b"\x01\x02", [True, 2]):  # a bytearray is a uint8 buffer, like numpy's
        with pytest.raises((TypeError, rt.InvalidArgumentError)):
            stack.cache.match(not_tokens)
    assert stack.cache.check_invariants() == ""
    stack.cache.release(a.lock)


def test_engine_submit_takes_integer_ids_only():
    s = Stack()
    for pages in (np.array([[1.9, 0.9]]), [["1", "1"]], np.array([[True, True]]),
                  np.array([[2**63, 0]], dtype=np.uint64), [[2**64 - 1, 0]]):
        with pytest.raises(rt.InvalidArgumentError, match="integers that fit int64"):
            s.engine.submit(rt.Direction.DEVICE_TO_HOST, pages=pages)
    assert s.engine.pending() == []
    with pytest.raises(rt.InvalidArgumentError, match="stream"):
        s.engine.submit(rt.Direction.DEVICE_TO_HOST, pages=[[0, 0]], stream=2**64)
    assert s.engine.submit(rt.Direction.DEVICE_TO_HOST, pages=[[1, 0]]).wait() == rt.TransferState.DONE


def test_ten_thousand_page_ids_cost_no_python_loop():
    P = 4
    s = Stack(small_config(page_size=P, gpu_pages=20000, host_pages=0, host_snapshot_slots=0,
                           page_bytes=8))
    c = s.cache
    tokens = np.arange(10000 * P, dtype=np.int32)
    a = c.admit(tokens[:1])
    t0 = time.perf_counter()
    pages = c.alloc_pages(a.lock, 10000)
    r = c.insert(a.lock, tokens, torch.from_numpy(pages))
    table = c.path_pages(a.lock)
    spare = c.alloc_pages(a.lock, 10000)
    c.free_pages(a.lock, spare)
    elapsed = time.perf_counter() - t0
    c.release(a.lock)
    assert len(r.not_taken) == 0 and np.array_equal(table, pages)
    # One C++ pass per call: far below what 4 x 10^4 Python objects would cost.
    assert elapsed < 0.25, elapsed
    assert c.check_invariants() == ""


# --- GIL and threads -----------------------------------------------------------------------
def test_the_gil_is_released_during_cache_calls():
    s = Stack(small_config(page_size=4, gpu_pages=64, page_bytes=8))
    s.serve(np.arange(64 * 4 - 4, dtype=np.int32))
    prompt = np.arange(64 * 4 - 3, dtype=np.int32)
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.05)
    during = 0
    for _ in range(5):  # one C++ call of tens of milliseconds, a few times on a busy machine
        before = ticks[0]
        assert s.cache._admit_release_loop(prompt, 200000) > 0
        during = ticks[0] - before
        if during > 0:
            break
    stop.set()
    t.join()
    assert during > 0, "a Python thread made no progress while the cache ran"


def test_ticket_wait_releases_the_gil():
    s = Stack()
    s.arenas  # noqa: B018
    t = s.engine.submit(rt.Direction.DEVICE_TO_HOST, pages=np.array([[0, 0]]))
    s.engine.delay_ticket(t.id)
    done = threading.Event()

    def waiter():
        t.wait()
        done.set()

    w = threading.Thread(target=waiter)
    w.start()
    time.sleep(0.05)
    assert not done.is_set() or t.poll() == rt.TransferState.DONE
    s.engine.resume(t.id)  # runs only if the waiter let go of the GIL
    w.join(timeout=10)
    assert done.is_set() and t.poll() == rt.TransferState.DONE


def test_dropping_a_pending_ticket_releases_the_gil():
    # Dropping a pending ticket waits for its copy; the thread that lets it finish may be
    # Python's, so the wait must not hold the GIL. Run apart: a regression deadlocks every
    # thread of the process, this test's included.
    code = """
import threading, time, numpy as np, radixtier as rt
from conftest import Stack
s = Stack()
t = s.engine.submit(rt.Direction.DEVICE_TO_HOST, pages=np.array([[0, 0]]))
s.engine.delay_ticket(t.id)
ticket_id = t.id
threading.Thread(target=lambda: (time.sleep(0.1), s.engine.resume(ticket_id))).start()
del t  # returns once the resumer ran
assert s.engine.pending() == []
print("dropped")
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=env, cwd=os.path.dirname(__file__))
    assert r.returncode == 0 and "dropped" in r.stdout, r.stderr


def test_one_cache_shared_by_threads():
    s = Stack(small_config(page_size=4, gpu_pages=256, host_pages=256, page_bytes=16))
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(200):
                base = int(rng.integers(0, 4)) * 1000
                tokens = np.arange(base, base + 4 * int(rng.integers(1, 6)), dtype=np.int32)
                a = s.cache.admit(np.append(tokens, 7))
                s.cache.wait(a.lock)
                have = len(s.cache.path_pages(a.lock))
                need = len(tokens) // 4
                if need > have:
                    mine = s.cache.alloc_pages(a.lock, need - have)
                    full = np.concatenate([s.cache.path_pages(a.lock), mine])
                    r = s.cache.insert(a.lock, tokens, full)
                    s.cache.free_pages(a.lock, r.not_taken)
                s.cache.release(a.lock)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert s.cache.check_invariants() == ""
    assert s.cache.stats().admissions == 800


# --- snapshot policies ---------------------------------------------------------------------
def test_snapshot_policies_are_the_schedulers():
    p = rt.SnapshotPolicy("interval:64+tail")
    assert p.name == "interval:64+tail" and p.tail and not p.branch
    assert p.next_cut(10) == 64 and rt.SnapshotPolicy("end-only").next_cut(10) is None
    q = rt.SnapshotQuery(boundary=128, prompt_tokens=300, page_size=16, chunk_tokens=64)
    assert p.keep(q)
    q.boundary = 80
    assert not p.keep(q)
    q.boundary = 256  # the +tail boundary: last chunk multiple below 288
    assert p.keep(q) and rt.SnapshotPolicy.tail_boundary(q) == 256
    with pytest.raises(rt.InvalidArgumentError, match="multiple of the page size"):
        rt.SnapshotPolicy("interval:10").validate(16)
    with pytest.raises(rt.InvalidArgumentError, match="unknown snapshot policy"):
        rt.SnapshotPolicy.parse("sometimes")
    b = rt.SnapshotPolicy("budgeted")
    plan = b.plan(rt.SnapshotQuery(prompt_tokens=4096, page_size=16, chunk_tokens=256,
                                   snapshot_bytes=1000, kv_bytes_per_token=100))
    assert plan and all(x % 256 == 0 for x in plan)


def test_one_cache_per_engine():
    # A second cache over one engine would hand out the same pages: the first cache's hits
    # would read the second one's bytes.
    s = Stack()
    with pytest.raises(rt.InvalidArgumentError, match="already serves a PrefixCache"):
        rt.PrefixCache(s.config, s.engine)
    s.serve(np.arange(1, 9))  # the first cache is as it was
    assert s.cache.check_invariants() == ""
    s.cache = None
    gc.collect()
    s.cache = rt.PrefixCache(s.config, s.engine)  # the first one is gone: the engine is free
    assert s.cache.check_invariants() == ""
