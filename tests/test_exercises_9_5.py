"""Section 9.5's exercises: 9.5.1 merging two tiles' online-softmax states, 9.5.2 how long a context fits beside the
weights, 9.5.3 how many layers until every token has heard from every other, 9.5.5 a sliding window with a rolling
cache (9.5.4 is answered in words).

Each checker accepts the notebook's reference solution and rejects the usual mistakes, each with its own
hint (exercises_common.py says how; the shared layout is tested in test_exercises_layout.py).
"""

import collections
import dataclasses
import functools
import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from exercises_common import (
    connect,
    fails_on_every_seed,
    section_tests,
)

from helpers.exercises import verdict
from helpers.exercises.s9_5 import _CachedSelfAttention
from helpers.positions import rope

# Wrong answers and right ones unlike the reference ---------------------------------------------------------------

def _merge(a, b, rescale=True, upside_down=False, add_maxima=False):
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = m_a + m_b if add_maxima else torch.maximum(m_a, m_b)
    r_a, r_b = (torch.exp(m - m_a), torch.exp(m - m_b)) if upside_down else (torch.exp(m_a - m), torch.exp(m_b - m))
    if not rescale:
        r_a = r_b = 1.0
    return m, l_a * r_a + l_b * r_b, acc_a * r_a + acc_b * r_b


def _merge_unshifted(a, b):
    """Wrong: each tile's sums made absolute by exp(m_a), exp(m_b), added, then made relative to the new maximum;
    equal in exact arithmetic, but exp(m) overflows for scores near 1,000 (NaN turned into 0 to hide it)."""
    m = torch.maximum(a[0], b[0])
    return m, *(torch.nan_to_num((x * a[0].exp() + y * b[0].exp()) / m.exp()) for x, y in ((a[1], b[1]), (a[2], b[2])))


def _merge_all_empty_only(a, b):
    """Wrong: handles a batch in which every query saw no key, and gives NaN when only some did (a student's)."""
    if torch.isinf(a[0]).all() and torch.isinf(b[0]).all():
        return a
    return _merge(a, b)


def _context(per=lambda L, H, G, dh, B, b: 2 * L * G * dh * B * b, weights=lambda p, b: p * b, rounding="floor",
             clamp=True, window_rule="right"):
    """A longest_context: right by default, each argument a place for a mistake."""
    def longest_context(memory, params, layers, heads, kv_heads, d_head, batch=1, bytes_per=2, window=None):
        free = memory - weights(params, bytes_per)
        free = max(free, 0) if clamp else free
        p = per(layers, heads, kv_heads, d_head, batch, bytes_per)
        t = {"floor": free // p, "round": round(free / p), "ceil": math.ceil(free / p), "float": free / p,
             "ceil-1": math.ceil(free / p) - 1, "less": int(free / p - 1e-9), "int": int(free / p)}[rounding]
        if window is None or window_rule == "ignore":
            return t
        return {"right": math.inf if t >= window else t, "min": min(t, window), "strict": math.inf if t > window else t,
                "always": math.inf, "zero": math.inf if t >= window else 0,
                "bytes": math.inf if window * p < free else t}[window_rule]
    return longest_context


def _context_float32(memory, params, layers, heads, kv_heads, d_head, batch=1, bytes_per=2, window=None):
    """Wrong: in float32 tensors, which round the memory and the weights' bytes."""
    as32 = lambda x: torch.tensor(float(x), dtype=torch.float32)                        # noqa: E731
    free = (as32(memory) - as32(params) * bytes_per).clamp(min=0)
    tokens = int(torch.floor(free / as32(2 * layers * kv_heads * d_head * batch * bytes_per)))
    return math.inf if window is not None and tokens >= window else tokens


def _context_floats(memory, params, layers, heads, kv_heads, d_head, batch=1, bytes_per=2, window=None):
    """Right: in floats, math.floor and float('inf')."""
    left = max(0.0, float(memory) - float(params) * bytes_per)
    n = math.floor(left / (2.0 * layers * kv_heads * d_head * batch * bytes_per))
    return float("inf") if window and n >= window else n


