import pytest
import torch
import torch.nn.functional as F

from helpers.attention import attention, causal_mask, padding_mask
from helpers.efficient import CachedDecoder, CachedSelfAttention, generate, naive_attention, tiled_attention


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


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_cached_attention_matches_written_out_gqa(kv_heads):
    torch.manual_seed(0)
    layer = CachedSelfAttention(32, 4, kv_heads).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    y, (k, v) = layer(x)
    assert k.shape == v.shape == (2, kv_heads, 7, 8)
    from helpers.positions import rope

    q = rope(layer.q(x).view(2, 7, 4, 8).transpose(1, 2))
    k_rep, v_rep = (t.repeat_interleave(4 // kv_heads, dim=1) for t in (k, v))
    out, _ = attention(q, k_rep, v_rep, causal_mask(7))
    assert torch.allclose(y, layer.out(out.transpose(1, 2).reshape(2, 7, 32)))


def test_cache_gives_the_same_logits():
    torch.manual_seed(1)
    model = CachedDecoder(20, d=32, heads=4, kv_heads=2, layers=2).double().eval()
    tokens = torch.randint(20, (2, 12))
    with torch.no_grad():
        full, _ = model(tokens)
        first, caches = model(tokens[:, :5])               # a prompt of five tokens ...
        middle, caches = model(tokens[:, 5:9], caches)     # ... a chunk of four ...
        parts = [first, middle]
        for t in range(9, 12):                             # ... then one token at a time
            logits, caches = model(tokens[:, t:t + 1], caches)
            parts.append(logits)
    assert torch.allclose(torch.cat(parts, 1), full)
    assert caches[0][0].shape == (2, 2, 12, 8)


def test_generate_with_and_without_cache_agree():
    torch.manual_seed(2)
    model = CachedDecoder(30, d=32, heads=4, kv_heads=1, layers=2).eval()
    prompt = torch.randint(30, (3, 4))
    a, b = generate(model, prompt, 15), generate(model, prompt, 15, use_cache=False)
    assert a.shape == (3, 19) and torch.equal(a, b) and torch.equal(a[:, :4], prompt)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: CachedSelfAttention(30, 4, 2), "heads"),
        (lambda: CachedSelfAttention(32, 4, 3), "kv_heads"),
        (lambda: CachedSelfAttention(12, 4, 2), "even"),
        (lambda: CachedSelfAttention(32, 0, 1), "heads must be a positive int, got 0"),
        (lambda: CachedSelfAttention(32, 4, True), "kv_heads must be a positive int, got True"),
        (lambda: CachedSelfAttention(32, 4, 2)(torch.randn(1, 1, 32), (torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 2, 8))),
         "caches differ"),
        (lambda: CachedDecoder(10)([[1, 2]]), "tokens must be a torch.Tensor"),
        (lambda: generate(CachedDecoder(10), torch.zeros(1, 2, dtype=torch.long), 2.5), "steps must be a non-negative int"),
        (lambda: CachedDecoder(1), "vocab"),
        (lambda: CachedDecoder(10)(torch.zeros(3, dtype=torch.long)), "batch, length"),
        (lambda: generate(CachedDecoder(10), torch.zeros(1, 0, dtype=torch.long), 3), "prompt"),
        (lambda: generate(CachedDecoder(10), torch.zeros(1, 2, dtype=torch.long), -1), "steps must be a non-negative int"),
    ],
)
def test_decoder_rejects_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()
