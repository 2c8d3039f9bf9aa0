import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers.attention import attention, causal_mask, check_mask, padding_mask, softmax_jacobian


def test_attention_matches_pytorch():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(3))
    out, w = attention(q, k, v)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v), atol=1e-6)
    assert torch.allclose(w.sum(-1), torch.ones(2, 3, 5))


def test_attention_with_causal_mask_matches_pytorch():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(4, 6, 8, generator=g) for _ in range(3))
    out, w = attention(q, k, v, causal_mask(6))
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6)
    assert (w[:, 0, 1:] == 0).all()


def test_cross_attention_shapes():
    out, w = attention(torch.randn(3, 4), torch.randn(7, 4), torch.randn(7, 2))
    assert out.shape == (3, 2) and w.shape == (3, 7)


def test_causal_mask():
    assert causal_mask(3).tolist() == [[False, True, True], [False, False, True], [False, False, False]]


def test_padding_mask_hides_padding_only():
    m = padding_mask([2, 4], 4)
    assert m.shape == (2, 1, 4)
    assert m[0, 0].tolist() == [False, False, True, True]
    assert not m[1].any()


def test_padding_zeroes_weights():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 8, generator=g)
    _, w = attention(x, x, x, padding_mask([2, 4], 4))
    assert (w[0, :, 2:] == 0).all()


def test_padding_mask_accepts_numpy_lengths():
    assert torch.equal(padding_mask(np.array([2, 4]), np.int64(4)), padding_mask([2, 4], 4))


def test_fully_masked_query_gets_zeros_like_sdpa():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 8, generator=g) for _ in range(3))
    mask = torch.zeros(2, 4, 4, dtype=torch.bool)
    mask[1, 2] = True                                      # query 2 of the second sequence sees nothing
    out, w = attention(q, k, v, mask)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, attn_mask=~mask), atol=1e-6)
    assert (out[1, 2] == 0).all() and (w[1, 2] == 0).all()
    assert torch.allclose(w.sum(-1)[0], torch.ones(4))    # every other row still sums to one


def test_softmax_jacobian_matches_autograd():
    s = torch.randn(5, dtype=torch.float64)
    J = torch.autograd.functional.jacobian(lambda z: torch.softmax(z, -1), s)
    assert torch.allclose(softmax_jacobian(torch.softmax(s, -1)), J)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: attention(torch.randn(3, 4), torch.randn(3, 5), torch.randn(3, 4)), "differ in width"),
        (lambda: attention(torch.randn(3, 4), torch.randn(3, 4), torch.randn(2, 4)), "differ in number"),
        (lambda: attention(torch.randn(4), torch.randn(3, 4), torch.randn(3, 4)), "q needs at least 2 dimensions"),
        (lambda: attention([[1.0]], torch.randn(3, 1), torch.randn(3, 1)), "q must be a torch.Tensor, got list"),
        (lambda: attention(torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4), [[True]]), "mask must be a torch.Tensor"),
        (lambda: attention(torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4), torch.ones(2, 2).bool()),
         "does not fit"),
        (lambda: check_mask(torch.zeros(3, 3), (3, 3)), "boolean"),
        (lambda: causal_mask(0), "T must be a positive int, got 0"),
        (lambda: causal_mask(True), "T must be a positive int, got True"),
        (lambda: padding_mask([0, 2], 4), "1..4"),
        (lambda: padding_mask([2.5, 3.0], 4), "lengths must be integers"),
        (lambda: padding_mask([2, 3], 4.5), "T must be a positive int, got 4.5"),
        (lambda: padding_mask([[1]], 4), "one-dimensional"),
        (lambda: softmax_jacobian(torch.tensor(1.0)), "p needs at least 1 dimensions"),
    ],
)
def test_bad_arguments_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# Issue 23: integer input, masks that would grow the output, and softmax_jacobian's domain.
QKV = tuple(torch.randn(3, 2, 5, 8, generator=torch.Generator().manual_seed(23)).unbind(0))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64])
def test_attention_refuses_values_that_are_not_real_floating_point(dtype):
    q, k, v = QKV
    with pytest.raises(ValueError, match=f"q must be a real floating-point tensor.*got {dtype}"):
        attention(q.to(dtype), k.to(dtype), v.to(dtype))
    with pytest.raises(ValueError, match=f"k must be a real floating-point tensor.*got {dtype}"):
        attention(q, k.to(dtype), v)          # an int q and k with a float v gave int weights, all 0
    with pytest.raises(ValueError, match=f"v must be a real floating-point tensor.*got {dtype}"):
        attention(q, k, v.to(dtype))