def _context_loop(memory, params, layers, heads, kv_heads, d_head, batch=1, bytes_per=2, window=None):
    """Right: the cache per token added up layer by layer and sequence by sequence, divmod, a NumPy integer."""
    per = 0
    for _ in range(layers):
        for _ in range(batch):
            per += 2 * kv_heads * d_head * bytes_per
    tokens, _ = divmod(memory - params * bytes_per, per)
    tokens = np.int64(max(tokens, 0))
    return math.inf if window is not None and tokens >= window else tokens


def _context_tensor(memory, params, layers, heads, kv_heads, d_head, batch=1, bytes_per=2, window=None):
    """Right: int64 tensors, a 0-d tensor returned."""
    free = torch.tensor(memory) - torch.tensor(params) * bytes_per
    per = torch.tensor([2, layers, kv_heads, d_head, batch, bytes_per]).prod()
    tokens = torch.div(free.clamp(min=0), per, rounding_mode="floor")
    return math.inf if window is not None and tokens >= window else tokens


# 9.5.5: attempts at a sliding window with a rolling cache --------------------------------------------------------

def _project(layer, x, past, rotate=True):
    B, T, d = x.shape
    q = layer.q(x).view(B, T, layer.heads, layer.dh).transpose(1, 2)
    k, v = layer.kv(x).view(B, T, 2, layer.kv_heads, layer.dh).permute(2, 0, 3, 1, 4)
    return (rope(q, offset=past), rope(k, offset=past), v) if rotate else (q, k, v)


def _attend(layer, x, q, k, v, seen, scale=None):
    B, T, d = x.shape
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=seen, enable_gqa=layer.kv_heads != layer.heads, scale=scale)
    return layer.out(y.transpose(1, 2).reshape(B, T, d))


def _window(keep="window", position="count", low=0, causal=True, mask=True, rotate=True, both=False, invert=False,
            transpose=False, additive=False, unscaled=False):
    """A student's sliding_window_attention: right by default; ``keep`` what the cache holds (window, window-1, all),
    ``position`` how a call finds its first position (count, the cache's length, restart at 0), ``low`` the mask's
    lower edge shifted, ``causal`` and ``mask`` whether the future and the keys beyond the window are hidden,
    ``rotate`` whether RoPE is applied, ``both`` whether the cache is returned beside the output, ``invert`` whether
    the mask is True where hidden (the book's convention) when it reaches SDPA, ``transpose`` whether it is
    transposed (square on a first call only), ``additive`` whether it reaches SDPA as a float 0/1 mask (added),
    ``unscaled`` whether the scores are left undivided by sqrt(dh)."""
    def sliding_window_attention(layer, x, cache, window):
        B, T, d = x.shape
        past = {"count": cache.get("position", 0) if cache else 0, "restart": 0,
                "length": cache["k"].shape[-2] if cache else 0}[position]
        q, k, v = _project(layer, x, past, rotate)
        if cache:
            k, v = torch.cat([cache["k"], k], dim=-2), torch.cat([cache["v"], v], dim=-2)
        n = k.shape[-2]
        i, j = torch.arange(n - T, n)[:, None], torch.arange(n)          # positions from the first key held
        seen = (j > i - window + low) if mask else torch.ones(T, n, dtype=torch.bool)
        seen = seen & (j <= i) if causal else seen
        seen = seen.T if transpose else seen
        y = _attend(layer, x, q, k, v, ~seen if invert else seen.float() if additive else seen,
                    scale=1.0 if unscaled else None)
        if cache is not None:
            start = {"window": max(n - window, 0), "window-1": max(n - window + 1, 0), "all": 0}[keep]
            cache["k"], cache["v"] = k[..., start:, :], v[..., start:, :]
            cache["position"] = cache.get("position", 0) + T
        return (y, cache) if both else y
    return sliding_window_attention


