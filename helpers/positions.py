"""Position encodings: the sinusoidal table, RoPE, T5's relative buckets and ALiBi's linear biases."""

import math

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


def t5_bucket(offset, bidirectional=True, buckets=32, max_distance=128):
    """T5's bucket index for each relative offset ``j - i`` (key position minus query position).

    ``offset`` (any shape, integers) -> bucket indices of the same shape, in ``0 .. buckets - 1``.
    Half of each direction's buckets hold one offset each (0, 1, 2, ...); the rest cover larger offsets
    on a logarithmic scale, and the farthest, including every offset of ``max_distance`` or more,
    share the last bucket. With
    ``bidirectional=True`` keys before and after the query get separate buckets; with ``False`` (a
    causal model) only offsets ``<= 0`` are told apart. Follows Raffel et al. (2020), as implemented in
    T5's reference code.
    """
    offset = torch.as_tensor(offset)
    if offset.is_floating_point() or offset.is_complex():
        raise ValueError(f"offsets must be integers, got dtype {offset.dtype}")
    per_direction = buckets // 2 if bidirectional else buckets
    exact = per_direction // 2
    if exact < 1 or (bidirectional and buckets % 2):
        raise ValueError(f"buckets must be an even number >= 4 (bidirectional) or >= 2 (causal), got {buckets}")
    if max_distance <= exact:
        raise ValueError(f"max_distance must exceed the {exact} exact offsets, got {max_distance}")
    offset = offset.long()
    if bidirectional:
        base = (offset > 0).long() * per_direction         # keys after the query use the upper half
        distance = offset.abs()
    else:
        base = torch.zeros_like(offset)
        distance = (-offset).clamp(min=0)                   # the future is not told apart
    # Logarithmic buckets from `exact` up to max_distance (clamped to 1 first: log 0 is unused anyway).
    log_ratio = torch.log(distance.clamp(min=1).double() / exact) / math.log(max_distance / exact)
    far = (exact + log_ratio * (per_direction - exact)).long().clamp(max=per_direction - 1)
    return base + torch.where(distance < exact, distance, far)


def alibi_slopes(heads, dtype=torch.float64):
    """ALiBi's per-head slopes ``m_h`` (Press et al., 2022): ``(heads,)``.

    For ``heads`` a power of two, the geometric sequence ``2^(-8/H), 2^(-16/H), ..., 2^(-8)``; otherwise
    the slopes for the nearest smaller power of two followed by every other slope of the next one,
    as in the paper's code.
    """
    if not isinstance(heads, int) or heads < 1:
        raise ValueError(f"heads must be a positive int, got {heads!r}")

    def geometric(n):
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    below = 2 ** int(math.log2(heads))
    slopes = geometric(below) + geometric(2 * below)[0::2][: heads - below]
    return torch.tensor(slopes, dtype=dtype)


def alibi_bias(T, heads, dtype=torch.float64):
    """ALiBi's ``(heads, T, T)`` additive score bias ``-m_h |i - j|`` for query ``i`` and key ``j``.

    Under a causal mask (keys ``j <= i``) this is the paper's penalty ``-m_h (i - j)``; add it to the
    scores before the softmax. Nothing is learned and every length ``T`` has a bias.
    """
    if not isinstance(T, int) or T < 1:
        raise ValueError(f"T must be a positive int, got {T!r}")
    pos = torch.arange(T, dtype=dtype)
    distance = (pos[:, None] - pos[None, :]).abs()                  # (T, T)
    return 0.0 - alibi_slopes(heads, dtype)[:, None, None] * distance      # 0.0 - ...: no -0.0 on the diagonal
