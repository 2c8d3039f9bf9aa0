"""Property-based tests of the invariants the chapter relies on (hypothesis draws shapes and data)."""

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.attention import attention, causal_mask
from helpers.efficient import tiled_attention
from helpers.positions import frequencies, rope, sinusoidal

# Random examples on every run (a fixed seed would test the same 40 cases forever); a failure prints
# the @reproduce_failure line that replays it. Few enough examples to stay within a few seconds.
settings.register_profile("book", max_examples=30, deadline=None, database=None, print_blob=True)
settings.load_profile("book")

sizes = st.integers(1, 9)
widths = st.integers(1, 8).map(lambda h: 2 * h)
seeds = st.integers(0, 2**31 - 1)


def randn(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@given(m=sizes, n=sizes, d=widths, d_v=sizes, seed=seeds, scale=st.floats(0.1, 30.0))
def test_weights_are_distributions_and_outputs_convex_combinations(m, n, d, d_v, seed, scale):
    q, k, v = scale * randn(seed, m, d), randn(seed + 1, n, d), randn(seed + 2, n, d_v)
    out, w = attention(q, k, v)
    assert (w >= 0).all()
    assert torch.allclose(w.sum(-1), torch.ones(m, dtype=w.dtype))
    # A convex combination lies inside the values' bounding box, coordinate by coordinate.
    assert (out >= v.min(0).values - 1e-12).all() and (out <= v.max(0).values + 1e-12).all()


@given(m=sizes, n=st.integers(0, 40), d=widths, tile=st.integers(1, 50), seed=seeds, hide=st.floats(0.0, 1.0),
       empty=st.lists(st.integers(0, 8), max_size=3))
def test_tiled_attention_equals_full_attention_and_hides_fully_masked_rows(m, n, d, tile, seed, hide, empty):
    q, k, v = randn(seed, 2, m, d), randn(seed + 1, 2, n, d), randn(seed + 2, 2, n, 3)
    mask = torch.rand(2, m, n, generator=torch.Generator().manual_seed(seed)) < hide
    mask[:, [i for i in empty if i < m]] = True            # some queries see no key at all
    full, w = attention(q, k, v, mask)
    assert torch.allclose(tiled_attention(q, k, v, tile, mask), full)
    blind = mask.all(-1)                                   # (2, m): every key hidden (or no keys)
    assert (full[blind] == 0).all() and (w[blind] == 0).all() and not full.isnan().any()
    assert torch.allclose(w.sum(-1)[~blind], torch.ones(int((~blind).sum()), dtype=w.dtype))
    if n:
        assert torch.allclose(full, F.scaled_dot_product_attention(q, k, v, attn_mask=~mask))


@given(T=st.integers(1, 30), d=widths, tile=st.integers(1, 40), seed=seeds)
def test_causal_tiled_attention_equals_masked_attention(T, d, tile, seed):
    q, k, v = randn(seed, T, d), randn(seed + 1, T, d), randn(seed + 2, T, d)
    assert torch.allclose(tiled_attention(q, k, v, tile, is_causal=True), attention(q, k, v, causal_mask(T))[0])


@given(T=st.integers(2, 10), d=widths, cut=st.integers(1, 9), seed=seeds)
def test_causal_outputs_ignore_future_tokens(T, d, cut, seed):
    cut = min(cut, T - 1)
    x = randn(seed, T, d)
    y = x.clone()
    y[cut:] = randn(seed + 1, T - cut, d)                 # change the future of position cut - 1
    mask = causal_mask(T)
    assert torch.allclose(attention(x, x, x, mask)[0][:cut], attention(y, y, y, mask)[0][:cut])


@given(T=st.integers(1, 12), d=widths, seed=seeds, offset=st.integers(0, 1000))
def test_rope_preserves_norms(T, d, seed, offset):
    x = randn(seed, T, d)
    assert torch.allclose(rope(x, offset=offset).norm(dim=-1), x.norm(dim=-1))


@given(d=widths, m=st.integers(0, 200), n=st.integers(0, 200), shift=st.integers(-100, 100), seed=seeds)
def test_rope_scores_depend_only_on_the_offset(d, m, n, shift, seed):
    q, k = randn(seed, 1, d), randn(seed + 1, 1, d)
    score = lambda a, b: (rope(q, offset=a) @ rope(k, offset=b).T).item()
    shift = max(shift, -min(m, n))                         # positions stay non-negative
    assert abs(score(m, n) - score(m + shift, n + shift)) < 1e-9 * (1 + abs(score(m, n)))


@given(d=widths, k=st.integers(0, 50), T=st.integers(2, 60))
def test_sinusoidal_shift_is_one_linear_map(d, k, T):
    p = sinusoidal(T + k, d)
    # The block rotation by omega_j k, the same for every position t.
    c, s = (frequencies(d) * k).cos(), (frequencies(d) * k).sin()
    rotate = torch.zeros(d, d, dtype=p.dtype)
    rotate[0::2, 0::2] = torch.diag(c)
    rotate[0::2, 1::2] = torch.diag(s)
    rotate[1::2, 0::2] = torch.diag(-s)
    rotate[1::2, 1::2] = torch.diag(c)
    assert torch.allclose(p[:T] @ rotate.T, p[k:T + k], atol=1e-10)