def _window_circular(layer, x, cache, window):
    """Right: a buffer of exactly window slots written round-robin, each slot with its token's position."""
    B, T, d = x.shape
    past = cache["seen"] if cache else 0
    q, k, v = _project(layer, x, past)
    new = torch.arange(past, past + T)
    keys, values, at = (torch.cat([cache["k"], k], -2), torch.cat([cache["v"], v], -2), torch.cat([cache["at"], new])
                        ) if cache else (k, v, new)
    y = _attend(layer, x, q, keys, values, (at[None, :] <= new[:, None]) & (at[None, :] > new[:, None] - window))
    if cache is not None:
        if not cache:
            cache["k"], cache["v"] = torch.zeros(B, layer.kv_heads, window, layer.dh), torch.zeros(B, layer.kv_heads,
                                                                                                 window, layer.dh)
            cache["at"] = torch.full((window,), -10 ** 9)
        slots = new % window
        cache["k"], cache["v"], cache["at"] = cache["k"].clone(), cache["v"].clone(), cache["at"].clone()
        for t in range(T):                                    # a later token of the call overwrites an earlier one
            cache["k"][..., slots[t], :], cache["v"][..., slots[t], :] = k[..., t, :], v[..., t, :]
            cache["at"][slots[t]] = new[t]
        cache["seen"] = past + T
    return y


def _window_unrotated(layer, x, cache, window):
    """Right: caches keys before RoPE and rotates what it holds at positions counted from its first key (only
    differences of positions matter), with einsum and a softmax written out, keeping window - 1 tokens."""
    B, T, d = x.shape
    q, k, v = _project(layer, x, 0, rotate=False)
    if cache:
        k, v = torch.cat([cache["k"], k], -2), torch.cat([cache["v"], v], -2)
    n, group = k.shape[-2], layer.heads // layer.kv_heads
    scores = torch.einsum("bhqd,bhkd->bhqk", rope(q, offset=n - T), rope(k, offset=0).repeat_interleave(group, 1))
    i, j = torch.arange(n - T, n)[:, None], torch.arange(n)
    scores = scores.masked_fill(~((j <= i) & (j > i - window)), -1e9) / layer.dh ** 0.5
    y = torch.softmax(scores, -1) @ v.repeat_interleave(group, 1)
    if cache is not None:
        cache["k"], cache["v"] = k[..., n - min(n, window - 1):, :], v[..., n - min(n, window - 1):, :]
    return layer.out(y.transpose(1, 2).reshape(B, T, d))


def _window_float64(layer, x, cache, window):
    """Right: computed in float64 and returned so, the position kept as a 0-d tensor."""
    B, T, d = x.shape
    past = int(cache["t"]) if cache else 0
    xd = x.double()
    q = (xd @ layer.q.weight.double().T).view(B, T, layer.heads, layer.dh).transpose(1, 2)
    k, v = (xd @ layer.kv.weight.double().T).view(B, T, 2, layer.kv_heads, layer.dh).permute(2, 0, 3, 1, 4)
    q, k = rope(q, offset=past), rope(k, offset=past)
    if cache:
        k, v = torch.cat([cache["k"], k], -2), torch.cat([cache["v"], v], -2)
    n = k.shape[-2]
    i, j = torch.arange(past, past + T)[:, None], torch.arange(past + T - n, past + T)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=(j <= i) & (j > i - window), enable_gqa=True)
    if cache is not None:
        cache["k"], cache["v"], cache["t"] = k[..., -window:, :], v[..., -window:, :], torch.tensor(past + T)
    return y.transpose(1, 2).reshape(B, T, d) @ layer.out.weight.double().T


def _window_deque(layer, x, cache, window):
    """Right: a rolling buffer as two deque(maxlen=window) of one token's keys (values) each (a students' review)."""
    B, T, d = x.shape
    past = cache["position"] if cache else 0
    q, k, v = _project(layer, x, past)
    if cache:
        k, v = torch.cat([torch.stack(list(cache["k"]), -2), k], -2), torch.cat([torch.stack(list(cache["v"]), -2), v], -2)
    n = k.shape[-2]
    i, j = torch.arange(past, past + T)[:, None], torch.arange(past + T - n, past + T)
    y = _attend(layer, x, q, k, v, (j <= i) & (j > i - window))
    if cache is not None:
        cache["k"] = collections.deque(k.unbind(-2), maxlen=window)
        cache["v"] = collections.deque(v.unbind(-2), maxlen=window)
        cache["position"] = past + T
    return y


