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


def test_softmax_jacobian_matches_autograd():
    s = torch.randn(5, dtype=torch.float64)
    J = torch.autograd.functional.jacobian(lambda z: torch.softmax(z, -1), s)
    assert torch.allclose(softmax_jacobian(torch.softmax(s, -1)), J)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: attention(torch.randn(3, 4), torch.randn(3, 5), torch.randn(3, 4)), "differ in width"),
        (lambda: attention(torch.randn(3, 4), torch.randn(3, 4), torch.randn(2, 4)), "differ in number"),
        (lambda: attention(torch.randn(4), torch.randn(3, 4), torch.randn(3, 4)), "at least two"),
        (lambda: attention(torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4), torch.ones(2, 2).bool()),
         "does not fit"),
        (lambda: check_mask(torch.zeros(3, 3), (3, 3)), "boolean"),
        (lambda: causal_mask(0), "positive"),
        (lambda: padding_mask([0, 2], 4), "1..4"),
        (lambda: padding_mask([[1]], 4), "one-dimensional"),
        (lambda: softmax_jacobian(torch.tensor(1.0)), "at least one"),
    ],
)
def test_bad_arguments_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call()
