"""Efficient attention (section 9.5): tiled attention and a decoder with a key–value cache.

The lessons themselves (the online-softmax loop, linear attention, grouped-query attention written out,
sparse masks, random features) are written out in the notebook; this module holds their reusable,
batched and tested versions. Measuring time and memory is ``helpers.measure``'s job.
"""

import torch
import torch.nn.functional as F
from torch import nn

from helpers.attention import check_mask, check_qkv
from helpers.checks import flag, non_negative_int, positive_int, tensor
from helpers.positions import rope


def tiled_attention(q, k, v, tile, mask=None, is_causal=False):
    """Exact scaled dot-product attention that never holds more than ``tile`` keys' scores per query.

    Shapes: ``q (..., m, d_k)``, ``k (..., n, d_k)``, ``v (..., n, d_v)`` -> ``(..., m, d_v)``; the
    leading dimensions broadcast. ``mask`` is boolean, broadcastable to ``(..., m, n)``, True where a
    query may *not* see a key (as in ``helpers.attention``). ``is_causal`` hides key ``j > i`` from
    query ``i`` (aligned top-left, as ``F.scaled_dot_product_attention``) without building a mask, and
    skips the blocks that lie wholly in the future. A query that sees no key at all (a fully masked
    row, or no keys) gets zeros, as in ``helpers.attention.attention`` and SDPA. The running maximum,
    normalizer and weighted sum are kept in float32 (or wider) whatever the input's dtype, and only
    the result is cast back: summed over thousands of keys in bfloat16 they would lose digits.
    """
    tile = positive_int(tile, "tile")
    is_causal = flag(is_causal, "is_causal")
    check_qkv(q, k, v)
    m_q, n = q.shape[-2], k.shape[-2]
    if mask is not None:
        lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        check_mask(mask, (*lead, m_q, n))
    out_dtype = torch.promote_types(q.dtype, v.dtype)
    wide = torch.promote_types(out_dtype, torch.float32)
    q = q.to(wide) * q.shape[-1] ** -0.5                # scale before the product: no overflow
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    m = torch.full((*lead, m_q, 1), float("-inf"), dtype=wide, device=q.device)   # running maximum
    total = torch.zeros((*lead, m_q, 1), dtype=wide, device=q.device)             # running normalizer
    acc = torch.zeros((*lead, m_q, v.shape[-1]), dtype=wide, device=q.device)     # running weighted sum
    rows = torch.arange(m_q, device=q.device)[:, None]
    stop = min(n, m_q) if is_causal else n              # keys j >= m_q are in every query's future
    for j in range(0, stop, tile):
        s = q @ k[..., j:j + tile, :].to(wide).transpose(-2, -1)                  # (..., m, tile)
        if mask is not None:
            s = s.masked_fill(mask[..., j:j + tile] if mask.shape[-1] > 1 else mask, float("-inf"))
        if is_causal:
            cols = torch.arange(j, min(j + tile, n), device=q.device)[None, :]
            s = s.masked_fill(cols > rows, float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        # While a query has seen only hidden keys its maximum is -inf; shift by 0 instead (no NaN).
        shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        rescale = torch.exp(m - shift)
        p = torch.exp(s - shift)
        total = total * rescale + p.sum(dim=-1, keepdim=True)
        acc = acc * rescale + p @ v[..., j:j + tile, :].to(wide)
        m = m_new
    # A query that saw no key has total = 0 and acc = 0: divide by 1 instead, which gives its zeros.
    return (acc / torch.where(total > 0, total, torch.ones_like(total))).to(out_dtype)


def naive_attention(q, k, v):
    """Scaled dot-product attention that materializes all scores: ``(..., T, d) -> (..., T, d_v)``."""
    check_qkv(q, k, v)
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5          # (..., T, T): the memory we want to avoid
    return torch.softmax(s, dim=-1) @ v


class CachedSelfAttention(nn.Module):
    """Causal self-attention with RoPE and ``kv_heads`` key–value heads shared by ``heads`` query heads.

    ``kv_heads == heads`` is multi-head attention, ``kv_heads == 1`` multi-query attention, anything
    between grouped-query attention. ``forward(x (B, T, d), cache)`` returns ``(y (B, T, d), cache)``,
    where ``cache`` is ``None`` or the ``(k, v)`` pair, each ``(B, kv_heads, past, d / heads)``, of the
    tokens before ``x``.
    """

    def __init__(self, d, heads, kv_heads):
        super().__init__()
        d, heads, kv_heads = positive_int(d, "d"), positive_int(heads, "heads"), positive_int(kv_heads, "kv_heads")
        if d % heads or heads % kv_heads:
            raise ValueError(f"need heads | d and kv_heads | heads, got d={d}, heads={heads}, kv_heads={kv_heads}")
        self.heads, self.kv_heads, self.dh = heads, kv_heads, d // heads
        if self.dh % 2:
            raise ValueError(f"RoPE needs an even head width, got {self.dh}")
        self.q = nn.Linear(d, d, bias=False)
        self.kv = nn.Linear(d, 2 * kv_heads * self.dh, bias=False)
        self.out = nn.Linear(d, d, bias=False)

    def forward(self, x, cache=None):
        tensor(x, "x")
        if x.dim() != 3:
            raise ValueError(f"x must be (batch, length, width), got shape {tuple(x.shape)}")
        B, T, _ = x.shape
        if cache is not None and cache[0].shape != cache[1].shape:
            raise ValueError(f"the key and value caches differ: {tuple(cache[0].shape)} != {tuple(cache[1].shape)}")
        past = 0 if cache is None else cache[0].shape[-2]
        q = self.q(x).view(B, T, self.heads, self.dh).transpose(1, 2)                     # (B, H, T, dh)
        k, v = self.kv(x).view(B, T, 2, self.kv_heads, self.dh).permute(2, 0, 3, 1, 4)    # (B, G, T, dh) each
        q, k = rope(q, offset=past), rope(k, offset=past)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=-2), torch.cat([cache[1], v], dim=-2)
        # Query i (absolute position past + i) sees keys 0..past + i; a single new token sees them all.
        allowed = None
        if T > 1:
            allowed = torch.arange(past + T, device=x.device) <= torch.arange(past, past + T, device=x.device)[:, None]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=self.kv_heads != self.heads)
        return self.out(y.transpose(1, 2).reshape(B, T, -1)), (k, v)