def _window_tokens(layer, x, cache, window):
    """Right: one token at a time, each attending to the keys held (at most window), with einsum (a students'
    review)."""
    B, T, d = x.shape
    past = cache["position"] if cache else 0
    q, k, v = _project(layer, x, past)
    K, V = (cache["k"], cache["v"]) if cache else (k[..., :0, :], v[..., :0, :])
    group, outs = layer.heads // layer.kv_heads, []
    for t in range(T):
        K, V = torch.cat([K, k[..., t:t + 1, :]], -2)[..., -window:, :], torch.cat([V, v[..., t:t + 1, :]], -2)[..., -window:, :]
        s = torch.einsum("bhd,bhkd->bhk", q[..., t, :], K.repeat_interleave(group, 1)) / layer.dh ** 0.5
        outs.append(torch.einsum("bhk,bhkd->bhd", torch.softmax(s, -1), V.repeat_interleave(group, 1)))
    if cache is not None:
        cache["k"], cache["v"], cache["position"] = K, V, past + T
    return layer.out(torch.stack(outs, 2).transpose(1, 2).reshape(B, T, d))


def _window_inputs(layer, x, cache, window):
    """Wrong: keeps the last window inputs and recomputes their keys and values, more numbers than those."""
    B, T, d = x.shape
    past = cache["t"] if cache else 0
    xs = torch.cat([cache["x"], x], 1) if cache else x
    n = xs.shape[1]
    q, k, v = _project(layer, xs, past + T - n)
    i, j = torch.arange(n)[:, None], torch.arange(n)
    y = _attend(layer, xs, q, k, v, (j <= i) & (j > i - window))[:, -T:]
    if cache is not None:
        cache["x"], cache["t"] = xs[:, -window:], past + T
    return y


