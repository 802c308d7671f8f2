"""Key namespaces, retention priorities and host pins through the binding (issue 15)."""

import numpy as np
import pytest

import radixtier as rt


def serve(cache, tokens, namespace=0, priority=35):
    """Inserts `tokens` (whole pages, a snapshot at the end) as one request of `namespace`."""
    tokens = np.asarray(tokens, dtype=np.int32)
    a = cache.admit(np.append(tokens, 0).astype(np.int32), namespace=namespace,
                    priority=priority)
    cache.wait(a.lock)
    table = cache.path_pages(a.lock)
    need = len(tokens) // cache.page_size - len(table)
    table = np.concatenate([table, cache.alloc_pages(a.lock, need)])
    cache.insert(a.lock, tokens, table, cache.alloc_snapshot_slot(a.lock))
    cache.release(a.lock)
    return a


def test_namespaces_priorities_and_pins(stack):
    c = stack.cache
    tokens = list(range(1, 9))
    assert serve(c, tokens, namespace=0).cached_tokens == 0
    assert serve(c, tokens, namespace=3, priority=80).cached_tokens == 0  # nothing shared
    assert c.match(tokens, namespace=3).usable_tokens == 8
    assert c.match(tokens, namespace=4).usable_tokens == 0
    assert c.inspect(tokens, namespace=3)[0].kv_priority == 80
    assert c.inspect(tokens)[0].kv_priority == 35
    with pytest.raises(rt.InvalidArgumentError, match="priority"):
        c.admit(tokens + [0], priority=101)

    pin = c.pin(tokens, namespace=3)
    assert c.pinned_host_pages > 0 and c.inspect(tokens, namespace=3)[0].pins == 1
    c.flush()
    assert c.match(tokens).usable_tokens == 0
    assert c.match(tokens, namespace=3).usable_tokens == 8  # pinned: kept on host
    c.unpin(pin)
    with pytest.raises(rt.NotFoundError):
        c.unpin(pin)
    c.flush(namespace=3)
    assert c.match(tokens, namespace=3).usable_tokens == 0
    assert c.check_invariants() == ""


def test_pins_beyond_their_share_are_refused():
    from conftest import Stack, small_config

    s = Stack(small_config(host_pin_share=0.0))
    serve(s.cache, list(range(1, 9)))
    with pytest.raises(rt.OutOfMemoryError, match="host_pin_share"):
        s.cache.pin(list(range(1, 9)))
    assert s.cache.config.host_pin_share == 0.0
