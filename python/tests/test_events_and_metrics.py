"""KV events and Prometheus metrics from Python: a router subscribes to the full stream over
ZMQ (python3-zmq, python3-msgpack), rebuilds the cache's contents, snapshots included, from
the events alone and finds inspect()'s (test_kv_event_consumers.py: vLLM's, Dynamo's and
llm-d's decoders on the vLLM stream);
the reference engine's metrics endpoint, scraped over HTTP, reports stats()."""

import ctypes
import ctypes.util
import random
import struct
import urllib.request

import msgpack
import numpy as np
import pytest
import zmq

import radixtier as rt
from conftest import Stack, small_config

pytestmark = pytest.mark.skipif(not (rt.HAVE_EVENTS and rt.HAVE_METRICS),
                                reason="radixtier_events / radixtier_metrics not built")


def _xxh64():
    lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
    lib.XXH64.restype = ctypes.c_uint64
    lib.XXH64.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]
    return lib.XXH64


def test_block_hash_is_xxh64_of_the_documented_bytes():
    xxh64 = _xxh64()  # the system's libxxhash, not radixtier's code
    parent = 0
    tokens = [5, -1, 70000, 2**31 - 1, 0, 9, 9, 9]
    for i in range(0, len(tokens), 4):
        page = tokens[i:i + 4]
        data = struct.pack("<Q", parent) + struct.pack(f"<{len(page)}i", *page)
        want = xxh64(data, len(data), 0)
        assert rt.block_hash(parent, np.array(page, dtype=np.int32)) == want
        parent = want
    assert rt.block_hashes(np.array(tokens, dtype=np.int32), 4)[-1] == parent


class Router:
    """A router's copy of one worker's cache, from the full stream (snapshot_endpoint: vLLM's
    events as tagged maps, and the snapshot events) alone."""

    def __init__(self, page_size):
        self.ps = page_size
        self.blocks = {}  # (hash, medium) -> tokens
        self.snapshots = set()  # (hash, boundary, medium)

    def apply(self, payload):
        batch = msgpack.unpackb(payload, raw=False)
        ts, events, rank = batch  # [ts, events, data_parallel_rank]
        assert isinstance(ts, float) and rank == 0
        for ev in events:
            tag = ev["type"]
            if tag == "BlockStored":
                assert ev["block_size"] == self.ps and ev["medium"] in ("GPU", "CPU")
                assert ev["lora_name"] is None and ev["lora_id"] is None  # default namespace
                h = ev["parent_block_hash"] if ev["parent_block_hash"] is not None else 0
                tokens, bs = ev["token_ids"], ev["block_size"]
                for i, bh in enumerate(ev["block_hashes"]):
                    page = tokens[i * bs:(i + 1) * bs]
                    h = rt.block_hash(h, np.array(page, dtype=np.int32))
                    assert h == bh, "a router reproduces every hash from the tokens"
                    assert (bh, ev["medium"]) not in self.blocks
                    self.blocks[(bh, ev["medium"])] = tuple(page)
            elif tag == "BlockRemoved":
                for bh in ev["block_hashes"]:
                    del self.blocks[(bh, ev["medium"])]
            elif tag == "AllBlocksCleared":
                self.blocks.clear()
                self.snapshots.clear()
            elif tag == "SnapshotStored":
                key = (ev["block_hash"], ev["boundary"], ev["medium"])
                assert key not in self.snapshots
                self.snapshots.add(key)
            elif tag == "SnapshotRemoved":
                self.snapshots.remove((ev["block_hash"], ev["boundary"], ev["medium"]))
            else:
                raise AssertionError(f"unknown event {tag}")


