"""Section 9.5's checkers, in exercise order: 9.5.1 merging two tiles' online-softmax states, 9.5.2 how long a
context fits beside the weights, 9.5.3 how many layers until every token has heard from every other, 9.5.5 a sliding
window with a rolling cache (9.5.4 is answered in words)."""

import functools
import math

import torch
import torch.nn.functional as F

from helpers.exercises.judge import (
    Wrong,
    as_integer,
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
from helpers.positions import frequencies, rope

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
    # The fourth shown case puts tile b's scores near 1,000, where exp overflows even in float64: a merge that
    # exponentiates the maxima themselves (exp(m_a) l_a + exp(m_b) l_b, then divided by exp(m)) fails there only.
    shown = [(3, 4, 5, 2, 0.0), (2, 3, 3, 2, 30.0), (4, 6, 2, 3, -30.0), (2, 3, 4, 2, 1000.0)]
    for case, (m_q, n_a, n_b, d_v, offset) in cases(shown, hidden, describe):
        s_a, s_b = r.randn(m_q, n_a) * 3, r.randn(m_q, n_b) * 3 + offset
        v_a, v_b = r.randn(n_a, d_v), r.randn(n_b, d_v)
        a, b = _state(s_a, v_a), _state(s_b, v_b)
        m, total, acc = _state(torch.cat([s_a, s_b], -1), torch.cat([v_a, v_b]))
        got = pair(call(answer, a, b, case=case), case, ("m", "l", "acc"))
        compare(got[0], m, case, what="maximum m",
                hint="The merged m holds, for each query, the largest score either tile saw, in m_a's shape.",
                mistakes=[(a[0] + b[0], "The merged m is the largest score either tile saw, not the sum of the two "
                                        "maxima.")])
        for what, got_x, want, x_a, x_b in (("normalizer l", got[1], total, a[1], b[1]), ("sum acc", got[2], acc, a[2], b[2])):
            output = [(acc / total, "Your acc is the attention output, acc / l: the state keeps the unnormalized acc, "
                                    "beside l, so that later tiles can still be merged into it; divide only at the "
                                    "end.")] if what == "sum acc" else []
            compare(got_x, want, case, what=what, mistakes=[
                (x_a + x_b, f"Rescale each tile's {what} before adding: each is relative to its own tile's maximum, "
                            "as what the section's loop accumulated is relative to its running maximum."),
                (x_a * torch.exp(m - a[0]) + x_b * torch.exp(m - b[0]),
                 "Your rescaling is upside down: it enlarges what a tile with a smaller maximum accumulated, where "
                 "it should shrink it."),
                *output,
            ], hint=f"The merged {what} is not what a single pass over both tiles gives: compare your rescaling with "
                    "the section's loop, which rescales what it accumulated when a block raises the maximum."
                    + (" Here the scores are near 1,000, where exp overflows: exponentiate only differences such as "
                       "m_a - m, which are at most 0, never a maximum itself." if abs(offset) >= 500 else ""))
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
        compare(got_x, want_x, case, what=what, hint="Where neither tile saw a key, both maxima and the merged one "
                                                     "are -inf, and -inf - (-inf) is NaN: your rescaling gives NaN "
                                                     "there, where such a query must keep l = 0 and acc = 0.")


# 9.5.2: how long a context fits beside the weights ----------------------------------------------------------

def _context_variants(memory, params, layers, heads, kv_heads, d_head, batch, bytes_per, window):
    """What each usual mistake gives, with its hint: ``(miscounts, window mistakes)``, each ``[(result, hint)]``; the
    window mistakes in the order in which a check that reached them would suspect them."""
    free, per = memory - params * bytes_per, 2 * layers * kv_heads * d_head * batch * bytes_per

    def tokens(free=free, per=per, how="floor", negative=False):
        free = free if negative else max(free, 0)
        return {"floor": free // per, "round": round(free / per), "ceil": -(-free // per)}[how]

    def windowed(t):
        return math.inf if window is not None and t >= window else t
    miscounts = [
        (windowed(tokens(per=per // kv_heads * heads)), "Only the key-value heads are cached: yours counts the query "
                                                         "heads."),
        (windowed(tokens(per=per // kv_heads * (heads // kv_heads))), "Use kv_heads, the number of key-value heads, "
                                                                      "not the group size heads / kv_heads."),
        (windowed(tokens(per=per // 2)), "Both keys and values are cached: yours counts one of them."),
        (windowed(tokens(per=per * 2)), "Keys and values make one factor 2: yours counts it twice."),
        (windowed(tokens(per=per // layers)), "Every layer has its own cache: yours counts one layer's."),
        (windowed(tokens(per=per // batch)), "Each sequence of the batch has its own cache: yours counts one "
                                             "sequence's (or the tokens of all of them together)."),
        (windowed(tokens(per=per // bytes_per)), "The cache's numbers take bytes_per bytes each, as the weights' do: "
                                                 "yours counts one byte per number."),
        (windowed(tokens(per=per * 8)), "Count bytes, not bits: bytes_per is already in bytes."),
        (windowed(tokens(per=per // d_head)), "Each head caches d_head numbers per token: yours counts one."),
        (windowed(tokens(free=memory)), "The weights take memory too: yours gives all of it to the cache."),
        (windowed(tokens(free=memory - params)), "Each weight takes bytes_per bytes: yours counts one byte per "
                                                 "parameter."),
        (windowed(tokens(how="round")), "Round down: a token whose keys and values do not fit whole does not fit."),
        (windowed(tokens(how="ceil")), "Round down: a token whose keys and values do not fit whole does not fit."),
        (windowed(tokens(negative=True)), "When the weights alone do not fit, no token does: the answer is 0, not a "
                                          "negative count."),
    ]
    t, mistakes = tokens(), []
    if t == 0:
        miscounts.append((-1, "No token fits here: the answer is 0, not a negative count."))
    if free > 0 and free % per == 0:
        miscounts.append((windowed(t - 1), "Exactly this many tokens fit here, with nothing left over: yours stops one "
                                           "short."))
    single = torch.tensor([float(memory), float(params), float(per)], dtype=torch.float32)
    rounded = int(torch.floor(((single[0] - single[1] * bytes_per) / single[2]).clamp(min=0)))
    if rounded != t:
        miscounts.append((windowed(rounded), "Your count is what float32 gives, which rounds numbers this large (it is "
                                             "exact only up to 16,777,216): compute in Python ints or float64."))
    if window is not None:
        mistakes = [
            (t if t == window else None, "Exactly window tokens fit here: the rolling buffer fits, so any length "
                                         "does."),
            (t, "Yours ignores the window: a model with a sliding window keeps only the last window tokens' keys and "
                "values, so when those fit, any length does."),
            (min(t, window), "When the rolling buffer fits, the context has no limit: return math.inf, not the "
                             "window."),
            (math.inf, "The rolling buffer of window tokens does not fit here: the context is limited as it is "
                       "without a window."),
            (math.inf if t >= window else 0, "When the rolling buffer does not fit, the model still takes the tokens "
                                             "that do fit, as without a window: not 0."),
        ]
    return miscounts, mistakes


@exercise("9.5.2", "Your longest contexts are exact: the cache of every layer, key-value head, token and sequence "
                   "beside the weights, and no limit where a sliding window's rolling buffer fits.")
def _(answer):
    r = fresh()
    GiB = 2 ** 30

    def draw(kind):
        kv_heads = r.choice([1, 2, 4, 8])
        layers, heads, d_head = r.integer(1, 80), kv_heads * r.choice([1, 2, 4, 8]), r.choice([64, 80, 96, 128, 256])
        batch, nbytes, params = r.integer(1, 16), r.choice([1, 2, 4]), r.integer(10 ** 6, 10 ** 10)
        per, tokens = 2 * layers * kv_heads * d_head * batch * nbytes, r.integer(1, 200_000)
        memory = params * nbytes + tokens * per + r.integer(0, per - 1)
        window = {"none": None, "fits": r.integer(1, tokens), "short": r.integer(tokens + 1, tokens + 100_000)}[kind]
        return memory, params, layers, heads, kv_heads, d_head, batch, nbytes, window
    # Case 1 tells every mistake of the cache's size apart (no two of its factors are equal, none is 2, the
    # fraction of a token left over is above one half); case 2 is Mistral 7B on 24 GiB, whose rolling buffer
    # fits; in case 3 exactly window tokens fit, with no byte left over (a buffer tested with < does not fit);
    # in case 4 the buffer does not fit; in case 5 the weights alone do not fit; case 6 is a multi-head model
    # (Llama 2 13B's shape) into which exactly 12,345 tokens fit, with nothing left over (a count one short
    # fails, and so does this count computed in float32); case 7 is a multi-query model.
    # The hidden cases draw sizes for the three kinds of window (none, one whose buffer fits, one whose does not).
    per3 = 2 * 24 * 4 * 64 * 2 * 2
    shown = [(24 * GiB, 1_000_000_000, 28, 40, 8, 96, 3, 4, None),
             (24 * GiB, 7_241_732_096, 32, 32, 8, 128, 1, 2, 4096),
             (1_000_000 * 2 + 1000 * per3, 1_000_000, 24, 16, 4, 64, 2, 2, 1000),
             (16 * GiB, 6_000_000_000, 32, 32, 8, 128, 8, 2, 8192),
             (8 * GiB, 7_000_000_000, 32, 32, 8, 128, 1, 2, None),
             (36_144_752_640, 13_015_864_320, 40, 40, 40, 128, 1, 2, None),
             (80 * GiB, 70_000_000_000, 80, 64, 1, 128, 2, 1, 4096)]

    def describe(memory, params, layers, heads, kv_heads, d_head, batch, nbytes, window):
        slide = f", a sliding window of {window:,} tokens" if window is not None else ", no window"
        return (f"{memory:,} bytes, {params:,} weights, {layers} layers, {heads} query head{'s' * (heads > 1)} and "
                f"{kv_heads} key-value head{'s' * (kv_heads > 1)} of width {d_head}, batch {batch}, "
                f"{nbytes} byte{'s' * (nbytes > 1)} per number{slide}")
    for case, parameters in cases(shown, [draw("none"), draw("fits"), draw("short")], describe):
        memory, params, layers, heads, kv_heads, d_head, batch, nbytes, window = parameters
        free = max(memory - params * nbytes, 0)
        tokens = free // (2 * layers * kv_heads * d_head * batch * nbytes)
        want = math.inf if window is not None and tokens >= window else tokens
        miscounts, window_mistakes = _context_variants(*parameters)
        got = as_integer(call(answer, memory, params, layers, heads, kv_heads, d_head, batch, nbytes, window, case=case),
                         case, "number of tokens", inf_ok=True)
        if got == want:
            continue
        # An answer that reached a case with a window has counted the cache right in the cases before it: the first
        # window mistake that fits is the one to name; failing that, every miscount that fits.
        hints = [why for result, why in window_mistakes if result == got][:1] or list(
            dict.fromkeys(why for result, why in miscounts if result == got))
        if got < 0 and want == 0 and not hints:   # int(free / per) truncates where the named mistake floors
            hints = ["When the weights alone do not fit, no token does: the answer is 0, not a negative count."]
        if not hints and want != math.inf and got in (want - 1, want + 1):   # a students' review: told of the cache
            hints = ["Off by one: count the tokens whose cache fits whole in the memory the weights leave, no more "
                     "and no fewer (round down once, at the end)."]
        if want == math.inf or got == math.inf:
            raise Wrong(f"{case}: expected {want if want == math.inf else f'{want:,}'}, got "
                        f"{got if got == math.inf else f'{got:,}'}. "
                        + ("This result fits more than one mistake: " if len(hints) > 1 else "")
                        + (" Or: ".join(hints) or _CONTEXT_HINT))
        compare_number(got, want, case, exact=True, what="number of tokens", hint=_CONTEXT_HINT,
                       mistakes=[(got, why) for why in hints])


_CONTEXT_HINT = ("It matches none of the usual single mistakes: compare your cache per token with the one the section "
                 "prints for 80 layers of width 8,192 in 16-bit numbers (2.6 MB).")


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
    for k in range(1, 8):
        T = pick(g, (9, 12, 16, 20)) if k < 7 else pick(g, (128, 144, 160))
        # Case 1, a window of one neighbour on either side, tells the mistakes apart: T - 1 layers connect every
        # pair, T - 2 hops, T / 2 layers the middle token alone.
        pattern = _pattern(g, T, ("window",), r=1) if k == 1 else _pattern(g, T)
        if k == 2:                      # the first query sees every key at once, the others only their neighbours:
            pattern = _pattern(g, T, ("window",)) | (torch.arange(T)[:, None] == 0)   # counting it alone is too few
        if k == 6:                      # a directed pattern that never connects: symmetrizing it would connect it
            i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
            pattern = ((i - j).abs() <= 1) & (j <= i)
        if k == 7:                      # a long band, as the notebook's next cell draws: its path counts pass 5^55,
            pattern = _pattern(g, T, ("window",), r=2)      # past int64's 9.2e18 and float32's 3.4e38: counting
            #                                                 paths overflows (in float32 to inf, then inf * 0 = NaN)
        want = _diameter(pattern)
        case = f"case {k} of 7 (a hidden {T} x {T} pattern)"
        got = as_integer(call(answer, pattern, case=case), case, "number of layers", inf_ok=True)
        hint = _OVERFLOW if k == 7 else None       # right on the short patterns, wrong on the long band
        if want == math.inf or got == math.inf:
            if got != want:
                raise Wrong(f"{case}: expected {want}, got {got}. " + (
                    "Some key never reaches some query, however many layers: return math.inf." if want == math.inf else
                    hint or "This pattern does connect every pair: keep adding layers until it does (at most T)."))
            continue
        compare_number(got, want, case, exact=True, what="number of layers", mistakes=[
            (_diameter(pattern, hops=True), "Count layers, not extra hops: one layer already connects what the pattern "
                                            "allows, so start at 1."),
            (want + 1, "Off by one: stop at the first number of layers after which everything is connected."),
            (_diameter(pattern, middle=True), "Every query must receive every key, not only the middle token."),
            (_diameter(pattern, first=True), "That is what the first query alone needs: every query must receive "
                                             "every key, not only the first one (and a formula for a plain band "
                                             "fits no other pattern)."),
        ], hint=hint or "It matches none of the usual mistakes: follow the information one layer at a time, as the "
                        "section's receptive-field cell does, and stop at the first layer after which every pair is "
                        "connected.")


_OVERFLOW = ("Your count is right on the short patterns and wrong on this long band: if you count paths, the counts "
             "grow like 5^L here and overflow (an int64 holds 9.2e18 at most, a float32 3.4e38). Keep only whether each pair is "
             "connected: booleans, or counts clamped to 1 after each layer.")


# 9.5.5: a sliding window with a rolling cache ----------------------------------------------------------------

# Nothing is cached yet on a first call: the mask alone is wrong (a students' review: a transposed mask, and a float
# 0/1 mask, which SDPA adds to the scores, were pointed at the cache).
_FIRST_CALL = ("It matches none of the usual mistakes: check your window mask on this first call, where nothing is "
               "cached yet. Each query sees itself and the window - 1 tokens before it, never a later one; "
               "scaled_dot_product_attention reads a boolean mask as True where a key may be seen, and adds a float "
               "mask to the scores.")

class _CachedSelfAttention(torch.nn.Module):
    """The section's CachedSelfAttention (its listing, as the reader's function receives it): causal self-attention
    with RoPE, ``kv_heads`` key-value heads shared by the query heads, and a cache dict that its forward fills."""

    def __init__(self, d, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.dh = heads, kv_heads, d // heads
        self.q = torch.nn.Linear(d, d, bias=False)
        self.kv = torch.nn.Linear(d, 2 * kv_heads * self.dh, bias=False)
        self.out = torch.nn.Linear(d, d, bias=False)

    def forward(self, x, cache=None):
        B, T, d = x.shape
        past = cache["k"].shape[-2] if cache else 0
        q = self.q(x).view(B, T, self.heads, self.dh).transpose(1, 2)
        k, v = self.kv(x).view(B, T, 2, self.kv_heads, self.dh).permute(2, 0, 3, 1, 4)
        q, k = rope(q, offset=past), rope(k, offset=past)
        if cache:
            k, v = torch.cat([cache["k"], k], dim=-2), torch.cat([cache["v"], v], dim=-2)
        if cache is not None:
            cache["k"], cache["v"] = k, v
        hidden = torch.arange(past + T) > torch.arange(past, past + T)[:, None] if T > 1 else None
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None if hidden is None else ~hidden,
                                           enable_gqa=self.kv_heads != self.heads)
        return self.out(y.transpose(1, 2).reshape(B, T, d))


def _layer(g, heads, kv_heads, dh):
    """A layer with weights drawn from ``g``, scaled so that the scores spread (a window then changes the output)."""
    d = heads * dh
    layer = _CachedSelfAttention(d, heads, kv_heads)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 1.5 / p.shape[1] ** 0.5)
    return layer


def _rotate(x, positions):
    """RoPE (``helpers.positions.rope``) with each row of ``x`` (..., N, dh) rotated at its own position, in float64."""
    angle = torch.tensor(list(positions), dtype=torch.float64)[:, None] * frequencies(x.shape[-1])
    cos, sin, even, odd = angle.cos(), angle.sin(), x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def _windowed_outputs(layer, x, ends, window=None, rotated=None, future=False, no_rope=False, inverted=None,
                      scale=None):
    """What the layer gives the tokens of ``x`` (B, N, d), computed in float64 over the whole sequence.

    Token i sees key j when ``0 <= i - j < window`` (every earlier key without a window); ``future``: also the later
    keys of its own call (``ends[i]``, where its call ends). ``rotated``: the position each token is rotated at (its
    own by default); ``no_rope``: none is rotated. ``inverted``: the mask negated, as a mask True where hidden passed
    to SDPA gives: each token sees the keys at hand (the window's before its call, and its call's) that it should not,
    and a token that then sees none gets ``inverted`` (0, or NaN, as SDPA's versions differ) before the projection.
    ``scale``: what the scores are multiplied by (1 / sqrt(dh) by default).
    """
    B, N, d = x.shape
    H, G, dh = layer.heads, layer.kv_heads, layer.dh
    x = x.to(torch.float64)
    q = (x @ layer.q.weight.detach().double().T).view(B, N, H, dh).transpose(1, 2)
    k, v = (x @ layer.kv.weight.detach().double().T).view(B, N, 2, G, dh).permute(2, 0, 3, 1, 4)
    if not no_rope:
        q, k = _rotate(q, range(N) if rotated is None else rotated), _rotate(k, range(N) if rotated is None else rotated)
    k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    seen = (i - j < (window or N + 1)) & ((j < torch.tensor(ends)[:, None]) if future else (j <= i))
    if inverted is not None:
        first = {}                                    # where each call starts: its tokens share their end
        starts = torch.tensor([first.setdefault(e, t) for t, e in enumerate(ends)])[:, None]
        seen = ~seen & (j < torch.tensor(ends)[:, None]) & (j >= starts - (window or N + 1))
    scores = (q @ k.transpose(-2, -1) * (dh ** -0.5 if scale is None else scale)).masked_fill(~seen, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v
    if inverted is not None:
        y = y.masked_fill(~seen.any(-1)[:, None], inverted)
    return y.transpose(1, 2).reshape(B, N, d) @ layer.out.weight.detach().double().T


def numbers_held(cache, seen=None):
    """How many floating-point numbers ``cache`` holds, in tensors however they are kept: in dicts, lists, tuples,
    deques or any other iterable, and in the attributes of objects (dataclasses, classes with __slots__)."""
    seen = set() if seen is None else seen
    if id(cache) in seen or isinstance(cache, str | bytes | int | float | bool | type(None)):
        return 0
    seen.add(id(cache))
    if isinstance(cache, torch.Tensor):
        return cache.numel() if cache.is_floating_point() else 0
    if isinstance(cache, dict):
        return sum(numbers_held(v, seen) for v in cache.values())
    held = [getattr(cache, name) for name in getattr(type(cache), "__slots__", ()) if hasattr(cache, name)]
    held += list(getattr(cache, "__dict__", {}).values())
    try:
        held += list(cache) if not isinstance(cache, torch.nn.Module) else []
    except TypeError:                                # not iterable
        pass
    return sum(numbers_held(v, seen) for v in held)


@exercise("9.5.5", "Your layer gives every token what full attention restricted to its window gives it, in one call "
                   "or token by token, and its cache stops growing at the keys and values of the window.")
def _(answer):
    g = generator()
    # (batch, query heads, key-value heads, head width, window, the tokens of each call; None: called without a
    # cache). Case 1: a prompt longer than the window, single tokens, a call of several tokens, single tokens again;
    # case 2: no cache, a sequence longer than the window at once; case 3: a prompt shorter than the window and
    # single tokens past it (multi-query); case 4: a call longer than the window once the cache is full. The
    # hidden case draws its sizes for case 1's kind.
    shown = [(2, 4, 2, 4, 5, [8, 1, 1, 1, 1, 1, 1, 3, 1, 1]),
             (1, 2, 2, 6, 4, None),
             (1, 2, 1, 8, 6, [3] + [1] * 8),
             (2, 4, 1, 4, 3, [4, 1, 1, 7, 1, 2])]
    G, window = pick(g, (1, 2)), int(torch.randint(2, 8, (1,), generator=g))
    hidden = [(pick(g, (1, 2, 3)), G * pick(g, (1, 2, 3)), G, pick(g, (2, 4, 6, 8)), window,
               [window + int(torch.randint(1, window + 3, (1,), generator=g))] + [1] * (window + 1)
               + [int(torch.randint(2, window + 3, (1,), generator=g)), 1])]

    def describe(B, H, G, dh, window, calls):
        how = "called once without a cache on 12 tokens" if calls is None else (
            f"calls of {', '.join(map(str, calls))} tokens")
        return (f"batch {B}, {H} query heads and {G} key-value head{'s' * (G > 1)} of width {dh}, window {window}, "
                f"{how}")
    for case, (B, H, G, dh, window, calls) in cases(shown, hidden, describe):
        layer = _layer(g, H, G, dh)
        sizes = [12] if calls is None else calls
        N = sum(sizes)
        x = torch.randn(B, N, H * dh, generator=g)
        starts = [sum(sizes[:c]) for c in range(len(sizes))]
        ends = [s + n for s, n in zip(starts, sizes, strict=True) for _ in range(n)]
        want = _windowed_outputs(layer, x, ends, window)
        # What the usual mistakes give, over the whole sequence: no window, a window one too wide or too narrow,
        # the later keys of a call seen, no rotation, and positions that restart in every call or stop at the
        # cache's length once it is full (a cache of window or window - 1 tokens).
        restart = [t - s for s, n in zip(starts, sizes, strict=True) for t in range(s, s + n)]
        mistakes = [
            (_windowed_outputs(layer, x, ends), "Your tokens see keys further back than the window: each sees only "
                                                "itself and the window - 1 tokens before it."),
            (_windowed_outputs(layer, x, ends, window + 1), "Off by one: your tokens see one key too many, the token "
                                                            "itself and the window tokens before it."),
            (_windowed_outputs(layer, x, ends, window, future=True), "Your tokens see the later tokens of their own "
                                                                     "call: hide the future too."),
            (_windowed_outputs(layer, x, ends, window, no_rope=True), "Your queries and keys are not rotated: apply "
                                                                      "RoPE at their positions, as CachedSelfAttention "
                                                                      "does."),
            (_windowed_outputs(layer, x, ends, window, scale=1.0), "Your scores are not scaled: divide them by the square "
                                                                   "root of the head width, as "
                                                                   "scaled_dot_product_attention does."),
            (_windowed_outputs(layer, x, ends, window, rotated=restart), "Your positions start again at 0 in every "
                                                                         "call: a token's position counts every token "
                                                                         "before it, those of earlier calls too."),
        ]
        for empty in (0.0, float("nan")):
            mistakes.append((_windowed_outputs(layer, x, ends, window, inverted=empty),
                             "Your mask is inverted: SDPA's boolean mask is True where a key may be seen, the opposite "
                             "of the book's masks (True where hidden)."))
        if window > 1:
            mistakes.append((_windowed_outputs(layer, x, ends, window - 1),
                             "Off by one: your tokens see one key too few, the token itself and the window - 2 tokens "
                             "before it."))
        for kept in (window - 1, window):
            full = [min(s, kept) + t - s for s, n in zip(starts, sizes, strict=True) for t in range(s, s + n)]
            mistakes.append((_windowed_outputs(layer, x, ends, window, rotated=full),
                             "Your positions stop growing when the cache is full: a token's position is its index in "
                             "the whole sequence, not in the cache."))
        bound = 2 * B * G * window * dh
        # A second sequence through the same layer, its calls alternating with the first's, each resumed from a copy
        # of its cache dict (as the section's timing cell resumes): what an answer keeps outside the dict it is
        # given (a default argument, a module-level store) then gives the wrong outputs.
        x2 = torch.randn(B, N, H * dh, generator=g) if calls is not None else None
        runs = [(x, want, mistakes, "")] + ([] if x2 is None else [(x2, _windowed_outputs(layer, x2, ends, window), [],
                                                                    ", a second sequence through the same layer")])
        caches = [None if calls is None else {} for _ in runs]

        for c, (s, n) in enumerate(zip(starts, sizes, strict=True), start=1):
            for r, (xr, wanted, named, which) in enumerate(runs):
                where = (f"{case}{which}, call {c} of {len(sizes)}: {n} new token{'s' * (n > 1)}"
                         + (f" after {s}" if s else "") if calls is not None else case)
                cache = caches[r]

                @functools.wraps(answer)
                def run(layer, x, answer=answer, cache=cache, window=window):
                    return answer(layer, x, cache, window)      # the cache is the caller's, updated in place
                got = call(run, layer, xr[:, s:s + n], case=where)
                if isinstance(got, tuple | list):
                    raise Wrong(f"{where}: return the output y (B, T, d) alone, got a {type(got).__name__}: the cache "
                                "is the dict you were given, updated in place.")
                if cache is not None and not cache:
                    raise Wrong(f"{where}: your function left the dict it was given empty: update it in place "
                                "(cache['k'] = ...), not a new dict of your own.")
                compare(got, wanted[:, s:s + n].float(), where, what="output",
                        mistakes=[(result[:, s:s + n], why) for result, why in named],
                        hint=_FIRST_CALL if s == 0 else
                        "It matches none of the usual mistakes: check your window mask for a call of several "
                        "tokens that follow cached ones, against the positions of both; and keep everything a "
                        "sequence needs in its own cache dict.")
                if cache is not None and numbers_held(cache) > bound:
                    raise Wrong(f"{where}: after {s + n} tokens your cache holds {numbers_held(cache):,} numbers, more "
                                f"than the keys and values of the last {window} tokens ({bound:,}): keep only what "
                                "the window still needs.")
                if cache is not None:
                    caches[r] = dict(cache)