class CachedDecoder(nn.Module):
    """A small decoder-only transformer (pre-norm blocks, RoPE, grouped-query attention).

    ``forward(tokens (B, T), caches)`` returns ``(logits (B, T, vocab), caches)``; ``caches`` is
    ``None`` or one ``(k, v)`` pair per layer for the tokens before ``tokens``.
    """

    def __init__(self, vocab, d=64, heads=4, kv_heads=None, layers=2):
        super().__init__()
        vocab, layers = positive_int(vocab, "vocab"), positive_int(layers, "layers")
        if vocab < 2:
            raise ValueError(f"need vocab >= 2 and layers >= 1, got {vocab} and {layers}")
        kv_heads = heads if kv_heads is None else kv_heads
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            self.blocks.append(nn.ModuleDict(
                {"norm1": nn.LayerNorm(d), "attn": CachedSelfAttention(d, heads, kv_heads), "norm2": nn.LayerNorm(d), "mlp": mlp}
            ))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens, caches=None):
        if tensor(tokens, "tokens").dim() != 2:
            raise ValueError(f"tokens must be (batch, length), got shape {tuple(tokens.shape)}")
        if caches is not None and len(caches) != len(self.blocks):
            raise ValueError(f"need one cache per layer ({len(self.blocks)}), got {len(caches)}")
        x = self.embed(tokens)
        new = []
        for i, b in enumerate(self.blocks):
            a, c = b["attn"](b["norm1"](x), None if caches is None else caches[i])
            x = x + a
            x = x + b["mlp"](b["norm2"](x))
            new.append(c)
        return self.head(self.norm(x)), new


@torch.no_grad()
def generate(model, prompt, steps, use_cache=True):
    """Greedy decoding: ``prompt (B, T0) -> (B, T0 + steps)``.

    Without the cache every step runs the model on the whole sequence so far; with it, the prompt is
    run once and every later step feeds only the newest token, reusing the stored keys and values.
    """
    tensor(prompt, "prompt")
    if prompt.dim() != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must be (batch, length >= 1), got shape {tuple(prompt.shape)}")
    steps = non_negative_int(steps, "steps")
    tokens, caches, feed = prompt, None, prompt
    for _ in range(steps):
        if use_cache:
            logits, caches = model(feed, caches)
        else:
            logits, _ = model(tokens)
        feed = logits[:, -1].argmax(-1, keepdim=True)     # (B, 1)
        tokens = torch.cat([tokens, feed], dim=1)
    return tokens
