import pytest
import torch
import torch.nn.functional as F

from helpers.attention import attention, causal_mask, padding_mask
from helpers.efficient import naive_attention, tiled_attention
from helpers.measure import count_flops


def qkv(*shape, seed=0, n=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*shape, generator=g, dtype=torch.float64)
    kv_shape = (*shape[:-2], n or shape[-2], shape[-1])
    return q, torch.randn(*kv_shape, generator=g, dtype=torch.float64), torch.randn(*kv_shape, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("tile", [1, 3, 16, 37, 64, 500])
def test_tiled_equals_full_attention(tile):
    q, k, v = qkv(2, 3, 37, 8)
    assert torch.allclose(tiled_attention(q, k, v, tile), F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("tile", [1, 5, 16, 37, 64])
def test_tiled_causal_equals_full_causal(tile):
    q, k, v = qkv(2, 3, 37, 8, seed=1)
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(tiled_attention(q, k, v, tile, is_causal=True), full)
    assert torch.allclose(tiled_attention(q, k, v, tile, mask=causal_mask(37)), full)


@pytest.mark.parametrize("tile", [2, 7, 40])
def test_tiled_with_padding_mask_and_cross_attention(tile):
    q, k, v = qkv(2, 5, 8, seed=2, n=40)
    mask = padding_mask([13, 40], 40)                       # (2, 1, 40): broadcasts over the queries
    assert torch.allclose(tiled_attention(q, k, v, tile, mask=mask), attention(q, k, v, mask)[0])


def test_causal_tiled_skips_only_the_keys_after_the_last_query():
    """What the docstring says: in self-attention every block's scores are computed (and masked), the
    same matrix products as without the flag; with more keys than queries the blocks after the last
    query are skipped."""
    def flops(q, k, v, causal):
        return count_flops(lambda q, k, v: tiled_attention(q, k, v, 4, is_causal=causal), q, k, v)

    q, k, v = qkv(1, 16, 8, seed=5)
    assert flops(q, k, v, True) == flops(q, k, v, False) == 4 * 16 * 16 * 8
    q, k, v = qkv(1, 8, 8, seed=6, n=32)
    assert flops(q, k, v, True) == 4 * 8 * 8 * 8 < flops(q, k, v, False)


def test_tiled_causal_with_fewer_keys_than_queries():
    q, k, v = qkv(1, 9, 4, seed=3, n=5)
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(tiled_attention(q, k, v, 2, is_causal=True), full)


def test_fully_masked_rows_and_no_keys_give_zeros_like_sdpa():
    q, k, v = qkv(6, 4, seed=4)
    mask = torch.zeros(6, 6, dtype=torch.bool)
    mask[2] = True
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=~mask)
    for out in (tiled_attention(q, k, v, 4, mask=mask), attention(q, k, v, mask)[0]):
        assert torch.allclose(out, sdpa) and (out[2] == 0).all() and not out.isnan().any()
    assert (attention(q, k, v, mask)[1][2] == 0).all()
    none = torch.zeros(0, 4, dtype=torch.float64)
    assert torch.equal(tiled_attention(q, none, none, 3), torch.zeros(6, 4, dtype=torch.float64))
    assert torch.equal(attention(q, none, none)[0], torch.zeros(6, 4, dtype=torch.float64))


def test_tiled_accepts_float32_and_broadcasts_heads():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 10, 8, generator=g)
    k, v = torch.randn(2, 1, 10, 8, generator=g), torch.randn(2, 1, 10, 8, generator=g)
    out = tiled_attention(q, k, v, 3)
    assert out.shape == (2, 4, 10, 8) and out.dtype == torch.float32
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k.expand_as(q), v.expand_as(q)), atol=1e-6)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda q, k, v: tiled_attention(q, k, v, 0), "positive int"),
        (lambda q, k, v: tiled_attention(q, k, v, 2.5), "positive int"),
        (lambda q, k, v: tiled_attention(q, k[..., :3], v, 2), "differ in width"),
        (lambda q, k, v: tiled_attention(q, k, v[:-1], 2), "differ in number"),
        (lambda q, k, v: tiled_attention(q[0], k, v, 2), "q needs at least 2 dimensions"),
        (lambda q, k, v: tiled_attention(q, k, v, 2, mask=torch.ones(3, 3, dtype=torch.bool)), "does not fit"),
        (lambda q, k, v: tiled_attention(q, k, v, 2, mask=torch.ones(6, 6)), "boolean"),
        (lambda q, k, v: tiled_attention(q, k, v, True), "positive int"),
        (lambda q, k, v: tiled_attention(q, k, v, 2, is_causal="no"), "is_causal must be True or False"),
        (lambda q, k, v: tiled_attention(q.tolist(), k, v, 2), "q must be a torch.Tensor, got list"),
        (lambda q, k, v: naive_attention(q[0], k, v), "q needs at least 2 dimensions"),
        (lambda q, k, v: naive_attention(q, k, v.tolist()), "v must be a torch.Tensor"),
    ],
)
def test_tiled_rejects_bad_arguments(call, message):
    q, k, v = qkv(6, 4)
    with pytest.raises(ValueError, match=message):
        call(q, k, v)


def test_naive_attention_matches_pytorch():
    q, k, v = qkv(3, 20, 8, seed=6)
    assert torch.allclose(naive_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))


# Issue 23: integer input is refused; naive_attention is a float32 (and float64) teaching baseline.
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_tiled_and_naive_attention_refuse_integer_input(dtype):
    q, k, v = (t.to(dtype) for t in qkv(6, 4))
    for f in (lambda *a: tiled_attention(*a, 2), naive_attention):
        with pytest.raises(ValueError, match=f"q must be a real floating-point tensor.*got {dtype}"):
            f(q, k, v)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_naive_attention_refuses_half_precision(dtype):
    q, k, v = (100 * t.to(dtype) for t in qkv(2, 5, 8))     # q k^T overflows float16: all NaN before
    with pytest.raises(ValueError, match="naive_attention is a float32 teaching baseline.*use attention"):
        naive_attention(q, k, v)


def test_naive_attention_names_mixed_dtypes():
    q, k, v = qkv(6, 4)
    with pytest.raises(ValueError, match="q, k and v must share one dtype, got torch.float32, torch.float64"):
        naive_attention(q.float(), k, v)                # an obscure "expected m1 and m2 to have the same dtype"


def test_masks_may_not_grow_tiled_attention_and_d_k_is_at_least_one():
    q, k, v = qkv(2, 5, 8)
    with pytest.raises(ValueError, match="would broadcast the scores"):
        tiled_attention(q, k, v, 2, mask=torch.zeros(4, 2, 5, 5, dtype=torch.bool))
    empty = torch.zeros(5, 0, dtype=torch.float64)
    for f in (lambda *a: tiled_attention(*a, 2), naive_attention, lambda *a: attention(*a)[0]):
        with pytest.raises(ValueError, match="need at least one feature"):
            f(empty, empty, v[0])                       # ZeroDivisionError before


def test_tiled_attention_without_keys_and_with_mixed_dtypes_behaves_as_attention():
    q = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    out = tiled_attention(q, torch.randn(0, 8), torch.randn(0, 8), 4)
    out.sum().backward()                          # before: the zeros were cut off from the graph
    assert out.shape == (3, 8) and not out.any() and q.grad is not None
    k, v = torch.randn(5, 8, dtype=torch.float64), torch.randn(5, 8)
    assert tiled_attention(q.detach(), k, v, 2).dtype == attention(q.detach(), k, v)[0].dtype == torch.float32
