"""Efficient attention (section 9.5): tiled attention, time and memory measurements, a decoder with a
key–value cache.

The lessons themselves (the online-softmax loop, linear attention, grouped-query attention written out,
sparse masks, random features) are written out in the notebook; this module holds their reusable,
batched and tested versions and the measuring plumbing.
"""

import contextlib
import functools
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from helpers.attention import check_mask, check_qkv
from helpers.positions import rope


def tiled_attention(q, k, v, tile, mask=None, is_causal=False):
    """Exact scaled dot-product attention that never holds more than ``tile`` keys' scores per query.

    Shapes: ``q (..., m, d_k)``, ``k (..., n, d_k)``, ``v (..., n, d_v)`` -> ``(..., m, d_v)``; the
    leading dimensions broadcast. ``mask`` is boolean, broadcastable to ``(..., m, n)``, True where a
    query may *not* see a key (as in ``helpers.attention``). ``is_causal`` hides key ``j > i`` from
    query ``i`` (aligned top-left, as ``F.scaled_dot_product_attention``) without building a mask, and
    skips the blocks that lie wholly in the future. A query that sees no key at all gets NaN, as the
    softmax of a row of ``-inf`` does.
    """
    if not isinstance(tile, int) or isinstance(tile, bool) or tile < 1:
        raise ValueError(f"tile must be a positive int, got {tile!r}")
    check_qkv(q, k, v)
    m_q, n = q.shape[-2], k.shape[-2]
    if mask is not None:
        lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        check_mask(mask, (*lead, m_q, n))
    scale = q.shape[-1] ** -0.5
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    dtype = torch.promote_types(q.dtype, v.dtype)
    m = torch.full((*lead, m_q, 1), float("-inf"), dtype=dtype, device=q.device)   # running maximum
    total = torch.zeros((*lead, m_q, 1), dtype=dtype, device=q.device)             # running normalizer
    acc = torch.zeros((*lead, m_q, v.shape[-1]), dtype=dtype, device=q.device)     # running weighted sum
    rows = torch.arange(m_q, device=q.device)[:, None]
    stop = min(n, m_q) if is_causal else n              # keys j >= m_q are in every query's future
    for j in range(0, stop, tile):
        s = q @ k[..., j:j + tile, :].transpose(-2, -1) * scale                    # (..., m, tile)
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
        acc = acc * rescale + p @ v[..., j:j + tile, :].to(dtype)
        m = m_new
    return acc / total


def naive_attention(q, k, v):
    """Scaled dot-product attention that materializes all scores: ``(..., T, d) -> (..., T, d_v)``."""
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5          # (..., T, T): the memory we want to avoid
    return torch.softmax(s, dim=-1) @ v


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _quiet_stderr():
    """Send file descriptor 2 to /dev/null for a moment (C++ logging does not go through sys.stderr)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_memory(fn, device=None):
    """Bytes allocated by ``fn()`` at its peak, above what was allocated when it started (measured).

    On CUDA this is ``torch.cuda.max_memory_allocated``. On the CPU it is measured with the PyTorch
    profiler (``profile_memory=True``): every allocation and free is an event with its size, and the
    running sum of the events, in time order, peaks at the answer. The result of ``fn`` is freed
    inside the measurement, so it counts towards the peak.
    """
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        out = fn()
        _sync(device)
        del out
        return torch.cuda.max_memory_allocated(device) - base
    if device.type != "cpu":
        raise ValueError(f"peak_memory measures the CPU or CUDA, not {device.type}")
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_stderr():                                # the profiler logs its start and stop on fd 2
        prof.start()
    try:
        out = fn()
        del out
    finally:
        with _quiet_stderr():
            prof.stop()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    now = peak = 0
    for e in events:
        now += e.nbytes()                                # positive: allocated, negative: freed
        peak = max(peak, now)
    return peak


def seconds(fn, repeats=3, device=None):
    """The shortest wall-clock time of ``repeats`` calls of ``fn()``, in seconds (the least disturbed).

    Call ``fn`` once before to warm up; on CUDA the device is synchronized around each call.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be positive, got {repeats}")
    device = torch.device(device or "cpu")
    best = math.inf
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def benchmark(methods, lengths, d=64, heads=1, repeats=2, device=None, dtype=torch.float32, seed=0):
    """Time and peak memory of attention methods against the sequence length.

    ``methods`` maps a name to ``f(q, k, v)`` with ``q, k, v (1, heads, T, d)``. Returns
    ``{name: {"T": [...], "seconds": [...], "bytes": [...]}}``; the memory run doubles as warm-up.
    """
    if not methods:
        raise ValueError("give at least one method")
    if not lengths or any(not isinstance(T, int) or T < 1 for T in lengths):
        raise ValueError(f"lengths must be positive ints, got {lengths!r}")
    device = torch.device(device or "cpu")
    g = torch.Generator(device=device).manual_seed(seed)
    results = {name: {"T": [], "seconds": [], "bytes": []} for name in methods}
    steps = [(T, name) for T in lengths for name in methods]
    with torch.no_grad():
        for T, name in tqdm(steps, desc=f"benchmark ({device.type})", file=sys.stderr, leave=False):
            q, k, v = torch.randn(3, 1, heads, T, d, generator=g, device=device, dtype=dtype).unbind(0)
            call = functools.partial(methods[name], q, k, v)
            results[name]["T"].append(T)
            results[name]["bytes"].append(peak_memory(call, device))
            results[name]["seconds"].append(seconds(call, repeats, device))
    return results


