import math

import numpy as np
import pytest
import torch

from helpers.positions import alibi_bias, alibi_slopes, frequencies, rope, sinusoidal, t5_bucket


def test_sinusoidal_values():
    p = sinusoidal(5, 4)
    assert p.shape == (5, 4)
    assert torch.allclose(p[3], torch.tensor([math.sin(3), math.cos(3), math.sin(0.03), math.cos(0.03)], dtype=p.dtype))


def test_rope_matches_the_pairwise_rotation():
    x = torch.randn(7, 6, dtype=torch.float64)
    y = rope(x)
    omega = frequencies(6)
    t, j = 4, 1
    c, s = math.cos(t * omega[j]), math.sin(t * omega[j])
    assert torch.allclose(y[t, 2 * j], c * x[t, 2 * j] - s * x[t, 2 * j + 1])
    assert torch.allclose(y[t, 2 * j + 1], s * x[t, 2 * j] + c * x[t, 2 * j + 1])


def test_rope_batches_and_offsets():
    x = torch.randn(2, 3, 10, 8, dtype=torch.float64)
    assert torch.allclose(rope(x)[..., 4:, :], rope(x[..., 4:, :], offset=4))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: sinusoidal(4, 5), "even"),
        (lambda: sinusoidal(0, 4), "T must be a positive int, got 0"),
        (lambda: rope(torch.randn(3, 5)), "even"),
        (lambda: rope(torch.randn(4)), r"\(\.\.\., T, d\)"),
        (lambda: frequencies(4, base=1.0), "greater than 1"),
        (lambda: frequencies(4, base=float("nan")), "base must be a finite number"),
        (lambda: sinusoidal(4.0, 4), "T must be a positive int, got 4.0"),
        (lambda: rope([[1.0, 2.0]]), "x must be a torch.Tensor"),
        (lambda: rope(torch.randn(3, 4), offset=1.5), "offset must be an int"),
    ],
)
def test_bad_arguments_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_rope_accepts_negative_offsets_and_numpy_ints():
    x = torch.randn(3, 4, dtype=torch.float64)
    assert torch.equal(rope(x, offset=-2)[2], x[2])                  # row 2 sits at position 0: no rotation
    assert torch.equal(rope(x, offset=np.int64(4)), rope(x, offset=4))


def test_t5_buckets_by_hand():
    # 32 buckets, 16 per direction: offsets 0..7 exact, then 8 + 8 log(|o| / 8) / log(16), at most 15.
    offsets = torch.tensor([0, -1, -7, -8, -16, -64, -128, -1000, 1, 8, 1000])
    assert t5_bucket(offsets).tolist() == [0, 1, 7, 8, 10, 14, 15, 15, 17, 24, 31]
    # Causal: 32 buckets for the past (16 exact), the future falls into bucket 0 with offset 0.
    assert t5_bucket(torch.tensor([0, -1, -15, -16, -32, 5]), bidirectional=False).tolist() == [0, 1, 15, 16, 21, 0]


def test_t5_buckets_are_monotone_and_in_range():
    past = t5_bucket(-torch.arange(500))
    assert (past.diff() >= 0).all() and past.max() == 15
    future = t5_bucket(torch.arange(1, 500))
    assert (future.diff() >= 0).all() and future.min() == 17 and future.max() == 31


