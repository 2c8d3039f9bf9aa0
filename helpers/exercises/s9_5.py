"""Section 9.5's checkers, in exercise order: 9.5.1 merging two tiles' online-softmax states, 9.5.2 the key-value
cache of a model you pick, 9.5.3 how many layers until every token has heard from every other."""

import math

import torch

from helpers.exercises.judge import (
    Wrong,
    as_integer,
    as_number,
    call,
    cases,
    compare,
    compare_number,
    exercise,
    fresh,
    generator,
    pair,
    pick,
)

# 9.5.1: merging two tiles' online-softmax states ------------------------------------------------------------

def _state(s, v):
    """A tile's (m, l, acc) for scores s (queries, keys); a query whose scores are all -inf gets (-inf, 0, 0)."""
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - torch.where(m.isinf(), torch.zeros_like(m), m))
    return m, e.sum(-1, keepdim=True), e @ v


@exercise("9.5.1", "Your merged state is the one a single pass over both tiles gives, and acc / l is exact attention.")
def _(answer):
    r = fresh()
    hidden = [(r.integer(1, 5), r.integer(1, 6), r.integer(1, 6), r.integer(1, 4), r.choice([-40.0, -5.0, 0.0, 5.0, 40.0]))
              for _ in range(2)]

    def describe(m_q, n_a, n_b, d_v, offset):
        shifted = f", tile b's scores shifted by {offset:+g}" if offset else ""
        return f"{m_q} quer{'y' if m_q == 1 else 'ies'}, tiles of {n_a} and {n_b} keys, d_v = {d_v}{shifted}"
    for case, (m_q, n_a, n_b, d_v, offset) in cases([(3, 4, 5, 2, 0.0), (2, 3, 3, 2, 30.0), (4, 6, 2, 3, -30.0)], hidden,
                                                    describe):
        s_a, s_b = r.randn(m_q, n_a) * 3, r.randn(m_q, n_b) * 3 + offset
        v_a, v_b = r.randn(n_a, d_v), r.randn(n_b, d_v)
        a, b = _state(s_a, v_a), _state(s_b, v_b)
        m, total, acc = _state(torch.cat([s_a, s_b], -1), torch.cat([v_a, v_b]))
        got = pair(call(answer, a, b, case=case), case, ("m", "l", "acc"))
        compare(got[0], m, case, what="maximum m", hint="The merged maximum is max(m_a, m_b), elementwise.", mistakes=[
            (a[0] + b[0], "The merged maximum is max(m_a, m_b), not their sum."),
        ])
        for what, got_x, want, x_a, x_b in (("normalizer l", got[1], total, a[1], b[1]), ("sum acc", got[2], acc, a[2], b[2])):
            compare(got_x, want, case, what=what, mistakes=[
                (x_a + x_b, f"Rescale each tile's {what} to the new maximum: multiply by exp(m_tile - m) before adding."),
                (x_a * torch.exp(m - a[0]) + x_b * torch.exp(m - b[0]),
                 "The rescaling factor is exp(m_tile - m), at most 1: yours is upside down."),
            ], hint=f"{what} = {what.split()[-1]}_a exp(m_a - m) + {what.split()[-1]}_b exp(m_b - m).")
    # Queries that saw no key in a tile (a fully masked row, as tiled_attention meets): m = -inf, l = 0, acc = 0 for
    # that tile. Mixed in one batch, as they come: an answer that special-cases a batch of them all fails here.
    case = ("the last case (4 queries: the first saw keys in tile a only, the second in neither tile, the third in "
            "both, the fourth in tile b only; a tile with no key has m = -inf, l = 0, acc = 0)")
    s_a, s_b = r.randn(4, 3) * 3, r.randn(4, 2) * 3
    s_a[[1, 3]], s_b[[0, 1]] = float("-inf"), float("-inf")
    v_a, v_b = r.randn(3, 3), r.randn(2, 3)
    a, b = _state(s_a, v_a), _state(s_b, v_b)
    want = _state(torch.cat([s_a, s_b], -1), torch.cat([v_a, v_b]))
    got = pair(call(answer, a, b, case=case), case, ("m", "l", "acc"))
    compare(got[0], want[0], case, what="maximum m", hint="A query that saw no key keeps m = -inf, the maximum of "
                                                           "nothing, in the merged state too: change only the shift.")
    for what, got_x, want_x in zip(("normalizer l", "sum acc"), got[1:], want[1:], strict=True):
        compare(got_x, want_x, case, what=what, hint="Where both tiles saw no key, exp(m_a - m) is "
                                                     "exp(-inf - (-inf)) = NaN: where m is -inf, shift by 0 instead "
                                                     "(torch.where), as tiled_attention does.")