def growth_exponent(x, y):
    """Least-squares slope of ``log y`` against ``log x``: ``y ~ x^slope``."""
    x, y = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
    if x.shape != y.shape or x.dim() != 1 or len(x) < 2:
        raise ValueError(f"need two 1-D series of equal length >= 2, got shapes {tuple(x.shape)} and {tuple(y.shape)}")
    if (x <= 0).any() or (y <= 0).any():
        raise ValueError("growth exponents need positive values")
    lx, ly = x.log(), y.log()
    lx = lx - lx.mean()
    return float((lx * (ly - ly.mean())).sum() / (lx * lx).sum())


class CachedSelfAttention(nn.Module):
    """Causal self-attention with RoPE and ``kv_heads`` key–value heads shared by ``heads`` query heads.

    ``kv_heads == heads`` is multi-head attention, ``kv_heads == 1`` multi-query attention, anything
    between grouped-query attention. ``forward(x (B, T, d), cache)`` returns ``(y (B, T, d), cache)``,
    where ``cache`` is ``None`` or the ``(k, v)`` pair, each ``(B, kv_heads, past, d / heads)``, of the
    tokens before ``x``.
    """

    def __init__(self, d, heads, kv_heads):
        super().__init__()
        if d % heads or heads % kv_heads:
            raise ValueError(f"need heads | d and kv_heads | heads, got d={d}, heads={heads}, kv_heads={kv_heads}")
        self.heads, self.kv_heads, self.dh = heads, kv_heads, d // heads
        if self.dh % 2:
            raise ValueError(f"RoPE needs an even head width, got {self.dh}")
        self.q = nn.Linear(d, d, bias=False)
        self.kv = nn.Linear(d, 2 * kv_heads * self.dh, bias=False)
        self.out = nn.Linear(d, d, bias=False)

    def forward(self, x, cache=None):
        B, T, _ = x.shape
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
        if vocab < 2 or layers < 1:
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
        if tokens.dim() != 2:
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
    if prompt.dim() != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must be (batch, length >= 1), got shape {tuple(prompt.shape)}")
    if steps < 0:
        raise ValueError(f"steps must be non-negative, got {steps}")
    tokens, caches, feed = prompt, None, prompt
    for _ in range(steps):
        if use_cache:
            logits, caches = model(feed, caches)
        else:
            logits, _ = model(tokens)
        feed = logits[:, -1].argmax(-1, keepdim=True)     # (B, 1)
        tokens = torch.cat([tokens, feed], dim=1)
    return tokens
