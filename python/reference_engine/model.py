"""A small hybrid model in PyTorch (fp32, CPU): Gated DeltaNet layers with a short conv and
their recurrent state, and GQA attention layers that read K/V from the cache's paged arena.

The same architecture as the C++ tiny model (docs/model.md):

    token -> embedding
    for each letter of `layers` ("GGAGGA"):  'G' Gated DeltaNet, 'A' causal GQA attention
        x += Mixer(RMSNorm(x));  x += SwiGLU(RMSNorm(x))
    logits = LMHead(RMSNorm(x))

Memory the cache manages is the model's real memory:
  * KV pool: the cache's GPU KV arena seen as float32 [pages, attn_layers, 2, page_size,
    kv_heads, head_dim] (radixtier.as_tensor, no copy). Position p's K/V live in page
    page_table[p // page_size], slot p % page_size.
  * Live recurrent state: one float32 vector of state_floats; per GDN layer, in order, its
    conv state [conv_kernel - 1, 3 * heads * head_dim] (oldest input first) then its
    recurrent state [heads, head_dim (v), head_dim (k)]. A snapshot is a verbatim copy.

Bit-identity (outputs with reuse == recomputed from scratch): every token is computed on its
own, in sequence, by the same sequence of torch ops on tensors of the same shapes, whatever
chunk it arrives in. Batching tokens would change the shapes the kernels see (a gemm over 7
rows vs 1 row, a vectorized body vs a scalar tail), and with them the rounding. Attention at
position p always runs over exactly the K/V bytes of positions 0..p read back from the pages,
so K/V that came from the cache (possibly demoted and promoted) are the same bytes the
recompute path wrote. Intra-op threading is pinned to one thread for the same reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

torch.set_num_threads(1)

NORM_EPS = 1e-6


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 97
    d_model: int = 32
    layers: str = "GGAGGA"
    heads: int = 4
    head_dim: int = 8
    kv_heads: int = 2
    conv_kernel: int = 4
    mlp_dim: int = 64
    page_size: int = 16
    seed: int = 0x5EED

    def validate(self) -> None:
        def bad(what):
            raise ValueError(f"ModelConfig: {what}")

        if self.vocab < 2:
            bad("vocab must be >= 2")
        if not self.layers or set(self.layers) - {"G", "A"}:
            bad(f"layers may only contain 'G' and 'A': {self.layers!r}")
        if "G" not in self.layers or "A" not in self.layers:
            bad("layers must contain at least one 'G' and one 'A' (a hybrid model)")
        if self.head_dim % 2:
            bad("head_dim must be even (rotary embedding)")
        if self.heads % self.kv_heads:
            bad("kv_heads must divide heads")
        if self.conv_kernel < 2:
            bad("conv_kernel must be >= 2")
        if self.page_size < 1:
            bad("page_size must be >= 1")


def _rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + NORM_EPS) * w


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + NORM_EPS)


class HybridModel:
    """Weights and a per-token forward(); keeps no per-call state (one model, many requests).
    On the CPU by default; `to("cuda")` runs the same ops on a GPU."""

    def __init__(self, config: ModelConfig = ModelConfig()):
        config.validate()
        self.cfg = c = config
        g = torch.Generator().manual_seed(c.seed)

        def fill(*shape, scale=1.0, offset=0.0):
            return offset + scale * (torch.rand(*shape, generator=g, dtype=torch.float32) * 2 - 1)

        d, hd, kvd, m = c.d_model, c.heads * c.head_dim, c.kv_heads * c.head_dim, c.mlp_dim
        self.conv_channels = 3 * hd
        in_s, hd_s, m_s = 1 / math.sqrt(d), 1 / math.sqrt(hd), 1 / math.sqrt(m)
        self.embed = fill(c.vocab, d)
        self.layers = []
        state = 0
        self.attn_layers = 0
        for kind in c.layers:
            layer = {"attn": kind == "A", "norm1": fill(d, scale=0.1, offset=1.0)}
            if kind == "A":
                layer["w_qkv"] = torch.cat([fill(hd, d, scale=in_s), fill(kvd, d, scale=in_s),
                                            fill(kvd, d, scale=in_s)])
                layer["w_o"] = fill(d, hd, scale=hd_s)
                layer["index"] = self.attn_layers
                self.attn_layers += 1
            else:
                # One projection for q, k, v (conv inputs), the output gate z, the decay
                # input a and the write strength b: [3HD + HD + H + H, d].
                layer["w_in"] = torch.cat([fill(self.conv_channels, d, scale=in_s),
                                           fill(hd, d, scale=in_s), fill(c.heads, d, scale=in_s),
                                           fill(c.heads, d, scale=in_s)])
                layer["conv"] = fill(c.conv_kernel, self.conv_channels, scale=0.6)  # [K, C]
                layer["a_bias"] = fill(c.heads, scale=0.5)
                layer["a_rate"] = torch.exp(fill(c.heads, scale=0.7, offset=-3.2))
                layer["o_norm"] = fill(c.head_dim, scale=0.1, offset=1.0)
                layer["w_o"] = fill(d, hd, scale=hd_s)
                layer["offset"] = state
                state += (c.conv_kernel - 1) * self.conv_channels + c.heads * c.head_dim ** 2
            layer["norm2"] = fill(d, scale=0.1, offset=1.0)
            layer["w_gate_up"] = torch.cat([fill(m, d, scale=in_s), fill(m, d, scale=in_s)])
            layer["w_down"] = fill(d, m, scale=m_s)
            self.layers.append(layer)
        self.final_norm = fill(d, scale=0.1, offset=1.0)
        self.lm_head = fill(c.vocab, d, scale=in_s)
        self.inv_freq = torch.pow(
            10000.0, -2.0 * torch.arange(c.head_dim // 2, dtype=torch.float64) / c.head_dim)
        self.state_floats = state
        self.kv_shape = (self.attn_layers, 2, c.page_size, c.kv_heads, c.head_dim)
        self.device = torch.device("cpu")

    def to(self, device) -> "HybridModel":
        """This model with its weights on `device` (e.g. "cuda"): the same weights, bit for
        bit (made on the CPU from the seed, then copied)."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        out = HybridModel.__new__(HybridModel)
        out.__dict__.update(self.__dict__)

        def move(v):
            return v.to(device) if isinstance(v, torch.Tensor) else v

        out.embed, out.final_norm, out.lm_head = move(self.embed), move(self.final_norm), \
            move(self.lm_head)
        out.inv_freq = move(self.inv_freq)
        out.layers = [{k: move(v) for k, v in layer.items()} for layer in self.layers]
        out.device = device
        return out

    # --- geometry the cache is configured with ------------------------------------------------
    @property
    def page_size(self) -> int:
        return self.cfg.page_size

    @property
    def page_bytes(self) -> int:
        return math.prod(self.kv_shape) * 4

    @property
    def state_bytes(self) -> int:
        return self.state_floats * 4

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.cfg.page_size)

    def kv_pool(self, view, pages: int) -> torch.Tensor:
        """The cache's KV arena (an ArenaView) as this model's page tensor, sharing memory."""
        import radixtier

        return radixtier.as_tensor(view, torch.float32, (pages, *self.kv_shape))

    def new_state(self) -> torch.Tensor:
        return torch.zeros(self.state_floats, dtype=torch.float32, device=self.device)

    # --- compute --------------------------------------------------------------------------------
    def forward(self, tokens, pos: int, page_table: torch.Tensor, kv: torch.Tensor,
                state: torch.Tensor) -> torch.Tensor:
        """Runs tokens at positions [pos, pos + len(tokens)), one at a time.

        K/V of earlier positions are read from `kv` pages `page_table` (int64, covering the new
        positions too); the new tokens' K/V are written there. `state` (the live recurrent
        state after `pos` tokens) is advanced in place. Returns the last token's logits.
        """
        n = len(tokens)
        if n == 0:
            raise ValueError("forward: no tokens")
        need = self.pages_for(pos + n)
        if len(page_table) < need:
            raise ValueError(f"forward: page table has {len(page_table)} pages, positions "
                             f"[0, {pos + n}) need {need}")
        if state.numel() != self.state_floats:
            raise ValueError("forward: state has the wrong size")
        table = torch.as_tensor(page_table[:need], dtype=torch.int64)
        logits = None
        with torch.no_grad():
            for i, t in enumerate(tokens):
                logits = self._step(int(t), pos + i, table, kv, state)
        return logits

    def _step(self, token, pos, table, kv, state):
        c = self.cfg
        x = self.embed[token]
        for layer in self.layers:
            h = _rmsnorm(x, layer["norm1"])
            if layer["attn"]:
                x = x + self._attention(layer, h, pos, table, kv)
            else:
                x = x + self._gdn(layer, h, state)
            h = _rmsnorm(x, layer["norm2"])
            gate, up = torch.mv(layer["w_gate_up"], h).split(c.mlp_dim)
            x = x + torch.mv(layer["w_down"], torch.nn.functional.silu(gate) * up)
        return torch.mv(self.lm_head, _rmsnorm(x, self.final_norm))

    def _gdn(self, layer, h, state):
        c = self.cfg
        H, D, K, C = c.heads, c.head_dim, c.conv_kernel, self.conv_channels
        off = layer["offset"]
        conv_state = state[off:off + (K - 1) * C].view(K - 1, C)
        rec = state[off + (K - 1) * C:off + (K - 1) * C + H * D * D].view(H, D, D)

        qkv, z, a, b = torch.mv(layer["w_in"], h).split([C, H * D, H, H])
        window = torch.cat([conv_state, qkv.unsqueeze(0)])  # [K, C], oldest first
        conv = torch.nn.functional.silu((window * layer["conv"]).sum(0))
        conv_state.copy_(window[1:])
        q, k, v = conv.view(3, H, D).unbind(0)
        q = _l2norm(q) * (1.0 / math.sqrt(D))
        k = _l2norm(k)

        alpha = torch.exp(-layer["a_rate"] * torch.nn.functional.softplus(a + layer["a_bias"]))
        beta = torch.sigmoid(b)
        # S_t = alpha S_{t-1} + beta (v - alpha S_{t-1} k) k^T;  o_t = S_t q
        sk = torch.bmm(rec, k.unsqueeze(-1)).squeeze(-1)  # [H, Dv]
        u = beta.unsqueeze(-1) * (v - alpha.unsqueeze(-1) * sk)
        rec.mul_(alpha.view(H, 1, 1)).add_(u.unsqueeze(-1) * k.unsqueeze(1))
        o = torch.bmm(rec, q.unsqueeze(-1)).squeeze(-1)  # [H, Dv]
        o = _rmsnorm(o, layer["o_norm"]) * torch.nn.functional.silu(z.view(H, D))
        return torch.mv(layer["w_o"], o.reshape(H * D))

    def _attention(self, layer, h, pos, table, kv):
        c = self.cfg
        H, D, Hkv, P = c.heads, c.head_dim, c.kv_heads, c.page_size
        q, k, v = torch.mv(layer["w_qkv"], h).split([H * D, Hkv * D, Hkv * D])
        angle = pos * self.inv_freq
        cos, sin = torch.cos(angle).float(), torch.sin(angle).float()
        q = _rope(q.view(H, D), cos, sin)
        k = _rope(k.view(Hkv, D), cos, sin)

        # This token's K/V into its page slot; then positions 0..pos read back from the pages.
        li = layer["index"]
        page = int(table[pos // P])
        kv[page, li, 0, pos % P] = k
        kv[page, li, 1, pos % P] = v.view(Hkv, D)
        pages = table[:pos // P + 1]
        keys = kv[pages, li, 0].reshape(-1, Hkv, D)[:pos + 1]  # [T, Hkv, D]
        vals = kv[pages, li, 1].reshape(-1, Hkv, D)[:pos + 1]
        qg = q.view(Hkv, H // Hkv, D)
        scores = torch.bmm(qg, keys.permute(1, 2, 0)) * (1.0 / math.sqrt(D))  # [Hkv, G, T]
        probs = torch.softmax(scores, dim=-1)
        o = torch.bmm(probs, vals.permute(1, 0, 2))  # [Hkv, G, D]
        return torch.mv(layer["w_o"], o.reshape(H * D))

    @staticmethod
    def greedy(logits: torch.Tensor) -> int:
        return int(torch.argmax(logits))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on pairs (2i, 2i+1) of the last dimension."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)
