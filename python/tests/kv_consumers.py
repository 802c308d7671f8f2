"""The KV event decoders of three routers, restated from their published definitions with
python3-msgpack (none of their code is copied; each decoder follows the rules the cited
definitions state, and fails where they fail):

vLLM     vllm/distributed/kv_events.py: EventBatch (msgspec Struct, array_like, omit_defaults:
         [ts, events, data_parallel_rank=None]); KVCacheEvent (tag=True, omit_defaults; in
         the current layout a map tagged under "type", in the legacy layout array_like too);
         BlockStored, BlockRemoved, AllBlocksCleared and their fields. msgspec's rules: a
         field without a default must be there, with its type (an int is not a bool); an
         unknown key of a map is ignored; an array may carry extra trailing elements; an
         unknown tag fails the whole batch.
         its example subscriber (examples/features/kv_events/, formerly
         examples/online_serving/): SUB on the topic, REQ replay.
Dynamo   lib/kv-router/src/zmq_wire/types.rs (KvEventBatch: the tuple (f64, Vec<RawKvEvent>,
         Option<i32>); BlockHashValue i64 | u64; token ids u32) and deserialize.rs
         (RawKvEventVisitor: a tagged map by field name, "cache_salt" the cache namespace, or a
         sequence by position; an unknown tag fails), extra_keys.rs
         (extra_keys_to_cache_namespace: "dynamo-cache-salt:" in the first block's keys).
llm-d    pkg/kvevents/engineadapter/vllm_adapter.go (VLLMAdapter.ParseMessage: the topic
         "kv@<pod-id>@<model-name>", an array batch of 2 or 3; decodeVLLMEvent: an event
         array or a map normalised by field order; an unknown tag fails; the converters'
         positions) and pkg/kvevents/pool.go (processEventBatch: lora_name, when set, replaces
         the model name in the block keys; the medium lower-cased, "gpu" when absent).

Each decoder returns plain dicts; `router_keys` gives the key each router files a block
under when it hashes a request's tokens itself (what decides where a request goes)."""

import msgpack


class DecodeError(Exception):
    pass


def _unpack(payload):
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as e:  # noqa: BLE001 - any malformed payload
        raise DecodeError(f"not msgpack: {e}") from e


# --- type checks (msgspec's: bool is not an int) -----------------------------------------

def _int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _opt(check):
    return lambda v: v is None or check(v)


def _list(check):
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def _str(v):
    return isinstance(v, str)


def _hash(v):  # vLLM's ExternalBlockHash: bytes | int
    return isinstance(v, bytes) or _int(v)


REQUIRED = object()

# vllm/distributed/kv_events.py, in declaration order: (name, check, default).
VLLM_EVENTS = {
    "BlockStored": [
        ("block_hashes", _list(_hash), REQUIRED),
        ("parent_block_hash", _opt(_hash), REQUIRED),
        ("token_ids", _list(_int), REQUIRED),
        ("block_size", _int, REQUIRED),
        ("lora_id", _opt(_int), REQUIRED),
        ("medium", _opt(_str), REQUIRED),
        ("lora_name", _opt(_str), REQUIRED),
        ("extra_keys", lambda v: v is None or isinstance(v, list), None),
        ("group_idx", _opt(_int), None),
        ("kv_cache_spec_kind", _opt(_str), None),
        ("kv_cache_spec_sliding_window", _opt(_int), None),
        ("locality", _opt(_str), None),
        ("ownership", _opt(_str), None),
    ],
    "BlockRemoved": [
        ("block_hashes", _list(_hash), REQUIRED),
        ("medium", _opt(_str), REQUIRED),
        ("group_idx", _opt(_int), None),
        ("locality", _opt(_str), None),
        ("ownership", _opt(_str), None),
    ],
    "AllBlocksCleared": [],
}


def vllm_decode(payload, layout):
    """msgspec.msgpack.Decoder(KVEventBatch).decode(payload) for vLLM's definitions:
    layout "current" (events as tagged maps) or "legacy" (events array_like)."""
    batch = _unpack(payload)
    if not isinstance(batch, list):
        raise DecodeError("EventBatch: expected an array")
    if len(batch) < 2:
        raise DecodeError("EventBatch: expected an array of at least length 2")
    ts, events = batch[0], batch[1]
    rank = batch[2] if len(batch) > 2 else None
    if not (isinstance(ts, float) or _int(ts)):
        raise DecodeError("EventBatch.ts: expected a float")
    if not isinstance(events, list):
        raise DecodeError("EventBatch.events: expected an array")
    if not _opt(_int)(rank):
        raise DecodeError("EventBatch.data_parallel_rank: expected an int or None")
    out = []
    for ev in events:
        if layout == "current":
            if not isinstance(ev, dict):
                raise DecodeError(f"expected an object, got {type(ev).__name__}")
            tag = ev.get("type")
            if tag not in VLLM_EVENTS:
                raise DecodeError(f"invalid value {tag!r} for the tag 'type'")
            fields = {}
            for name, check, default in VLLM_EVENTS[tag]:
                if name not in ev:
                    if default is REQUIRED:
                        raise DecodeError(f"{tag}: object missing required field {name!r}")
                    fields[name] = default
                    continue
                if not check(ev[name]):
                    raise DecodeError(f"{tag}.{name}: wrong type {ev[name]!r}")
                fields[name] = ev[name]
        else:
            if not isinstance(ev, list) or not ev:
                raise DecodeError(f"expected an array, got {type(ev).__name__}")
            tag = ev[0]
            if tag not in VLLM_EVENTS:
                raise DecodeError(f"invalid value {tag!r} for the tag")
            spec = VLLM_EVENTS[tag]
            required = sum(default is REQUIRED for _, _, default in spec)
            if len(ev) - 1 < required:
                raise DecodeError(f"{tag}: expected an array of at least length {required + 1}")
            fields = {}
            for i, (name, check, default) in enumerate(spec):
                value = ev[i + 1] if i + 1 < len(ev) else default
                if not check(value):
                    raise DecodeError(f"{tag}.{name}: wrong type {value!r}")
                fields[name] = value
        out.append({"type": tag, **fields})
    return {"ts": ts, "events": out, "data_parallel_rank": rank}


