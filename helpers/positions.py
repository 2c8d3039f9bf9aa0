"""Position encodings: the sinusoidal table, RoPE, T5's relative buckets and ALiBi's linear biases.

Positions and angles are computed in float32 or wider, whatever the requested or input dtype, and
only the result is cast: in float16 the position 4095 is stored as 4096, and an angle of thousands of
radians keeps no digit of its fraction, so a table computed in half precision is wrong by whole units.
The positions themselves must be whole numbers that dtype holds exactly (up to 2**24 in float32).

Integer input is refused, as ``F.scaled_dot_product_attention`` refuses it (and as
``helpers.attention`` does): ``rope``'s ``x`` must be a real floating-point tensor and every
requested ``dtype`` a real floating-point torch dtype; rotated or tabulated in integers, sines and
cosines would be truncated to whole numbers.
"""

import math

import torch

from helpers.checks import finite_float, flag, floating, floating_dtype, integer, integers, positive_int


def _wide(dtype):
    """The dtype to compute positions and angles in: ``dtype`` itself if it is float32 or wider."""
    return torch.promote_types(floating_dtype(dtype, "dtype"), torch.float32)


def _positions(start, stop, dtype, device=None):
    """``start, ..., stop - 1`` in ``dtype``, refused where ``dtype`` cannot hold them exactly."""
    exact = round(2 / torch.finfo(dtype).eps)                       # float32: every integer up to 2**24
    if max(abs(start), abs(stop - 1)) > exact:
        wider = " compute in float64 for longer sequences" if dtype != torch.float64 else " no wider dtype holds them"
        raise ValueError(f"positions {start}..{stop - 1} exceed {dtype}'s exact integers (2**{exact.bit_length() - 1});{wider}")
    return torch.arange(start, stop, dtype=dtype, device=device)


def frequencies(d, base=10000.0, dtype=torch.float64):
    """The ``d/2`` angular frequencies ``omega_j = base^(-2j/d)`` shared by both encodings, in ``dtype``
    (computed in float64 and rounded once: a large ``base`` such as 1e39 overflows float32 itself, while
    the frequencies it gives may not)."""
    if positive_int(d, "d") % 2:
        raise ValueError(f"the width d must be a positive even int (coordinates come in pairs), got {d!r}")
    if finite_float(base, "base") <= 1:
        raise ValueError(f"base must be greater than 1, got {base}")
    floating_dtype(dtype, "dtype")
    return (base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)).to(dtype)


def sinusoidal(T, d, base=10000.0, dtype=torch.float64):
    """``(T, d)`` table: ``p[t, 2j] = sin(omega_j t)``, ``p[t, 2j+1] = cos(omega_j t)``, in ``dtype``."""
    T, dtype = positive_int(T, "T"), floating_dtype(dtype, "dtype")
    angle = _angles(0, T, d, base, "cpu")                                       # (T, d/2), float64
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(-2).to(dtype)   # rounded once


def _angles(start, stop, d, base, device):
    """``(stop - start, d/2)`` angles ``t * omega_j`` in float64, whatever the output's dtype: in float32,
    ``t * omega_0`` at ``t = 10**6`` would be off by up to 0.03 rad (its spacing there is 1/16). Devices
    without float64 (Apple's MPS) get float32."""
    dtype = torch.float32 if torch.device(device).type == "mps" else torch.float64
    return _positions(start, stop, dtype, device)[:, None] * frequencies(d, base, dtype).to(device)


def rope(x, base=10000.0, offset=0):
    """Rotate each coordinate pair ``(2j, 2j+1)`` of the row for position ``t`` by ``t * omega_j``.

    ``x (..., T, d) -> (..., T, d)``; positions start at ``offset`` (for a key-value cache). The angles
    are computed in float64, so a float32 ``x`` at position 10**6 is rotated as accurately as at 10; half
    precision input is rotated in float32 and the result rounded once, to ``x``'s dtype. ``x`` must be
    real floating point, with ``d`` even.
    """
    floating(x, "x")
    if x.dim() < 2 or x.shape[-1] % 2 or not x.shape[-1]:
        raise ValueError("x must be (..., T, d) with d a positive even number (coordinates come in pairs),"
                         f" got shape {tuple(x.shape)}")
    offset = integer(offset, "offset")
    T, d = x.shape[-2:]
    wide = _wide(x.dtype)
    angle = _angles(offset, offset + T, d, base, x.device)                       # (T, d/2), float64
    cos, sin = angle.cos().to(wide), angle.sin().to(wide)
    even, odd = x[..., 0::2].to(wide), x[..., 1::2].to(wide)
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2).to(x.dtype)


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
    offset = integers(offset, "offsets")
    flag(bidirectional, "bidirectional")
    buckets = positive_int(buckets, "buckets")
    max_distance = positive_int(max_distance, "max_distance")     # NaN would make bucket -2^63
    per_direction = buckets // 2 if bidirectional else buckets
    exact = per_direction // 2
    if exact < 1 or (bidirectional and buckets % 2):
        raise ValueError(f"buckets must be an even number >= 4 (bidirectional) or >= 2 (causal), got {buckets}")
    if max_distance <= exact:
        raise ValueError(f"max_distance must exceed the {exact} exact offsets, got {max_distance}")
    # Every offset of max_distance or more shares the last bucket; clamping first keeps -2**63 (whose
    # absolute value is itself in int64) from giving a negative bucket.
    offset = offset.long().clamp(-max_distance, max_distance)
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
    heads = positive_int(heads, "heads")
    floating_dtype(dtype, "dtype")

    def geometric(n):
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    below = 2 ** int(math.log2(heads))
    slopes = geometric(below) + geometric(2 * below)[0::2][: heads - below]
    return torch.tensor(slopes, dtype=dtype)


def alibi_bias(T, heads, dtype=torch.float64):
    """The ``(heads, T, T)`` additive score bias ``-m_h |i - j|`` for query ``i`` and key ``j``.

    Under a causal mask (keys ``j <= i``) this is ALiBi's penalty ``-m_h (i - j)``, the only one the paper
    defines; the symmetric form for unmasked attention is this book's extension. Add it to the scores
    before the softmax. Nothing is learned and every length ``T`` has a bias.
    """
    T, wide = positive_int(T, "T"), _wide(dtype)
    pos = _positions(0, T, wide)
    distance = (pos[:, None] - pos[None, :]).abs()                  # (T, T)
    bias = 0.0 - alibi_slopes(heads, wide)[:, None, None] * distance      # 0.0 - ...: no -0.0 on the diagonal
    return bias.to(dtype)
