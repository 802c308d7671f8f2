"""radixtier's KV events decoded unchanged by vLLM's, Dynamo's and llm-d's subscribers
(restated in kv_consumers.py from their published definitions), for both wire versions:
every batch decodes, each router's copy of the contents equals inspect() (GPU and CPU
media), two namespaces' equal tokens stay two blocks in every router's keys, snapshot events
never reach the vLLM endpoint, replay answers in both reply layouts, and the publisher
connects to a bound subscriber (vLLM's rule)."""

import random

import msgpack
import numpy as np
import pytest
import zmq

import kv_consumers as kc
import radixtier as rt
from conftest import small_config

pytestmark = pytest.mark.skipif(not rt.HAVE_EVENTS, reason="radixtier_events not built")

PS = 4
TOPIC = "kv@pod-a@tiny-hybrid"  # llm-d's kv@<pod-id>@<model-name>
NAMES = {7: "adapter-7"}


class Cache:
    """A cache whose requests insert whole pages in any namespace."""

    def __init__(self):
        self.config = small_config(gpu_pages=24, host_pages=48)
        self.arenas = rt.HostArenas(self.config)
        self.engine = rt.HostTransferEngine(self.arenas, self.config.slice_pages,
                                            rt.HostTransferEngine.Mode.THREADED)
        self.cache = rt.PrefixCache(self.config, self.engine)
        self.known = {0: [], 7: []}

    def serve(self, tokens, ns, snapshot):
        tokens = np.asarray(tokens, dtype=np.int32)
        try:
            a = self.cache.admit(np.append(tokens, 0).astype(np.int32), namespace=ns)
        except rt.OutOfMemoryError:
            return
        try:
            self.cache.wait(a.lock)
            table = self.cache.path_pages(a.lock)
            table = np.concatenate(
                [table, self.cache.alloc_pages(a.lock, len(tokens) // PS - len(table))])
            slot = self.cache.alloc_snapshot_slot(a.lock) if snapshot else None
            self.cache.insert(a.lock, tokens, table, slot)
            self.known[ns].append(list(map(int, tokens)))
        except rt.OutOfMemoryError:
            pass
        finally:
            self.cache.release(a.lock)

    def workload(self, n=240, seed=5, every_40=None):
        """`every_40`: called after every 40th step (a publisher's flush: the stream then has at
        least one batch per 40 steps, however the publisher's thread was scheduled)."""
        rng = random.Random(seed)
        for i in range(n):
            if every_40 is not None and i % 40 == 39:
                every_40()
            base = 1000 * rng.randrange(1, 5)
            tokens = [base + j for j in range(PS * rng.randrange(1, 10))]
            # The same prompts in the default namespace and in namespace 7.
            for ns in (0, 7):
                self.serve(tokens, ns, snapshot=rng.random() < 0.5)
            if i % 60 == 59:
                self.cache.drop_host()
        self.cache.drain()

    def engine_hashes(self, tokens, ns):
        """radixtier's block hashes of `tokens` in namespace `ns` (its id seeds the chain)."""
        out, h = [], ns
        for i in range(0, len(tokens) - len(tokens) % PS, PS):
            h = rt.block_hash(h, np.array(tokens[i:i + PS], dtype=np.int32))
            out.append(h)
        return out

    def expected(self, scope_of, media):
        """{(router key, medium)} of the usable KV, from inspect(); scope_of(ns) is the scope
        the router hashes namespace ns with."""
        want = set()
        res = {rt.Residency.GPU: ["GPU"], rt.Residency.HOST: ["CPU"],
               rt.Residency.BOTH: ["GPU", "CPU"], rt.Residency.NONE: []}
        for ns, prompts in self.known.items():
            for tokens in prompts:
                keys = kc.router_keys(tokens, PS, scope_of(ns))
                for n in self.cache.inspect(np.array(tokens, dtype=np.int32), namespace=ns):
                    for md in res[n.kv]:
                        for p in range((n.boundary - n.tokens) // PS, n.matched // PS):
                            want.add((keys[p], media[md]))
        return want


class RouterView:
    """A router's copy of one engine: engine hash -> its own key (the prefix it hashes), per
    medium; what it routes by."""

    def __init__(self):
        self.key_of = {}
        self.blocks = {}  # (engine hash, medium) -> router key

    def stored(self, hashes, parent, tokens, block_size, medium, scope):
        prefix = self.key_of[parent] if parent else (scope,)
        for i, h in enumerate(hashes):
            prefix = prefix + tuple(tokens[i * block_size:(i + 1) * block_size])
            self.key_of[h] = prefix
            assert (h, medium) not in self.blocks
            self.blocks[(h, medium)] = prefix

    def removed(self, hashes, medium):
        for h in hashes:
            del self.blocks[(h, medium)]

    def apply(self, events, scope, medium="medium"):
        """Events as a decoder returned them: scope(event) is what the router hashes a stored
        block's tokens with, `medium` the key of the tier (llm-d's parent 0 is none)."""
        for ev in events:
            if ev["type"] == "BlockStored":
                self.stored(ev["block_hashes"], ev["parent_block_hash"] or None, ev["token_ids"],
                            ev["block_size"], ev[medium], scope(ev))
            elif ev["type"] == "BlockRemoved":
                self.removed(ev["block_hashes"], ev[medium])
            elif ev["type"] == "AllBlocksCleared":
                self.blocks.clear()

    def keys(self):
        return {(k, md) for (_, md), k in self.blocks.items()}


def first_reply_to_req(ctx, endpoint):
    """vLLM's example subscriber's replay request, from a REQ socket (which strips the
    envelope and takes one reply per request): the frames of the first reply."""
    req = ctx.socket(zmq.REQ)
    req.connect(endpoint)
    req.send((0).to_bytes(8, "big"))
    assert req.poll(5000), "no replay answer"
    frames = req.recv_multipart()
    req.close(linger=0)
    return frames


def replay_dealer(ctx, endpoint, layout):
    """The same request from a DEALER (an empty delimiter first): every reply is read."""
    s = ctx.socket(zmq.DEALER)
    s.connect(endpoint)
    s.send_multipart([b"", (0).to_bytes(8, "big")])
    out = []
    while True:
        assert s.poll(5000), "no replay answer"
        frames = s.recv_multipart()[1:]
        seq, payload = frames[-2], frames[-1]
        assert len(frames) == (3 if layout == "topic-seq-payload" else 2)
        if not payload:
            assert int.from_bytes(seq, "big", signed=True) == -1
            break
        topic = frames[0] if layout == "topic-seq-payload" else TOPIC.encode()
        out.append((topic, seq, payload))
    s.close(linger=0)
    return out


def publish(cache, **options):
    pub = rt.EventPublisher(cache.cache, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", TOPIC,
                            data_parallel_rank=2, namespace_names=NAMES, **options)
    cache.workload(every_40=lambda: pub.flush(10.0))
    assert pub.flush(10.0) and pub.dropped == 0
    return pub


@pytest.mark.parametrize("wire", ["vllm-current", "vllm-legacy"])
def test_every_router_decodes_the_stream_and_rebuilds_the_contents(wire):
    c = Cache()
    pub = publish(c, wire_format=wire)
    ctx = zmq.Context()
    messages = replay_dealer(ctx, pub.replay_endpoint, "topic-seq-payload")
    assert [int.from_bytes(s, "big") for _, s, _ in messages] == list(range(pub.batches))
    assert len(messages) > 5
    layout = "current" if wire == "vllm-current" else "legacy"
    media = {"GPU": "GPU", "CPU": "CPU"}
    vllm, dynamo, llmd = RouterView(), RouterView(), RouterView()
    for topic, seq, payload in messages:
        assert topic == TOPIC.encode()
        # vLLM: its own structs, the layout of this wire version (the other one fails).
        batch = kc.vllm_decode(payload, layout)
        assert batch["data_parallel_rank"] == 2
        with pytest.raises(kc.DecodeError):
            kc.vllm_decode(payload, "legacy" if layout == "current" else "current")
        for ev in batch["events"]:
            if ev["type"] == "BlockStored":
                assert ev["block_size"] == PS and ev["medium"] in ("GPU", "CPU")
                assert (ev["lora_id"] is None) == (ev["lora_name"] is None)
        vllm.apply(batch["events"], lambda ev: ev["lora_name"])
        # Dynamo: the 3-tuple, maps or sequences; lora_name and the cache namespace scope it.
        batch = kc.dynamo_decode(payload)
        assert batch["data_parallel_rank"] == 2
        dynamo.apply(batch["events"], lambda ev: (ev["lora_name"], ev["cache_namespace"]))
        # llm-d: the topic names pod and model; lora_name, when set, is the model.
        pod, model, events = kc.llmd_decode([topic, seq, payload])
        assert (pod, model) == ("pod-a", "tiny-hybrid")
        llmd.apply(events, lambda ev: ev["model"], medium="device_tier")

    def name(ns):
        return NAMES.get(ns) if ns else None

    assert vllm.keys() == c.expected(name, media)
    assert dynamo.keys() == c.expected(lambda ns: (name(ns), None), media)
    assert llmd.keys() == c.expected(lambda ns: name(ns) or "tiny-hybrid",
                                     {"GPU": "gpu", "CPU": "cpu"})
    # Equal tokens in two namespaces are two blocks in every router's keys.
    both = {k for k, _ in vllm.keys() if k[0] is None} & {
        (None,) + k[1:] for k, _ in vllm.keys() if k[0] == "adapter-7"}
    assert both, "the workload puts the same prompts in both namespaces"
    # The engine hashes a router reproduces: namespace 7's chain starts from its id.
    for tokens in c.known[7][:5]:
        hashes = c.engine_hashes(tokens, 7)
        assert any(h in vllm.key_of for h in hashes)
    pub.close()
    ctx.destroy()


def test_an_overloaded_queue_restarts_the_stream_and_every_router_ends_exact():
    """A 4-event queue (issue 34): the publisher drops, and the cache restarts the stream
    (AllBlocksCleared, then the contents) at its next entry point, so each router's copy,
    applying every batch in order, equals inspect() at the end."""
    c = Cache()
    pub = rt.EventPublisher(c.cache, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", TOPIC,
                            queue_capacity=4, namespace_names=NAMES)
    c.workload(n=120)
    for _ in range(5):  # the restart waiting is taken, then a last loss is restarted
        assert pub.flush(10.0)
        c.cache.poll()
    assert pub.flush(10.0)
    assert pub.dropped > 0 and pub.restarts > 0
    ctx = zmq.Context()
    messages = replay_dealer(ctx, pub.replay_endpoint, "topic-seq-payload")
    assert [int.from_bytes(s, "big") for _, s, _ in messages] == list(range(pub.batches))
    vllm, dynamo, llmd = RouterView(), RouterView(), RouterView()
    cleared = 0
    for topic, seq, payload in messages:
        batch = kc.vllm_decode(payload, "current")
        cleared += sum(ev["type"] == "AllBlocksCleared" for ev in batch["events"])
        vllm.apply(batch["events"], lambda ev: ev["lora_name"])
        dynamo.apply(kc.dynamo_decode(payload)["events"],
                     lambda ev: (ev["lora_name"], ev["cache_namespace"]))
        llmd.apply(kc.llmd_decode([topic, seq, payload])[2], lambda ev: ev["model"],
                   medium="device_tier")
    assert cleared > 1, "the restarts reached the routers"

    def name(ns):
        return NAMES.get(ns) if ns else None

    media = {"GPU": "GPU", "CPU": "CPU"}
    assert vllm.keys() and vllm.keys() == c.expected(name, media)
    assert dynamo.keys() == c.expected(lambda ns: (name(ns), None), media)
    assert llmd.keys() == c.expected(lambda ns: name(ns) or "tiny-hybrid",
                                     {"GPU": "gpu", "CPU": "cpu"})
    pub.close()
    ctx.destroy()


def test_a_router_without_the_namespace_name_would_merge_two_namespaces():
    # The control for the test above: the same stream with lora_name dropped (what a router
    # keyed on lora_name saw when only lora_id was sent) files both namespaces' equal
    # tokens under one key.
    c = Cache()
    pub = publish(c)
    ctx = zmq.Context()
    view = RouterView()
    for _, _, payload in replay_dealer(ctx, pub.replay_endpoint, "topic-seq-payload"):
        view.apply(kc.vllm_decode(payload, "current")["events"], lambda ev: None)
    assert len(view.keys()) < len(view.blocks), "two engine blocks under one router key"
    pub.close()
    ctx.destroy()


def test_cache_salt_scopes_dynamos_keys():
    c = Cache()
    pub = publish(c, namespace_field="cache-salt")
    ctx = zmq.Context()
    dynamo = RouterView()
    for topic, seq, payload in replay_dealer(ctx, pub.replay_endpoint, "topic-seq-payload"):
        for ev in kc.vllm_decode(payload, "current")["events"]:  # vLLM ignores cache_salt
            assert ev.get("lora_name") is None and ev.get("lora_id") is None
        kc.llmd_decode([topic, seq, payload])  # decodes (llm-d keys on lora_name only)
        dynamo.apply(kc.dynamo_decode(payload)["events"],
                     lambda ev: (ev["lora_name"], ev["cache_namespace"]))
    assert dynamo.keys() == c.expected(lambda ns: (None, NAMES.get(ns)),
                                       {"GPU": "GPU", "CPU": "CPU"})
    pub.close()
    ctx.destroy()
    with pytest.raises(rt.InvalidArgumentError, match="cache_salt slot"):
        rt.EventPublisher(c.cache, "tcp://127.0.0.1:*", namespace_field="cache-salt",
                          wire_format="vllm-legacy")


def test_snapshot_events_only_on_their_own_endpoint_which_routers_cannot_decode():
    c = Cache()
    pub = publish(c, snapshot_endpoint="tcp://127.0.0.1:*",
                  snapshot_replay_endpoint="tcp://127.0.0.1:*")
    ctx = zmq.Context()
    # A subscriber of "" on the vLLM endpoint: the whole vLLM stream, no snapshot tag.
    for _, _, payload in replay_dealer(ctx, pub.replay_endpoint, "topic-seq-payload"):
        tags = {ev["type"] for ev in msgpack.unpackb(payload)[1]}
        assert tags <= {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
        kc.vllm_decode(payload, "current")
        kc.dynamo_decode(payload)
    # The full stream carries them (and every block event, in the cache's order); the three
    # routers reject a batch that holds one: why they travel apart.
    full = replay_dealer(ctx, pub.snapshot_replay_endpoint, "topic-seq-payload")
    assert len(full) == pub.snapshot_batches >= pub.batches  # a twin of every vLLM batch
    with_snapshots = [m for m in full
                      if any(ev["type"] == "SnapshotStored" for ev in msgpack.unpackb(m[2])[1])]
    assert with_snapshots
    topic, seq, payload = with_snapshots[0]
    assert topic == b"kv-snapshots"
    with pytest.raises(kc.DecodeError):
        kc.vllm_decode(payload, "current")
    with pytest.raises(kc.DecodeError):
        kc.dynamo_decode(payload)
    with pytest.raises(kc.DecodeError):
        kc.llmd_decode([TOPIC.encode(), seq, payload])
    ev = next(e for e in msgpack.unpackb(payload)[1] if e["type"] == "SnapshotStored")
    assert set(ev) == {"type", "block_hash", "boundary", "medium"} and ev["boundary"] % PS == 0
    pub.close()
    ctx.destroy()


@pytest.mark.parametrize("layout", ["topic-seq-payload", "seq-payload"])
def test_replay_replies_in_either_layout(layout):
    c = Cache()
    pub = publish(c, replay_format=layout)
    ctx = zmq.Context()
    got = replay_dealer(ctx, pub.replay_endpoint, layout)
    assert [int.from_bytes(s, "big") for _, s, _ in got] == list(range(pub.batches))
    # vLLM's example subscriber's REQ socket gets the same first reply, unwrapped.
    first = first_reply_to_req(ctx, pub.replay_endpoint)
    topic, seq, payload = got[0]
    assert first == ([topic, seq, payload] if layout == "topic-seq-payload" else [seq, payload])
    pub.close()
    ctx.destroy()


def test_dynamo_needs_the_rank_vllm_does_not():
    two = msgpack.packb([1.5, []])
    assert kc.vllm_decode(two, "current")["data_parallel_rank"] is None
    with pytest.raises(kc.DecodeError, match="size 3"):
        kc.dynamo_decode(two)
    assert kc.dynamo_decode(msgpack.packb([1.5, [], 0]))["data_parallel_rank"] == 0


def test_the_publisher_connects_to_a_bound_subscriber():
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")  # llm-d's central subscriber's filter
    sub.bind("tcp://127.0.0.1:*")
    at = sub.getsockopt(zmq.LAST_ENDPOINT).decode()
    c = Cache()
    pub = rt.EventPublisher(c.cache, at, topic=TOPIC)
    assert pub.endpoint == at
    frames = None
    for i in range(100):
        c.serve([100 * (i + 1) + j for j in range(8)], 0, snapshot=False)
        assert pub.flush(5.0)
        if sub.poll(100):
            frames = sub.recv_multipart()
            break
    assert frames is not None, "the connected publisher reached the bound subscriber"
    pod, model, events = kc.llmd_decode(frames)
    assert (pod, model) == ("pod-a", "tiny-hybrid") and events
    pub.close()
    ctx.destroy()


def test_bad_options_raise_and_publish_nothing():
    c = Cache()
    for kwargs, what in [({"wire_format": "vllm"}, "wire_format"),
                         ({"replay_format": "x"}, "replay_format"),
                         ({"namespace_field": "salt"}, "namespace_field"),
                         ({"data_parallel_rank": -1}, "data_parallel_rank"),
                         ({"namespace_names": {1: "a", 2: "a"}}, "names two namespaces")]:
        with pytest.raises(rt.InvalidArgumentError, match=what):
            rt.EventPublisher(c.cache, "tcp://127.0.0.1:*", **kwargs)