def expected(cache, known, ps):
    blocks, snaps = {}, set()
    media = {rt.Residency.GPU: ["GPU"], rt.Residency.HOST: ["CPU"],
             rt.Residency.BOTH: ["GPU", "CPU"], rt.Residency.NONE: []}
    for tokens in known:
        arr = np.array(tokens, dtype=np.int32)
        hashes = rt.block_hashes(arr, ps)
        for n in cache.inspect(arr):
            for md in media[n.kv]:
                for p in range((n.boundary - n.tokens) // ps, n.matched // ps):
                    blocks[(hashes[p], md)] = tuple(tokens[p * ps:(p + 1) * ps])
            if n.matched == n.boundary:
                for md in media[n.snapshot]:
                    snaps.add((hashes[n.boundary // ps - 1], n.boundary, md))
    return blocks, snaps


def replay_all(ctx, endpoint, router, start=0):
    req = ctx.socket(zmq.DEALER)
    req.connect(endpoint)
    req.send_multipart([b"", start.to_bytes(8, "big")])
    seqs = []
    while True:
        assert req.poll(5000), "no replay answer"
        _, _topic, seq, payload = req.recv_multipart()
        if not payload:
            assert int.from_bytes(seq, "big", signed=True) == -1
            break
        seqs.append(int.from_bytes(seq, "big"))
        router.apply(payload)
    req.close()
    return seqs


def test_router_rebuilds_the_contents_from_zmq_events():
    st = Stack(small_config(gpu_pages=32, host_pages=48))
    pub = rt.EventPublisher(st.cache, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*",
                            snapshot_endpoint="tcp://127.0.0.1:*",
                            snapshot_replay_endpoint="tcp://127.0.0.1:*")
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-snapshots")
    sub.connect(pub.snapshot_endpoint)
    rng = random.Random(3)
    known = []
    for i in range(400):
        base = 1000 * rng.randrange(1, 5)
        tokens = [base + j for j in range(4 * rng.randrange(1, 12))]
        known.append(tokens)
        try:
            st.serve(tokens, snapshot=rng.random() < 0.5)
        except rt.OutOfMemoryError:
            pass
        if i % 50 == 49:
            st.cache.drop_host()
    st.cache.drain()
    assert pub.flush(10.0)
    assert pub.flush(float("inf"))  # no limit, not a negative wait
    for bad in (float("nan"), -1.0):
        with pytest.raises(rt.InvalidArgumentError, match="timeout_s"):
            pub.flush(bad)
    router = Router(4)
    seqs = replay_all(ctx, pub.snapshot_replay_endpoint, router)
    assert seqs == list(range(pub.snapshot_batches)) and pub.dropped == 0
    want_blocks, want_snaps = expected(st.cache, known, 4)
    # What is left at the end depends on how the threaded copies interleaved with the serves
    # (14 blocks alone, 8 on a loaded machine): the check needs some, not a number.
    assert router.blocks == want_blocks and len(want_blocks) >= 4
    assert router.snapshots == want_snaps
    # The live stream: topic, 8-byte big-endian sequence number, payload.
    st.cache.flush()
    assert pub.flush(10.0)
    last = pub.snapshot_batches - 1
    while True:
        assert sub.poll(5000), "no live message"
        topic, seq, payload = sub.recv_multipart()
        assert topic == b"kv-snapshots"
        if int.from_bytes(seq, "big") == last:
            router.apply(payload)
            break
    assert router.blocks == {} and router.snapshots == set()
    pub.close()
    ctx.destroy()


def scrape(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.mark.parametrize("name", ["churn", "faults"])
def test_reference_engine_serves_metrics_and_events(name):
    from reference_engine import scenarios
    from reference_engine.engine import Engine
    from reference_engine.model import HybridModel

    s = getattr(scenarios, name)(scale=0.25)
    s.engine.metrics_bind = "127.0.0.1:0"
    s.engine.events_endpoint = "tcp://127.0.0.1:*"
    s.engine.events_replay_endpoint = "tcp://127.0.0.1:*"
    s.engine.events_options = dict(snapshot_endpoint="tcp://127.0.0.1:*",
                                   snapshot_replay_endpoint="tcp://127.0.0.1:*")
    model = HybridModel(s.model)
    engine = Engine(model, s.engine, s.failing_submissions, s.fail_at_admission)
    for r in s.requests:
        engine.submit(r)
    results = engine.run()
    engine.cache.drain()
    # Events: a router's copy rebuilt from the replay equals inspect() along every sequence
    # the engine inserted (each request's prompt and output).
    assert engine.events.flush(10.0)
    ctx = zmq.Context()
    router = Router(model.page_size)
    replay_all(ctx, engine.events.snapshot_replay_endpoint, router)
    ctx.destroy()
    known = [list(map(int, r.prompt)) + list(results[r.id].output) for r in s.requests
             if r.id in results]
    want_blocks, want_snaps = expected(engine.cache, known, model.page_size)
    assert router.blocks == want_blocks and want_blocks
    assert router.snapshots == want_snaps
    engine.events.close()
    # Metrics: the scrape equals stats().
    engine.metrics.update()
    st = engine.cache.stats()
    m = scrape(engine.metrics.port)
    assert st.admissions > 0 and m["radixtier_admissions_total"] == st.admissions
    assert m['radixtier_hit_tokens_total{tier="gpu"}'] == st.hit_tokens_gpu
    assert m['radixtier_hit_tokens_total{tier="host"}'] == st.hit_tokens_host
    assert m['radixtier_copy_bytes_total{direction="d2h"}'] == st.bytes_d2h
    assert m['radixtier_copy_bytes_total{direction="h2d"}'] == st.bytes_h2d
    assert m['radixtier_copies_total{direction="d2h"}'] == st.copies_d2h
    assert m["radixtier_kv_pages_demoted_total"] == st.kv_pages_demoted
    assert m["radixtier_transfers_failed_total"] == st.transfers_failed
    occ = engine.cache.occupancy()
    assert m['radixtier_pool_free{pool="gpu_pages"}'] == occ.gpu_pages_free
    assert m["radixtier_admission_latency_seconds_count"] == st.admissions
    engine.metrics.close()
