import math

import pytest
import torch

from helpers.positions import frequencies, rope, sinusoidal


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
        (lambda: sinusoidal(0, 4), "positive int"),
        (lambda: rope(torch.randn(3, 5)), "even"),
        (lambda: rope(torch.randn(4)), r"\(\.\.\., T, d\)"),
        (lambda: frequencies(4, base=1.0), "greater than 1"),
    ],
)
def test_bad_arguments_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call()