def _merge_logaddexp(a, b):
    """The normalizer through logaddexp; a query that saw no key (m = -inf) keeps the empty state."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = torch.maximum(m_a, m_b)
    seen = torch.isfinite(m)
    log_l = torch.logaddexp(m_a + l_a.log(), m_b + l_b.log())
    l_ = torch.where(seen, torch.exp(log_l - m), torch.zeros_like(m))
    safe = torch.where(seen, m, torch.zeros_like(m))
    return m, l_, acc_a * torch.exp(m_a - safe) + acc_b * torch.exp(m_b - safe)


def _merge_branches(a, b):
    """Rescale only the tile whose maximum is smaller (the other's factor is exactly 1)."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    a_first = m_a >= m_b
    m = torch.where(a_first, m_a, m_b)
    r = torch.exp(torch.where(a_first, m_b - m_a, m_a - m_b).nan_to_num(nan=0.0))   # -inf - -inf: nothing to rescale
    l_ = torch.where(a_first, l_a + l_b * r, l_a * r + l_b)
    return m, l_, torch.where(a_first, acc_a + acc_b * r, acc_a * r + acc_b)


def _connect_floyd(pattern):
    """Correct, another way: Floyd-Warshall's shortest paths in float64, the longest returned as a whole float."""
    T = pattern.shape[0]
    D = torch.where(pattern, 1.0, math.inf).double()
    for k in range(T):
        D = torch.minimum(D, D[:, k:k + 1] + D[k:k + 1, :])
    return D.max().item()


def _connect_bfs(pattern):
    """Correct, another way: the graph's diameter by breadth-first search from every key."""
    T = pattern.shape[0]
    worst = 0
    for j in range(T):
        dist = {j: 0}                                                       # hops from key j
        frontier = [j]
        while frontier:
            nxt = []
            for a in frontier:
                for i in pattern[:, a].nonzero().flatten().tolist():      # queries that see key a
                    if i not in dist:
                        dist[i] = dist[a] + 1
                        nxt.append(i)
            frontier = nxt
        if len(dist) < T:
            return math.inf
        worst = max(worst, max(dist.values()))
    return max(worst, 1)                                                    # one layer at least


def _connect_numpy(pattern):
    """Correct, another way: matrix powers in NumPy, returning a NumPy integer."""
    import numpy as np
    p = pattern.numpy().astype(np.int64)
    reach = p.copy()
    for n in range(1, p.shape[0] + 1):
        if reach.all():
            return np.int64(n)
        reach = np.minimum(reach @ p, 1)
    return math.inf


def _connect_counts(pattern, dtype=torch.long):
    """Wrong (a students' review): the number of paths in int64, R = R @ P. The counts grow like (2 r + 1)^L and wrap
    past 9.2e18, at T = 64 already for a band of r = 2, and the notebook's next cell printed inf there; the checks'
    patterns, of 20 tokens at most, never overflowed it. (``dtype``: the same counts in another type.)"""
    P = pattern.to(dtype)
    R = P.clone()
    for n in range(1, pattern.shape[0] + 1):
        if (R > 0).all():
            return n
        R = R @ P
    return math.inf


def _connect_boolean(pattern):
    """Right (a students' review): boolean reachability with any and all, no product of counts."""
    reach = pattern.clone()
    for n in range(1, pattern.shape[0] + 1):
        if reach.all():
            return n
        reach = (reach[:, :, None] & pattern[None, :, :]).any(1)
    return math.inf


def _connect_bfs_lists(pattern):
    """Right (a students' review): the longest shortest path by breadth-first search over Python lists."""
    T = pattern.shape[0]
    adjacent = [[j for j in range(T) if pattern[i, j]] for i in range(T)]
    worst = 0
    for start in range(T):
        dist, frontier = {start: 0}, [start]
        while frontier:
            following = []
            for u in frontier:
                for v in adjacent[u]:
                    if v not in dist:
                        dist[v] = dist[u] + 1
                        following.append(v)
            frontier = following
        if len(dist) < T:
            return float("inf")
        worst = max(worst, max(dist.values()))
    return max(worst, 1)


def _merge_output(a, b):
    """Wrong (a students' review): the attention output acc / l returned in place of the state's acc."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = torch.maximum(m_a, m_b)
    shift = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    r_a, r_b = torch.exp(m_a - shift), torch.exp(m_b - shift)
    l_ = l_a * r_a + l_b * r_b
    acc = acc_a * r_a + acc_b * r_b
    return m, l_, torch.where(l_ > 0, acc / l_, torch.zeros_like(acc))


def _merge_nan_to_num(a, b):
    """Right (a students' review): Appendix C's merge, its NaN (where neither tile saw a key) replaced by 0."""
    m = torch.maximum(a[0], b[0])
    r_a, r_b = torch.exp(a[0] - m), torch.exp(b[0] - m)
    return m, (a[1] * r_a + b[1] * r_b).nan_to_num(0.0), (a[2] * r_a + b[2] * r_b).nan_to_num(0.0)


def _merge_masked_float32(a, b):
    """Right (a students' review): in float32, each factor zeroed where its tile saw nothing."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = [tuple(t.float() for t in s) for s in (a, b)]
    m = torch.maximum(m_a, m_b)
    r_a = torch.exp(m_a - m).masked_fill(torch.isinf(m_a), 0.0)
    r_b = torch.exp(m_b - m).masked_fill(torch.isinf(m_b), 0.0)
    return m, l_a * r_a + l_b * r_b, acc_a * r_a + acc_b * r_b


# Wrong answers: for each exercise, (the mistake, a piece of the hint that must name it).
WRONG = {
    "9.5.1": [
        (lambda a, b: _merge(a, b, rescale=False), "Rescale each tile's normalizer l"),
        (lambda a, b: _merge(a, b, upside_down=True), "upside down"),
        (lambda a, b: _merge(a, b, add_maxima=True), "not the sum of the two maxima"),
        (lambda a, b: _merge(a, b)[1:], "return a tuple (m, l, acc)"),
        (_merge_all_empty_only, "Where neither tile saw a key"),
        (_merge_unshifted, "never a maximum itself"),
    ],
    "9.5.2": [
        (_context(per=lambda L, H, G, dh, B, b: 2 * L * H * dh * B * b), "yours counts the query heads"),
        (_context(per=lambda L, H, G, dh, B, b: L * G * dh * B * b), "yours counts one of them"),
        (_context(per=lambda L, H, G, dh, B, b: 2 * G * dh * B * b), "yours counts one layer"),
        (_context(per=lambda L, H, G, dh, B, b: 2 * L * G * dh * b), "yours counts one sequence"),
        (_context(per=lambda L, H, G, dh, B, b: 2 * L * G * dh * B), "one byte per number"),
        (_context(weights=lambda p, b: 0), "The weights take memory too"),
        (_context(weights=lambda p, b: p), "one byte per parameter"),
        (_context(rounding="round"), "Round down"),
        (_context(clamp=False), "not a negative count"),
        (_context(window_rule="ignore"), "Yours ignores the window"),
        (_context(window_rule="min"), "not the window"),
        (_context(window_rule="strict"), "Exactly window tokens fit here"),
        (_context(window_rule="always"), "does not fit here"),
        (_context(window_rule="zero"), "not 0"),
    ],
}


# Students at the exercises (REVIEW.md, brief 2): wrong attempts not in WRONG, and right answers unlike the
# reference. Each attempt is (answer, a piece of the message it must get); None marks a right answer.
STUDENTS = {
    "9.5.1": [
        (_merge_logaddexp, None),
        (_merge_branches, None),
        (lambda a, b: tuple(x.float() for x in _merge_logaddexp(a, b)), None),                       # float32
        (lambda a, b: (torch.maximum(a[0], b[0]), a[1] + b[1], a[2] + b[2]), "Rescale each tile's normalizer l"),
        (lambda a, b: {"m": torch.maximum(a[0], b[0])}, "return a tuple (m, l, acc)"),
        (lambda a, b: (torch.maximum(a[0], b[0]).squeeze(-1),) + _merge_logaddexp(a, b)[1:], "should have shape"),
        (_merge_nan_to_num, None),
        (_merge_masked_float32, None),
        (_merge_output, "the state keeps the unnormalized acc"),
    ],
    "9.5.2": [
        (_context_floats, None),
        (_context_loop, None),
        (_context_tensor, None),
        (_context(per=lambda L, H, G, dh, B, b: 2 * L * (H // G) * dh * B * b), "not the group size"),
        (_context(per=lambda L, H, G, dh, B, b: 4 * L * G * dh * B * b), "counts it twice"),
        (_context(per=lambda L, H, G, dh, B, b: 16 * L * G * dh * B * b), "not bits"),
        (_context(rounding="ceil"), "Round down"),
        (_context(rounding="float"), "should be an integer"),                 # free / per, not rounded
        (lambda *args: str(_context()(*args)), "should be an integer"),        # text
        (lambda *args: _context()(*args) / 2 ** 30, "should be an integer"),   # a size in GiB, not tokens
        (_context(rounding="ceil-1"), "yours stops one short"),               # ceil(free / per) - 1: an exact fit
        (_context(rounding="less"), "yours stops one short"),                 # int(free / per - 1e-9)
        (_context(window_rule="bytes"), "Exactly window tokens fit here"),    # window * per < free: a buffer that
                                                                              # fills the memory to the byte fits
        (_context_float32, "what float32 gives"),
        (_context(rounding="int", clamp=False), "not a negative count"),    # int() truncates: -41,275, not -41,276
        # a students' review: one token fewer was told to compare its cache per token
        (lambda *args: _context()(*args) - 1, "Off by one"),
    ],
}


# The exercises added later: each wrong answer is tried on several fresh checks, and RIGHT holds right answers
# written differently from the reference.
NEW_WRONG = {
    "9.5.3": [
        (lambda pattern: connect(pattern, hops=True), "start at 1"),
        (lambda pattern: connect(pattern, plus=1), "stop at the first number of layers"),
        (lambda pattern: connect(pattern, middle=True), "not only the middle token"),
        (lambda pattern: connect(pattern, first=True), "not only the first one"),
        (lambda pattern: connect(pattern, never=pattern.shape[0]), "return math.inf"),
        (lambda pattern: connect(pattern, never=-1), "return math.inf"),
    ],
    "9.5.5": [
        (_window(keep="all", mask=False), "further back than the window"),        # CachedSelfAttention as it is
        (_window(keep="all"), "keep only what the window still needs"),          # a window by the mask alone
        (_window(position="length"), "positions stop growing"),
        (_window(keep="window-1", position="length"), "positions stop growing"),
        (_window(low=-1), "one key too many"),
        (_window(low=1), "one key too few"),
        (_window(causal=False), "later tokens of their own call"),
        (_window(rotate=False), "not rotated"),
        (_window(position="restart"), "start again at 0"),
        (_window(both=True), "return the output y (B, T, d) alone"),
        (_window_inputs, "keep only what the window still needs"),
        (_window(invert=True), "Your mask is inverted"),                  # the book's True-where-hidden mask in SDPA
        # a students' review: on a first call nothing is cached, and the hint named the cache
        (_window(transpose=True), "on this first call, where nothing is cached yet"),
        (_window(additive=True), "adds a float mask to the scores"),
        # a students' review: the missing scale was pointed at the window mask
        (_window(unscaled=True), "Your scores are not scaled"),
    ],
}


RIGHT = {
    "9.5.3": [_connect_bfs, _connect_numpy, _connect_floyd, _connect_boolean, _connect_bfs_lists],
    "9.5.5": [_window_circular, _window_unrotated, _window_float64, _window(keep="window-1"), _window_deque,
              _window_tokens],
}


# The tests every section runs (exercises_common.py) ---------------------------------------------------------------

globals().update(section_tests("9.5", wrong=WRONG, students=STUDENTS, new_wrong=NEW_WRONG, right=RIGHT))


# This section's own tests -----------------------------------------------------------------------------------------

def test_an_in_place_merge_is_told_so():
    def merge(a, b):
        (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
        m = torch.maximum(m_a, m_b)
        r_a, r_b = torch.exp(m_a - m), torch.exp(m_b - m)
        acc_a *= r_a                                          # in place: the caller's state is changed
        return m, l_a * r_a + l_b * r_b, acc_a + acc_b * r_b
    ok, message = verdict("9.5.1", merge)
    assert ok is False and "changed its input a in place" in message, message


def test_9_5_2_shown_cases_hold_every_kind_whatever_the_draw():
    """Every mistake about the window is met in the shown cases (a buffer that fits, exactly fits, does not fit) and so
    are weights that do not fit: on every seed an answer wrong only there fails."""
    right = _context()
    kinds = {"a buffer that fits": lambda t, window: window is not None and t > window,
             "a buffer that exactly fits": lambda t, window: window is not None and t == window,
             "a buffer that does not fit": lambda t, window: window is not None and t < window,
             "weights that do not fit": lambda t, window: t == 0}
    for name, kind in kinds.items():
        def wrong_for_this_kind(memory, params, layers, heads, kv_heads, d_head, batch=1, bytes_per=2, window=None,
                                kind=kind):
            t = _context(window_rule="ignore")(memory, params, layers, heads, kv_heads, d_head, batch, bytes_per)
            got = right(memory, params, layers, heads, kv_heads, d_head, batch, bytes_per, window)
            return (7 if got == math.inf else got + 1) if kind(t, window) else got
        for seed in range(4):
            ok, message = verdict("9.5.2", wrong_for_this_kind, seed=seed)
            assert ok is False and "drawn at random" not in message, (name, message)


def test_9_5_5_a_layer_changed_in_place_is_told_so():
    def scaled(layer, x, cache, window):
        with torch.no_grad():
            layer.q.weight.mul_(1.0)                          # in place, even if by 1: the weights are the caller's
            layer.out.weight.add_(1.0)
        return _window()(layer, x, cache, window)
    ok, message = verdict("9.5.5", scaled)
    assert ok is False and "changed the model it was given as layer" in message, message


def _kept_elsewhere(where):
    """A student's sliding window that keeps every key and value (never trimmed) somewhere the size check once missed:
    in an object inside the dict, an unbounded deque, a dataclass, a default argument, a module-level store."""
    store, full = {}, _window(keep="all")

    @dataclasses.dataclass
    class Held:
        k: torch.Tensor
        v: torch.Tensor

    class Box:
        __slots__ = ("kv",)

    def sliding_window_attention(layer, x, cache, window, _memory={}):  # noqa: B006 (the mistake under test)
        if cache is None:
            return full(layer, x, cache, window)
        inner = {"object": lambda: cache.get("box") and {"k": cache["box"].kv[0], "v": cache["box"].kv[1]},
                 "deque": lambda: cache.get("kv") and {"k": cache["kv"][0], "v": cache["kv"][1]},
                 "dataclass": lambda: cache.get("held") and {"k": cache["held"].k, "v": cache["held"].v},
                 "default argument": lambda: _memory.get("kv"),
                 "module": lambda: store.get("kv")}[where]() or {}
        inner = dict(inner, position=cache["position"]) if inner else {}
        y = full(layer, x, inner, window)
        cache["position"] = inner["position"]
        if where == "object":
            cache["box"] = Box()
            cache["box"].kv = (inner["k"], inner["v"])
        elif where == "deque":
            cache["kv"] = collections.deque([inner["k"], inner["v"]])
        elif where == "dataclass":
            cache["held"] = Held(inner["k"], inner["v"])
        else:
            (_memory if where == "default argument" else store)["kv"] = {"k": inner["k"], "v": inner["v"]}
        return y
    return sliding_window_attention


@pytest.mark.parametrize("where", ["object", "deque", "dataclass", "default argument", "module"])
def test_9_5_5_keys_kept_outside_what_the_size_check_counts_fail_every_check(where):
    """A students' review: an untrimmed cache inside an object, a deque or a dataclass was not counted, and one kept
    outside the dict (a default argument, a module-level store) was invisible; all five passed every draw. The check
    now counts tensors however they are held, runs a second sequence through the same layer between the first's calls,
    and resumes each from a copy of its dict."""
    for seed in range(3):
        ok, message = verdict("9.5.5", _kept_elsewhere(where), seed=seed)
        assert ok is False and ("keep only what the window still needs" in message
                                or "a second sequence" in message), message


def test_9_5_5_a_new_dict_of_its_own_is_told_so():
    def rebound(layer, x, cache, window):
        cache = {} if cache is not None else None                  # a new dict: the caller's stays empty
        return _window()(layer, x, cache, window)
    ok, message = verdict("9.5.5", rebound)
    assert ok is False and "left the dict it was given empty" in message, message


def test_9_5_5_the_checker_s_layer_is_the_section_s():
    """The layer the checker hands the answer is the section's CachedSelfAttention: its own forward, with a cache, gives
    what the notebook's does."""
    import jupytext
    from exercises_common import NOTEBOOKS
    nb = jupytext.read(NOTEBOOKS["9.5"])
    source = next(c.source for c in nb.cells if c.cell_type == "code" and "class CachedSelfAttention" in c.source)
    namespace = {"nn": torch.nn, "torch": torch, "F": F, "rope": rope}
    exec(source, namespace)
    torch.manual_seed(0)
    ours, theirs = _CachedSelfAttention(16, 4, 2), namespace["CachedSelfAttention"](16, 4, 2)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 7, 16)
    caches = {}, {}
    outs = [[m(x[:, :4], c), m(x[:, 4:5], c), m(x[:, 5:], c)] for m, c in zip((ours, theirs), caches, strict=True)]
    assert all(torch.equal(a, b) for a, b in zip(*outs, strict=True))


def test_9_5_3_a_symmetrized_pattern_is_rejected():
    def layers(pattern):                                  # ignores direction: a causal pattern then connects
        p = pattern | pattern.T
        r = p.clone()
        for n in range(1, len(p) + 1):
            if r.all():
                return n
            r = (r.float() @ p.float()) > 0
        return math.inf
    assert not any(verdict("9.5.3", layers)[0] for _ in range(5))


# A students' review: an answer whose overflow no check reached, and a hint that named nothing -----------------------

def test_9_5_3_path_counts_that_overflow_fail_every_check():
    """D3: counting paths in int64 passed every check (20 tokens at most) and printed inf in the notebook's next cell
    for a band of r = 2 at T = 64. Every check now holds such a band at T >= 128, and says the counts overflow."""
    fails_on_every_seed("9.5.3", _connect_counts, "overflow", seeds=range(25))


def test_9_5_3_path_counts_in_float32_fail_every_check():
    """A students' review: path counts in float32 (R = R @ P, not clamped) passed every check; at T = 128, as the
    notebook's next cell draws, a band of r = 2 needs 64 layers, the counts pass float32's 3.4e38 near 5^55, and inf * 0
    turns them into NaN, so the answer returned inf there."""
    fails_on_every_seed("9.5.3", functools.partial(_connect_counts, dtype=torch.float32), "overflow", seeds=range(10))


def test_9_5_1_the_output_in_place_of_the_state_is_told_so():
    """A merge that returned acc / l, the attention output, got the hint about rescaling."""
    fails_on_every_seed("9.5.1", _merge_output, "the state keeps the unnormalized acc", seeds=range(20))


def test_9_5_2_a_fractional_count_is_shown_once():
    """A students' review (2026-12-04): free / per, not rounded, was printed twice ('got float 42181.69 42181.69')."""
    ok, message = verdict("9.5.2", _context(rounding="float"))
    shown = re.search(r"got float (\S+)", message)
    assert not ok and shown and message.count(shown.group(1)) == 1, message