# 9.5.2: the key-value cache of a model you pick -------------------------------------------------------------

@exercise("9.5.2", "Your cache sizes are exact for multi-head, grouped-query and multi-query models.")
def _(answer):
    r = fresh()
    hidden = []
    for _ in range(3):
        kv_heads = r.choice([1, 2, 4, 8])
        hidden.append((r.integer(1, 80), kv_heads * r.integer(1, 8), kv_heads, r.choice([32, 64, 80, 96, 128, 256]),
                       r.integer(1, 100_000), r.integer(1, 16), r.choice([1, 2, 4])))
    # The first case tells apart every mistake below but a forgotten bytes_per (1 byte per number): no two of its
    # factors are equal and none is 2; the second tells that one apart (4 bytes, no factor 4 elsewhere). The shown
    # cases cover every kind the message names, whatever the hidden ones draw: grouped-query (cases 1 to 3),
    # multi-query (case 4) and multi-head (case 5, GPT-2 medium's shape: kv_heads = heads). Case 6's product,
    # 2^5 x 283,497,165, has an odd factor above 2^24: float32 cannot hold it, so a product rounded there fails.
    shown = [(28, 40, 8, 128, 4096, 3, 1), (32, 32, 8, 128, 8192, 2, 4), (2, 8, 2, 16, 64, 1, 4), (24, 16, 1, 64, 1000, 3, 2),
             (24, 16, 16, 64, 1024, 3, 4), (27, 9, 3, 80, 99_999, 7, 1)]

    def describe(layers, heads, kv_heads, d_head, T, batch, nbytes):
        return (f"{layers} layers, {heads} query heads, {kv_heads} key-value head{'s' * (kv_heads > 1)} of width {d_head}, "
                f"{T:,} tokens, batch {batch}, {nbytes} byte{'s' * (nbytes > 1)} per number")
    for case, (layers, heads, kv_heads, d_head, T, batch, nbytes) in cases(shown, hidden, describe):
        want = 2 * layers * kv_heads * d_head * T * batch * nbytes
        mistakes = [
            (want // kv_heads * heads, "Only the key-value heads are cached: use kv_heads, not the query heads."),
            (want // kv_heads * (heads // kv_heads), "Use kv_heads, the number of key-value heads, not the group size "
                                                     "heads / kv_heads."),
            (want // 2, "Both keys and values are cached: a factor 2."),
            (want // layers, "Every layer has its own cache: multiply by the number of layers."),
            (want // batch, "Each sequence in the batch has its own cache: multiply by the batch size."),
            (want // nbytes, "Count bytes: multiply by the bytes per number."),
            (want // nbytes * 2, "Use the argument bytes_per: not every cache holds 2-byte numbers."),
            (want * 8, "Count bytes, not bits: bytes_per is already in bytes."),
            (want // d_head, "Each head caches a vector of d_head numbers per token: multiply by d_head."),
            (want * 2, "Keys and values make one factor 2: yours counts it twice."),
        ]
        wrapped = (want + 2 ** 31) % 2 ** 32 - 2 ** 31              # the product computed in int32, wrapped around
        if wrapped != want:
            mistakes.append((wrapped, f"{wrapped:,} is what this product gives when computed in int32 (a torch.int32 or "
                                      f"NumPy int32 tensor), which wraps around past {2 ** 31 - 1:,}: compute it in "
                                      "Python ints or int64."))
        got = call(answer, layers, heads, kv_heads, d_head, T, batch, nbytes, case=case)
        value = as_number(got, case, "number of bytes")
        if isinstance(value, float) and value != want and math.isclose(value, want, rel_tol=1e-6):
            raise Wrong(f"{case}: expected {want:,}, got {value:,.0f}, off by {abs(value - want):,.0f}: the product was "
                        "rounded in floating point (float32 keeps 24 bits, exact only up to 16,777,216). Compute it in "
                        "Python ints or int64.")
        compare_number(got, want, case, exact=True,
                       what="number of bytes", mistakes=mistakes,
                       hint="2 (keys and values) x layers x kv_heads x d_head x T x batch x bytes per number.")


# 9.5.3: how many layers a sparse pattern needs to connect every pair ----------------------------------------

def _diameter(pattern, hops=False, middle=False, first=False):
    T = pattern.shape[0]
    p = pattern.to(torch.float64)
    reach = p.clone()
    for n in range(1, T + 1):
        done = (reach[T // 2] > 0).all() if middle else (reach[0] > 0).all() if first else (reach > 0).all()
        if done:
            return n - 1 if hops else n
        reach = ((reach @ p) > 0).to(torch.float64)
    return math.inf


def _pattern(g, T, kinds=("window", "strided", "global", "random", "causal", "blocks"), r=None):
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    kind = pick(g, kinds)
    r = r or pick(g, (1, 2, 3))
    window = (i - j).abs() <= r
    if kind == "strided":
        return window | ((i - j) % pick(g, (3, 4, 5)) == 0)
    if kind == "global":
        n = pick(g, (1, 2))
        return window | (i < n) | (j < n)
    if kind == "random":
        return (torch.rand(T, T, generator=g) < 0.08) | (i == j)
    if kind == "causal":
        return window & (j <= i)                            # never reaches the future: never all connected
    if kind == "blocks":
        return (i // 4 == j // 4)                           # separate blocks: never connected
    return window


@exercise("9.5.3", "Your count is the fewest layers after which every query has received information from every "
                   "key, and math.inf for patterns that never connect them.")
def _(answer):
    g = generator()
    kinds = []
    for k in range(1, 7):
        T = pick(g, (9, 12, 16, 20))
        # Case 1, a window of one neighbour on either side, tells the mistakes apart: T - 1 layers connect every
        # pair, T - 2 hops, T / 2 layers the middle token alone.
        pattern = _pattern(g, T, ("window",), r=1) if k == 1 else _pattern(g, T)
        if k == 2:                      # the first query sees every key at once, the others only their neighbours:
            pattern = _pattern(g, T, ("window",)) | (torch.arange(T)[:, None] == 0)   # counting it alone is too few
        if k == 6:                      # a directed pattern that never connects: symmetrizing it would connect it
            i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
            pattern = ((i - j).abs() <= 1) & (j <= i)
        want = _diameter(pattern)
        kinds.append(want)
        case = f"case {k} of 6 (a hidden {T} x {T} pattern)"
        got = as_integer(call(answer, pattern, case=case), case, "number of layers", inf_ok=True)
        if want == math.inf or got == math.inf:
            if got != want:
                raise Wrong(f"{case}: expected {want}, got {got}. " + (
                    "Some key never reaches some query, however many layers: return math.inf." if want == math.inf else
                    "This pattern does connect every pair: keep adding layers until it does (at most T)."))
            continue
        compare_number(got, want, case, exact=True, what="number of layers", mistakes=[
            (_diameter(pattern, hops=True), "Count layers, not extra hops: one layer already connects what the pattern "
                                            "allows, so start at 1."),
            (want + 1, "Off by one: stop at the first number of layers after which everything is connected."),
            (_diameter(pattern, middle=True), "Every query must receive every key, not only the middle token."),
            (_diameter(pattern, first=True), "Every query must receive every key, not only the first one."),
        ], hint="Information from key j reaches query i after n layers where the boolean power pattern^n is True; "
                "find the smallest n at which it is True everywhere.")
