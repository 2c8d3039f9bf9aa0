"""Attention primitives that several notebooks reuse: scaled dot-product attention and masks.

Masks follow ``torch.nn.MultiheadAttention``: a boolean tensor in which ``True`` marks a key that a
query may *not* attend to. A query that may attend to no key at all (a fully masked row, or no keys)
gets all-zero weights and a zero output, as ``F.scaled_dot_product_attention`` does on the CPU in torch
2.13 (its GPU kernels were not checked here);
the softmax of a row of ``-inf`` alone would be NaN.

A mask may hide keys but not add sequences: it must broadcast to the scores' shape without growing
it. Integer input is refused: ``q``, ``k``, ``v`` (and ``softmax_jacobian``'s ``p``) must be real
floating-point tensors, as ``F.scaled_dot_product_attention`` requires; computed in integers the
weights would be truncated to zeros. Every helper of the chapter's attention and positions follows
this one rule.
"""

import torch

from helpers.checks import floating, integers, positive_int, tensor


def attention(q, k, v, mask=None):
    """Scaled dot-product attention, written out; returns ``(outputs, weights)``.

    Shapes: ``q (..., m, d_k)``, ``k (..., n, d_k)``, ``v (..., n, d_v)``, real floating point;
    ``mask`` broadcasts to the scores ``(..., m, n)`` without growing them -> outputs
    ``(..., m, d_v)``, weights ``(..., m, n)``. A fully masked query gets zero weights and a zero
    output. Half-precision inputs are computed in float32, mixed dtypes in the widest of them,
    and the results cast back (outputs to v's dtype, weights to q's): the scale comes before the
    product, so large entries do not overflow.
    """
    check_qkv(q, k, v)
    wide = compute_dtype(q, k, v)
    s = (q.to(wide) * q.shape[-1] ** -0.5) @ k.to(wide).transpose(-2, -1)   # (..., m, n) scores
    if mask is not None:
        check_mask(mask, s.shape)
        s = s.masked_fill(mask, float("-inf"))
    w = torch.softmax(s, dim=-1)
    if mask is not None:
        w = w.masked_fill(mask.all(dim=-1, keepdim=True), 0.0)     # no key to see: zeros, not NaN
    return (w @ v.to(wide)).to(v.dtype), w.to(q.dtype)


def compute_dtype(q, k, v):
    """The dtype attention computes in: float16/bfloat16 -> float32; mixed dtypes in the widest of them, so
    float64 keeps its precision."""
    return torch.promote_types(torch.promote_types(q.dtype, k.dtype), torch.promote_types(v.dtype, torch.float32))


def check_qkv(q, k, v):
    """Raise ``ValueError`` unless ``q (..., m, d_k)``, ``k (..., n, d_k)``, ``v (..., n, d_v)`` fit:
    real floating-point tensors, with ``d_k >= 1``."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        floating(t, name, min_dim=2)                           # (tokens, features) at least
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"queries and keys differ in width: {q.shape[-1]} != {k.shape[-1]}")
    if q.shape[-1] == 0:
        raise ValueError(f"queries and keys need at least one feature (the scale is 1/sqrt(d_k)), got shape {tuple(q.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"keys and values differ in number: {k.shape[-2]} != {v.shape[-2]}")
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(f"the leading (batch, head) dimensions of q, k and v do not broadcast: {tuple(q.shape[:-2])},"
                         f" {tuple(k.shape[:-2])} and {tuple(v.shape[:-2])}") from None


def check_mask(mask, shape):
    """Raise ``ValueError`` unless ``mask`` is boolean and broadcasts to ``shape`` (..., m, n) without growing it.

    A mask of more than two dimensions must have as many as the scores: broadcasting aligns the last
    dimensions, so a ``(B, 1, n)`` padding mask against ``(B, H, m, n)`` scores would line its batch up
    with the heads, silently wrong whenever ``B == H`` (add the head axis: ``mask[:, None]``). A two-dimensional
    mask is ``(m, n)``, one row per query, shared by every sequence (a causal mask): a padding mask
    ``(B, n)`` must be given as ``(B, 1, n)``, since when ``B == m`` the two cannot be told apart.
    """
    tensor(mask, "mask")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be boolean (True hides a key), got {mask.dtype}")
    shape = tuple(shape)
    if 2 < mask.dim() < len(shape):
        raise ValueError(f"mask of shape {tuple(mask.shape)} has fewer dimensions than the scores {shape}: its first"
                         " would line up with the scores' second (the heads, say); give it the scores' dimensions"
                         " (for a padding mask and multi-head scores, mask[:, None])")
    try:
        grown = torch.broadcast_shapes(mask.shape, shape)
    except RuntimeError:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not fit scores of shape {shape}") from None
    if tuple(grown) != shape:        # SDPA refuses this too: the mask would add sequences to the output
        raise ValueError(f"mask of shape {tuple(mask.shape)} would broadcast the scores {shape} to {tuple(grown)};"
                         " a mask may hide keys, not add sequences")


def causal_mask(T, device=None):
    """``(T, T)`` boolean mask hiding the future: entry ``(i, j)`` is True where ``j > i``."""
    T = positive_int(T, "T")
    return torch.triu(torch.ones(T, T, dtype=torch.bool, device=device), diagonal=1)


def padding_mask(lengths, T):
    """``(B, 1, T)`` boolean mask hiding positions at or beyond each sequence's length.

    ``lengths`` holds ``B`` integers in ``1..T``. The mask broadcasts over the queries of a
    ``(B, T, T)`` score matrix; for multi-head scores ``(B, H, T, T)`` give it a head axis, ``[:, None]``.
    """
    T = positive_int(T, "T")
    lengths = integers(lengths, "lengths")
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be one-dimensional, got shape {tuple(lengths.shape)}")
    if (lengths < 1).any() or (lengths > T).any():
        raise ValueError(f"every length must lie in 1..{T}, got {lengths.tolist()}")
    return (torch.arange(T, device=lengths.device) >= lengths[:, None])[:, None, :]


def softmax_jacobian(p):
    """Jacobian ``diag(p) - p p^T`` of the softmax at probabilities ``p``: ``(..., n) -> (..., n, n)``.

    ``p`` is a softmax's output: a real floating-point tensor whose last dimension holds probabilities,
    non-negative and summing to 1 within ``sqrt(eps) + n eps'``, where ``eps`` is its dtype's and
    ``eps'`` that of the float32 (or wider) sum a softmax accumulates: the rounding a softmax leaves.
    Anything else is refused: the formula holds only at a softmax's output.
    """
    floating(p, "p", min_dim=1)
    if p.isnan().any() or (p < 0).any():
        raise ValueError("p must hold probabilities, non-negative and not NaN (a softmax's output)")
    tolerance = torch.finfo(p.dtype).eps ** 0.5 + p.shape[-1] * torch.finfo(torch.promote_types(p.dtype, torch.float32)).eps
    sums = p.double().sum(-1).flatten()
    worst = sums[(sums - 1).abs().argmax()].item() if sums.numel() else 1.0
    if not abs(worst - 1) <= tolerance:
        raise ValueError(f"p must sum to 1 along its last dimension (a softmax's output), within {tolerance:.1g};"
                         f" a row of {p.shape[-1]} sums to {worst:.6g}")
    return torch.diag_embed(p) - p[..., :, None] * p[..., None, :]
