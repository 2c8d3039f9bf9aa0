"""Half precision (float16 and bfloat16) at a long sequence: the helpers' error against a float64
reference must stay within a small factor of what PyTorch's own SDPA, or rounding the input, costs."""

import pytest
import torch
import torch.nn.functional as F

from helpers.attention import attention
from helpers.efficient import tiled_attention
from helpers.positions import alibi_bias, rope, sinusoidal

T, d = 4096, 64
HALF = [torch.float16, torch.bfloat16]


@pytest.fixture(scope="module")
def case():
    """``q, k, v (1, T, d)`` in float64 and the exact outputs, plain and causal (computed once)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 1, T, d, generator=g, dtype=torch.float64).unbind(0)
    exact = {c: F.scaled_dot_product_attention(q, k, v, is_causal=c) for c in (False, True)}
    return (q, k, v), exact


def error(got, want):
    return (got.double() - want).abs().max().item()


@pytest.mark.parametrize("dtype", HALF)
def test_attention_and_tiled_attention_are_as_accurate_as_sdpa(case, dtype):
    qkv, exact = case
    h = [t.to(dtype) for t in qkv]
    for causal in (False, True):
        sdpa = error(F.scaled_dot_product_attention(*h, is_causal=causal), exact[causal])
        tiled = tiled_attention(*h, 512, is_causal=causal)
        assert tiled.dtype == dtype and error(tiled, exact[causal]) <= 2 * sdpa, (causal, error(tiled, exact[causal]), sdpa)
        if not causal:                      # the masked path is the same code (tested in float64)
            out, w = attention(*h)
            assert out.dtype == w.dtype == dtype and error(out, exact[causal]) <= 2 * sdpa, (error(out, exact[causal]), sdpa)


@pytest.mark.parametrize("dtype", HALF)
def test_large_entries_do_not_overflow(dtype):
    # Entries of scale 60: q k^T reaches ~ 60 * 60 * 64 = 230400 > 65504 (float16's largest) unscaled.
    g = torch.Generator().manual_seed(1)
    q, k = (60 * torch.randn(256, d, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(256, d, generator=g, dtype=torch.float64)
    exact = F.scaled_dot_product_attention(q, k, v)
    h = [t.to(dtype) for t in (q, k, v)]
    sdpa = error(F.scaled_dot_product_attention(*h), exact)
    assert error(attention(*h)[0], exact) <= 2 * sdpa + 1e-3
    assert error(tiled_attention(*h, 64), exact) <= 2 * sdpa + 1e-3


@pytest.mark.parametrize("dtype", HALF)
def test_rope_costs_little_more_than_rounding_its_input(dtype):
    x = torch.randn(T, d, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    rounding = error(x.to(dtype), x)
    y = rope(x.to(dtype))
    assert y.dtype == dtype
    assert error(y, rope(x)) <= 3 * rounding, (error(y, rope(x)), rounding)


@pytest.mark.parametrize("dtype", HALF)
def test_tables_in_half_precision_are_the_rounded_exact_tables(dtype):
    for table in (lambda dt: sinusoidal(T, d, dtype=dt), lambda dt: alibi_bias(T, 1, dtype=dt)):
        exact = table(torch.float64)
        rounding = error(exact.to(dtype), exact)           # what storing the exact table costs
        got = table(dtype)
        assert got.dtype == dtype and error(got, exact) <= 1.5 * rounding, (error(got, exact), rounding)