# --- Dynamo ---------------------------------------------------------------------------

DYNAMO_SALT_PREFIX = "dynamo-cache-salt:"


def _u64(v):
    if not _int(v) or not -(2**63) <= v < 2**64:
        raise DecodeError(f"BlockHashValue: {v!r} is not an i64 or u64")
    return v % 2**64


def _u32_list(v):
    if not isinstance(v, list) or not all(_int(x) and 0 <= x < 2**32 for x in v):
        raise DecodeError("token_ids: expected a sequence of u32")
    return v


def _opt_text(v, what):
    if v is not None and not _str(v):
        raise DecodeError(f"{what}: expected a string or nil")
    return v or None  # an empty medium or salt is absent


def _dynamo_salt_from_extra_keys(extra_keys, lora_name):
    if not extra_keys or not isinstance(extra_keys[0], list):
        return None
    unmatched = lora_name
    for key in extra_keys[0]:
        if not _str(key):
            continue
        if unmatched and key == unmatched:
            unmatched = None
            continue
        if key.startswith(DYNAMO_SALT_PREFIX) and len(key) > len(DYNAMO_SALT_PREFIX):
            return key[len(DYNAMO_SALT_PREFIX):]
    return None


def dynamo_decode(payload):
    """rmp_serde::from_slice::<KvEventBatch>(payload) for Dynamo's zmq_wire."""
    batch = _unpack(payload)
    if not isinstance(batch, list) or len(batch) != 3:
        raise DecodeError("KvEventBatch: invalid length, expected a tuple of size 3")
    ts, events, rank = batch
    if not (isinstance(ts, float) or _int(ts)):
        raise DecodeError("KvEventBatch.ts: expected f64")
    if rank is not None and not (_int(rank) and -(2**31) <= rank < 2**31):
        raise DecodeError("KvEventBatch.data_parallel_rank: expected Option<i32>")
    if not isinstance(events, list):
        raise DecodeError("KvEventBatch.events: expected a sequence")
    out = []
    for ev in events:
        if isinstance(ev, dict):
            tag = ev.get("type")
            if tag is None:
                raise DecodeError("missing field `type`")
            get = ev.get
            fields = {k: ev[k] for k in ev}
        elif isinstance(ev, list) and ev and _str(ev[0]):
            tag = ev[0]
            order = {
                "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size",
                                "lora_id", "medium", "lora_name", "extra_keys"],
                "BlockRemoved": ["block_hashes", "medium"],
            }.get(tag, [])
            fields = {name: ev[i + 1] for i, name in enumerate(order) if i + 1 < len(ev)}
            get = fields.get
        else:
            raise DecodeError("a kv event encoded as a tagged map or sequence")
        if tag == "BlockStored":
            for need in ("block_hashes", "token_ids", "block_size"):
                if need not in fields:
                    raise DecodeError(f"missing field `{need}`")
            if not _int(fields["block_size"]) or fields["block_size"] < 0:
                raise DecodeError("block_size: expected usize")
            parent = get("parent_block_hash")
            lora_name = _opt_text(get("lora_name"), "lora_name")
            salt = _opt_text(get("cache_salt"), "cache_salt") if isinstance(ev, dict) else None
            if salt is None:
                salt = _dynamo_salt_from_extra_keys(get("extra_keys"), lora_name)
            if not isinstance(fields["block_hashes"], list):
                raise DecodeError("block_hashes: expected a sequence")
            out.append({
                "type": tag,
                "block_hashes": [_u64(h) for h in fields["block_hashes"]],
                "parent_block_hash": None if parent is None else _u64(parent),
                "token_ids": _u32_list(fields["token_ids"]),
                "block_size": fields["block_size"],
                "medium": _opt_text(get("medium"), "medium"),
                "lora_name": lora_name,
                "cache_namespace": salt,
            })
        elif tag == "BlockRemoved":
            if "block_hashes" not in fields or not isinstance(fields["block_hashes"], list):
                raise DecodeError("missing field `block_hashes`")
            out.append({"type": tag, "block_hashes": [_u64(h) for h in fields["block_hashes"]],
                        "medium": _opt_text(get("medium"), "medium")})
        elif tag in ("AllBlocksCleared", "Ignored"):
            out.append({"type": tag})
        else:
            raise DecodeError(f"unknown variant `{tag}`, expected one of `BlockStored`, "
                              "`BlockRemoved`, `AllBlocksCleared`, `Ignored`")
    return {"ts": ts, "events": out, "data_parallel_rank": rank}


