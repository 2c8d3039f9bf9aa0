"""Efficient attention (section 9.5): tiled attention and its naive reference.

The lessons themselves (the online-softmax loop, linear attention, the key–value cache, grouped-query
attention written out, sparse masks, random features) are written out in the notebook; this module
holds the batched and tested tiled attention that the section checks against PyTorch's fused kernel,
with masks, a causal flag and any tile. The section's benchmark times and measures the listing's own
loop instead, the code on the page: ``tiled_attention`` also scales the queries before the product, one
more copy of them, and holds a few temporaries for masked rows, so its memory is not the listing's (455
numbers per query against 388 in float32: at T = 4,096 and blocks of 64 keys, 7.5 MB against 6.4). Its
sums in float32 or wider add nothing for float32 inputs. Measuring time and memory is ``helpers.measure``'s job.
"""

import torch

from helpers.attention import attention, check_mask, check_qkv, compute_dtype
from helpers.checks import flag, positive_int


def tiled_attention(q, k, v, tile, mask=None, is_causal=False):
    """Exact scaled dot-product attention that never holds more than ``tile`` keys' scores per query.

    Shapes: ``q (..., m, d_k)``, ``k (..., n, d_k)``, ``v (..., n, d_v)`` -> ``(..., m, d_v)``; the
    leading dimensions broadcast; ``q``, ``k`` and ``v`` are real floating point (integer tensors are
    refused, as in ``helpers.attention``). ``mask`` is boolean and broadcasts to the scores
    ``(..., m, n)`` without growing them, True where a query may *not* see a key (as in
    ``helpers.attention``). ``is_causal`` hides key ``j > i`` from query ``i`` (aligned top-left, as
    ``F.scaled_dot_product_attention``) without building a mask: every block's scores are computed
    and its future keys masked. Only the blocks after the last query (keys ``j >= m``, hidden from
    every query) are skipped, so in self-attention (``m == n``) none is: unlike FlashAttention-2, it
    does not skip the blocks that lie wholly in a block of queries' future. A query that sees no key
    at all (a fully masked row, or no keys) gets zeros, as in ``helpers.attention.attention`` and SDPA.
    The running maximum, normalizer and weighted sum are kept in float32 (or wider) whatever the
    input's dtype, and only the result is cast back: summed over thousands of keys in bfloat16 they
    would lose digits. The output has ``v``'s dtype, as ``helpers.attention.attention``'s.
    """
    tile = positive_int(tile, "tile")
    is_causal = flag(is_causal, "is_causal")
    check_qkv(q, k, v)
    m_q, n = q.shape[-2], k.shape[-2]
    if mask is not None:
        lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        check_mask(mask, (*lead, m_q, n))
    if n == 0:                                          # no key: zeros, still a function of q, k and v for autograd
        return attention(q, k, v, mask)[0]
    out_dtype = v.dtype
    wide = compute_dtype(q, k, v)
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
    """Scaled dot-product attention that materializes all scores: ``(..., T, d) -> (..., T, d_v)``.

    A float32 (or float64) teaching baseline, written as the formula reads: ``q``, ``k`` and ``v``
    share one of those dtypes. Half precision is refused: there ``q k^T`` overflows float16 at
    scores that float32 holds easily, and the softmax of ``inf - inf`` is NaN. ``attention`` and
    ``tiled_attention`` compute half-precision input in float32.
    """
    check_qkv(q, k, v)
    if q.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"naive_attention is a float32 teaching baseline, got {q.dtype}: for half precision"
                         " use attention or tiled_attention, which compute in float32")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5          # (..., T, T): the memory we want to avoid
    return torch.softmax(s, dim=-1) @ v
