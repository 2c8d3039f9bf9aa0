"""Attention primitives that several notebooks reuse: scaled dot-product attention and masks.

Masks follow ``torch.nn.MultiheadAttention``: a boolean tensor in which ``True`` marks a key that a
query may *not* attend to.
"""

import torch


def attention(q, k, v, mask=None):
    """Scaled dot-product attention, written out; returns ``(outputs, weights)``.

    Shapes: ``q (..., m, d_k)``, ``k (..., n, d_k)``, ``v (..., n, d_v)``, ``mask`` broadcastable
    to ``(..., m, n)`` -> outputs ``(..., m, d_v)``, weights ``(..., m, n)``.
    """
    check_qkv(q, k, v)
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5          # (..., m, n) scores
    if mask is not None:
        check_mask(mask, s.shape)
        s = s.masked_fill(mask, float("-inf"))
    w = torch.softmax(s, dim=-1)
    return w @ v, w


def check_qkv(q, k, v):
    """Raise ``ValueError`` unless ``q (..., m, d_k)``, ``k (..., n, d_k)``, ``v (..., n, d_v)`` fit."""
    if q.dim() < 2 or k.dim() < 2 or v.dim() < 2:
        raise ValueError("q, k and v need at least two dimensions (tokens, features)")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"queries and keys differ in width: {q.shape[-1]} != {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"keys and values differ in number: {k.shape[-2]} != {v.shape[-2]}")


def check_mask(mask, shape):
    """Raise ``ValueError`` unless ``mask`` is boolean and broadcastable to ``shape`` (..., m, n)."""
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be boolean (True hides a key), got {mask.dtype}")
    try:
        torch.broadcast_shapes(mask.shape, tuple(shape))
    except RuntimeError:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not fit scores of shape {tuple(shape)}") from None


def causal_mask(T, device=None):
    """``(T, T)`` boolean mask hiding the future: entry ``(i, j)`` is True where ``j > i``."""
    if not isinstance(T, int) or T < 1:
        raise ValueError(f"T must be a positive int, got {T!r}")
    return torch.triu(torch.ones(T, T, dtype=torch.bool, device=device), diagonal=1)


def padding_mask(lengths, T):
    """``(B, 1, T)`` boolean mask hiding positions at or beyond each sequence's length.

    It broadcasts over the queries of a ``(B, T, T)`` score matrix.
    """
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be one-dimensional, got shape {tuple(lengths.shape)}")
    if (lengths < 1).any() or (lengths > T).any():
        raise ValueError(f"every length must lie in 1..{T}, got {lengths.tolist()}")
    return (torch.arange(T) >= lengths[:, None])[:, None, :]


def softmax_jacobian(p):
    """Jacobian ``diag(p) - p p^T`` of the softmax at probabilities ``p``: ``(..., n) -> (..., n, n)``."""
    if p.dim() < 1:
        raise ValueError("p needs at least one dimension")
    return torch.diag_embed(p) - p[..., :, None] * p[..., None, :]