def test_a_mask_may_not_grow_the_output():
    q, k, v = QKV
    with pytest.raises(ValueError, match=r"mask of shape \(4, 2, 5, 5\) would broadcast the scores \(2, 5, 5\)"):
        attention(q, k, v, torch.zeros(4, 2, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="would broadcast"):
        attention(q[0], k[0], v[0], torch.zeros(2, 5, 5, dtype=torch.bool))
    out, w = attention(q, k, v, torch.zeros(1, 5, 5, dtype=torch.bool))     # broadcasting down is fine
    assert out.shape == (2, 5, 8) and w.shape == (2, 5, 5)


def test_padding_mask_of_no_sequences_is_empty():
    assert padding_mask([], 4).shape == (0, 1, 4)
    assert padding_mask(torch.tensor([], dtype=torch.long), 4).shape == (0, 1, 4)
    with pytest.raises(ValueError, match="lengths must be integers"):
        padding_mask(torch.tensor([], dtype=torch.float32), 4)      # an empty float tensor is still floats


@pytest.mark.parametrize(
    ("p", "message"),
    [
        (torch.tensor([2.0, -1.0]), "p must hold probabilities"),           # sums to 1 but is negative
        (torch.tensor([0.5, 0.6]), r"p must sum to 1 along its last dimension"),
        (torch.tensor([[0.5, 0.5], [0.2, 0.2]]), r"p must sum to 1"),
        (torch.tensor([float("nan"), 1.0]), "p must hold probabilities"),
        (torch.tensor([0, 1]), "p must be a real floating-point tensor.*torch.int64"),
        (torch.ones(0), r"p must sum to 1"),                                 # no outcomes: no distribution
    ],
)
def test_softmax_jacobian_refuses_what_is_not_a_distribution(p, message):
    with pytest.raises(ValueError, match=message):
        softmax_jacobian(p)


def test_softmax_jacobian_takes_float32_softmax_outputs_and_empty_batches():
    s = torch.randn(31, 200, 40, generator=torch.Generator().manual_seed(0)) * 30
    J = softmax_jacobian(torch.softmax(s, -1))                  # float32 rounding is within the tolerance
    assert J.shape == (31, 200, 40, 40)
    assert softmax_jacobian(torch.ones(0, 3)).shape == (0, 3, 3)
    assert softmax_jacobian(torch.tensor([1.0], dtype=torch.float16)).dtype == torch.float16


def test_softmax_jacobian_tolerance_is_the_rounding_of_a_softmax_not_more():
    for dtype in (torch.float16, torch.bfloat16):
        p = torch.full((10000,), 1e-4, dtype=dtype)     # rounded, each 1e-4 sums to about 1
        softmax_jacobian(torch.softmax(torch.randn(10000), 0).to(dtype))
        with pytest.raises(ValueError, match="p must sum to 1"):
            softmax_jacobian(p * 1.2)                   # n eps of float16 would have let 20% pass


def test_a_mask_with_fewer_dimensions_than_multi_head_scores_is_refused():
    # A (B, 1, T) padding mask against (B, H, T, T) scores lines its batch up with the heads: when B == H
    # broadcasting accepts it and the second sequence's padding hid keys of the first's second head.
    x = torch.randn(2, 2, 4, 8)
    with pytest.raises(ValueError, match=r"mask\[:, None\]"):
        attention(x, x, x, padding_mask([2, 4], 4))
    _, w = attention(x, x, x, padding_mask([2, 4], 4)[:, None])
    assert w[0, :, :, 2:].abs().sum() == 0 and w[1].gt(0).all()
    _, w = attention(x, x, x, causal_mask(4))       # two dimensions broadcast over batch and heads, as before
    assert w.shape == (2, 2, 4, 4)
    with pytest.raises(ValueError, match=r"do not broadcast: \(2,\), \(2,\) and \(3,\)"):
        attention(torch.randn(2, 4, 8), torch.randn(2, 4, 8), torch.randn(3, 4, 8))
