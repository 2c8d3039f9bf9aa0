"""Position encodings: the sinusoidal table of Vaswani et al. and rotary embeddings (RoPE)."""

import torch


def frequencies(d, base=10000.0, dtype=torch.float64):
    """The ``d/2`` angular frequencies ``omega_j = base^(-2j/d)`` shared by both encodings."""
    if not isinstance(d, int) or d < 2 or d % 2:
        raise ValueError(f"the width d must be a positive even int (coordinates come in pairs), got {d!r}")
    if base <= 1:
        raise ValueError(f"base must be greater than 1, got {base}")
    return base ** (-torch.arange(0, d, 2, dtype=dtype) / d)


def sinusoidal(T, d, base=10000.0, dtype=torch.float64):
    """``(T, d)`` table: ``p[t, 2j] = sin(omega_j t)``, ``p[t, 2j+1] = cos(omega_j t)``."""
    if not isinstance(T, int) or T < 1:
        raise ValueError(f"T must be a positive int, got {T!r}")
    angle = torch.arange(T, dtype=dtype)[:, None] * frequencies(d, base, dtype)     # (T, d/2)
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(-2)


def rope(x, base=10000.0, offset=0):
    """Rotate each coordinate pair ``(2j, 2j+1)`` of the row for position ``t`` by ``t * omega_j``.

    ``x (..., T, d) -> (..., T, d)``; positions start at ``offset`` (for a key-value cache).
    """
    if x.dim() < 2:
        raise ValueError(f"x must be (..., T, d), got shape {tuple(x.shape)}")
    T, d = x.shape[-2:]
    omega = frequencies(d, base, x.dtype).to(x.device)
    angle = torch.arange(offset, offset + T, dtype=x.dtype, device=x.device)[:, None] * omega
    cos, sin = angle.cos(), angle.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)