# --- llm-d ----------------------------------------------------------------------------

LLMD_FIELD_ORDER = {
    "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                    "kv_cache_spec_sliding_window"],
    "BlockRemoved": ["block_hashes", "medium", "group_idx"],
    "AllBlocksCleared": [],
}


def llmd_parse_topic(topic):
    """parseVLLMTopic: "kv@<pod-id>@<model-name>" -> (pod, model); else (topic, "")."""
    parts = topic.split("@")
    return (parts[1], parts[2]) if len(parts) == 3 else (topic, "")


def _llmd_hash(v):
    if isinstance(v, bytes):
        if not v:
            raise DecodeError("hash byte slice is empty")
        return int.from_bytes(v[-8:].rjust(8, b"\0"), "big")
    if _int(v):
        return v % 2**64
    raise DecodeError(f"unsupported hash type: {type(v).__name__}")


def llmd_decode(frames):
    """VLLMAdapter: the three frames [topic, seq, payload] -> (pod, model, events), the
    events as processEventBatch sees them (tier lower-cased, the effective model name)."""
    if len(frames) != 3:
        raise DecodeError(f"expected 3 message parts from vLLM, got {len(frames)}")
    topic, seq, payload = frames
    if len(seq) != 8:
        raise DecodeError(f"invalid sequence bytes length: {len(seq)}")
    pod, model = llmd_parse_topic(topic.decode())
    batch = _unpack(payload)
    if not isinstance(batch, list) or len(batch) not in (2, 3):
        raise DecodeError("failed to decode vLLM event batch")
    if not isinstance(batch[0], float) or not isinstance(batch[1], list):
        raise DecodeError("failed to decode vLLM event batch")
    out = []
    for ev in batch[1]:
        if isinstance(ev, dict):
            if "type" not in ev:
                raise DecodeError('map-encoded event is missing the "type" tag')
            tag = ev["type"]
            fields = [tag] + [ev.get(n) for n in LLMD_FIELD_ORDER.get(tag, [])]
        elif isinstance(ev, list):
            fields = ev
        else:
            raise DecodeError("event is neither an array nor a map")
        if not fields or not _str(fields[0]):
            raise DecodeError("malformed tagged union")
        tag = fields[0]
        if tag not in LLMD_FIELD_ORDER:
            raise DecodeError(f"unknown vLLM event tag: {tag}")

        def at(i):
            return fields[i] if i < len(fields) else None

        if tag == "BlockStored":
            if len(fields) < 5:
                raise DecodeError(f"BlockStored: need at least 5 fields, got {len(fields)}")
            if not isinstance(fields[1], list) or not isinstance(fields[3], list):
                raise DecodeError("BlockStored: block_hashes / token_ids is not an array")
            tokens = [t % 2**32 for t in fields[3] if _int(t)]
            if len(tokens) != len(fields[3]) or not _int(fields[4]):
                raise DecodeError("BlockStored: token_ids / block_size")
            for i, what in ((6, "medium"), (7, "lora_name")):
                if at(i) is not None and not _str(at(i)):
                    raise DecodeError(f"BlockStored: {what} is not a string")
            out.append({
                "type": tag,
                "block_hashes": [_llmd_hash(h) for h in fields[1]],
                "parent_block_hash": 0 if at(2) is None else _llmd_hash(at(2)),
                "token_ids": tokens,
                "block_size": fields[4],
                "device_tier": (at(6) or "gpu").lower(),
                "model": at(7) or model,  # the effective model name
            })
        elif tag == "BlockRemoved":
            if len(fields) < 2 or not isinstance(fields[1], list):
                raise DecodeError("BlockRemoved: block_hashes is not an array")
            out.append({"type": tag, "block_hashes": [_llmd_hash(h) for h in fields[1]],
                        "device_tier": (at(2) or "gpu").lower()})
        else:
            out.append({"type": tag})
    return pod, model, out


def router_keys(tokens, block_size, scope):
    """The keys a router that hashes a request's tokens itself files its blocks under: each
    page's key names the whole prefix up to its end and the scope the router hashes with
    (Dynamo: lora_name and cache namespace; llm-d: the effective model name)."""
    keys, prefix = [], (scope,)
    for i in range(0, len(tokens) - len(tokens) % block_size, block_size):
        prefix = prefix + tuple(tokens[i:i + block_size])
        keys.append(prefix)
    return keys