def test_alibi_slopes():
    assert alibi_slopes(8).tolist() == [2.0**-i for i in range(1, 9)]
    # Not a power of two: the 8-head slopes, then every other slope of the 16-head sequence.
    expected = [2.0**-i for i in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    assert torch.allclose(alibi_slopes(12), torch.tensor(expected, dtype=torch.float64))


def test_alibi_bias():
    b = alibi_bias(5, 4)
    assert b.shape == (4, 5, 5)
    assert torch.equal(b[:, 3, 1], -2 * alibi_slopes(4))               # query 3, key 1: distance 2
    assert torch.equal(b, b.transpose(1, 2)) and (b.diagonal(dim1=1, dim2=2) == 0).all()
    assert not torch.signbit(b.diagonal(dim1=1, dim2=2)).any()         # +0.0, not -0.0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: t5_bucket(torch.tensor([0.5])), "offsets must be integers"),
        (lambda: t5_bucket(torch.tensor([1]), buckets=2), "even number"),
        (lambda: t5_bucket(torch.tensor([1]), buckets=33), "even number"),
        (lambda: t5_bucket(torch.tensor([1]), max_distance=8), "max_distance must exceed"),
        (lambda: t5_bucket(torch.tensor([1]), max_distance=float("nan")), "max_distance must be a positive int, got nan"),
        (lambda: t5_bucket(torch.tensor([1]), buckets=32.0), "buckets must be a positive int"),
        (lambda: t5_bucket(torch.tensor([1]), bidirectional="no"), "bidirectional must be True or False"),
        (lambda: alibi_slopes(0), "heads must be a positive int, got 0"),
        (lambda: alibi_bias(0, 4), "T must be a positive int, got 0"),
    ],
)
def test_bad_relative_arguments_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# Issue 23: integer dtypes and input. Positions are computed in floating point; an integer input or
# a requested integer dtype is refused, as F.scaled_dot_product_attention refuses integer tensors.
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64])
def test_rope_refuses_values_that_are_not_real_floating_point(dtype):
    with pytest.raises(ValueError, match=f"x must be a real floating-point tensor.*got {dtype}"):
        rope(torch.ones(3, 4, dtype=dtype))           # int64 was truncated: row 2 read [-1, 0, 0, 1]


@pytest.mark.parametrize("table", [
    lambda dt: frequencies(4, dtype=dt), lambda dt: sinusoidal(3, 4, dtype=dt),
    lambda dt: alibi_slopes(4, dtype=dt), lambda dt: alibi_bias(3, 2, dtype=dt)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64, "float32", np.float32])
def test_tables_refuse_dtypes_that_are_not_real_floating_point(table, dtype):
    with pytest.raises(ValueError, match="dtype must be a real floating-point torch dtype"):
        table(dtype)


def test_tables_return_the_dtype_asked_for():
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        assert frequencies(4, dtype=dtype).dtype == sinusoidal(3, 4, dtype=dtype).dtype == dtype
        assert alibi_slopes(4, dtype=dtype).dtype == alibi_bias(3, 2, dtype=dtype).dtype == dtype


def test_rope_and_tables_refuse_positions_float64_cannot_hold():
    x = torch.randn(2, 4)
    assert rope(x, offset=2**24).shape == (2, 4)                # 2**24 + 1 is not a float32, but angles are float64
    with pytest.raises(ValueError, match="exceed torch.float64's exact integers"):
        rope(x, offset=2**60)                                   # gave an obscure size mismatch
    with pytest.raises(ValueError, match=r"x must be \(\.\.\., T, d\) with d a positive even number"):
        rope(torch.ones(3, 0))                                  # named d, which the caller never passed


def test_float32_rope_and_tables_are_accurate_far_from_the_start():
    # The angles t * omega_j are float64: in float32, t * omega_0 at t = 10**6 is off by up to 1/32 rad.
    x = torch.randn(3, 2, 64, dtype=torch.float64)
    for offset in (0, 10**6, 2**24 + 3):
        torch.testing.assert_close(rope(x.float(), offset=offset), rope(x, offset=offset).float(), atol=2e-6, rtol=0)
    far = sinusoidal(10**6 + 8, 64, dtype=torch.float32)[-8:]
    torch.testing.assert_close(far, sinusoidal(10**6 + 8, 64)[-8:].float(), atol=1e-7, rtol=0)


def test_frequencies_in_half_precision_are_the_rounded_exact_ones():
    exact = frequencies(64)
    for dtype in (torch.float16, torch.bfloat16):
        assert torch.equal(frequencies(64, dtype=dtype), exact.to(dtype))


def test_t5_bucket_of_the_extreme_offsets_and_of_none():
    assert t5_bucket(torch.tensor([-2**63, 2**63 - 1])).tolist() == [15, 31]     # -2**63 gave -2**63
    assert t5_bucket(torch.tensor([-2**63]), bidirectional=False).tolist() == [31]
    assert t5_bucket([]).tolist() == []                          # an empty list was float32, refused


def test_frequencies_of_a_base_too_large_for_float32_are_computed_wider():
    # 1e39 overflows float32 (inf ** -0.5 = 0), but base^(-1/2) = 3.16e-20 fits in it.
    assert torch.equal(frequencies(4, base=1e39, dtype=torch.float32), torch.tensor([1.0, 1e39 ** -0.5]))
    with pytest.raises(ValueError, match="no wider dtype holds them"):
        rope(torch.randn(2, 4), offset=2**53)       # rope's positions are float64 already
