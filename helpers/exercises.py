"""Checkers for the chapter's exercises: ``check("9.3.1", my_alibi_bias)``.

A checker runs the reader's answer on a few cases and prints one line: correct, or which case failed,
expected against got (shape, index, largest error) and a hint. The hint comes from the usual mistakes:
each checker computes what each mistake would give and, when the answer matches one, names it. A starter
left as it is (a function whose body is ``...``, or ``raise NotImplementedError``) is reported as not
attempted yet, so a notebook runs top to bottom.

Nothing printed on success depends on the machine: results are compared within tolerances and the
messages hold no computed floats. ``verdict`` returns ``(ok, message)`` for the tests.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


class Wrong(Exception):
    """The answer failed a case; the message says which, and how."""


class NotAttempted(Exception):
    """The starter is still as it was."""


@dataclass
class Exercise:
    run: callable      # run(answer) raises Wrong or NotAttempted, or returns when every case passed
    done: str          # what a correct answer has shown, said without computed numbers


EXERCISES = {}


def exercise(number, done):
    def register(run):
        EXERCISES[number] = Exercise(run, done)
        return run
    return register


def verdict(number, answer):
    """``(ok, message)``: the line ``check`` prints. ``ok`` is None when the starter is untouched."""
    if number not in EXERCISES:
        raise KeyError(f"no exercise {number!r}; there are {', '.join(EXERCISES)}")
    name = getattr(answer, "__name__", "your answer")
    try:
        if answer is None or answer is Ellipsis:
            raise NotAttempted
        EXERCISES[number].run(answer)
    except NotAttempted:
        return None, f"Exercise {number}: not attempted yet. Complete {name} above and run the cell again."
    except Wrong as wrong:
        return False, f"Exercise {number}: not yet. {wrong}"
    except Exception as error:      # the reader's code raised: say what, not a traceback from in here
        return False, f"Exercise {number}: not yet. {name} raised {type(error).__name__}: {error}"
    return True, f"Exercise {number}: correct. {EXERCISES[number].done}"


def check(number, answer):
    """Run exercise ``number``'s checker on ``answer`` and print its verdict."""
    print(verdict(number, answer)[1])


# Comparing -----------------------------------------------------------------------------------------

def call(f, *args, **kwargs):
    """The answer's result; an untouched starter (``...`` or NotImplementedError) is not attempted."""
    try:
        out = f(*args, **kwargs)
    except NotImplementedError:
        raise NotAttempted from None
    if out is None or out is Ellipsis:
        raise NotAttempted
    return out


def _num(x):
    return "True" if x is True else "False" if x is False else f"{x:.4g}"


def close(got, want, atol=1e-5, rtol=1e-4):
    got = torch.as_tensor(got)
    if got.shape != want.shape:
        return False
    if want.dtype == torch.bool or not want.is_floating_point():
        return torch.equal(got, want)
    return torch.allclose(got.to(want.dtype), want, atol=atol, rtol=rtol, equal_nan=True)


def compare(got, want, case, mistakes=(), hint="", what="output", atol=1e-5, rtol=1e-4):
    """Raise ``Wrong`` unless tensor ``got`` equals ``want`` (within tolerances for floats).

    ``mistakes`` is a sequence of ``(result of the mistake, hint)``: the first whose result ``got``
    matches gives the hint; otherwise ``hint``.
    """
    def fail(detail):
        for result, why in mistakes:
            if close(got, result, atol, rtol):
                raise Wrong(f"{case}: {detail}. {why}")
        raise Wrong(f"{case}: {detail}. {hint}".rstrip())

    if not isinstance(got, torch.Tensor):
        raise Wrong(f"{case}: the {what} should be a tensor, got {type(got).__name__}")
    if got.shape != want.shape:
        fail(f"the {what} should have shape {tuple(want.shape)}, got {tuple(got.shape)}")
    if (want.dtype == torch.bool) != (got.dtype == torch.bool):
        raise Wrong(f"{case}: the {what} should be {'boolean' if want.dtype == torch.bool else 'numbers'}, got {got.dtype}")
    if close(got, want, atol, rtol):
        return
    if want.dtype == torch.bool or not want.is_floating_point():
        wrong = got != want
        index = tuple(wrong.nonzero()[0].tolist())
        fail(f"{int(wrong.sum())} of {want.numel()} entries differ, the first at index {index}: "
             f"expected {_num(want[index].item())}, got {_num(got[index].item())}")
    g = got.to(want.dtype)
    error = (g - want).abs().nan_to_num(float("inf"))
    index = tuple(int(i) for i in torch.unravel_index(error.argmax(), want.shape))
    fail(f"largest error {_num(error[index].item())} at index {index}: "
         f"expected {_num(want[index].item())}, got {_num(g[index].item())}")


def compare_number(got, want, case, mistakes=(), hint="", what="answer", exact=False):
    """Raise ``Wrong`` unless the number ``got`` equals ``want`` (exactly, or within 0.1%)."""
    try:
        g = float(got)
    except (TypeError, ValueError):
        raise Wrong(f"{case}: the {what} should be a number, got {type(got).__name__}") from None
    same = (lambda a, b: a == b) if exact else (lambda a, b: math.isclose(a, b, rel_tol=1e-3))
    if same(g, want):
        return
    shown = (lambda x: f"{x:,.0f}") if exact else _num
    detail = f"expected {shown(want)}, got {shown(g)}"
    for result, why in mistakes:
        if same(g, result):
            raise Wrong(f"{case}: {detail}. {why}")
    raise Wrong(f"{case}: {detail}. {hint}".rstrip())


def pair(out, case, names):
    if not (isinstance(out, tuple | list) and len(out) == len(names)):
        raise Wrong(f"{case}: return a tuple ({', '.join(names)})")
    return out


def randn(*shape, g):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


# 9.1 -----------------------------------------------------------------------------------------------

def _sdpa(Q, K, V, scale, dim=-1):
    w = torch.softmax(Q @ K.transpose(-2, -1) * scale, dim=dim)
    return w @ V, w


@exercise("9.1.1", "Your weights sum to one over the keys and your outputs are softmax(QK^T / sqrt(d_k)) V, "
                   "with and without leading batch dimensions.")
def _(answer):
    g = torch.Generator().manual_seed(11)
    for case, (m, n, d, d_v, lead) in {
        "case 1 of 3 (3 queries, 5 keys, d_k = 16)": (3, 5, 16, 2, ()),
        "case 2 of 3 (1 query, 7 keys, d_k = 64)": (1, 7, 64, 3, ()),
        "case 3 of 3 (a batch of 2, 4 queries, 6 keys, d_k = 32)": (4, 6, 32, 5, (2,)),
    }.items():
        Q, K, V = randn(*lead, m, d, g=g), randn(*lead, n, d, g=g), randn(*lead, n, d_v, g=g)
        out, w = pair(call(answer, Q, K, V), case, ("outputs", "weights"))
        want_out, want_w = _sdpa(Q, K, V, d ** -0.5)
        compare(w, want_w, case, what="weights", mistakes=[
            (_sdpa(Q, K, V, 1.0)[1], "Your weights are softmax(QK^T) without the scale: divide the scores by sqrt(d_k)."),
            (_sdpa(Q, K, V, 1 / d)[1], "You divided the scores by d_k: the scale is 1/sqrt(d_k)."),
            (_sdpa(Q, K, V, d ** -0.5, dim=-2)[1],
             "Your weights sum to one over the queries: take the softmax over the keys (dim=-1)."),
            (want_w.transpose(-2, -1), "Your weights are transposed: row i should hold query i's weights over the keys."),
        ], hint="Scores are Q K^T / sqrt(d_k), one row per query.")
        compare(out, want_out, case, what="outputs", hint="Your weights are right: the outputs are weights @ V.")


@exercise("9.1.2", "Your bandwidth makes the Nadaraya-Watson weights equal to softmax(q . k) for every query norm "
                   "and key norm tried: h = sqrt(rho / r).")
def _(answer):
    for k, (r, rho) in enumerate([(10.0, 1.0), (4.0, 2.0), (100.0, 0.5), (0.25, 3.0)], start=1):
        case = f"case {k} of 4 (query norm r = {r:g}, key norm rho = {rho:g})"
        compare_number(call(answer, r, rho), math.sqrt(rho / r), case, what="bandwidth", mistakes=[
            (1 / math.sqrt(r), "The keys' norm matters too: the query point is rho u, and |rho u - k|^2 = 2 rho^2 - 2 rho u.k."),
            (rho / r, "That is h^2: take the square root."),
            (math.sqrt(r / rho), "Upside down: a longer query makes the weights sharper, so the bandwidth shrinks as r grows."),
        ], hint="Expand |rho u - k|^2 / (2 h^2) and match the term in u.k with r u.k.")


# 9.2 -----------------------------------------------------------------------------------------------

def _masks(lengths, T):
    j = torch.arange(T)
    causal = j[None, :] > j[:, None]                                   # (T, T): key after query
    pad_keys = j[None, None, :] >= torch.as_tensor(lengths)[:, None, None]   # (B, 1, T)
    pad_queries = j[None, :, None] >= torch.as_tensor(lengths)[:, None, None]
    return causal, pad_keys, pad_queries


@exercise("9.2.1", "Your mask hides exactly the future and the padding keys, for every batch tried.")
def _(answer):
    for k, (lengths, T) in enumerate([([3, 5], 5), ([1, 4, 2], 4), ([6], 6)], start=1):
        case = f"case {k} of 3 (lengths {lengths}, T = {T})"
        causal, pad_keys, pad_queries = _masks(lengths, T)
        want = causal | pad_keys
        off_by_one = torch.arange(T)[None, :] >= torch.arange(T)[:, None]
        compare(call(answer, torch.tensor(lengths), T), want, case, what="mask", mistakes=[
            (~want, "True should mark what a query may NOT see (as nn.MultiheadAttention): your mask is inverted."),
            (off_by_one | pad_keys, "The diagonal is hidden: a query may attend to its own position "
                                    "(j > i is hidden, not j >= i)."),
            (causal | pad_queries, "You hid padding queries: pad the keys, j >= length, so the mask's last axis."),
            (causal & pad_keys.expand(-1, T, -1), "Combine the masks with |: a key is hidden if it is in the future OR padding."),
            (causal.expand(len(lengths), T, T), "The padding is missing: also hide keys j >= length."),
        ], hint="Hide key j from query i where j > i or j >= the sequence's length.")


def _mqa(x, Wq, Wk, Wv, heads, causal=True, split=True, scale=None, merge=True):
    B, T, d = x.shape
    q = (x @ Wq).view(B, T, heads, d // heads).transpose(1, 2) if split else (x @ Wq).view(B, heads, T, d // heads)
    k, v = (x @ Wk)[:, None], (x @ Wv)[:, None]                        # (B, 1, T, d_h): one head, shared
    s = q @ k.mT * (scale or (d // heads) ** -0.5)
    if causal:
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    y = torch.softmax(s, -1) @ v                                       # (B, H, T, d_h)
    return y.transpose(1, 2).reshape(B, T, d) if merge else y.reshape(B, T, d)


@exercise("9.2.3", "Your multi-query attention equals multi-head attention whose heads all use the same key and value "
                   "weights, causally, for every shape tried.")
def _(answer):
    g = torch.Generator().manual_seed(23)
    for k, (B, T, d, H) in enumerate([(2, 5, 8, 2), (1, 6, 12, 3), (2, 4, 16, 4)], start=1):
        case = f"case {k} of 3 (B = {B}, T = {T}, d = {d}, {H} heads)"
        x, Wq, Wk, Wv = randn(B, T, d, g=g), randn(d, d, g=g), randn(d, d // H, g=g), randn(d, d // H, g=g)
        # Multi-head attention with every head's key and value weights equal to the shared ones.
        Wk_all, Wv_all = Wk.repeat(1, H), Wv.repeat(1, H)
        q, kk, v = ((x @ W).view(B, T, H, d // H).transpose(1, 2) for W in (Wq, Wk_all, Wv_all))
        s = (q @ kk.mT / (d // H) ** 0.5).masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        want = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, d)
        compare(call(answer, x, Wq, Wk, Wv, H), want, case, mistakes=[
            (_mqa(x, Wq, Wk, Wv, H, causal=False), "Later tokens leak into earlier ones: add the causal mask."),
            (_mqa(x, Wq, Wk, Wv, H, scale=d ** -0.5), "Scale by 1/sqrt(d_h), the width of one head, not 1/sqrt(d)."),
            (_mqa(x, Wq, Wk, Wv, H, split=False), "Split the queries into heads with view(B, T, H, d_h).transpose(1, 2), "
                                                  "not view(B, H, T, d_h): that mixes tokens into heads."),
            (_mqa(x, Wq, Wk, Wv, H, merge=False), "Put the heads back with transpose(1, 2) before the reshape to (B, T, d)."),
        ], hint="Every head's queries attend to the same keys x Wk and values x Wv.")


# 9.3 -----------------------------------------------------------------------------------------------

@exercise("9.3.2", "Your far weights are right for steep and shallow heads, short and long sequences.")
def _(answer):
    for k, (m, T, w) in enumerate([(0.5, 16, 4), (1 / 16, 1024, 64), (2 ** -8, 4096, 512), (0.25, 8, 0)], start=1):
        case = f"case {k} of 4 (slope {m:g}, T = {T}, window {w})"
        delta = torch.arange(T, dtype=torch.float64)                   # distances of the keys 0 .. T-1 back
        weight = torch.exp(-m * delta)
        compare_number(call(answer, m, T, w), float(weight[delta > w].sum() / weight.sum()), case, mistakes=[
            (float(weight[delta >= w].sum() / weight.sum()), "More than w back means distances w + 1 .. T - 1: "
                                                             "distance w itself is inside the window."),
            (float(weight[delta > w].sum()), "Normalize: divide by the sum of exp(-m delta) over all T keys."),
            (float(torch.exp(m * delta)[delta > w].sum() / torch.exp(m * delta).sum()), "The bias is -m delta: "
                                                                                          "the weight falls with distance."),
        ], hint="With equal content scores the weights are softmax(-m delta) over delta = 0 .. T - 1.")


def _rope(x, scale=1.0, sign=1.0, start=0, halves=False):
    T, d = x.shape[-2:]
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
    angle = sign * (torch.arange(start, start + T, dtype=x.dtype) / scale)[:, None] * omega
    cos, sin = angle.cos(), angle.sin()
    a, b = (x[..., : d // 2], x[..., d // 2:]) if halves else (x[..., 0::2], x[..., 1::2])
    ra, rb = a * cos - b * sin, a * sin + b * cos
    return torch.cat([ra, rb], -1) if halves else torch.stack([ra, rb], -1).flatten(-2)


@exercise("9.3.3", "Your rotation matches RoPE at scale 1 and rotates by t / scale at larger scales, batched too.")
def _(answer):
    g = torch.Generator().manual_seed(33)
    for k, (shape, scale) in enumerate([((5, 4), 1.0), ((8, 8), 4.0), ((2, 3, 6, 4), 2.0)], start=1):
        case = f"case {k} of 3 (x of shape {shape}, scale {scale:g})"
        x = randn(*shape, g=g)
        want = _rope(x, scale)
        compare(call(answer, x, scale), want, case, mistakes=[
            (_rope(x, scale, sign=-1.0), "Your pairs rotate the wrong way: (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos)."),
            (_rope(x, 1 / scale), "To stretch the context divide the positions by the scale, t / scale, not multiply."),
            (_rope(x, 1.0), "The scale is ignored: rotate position t by (t / scale) omega_j."),
            (_rope(x, scale, start=1), "Positions start at 0: the first row is not rotated."),
            (_rope(x, scale, halves=True), "Pair coordinates 2j and 2j+1 (interleaved), as the chapter's rope does, "
                                           "not j and j + d/2."),
        ], hint="Row t, pair (2j, 2j+1), rotates by the angle (t / scale) * 10000^(-2j/d).")


# 9.4 -----------------------------------------------------------------------------------------------

@exercise("9.4.2", "Your gradient matches autograd's: 2 w log Z softmax(z) / N, which pulls every logit down "
                   "in proportion to its probability while log Z is positive.")
def _(answer):
    g = torch.Generator().manual_seed(42)
    for k, (N, V, shift, w) in enumerate([(4, 10, 5.0, 1e-4), (3, 7, -3.0, 0.01), (6, 50, 20.0, 1.0)], start=1):
        case = f"case {k} of 3 ({N} rows of {V} logits, weight {w:g})"
        z = randn(N, V, g=g) + shift
        log_z = torch.logsumexp(z, -1, keepdim=True)
        p = torch.softmax(z, -1)
        want = 2 * w * log_z * p / N
        compare(call(answer, z, w), want, case, what="gradient", atol=1e-9, rtol=1e-6, mistakes=[
            (w * log_z * p / N, "The derivative of (log Z)^2 is 2 log Z times that of log Z: the factor 2 is missing."),
            (2 * w * log_z * p, "The loss is a mean over the N rows: divide by N."),
            (2 * w * log_z / V / N + 0 * p, "d log Z / dz_j is softmax(z)_j, not 1 / V."),
            (2 * log_z * p / N, "Multiply by the weight w."),
            (2 * w * z * p / N, "Use log Z = logsumexp(z) over the row, not the logits themselves."),
        ], hint="d/dz_j of w mean_rows (log Z)^2 is 2 w log Z softmax(z)_j / N.")


@exercise("9.4.3", "Your loss matches cross-entropy against the smoothed targets (1 - eps) one-hot + eps / V.")
def _(answer):
    g = torch.Generator().manual_seed(43)
    for k, (N, V, eps) in enumerate([(5, 4, 0.1), (8, 10, 0.2), (3, 3, 0.0)], start=1):
        case = f"case {k} of 3 ({N} rows, {V} classes, eps = {eps:g})"
        z = randn(N, V, g=g) * 2
        t = torch.randint(V, (N,), generator=g)
        log_p = torch.log_softmax(z, -1)
        one_hot = F.one_hot(t, V).double()
        want = -((1 - eps) * one_hot + eps / V) * log_p
        others = -((1 - eps) * one_hot + eps / (V - 1) * (1 - one_hot)) * log_p
        no_shrink = -(one_hot + eps / V) * log_p
        compare_number(call(answer, z, t, eps), want.sum(-1).mean().item(), case, what="loss", mistakes=[
            (others.sum(-1).mean().item(), "Spread eps over all V classes, the target included (eps / V each), "
                                           "as the original transformer and F.cross_entropy do, not over the other V - 1."),
            (no_shrink.sum(-1).mean().item(), "The target keeps 1 - eps (plus its share eps / V), not 1."),
            (-(want.sum(-1)).mean().item(), "A loss is positive: the cross-entropy is -sum(target * log p)."),
            (want.sum().item(), "Average over the rows, as F.cross_entropy does: a mean, not a sum."),
            ((-((1 - eps) * one_hot + eps / V) * torch.softmax(z, -1)).sum(-1).mean().item(),
             "Use log-probabilities (log_softmax), not probabilities."),
        ], hint="Targets (1 - eps) for the true class plus eps / V for every class; loss -sum(target * log_softmax(z)).")


# 9.5 -----------------------------------------------------------------------------------------------

def _state(s, v):
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m)
    return m, e.sum(-1, keepdim=True), e @ v


@exercise("9.5.1", "Your merged state is the one a single pass over both tiles gives, and acc / l is exact attention.")
def _(answer):
    g = torch.Generator().manual_seed(51)
    for k, (m_q, n_a, n_b, offset) in enumerate([(3, 4, 5, 0.0), (2, 3, 3, 30.0), (4, 6, 2, -30.0)], start=1):
        shifted = f", tile b's scores shifted by {offset:+g}" if offset else ""
        case = f"case {k} of 3 ({m_q} queries, tiles of {n_a} and {n_b} keys{shifted})"
        s_a, s_b = randn(m_q, n_a, g=g) * 3, randn(m_q, n_b, g=g) * 3 + offset
        v_a, v_b = randn(n_a, 2, g=g), randn(n_b, 2, g=g)
        a, b = _state(s_a, v_a), _state(s_b, v_b)
        m, total, acc = _state(torch.cat([s_a, s_b], -1), torch.cat([v_a, v_b]))
        got = pair(call(answer, a, b), case, ("m", "l", "acc"))
        compare(got[0], m, case, what="maximum m", hint="The merged maximum is max(m_a, m_b), elementwise.", mistakes=[
            (a[0] + b[0], "The merged maximum is max(m_a, m_b), not their sum."),
        ])
        for what, got_x, want, x_a, x_b in (("normalizer l", got[1], total, a[1], b[1]), ("sum acc", got[2], acc, a[2], b[2])):
            compare(got_x, want, case, what=what, mistakes=[
                (x_a + x_b, f"Rescale each tile's {what} to the new maximum: multiply by exp(m_tile - m) before adding."),
                (x_a * torch.exp(m - a[0]) + x_b * torch.exp(m - b[0]),
                 "The rescaling factor is exp(m_tile - m), at most 1: yours is upside down."),
            ], hint=f"{what} = {what.split()[-1]}_a exp(m_a - m) + {what.split()[-1]}_b exp(m_b - m).")
    # Queries that have seen no key in either tile (a fully masked row, as tiled_attention meets): m = -inf, l = 0.
    case = "case 4 of 4 (2 queries that saw no key in either tile: m = -inf, l = 0, acc = 0)"
    empty = (torch.full((2, 1), float("-inf"), dtype=torch.float64), torch.zeros(2, 1, dtype=torch.float64),
             torch.zeros(2, 3, dtype=torch.float64))
    got = pair(call(answer, empty, tuple(t.clone() for t in empty)), case, ("m", "l", "acc"))
    for what, got_x, want in zip(("maximum m", "normalizer l", "sum acc"), got, empty, strict=True):
        compare(got_x, want, case, what=what, hint="exp(m_a - m) is exp(-inf - (-inf)) = NaN here: where m is -inf, "
                                                     "shift by 0 instead (torch.where), as tiled_attention does.")


@exercise("9.5.2", "Your cache sizes are exact for multi-head, grouped-query and multi-query models.")
def _(answer):
    for k, (name, layers, heads, kv_heads, d_head, T, batch, nbytes) in enumerate([
        ("Llama 2 7B, 4,096 tokens, 16-bit", 32, 32, 32, 128, 4096, 1, 2),
        ("Llama 3 8B, 8,192 tokens, batch of 4, 16-bit", 32, 32, 8, 128, 8192, 4, 2),
        ("the chapter's toy decoder, 64 tokens, 32-bit", 2, 8, 2, 16, 64, 1, 4),
        ("a multi-query model, 1,000 tokens, 8-bit", 24, 16, 1, 64, 1000, 3, 1),
    ], start=1):
        case = f"case {k} of 4 ({name})"
        want = 2 * layers * kv_heads * d_head * T * batch * nbytes
        compare_number(call(answer, layers, heads, kv_heads, d_head, T, batch, nbytes), want, case, exact=True,
                       what="number of bytes", mistakes=[
            (want // kv_heads * heads, "Only the key-value heads are cached: use kv_heads, not the query heads."),
            (want // 2, "Both keys and values are cached: a factor 2."),
            (want // layers, "Every layer has its own cache: multiply by the number of layers."),
            (want // batch, "Each sequence in the batch has its own cache: multiply by the batch size."),
            (want // nbytes, "Count bytes: multiply by the bytes per number."),
        ], hint="2 (keys and values) x layers x kv_heads x d_head x T x batch x bytes per number.")


# 9.6 -----------------------------------------------------------------------------------------------

@exercise("9.6.1", "Your strided convolution gives the same tokens, in the same raster order, as the linear map of "
                   "flattened patches.")
def _(answer):
    g = torch.Generator().manual_seed(61)
    for k, (C, H, W, P, d) in enumerate([(3, 8, 8, 4, 5), (1, 6, 9, 3, 4), (2, 4, 8, 2, 6)], start=1):
        case = f"case {k} of 3 (image {(C, H, W)}, patches {P} x {P}, d = {d})"
        img, W_lin, b = randn(C, H, W, g=g), randn(d, C * P * P, g=g), randn(d, g=g)
        grid = img.unfold(1, P, P).unfold(2, P, P)                     # (C, H/P, W/P, P, P)
        flat = grid.permute(1, 2, 0, 3, 4).reshape(-1, C * P * P)       # raster order, each patch as (C, P, P)
        want = flat @ W_lin.T + b
        channels_last = grid.permute(1, 2, 3, 4, 0).reshape(-1, C * P * P) @ W_lin.T + b
        columns = grid.permute(2, 1, 0, 3, 4).reshape(-1, C * P * P) @ W_lin.T + b
        compare(call(answer, img, W_lin, b, P), want, case, what="tokens", mistakes=[
            (want.T, "Return one row per patch, (number of patches, d): transpose the (d, patches) output."),
            (channels_last, "Reshape the weight to (d, C, P, P): a patch flattens channel first, as in the helpers' patches."),
            (columns, "The patches go in raster order, row by row: flatten the (H/P, W/P) grid, do not transpose it."),
            (want - b, "Add the bias."),
        ], hint="F.conv2d(img[None], W_lin.view(d, C, P, P), b, stride=P), then flatten the grid into rows.")


@exercise("9.6.2", "Your index gives every pair of tokens in the window its own entry for each relative offset, "
                   "and equal offsets the same entry.")
def _(answer):
    for k, w in enumerate((2, 3, 7), start=1):
        case = f"case {k} of 3 (window {w} x {w})"
        y, x = torch.div(torch.arange(w * w), w, rounding_mode="floor"), torch.arange(w * w) % w
        dy, dx = y[:, None] - y[None, :], x[:, None] - x[None, :]          # query minus key
        want = (dy + w - 1) * (2 * w - 1) + (dx + w - 1)
        compare(call(answer, w), want, case, what="index", mistakes=[
            (dy * (2 * w - 1) + dx, "Shift the offsets by w - 1 so that they start at 0: an index cannot be negative."),
            ((dy + w - 1) * w + (dx + w - 1), "Each row offset has 2w - 1 column offsets: multiply by 2w - 1, not w, "
                                                "or different offsets share an entry."),
            (want.T, "Offsets are the query's position minus the key's: yours are the key's minus the query's."),
            ((dx + w - 1) * (2 * w - 1) + (dy + w - 1), "Rows first: the index is (dy + w - 1)(2w - 1) + (dx + w - 1)."),
        ], hint="index[a, b] = (dy + w - 1)(2w - 1) + (dx + w - 1), dy and dx query minus key.")


@exercise("9.6.3", "Your resized table keeps the class token and interpolates the grid of patch positions.")
def _(answer):
    g = torch.Generator().manual_seed(63)
    for k, (n, n_new, d) in enumerate([(2, 3, 4), (4, 6, 3), (14, 24, 8)], start=1):
        case = f"case {k} of 3 ({n} x {n} grid to {n_new} x {n_new}, d = {d})"
        pos = randn(1 + n * n, d, g=g)

        def resize(grid, n_new=n_new):                                    # (d, n, n) -> (n_new^2, d)
            grid = F.interpolate(grid[None], size=(n_new, n_new), mode="bilinear", align_corners=False)[0]
            return grid.flatten(1).T

        grid = pos[1:].reshape(n, n, d).permute(2, 0, 1)                  # (d, n, n)
        want = torch.cat([pos[:1], resize(grid)])
        compare(call(answer, pos, n_new), want, case, what="table", mistakes=[
            (torch.cat([pos[:1], resize(pos[1:].reshape(d, n, n))]),
             "Reshape to (n, n, d) and then move d first: reshape(d, n, n) mixes positions and features."),
            (torch.cat([pos[:1], resize(grid.transpose(1, 2))]),
             "The grid is transposed: the first spatial axis is the row, in raster order."),
            (resize(grid), "Keep the class token: row 0 of the table, unchanged, before the grid."),
            (resize(pos[:n * n].reshape(n, n, d).permute(2, 0, 1)) if n_new > n else want,
             "Row 0 is the class token, not a patch: interpolate rows 1 .. n^2 only."),
        ], hint="Row 0 is the class token, kept as it is; rows 1.. are an n x n grid in raster order, interpolated "
                "bilinearly (align_corners=False) to n_new x n_new.")


# New experiment exercises (9.1.3, 9.2.2, 9.3.1, 9.4.1, 9.5.3, 9.A.*) ---------------------------------
# Each check draws fresh cases (a new seed every time), computes what it expects before the answer runs,
# hands the answer copies or checks that its inputs are unchanged, and checks the type of what comes back.

import numbers as _numbers  # noqa: E402
import random as _random  # noqa: E402


def _fresh():
    """A generator seeded afresh at each check, so that no case can be learned from a message."""
    return torch.Generator().manual_seed(_random.SystemRandom().randrange(2**31))


def _pick(g, options):
    return options[int(torch.randint(len(options), (1,), generator=g))]


def _integer(got, case, what, inf_ok=False):
    """``got`` as an int: Python or NumPy integers and 0-d integer tensors; never a bool, float or string
    (with ``inf_ok``, also infinity: math.inf, as ``min`` of nothing)."""
    if inf_ok and isinstance(got, _numbers.Real | torch.Tensor) and not isinstance(got, bool) and \
            (not isinstance(got, torch.Tensor) or got.dim() == 0) and float(got) == math.inf:
        return math.inf
    if isinstance(got, torch.Tensor) and got.dim() == 0 and not got.is_floating_point() and got.dtype != torch.bool:
        return int(got)
    if isinstance(got, _numbers.Integral) and not isinstance(got, bool):
        return int(got)
    raise Wrong(f"{case}: the {what} should be an integer{' or math.inf' if inf_ok else ''}, got {type(got).__name__}"
                + (f" {got!r}" if isinstance(got, float | str | bool) else ""))


def _real(got, case, what):
    """``got`` as a float: a Python, NumPy or 0-d floating-point tensor number; never a bool or string."""
    if isinstance(got, torch.Tensor) and got.dim() == 0 and got.dtype != torch.bool:
        return float(got)
    if isinstance(got, _numbers.Real) and not isinstance(got, bool):
        return float(got)
    raise Wrong(f"{case}: the {what} should be a number, got {type(got).__name__}")


def _unchanged(before, after, case, what):
    if any(not torch.equal(a, b) for a, b in zip(before, after, strict=True)):
        raise Wrong(f"{case}: your function changed its input {what}; work on a copy (x.clone()) or without "
                    "in-place operations.")


# 9.1.3: decoding the reversal model with some source positions hidden ----------------------------------

def _decode_hiding(model, source, offsets, relative=1, copied=True, renormalize=True, context=True, wrap=False):
    """Greedy decoding with source positions n - 1 - t + o, o in offsets, hidden at output step t."""
    n = source.shape[1]
    with torch.no_grad():
        h, _ = model.encoder(model.embed(source))
        s = torch.tanh(model.init(h.mean(1)))
        prev = torch.full_like(source[:, 0], model.vocab)
        logits, weights = [], []
        for t in range(n):
            c, a = model.attention(s, h)
            hide = torch.zeros(n, dtype=torch.bool)
            for o in offsets:
                i = (n - 1 - t if copied else t) + relative * o
                if 0 <= i < n or (wrap and -n <= i < 0):
                    hide[i] = True
            a = a.masked_fill(hide, 0.0)
            if renormalize:
                a = a / a.sum(-1, keepdim=True)
            if context:
                c = (a[:, :, None] * h).sum(1)
            s = model.cell(torch.cat([model.embed(prev), c], -1), s)
            logit = model.out(torch.cat([s, c], -1))
            logits.append(logit)
            weights.append(a)
            prev = logit.argmax(-1)
    return torch.stack(logits, 1), torch.stack(weights, 1)


@exercise("9.1.3", "With the positions you hid, your decoder's weights and logits are those of the model's own "
                   "decoding loop with the hidden weights removed and the rest renormalized, also where an offset "
                   "points before the start of the string.")
def _(answer):
    from helpers.models import AdditiveAttention, AttentionSeq2Seq
    g = _fresh()
    # One case hides the copied position or its neighbours, one reaches past the start of the string (-1).
    offset_sets = (([0], [1], [0, 1]), ([-1, 0], [-1, 2]), ([0], [1], [-1, 0], [0, 1], [-1, 2]))
    for k in range(1, 4):
        n, d, B = _pick(g, (4, 5, 6, 7)), _pick(g, (8, 12, 16)), _pick(g, (3, 5, 8))
        offsets = list(_pick(g, offset_sets[k - 1]))
        case = f"case {k} of 3 (strings of {n} digits, width {d}, offsets {offsets})"
        with torch.random.fork_rng():
            torch.manual_seed(int(torch.randint(2**31, (1,), generator=g)))
            model = AttentionSeq2Seq(10, d, AdditiveAttention(d, d, d)).eval()
            with torch.no_grad():
                model.out.weight.mul_(8.0)          # clear winners: greedy decoding does not hinge on rounding
        source = torch.randint(10, (B, n), generator=g)
        want_logits, want_w = _decode_hiding(model, source, offsets)
        state = {name: p.clone() for name, p in model.state_dict().items()}
        attention, source_copy = model.attention, source.clone()
        got = pair(call(answer, model, source_copy, offsets), case, ("logits", "weights"))
        if model.attention is not attention or any(not torch.equal(p, state[name]) for name, p in model.state_dict().items()):
            raise Wrong(f"{case}: your function changed the model (its attention or its parameters): "
                        "decode with the model as it is, and leave it as you found it.")
        _unchanged([source], [source_copy], case, "source")
        compare(got[1], want_w, case, what="weights", atol=1e-5, rtol=1e-4, mistakes=[
            (_decode_hiding(model, source, offsets, relative=-1)[1],
             "Offset +1 is the position after the one being copied: n - 1 - t + 1, not n - 1 - t - 1."),
            (_decode_hiding(model, source, offsets, copied=False)[1],
             "At output step t the decoder copies source position n - 1 - t, not position t."),
            (_decode_hiding(model, source, offsets, renormalize=False)[1],
             "The weights left should sum to one again: divide by their sum (or set the hidden scores to -inf)."),
            (_decode_hiding(model, source, offsets, wrap=True)[1],
             "A position outside 0 .. n - 1 does not exist: skip it (a negative index wraps around to the end)."),
            (_decode_hiding(model, source, offsets, context=False)[1],
             "Your first step's weights are right, but the context still comes from the old ones: "
             "c = sum_i a_i h_i with the new a."),
        ], hint="At step t hide positions n - 1 - t + o for each offset o, then renormalize the other weights.")
        compare(got[0], want_logits, case, what="logits", atol=1e-4, rtol=1e-4, mistakes=[
            (_decode_hiding(model, source, offsets, context=False)[0],
             "Your weights are right, but the context still comes from the old ones: c = sum_i a_i h_i with the new a."),
        ], hint="Your weights are right: feed the context sum_i a_i h_i and your own previous prediction, as "
                "AttentionSeq2Seq.forward does.")


# 9.2.2: how far back a layer sees, measured with gradients ----------------------------------------------

class _Conv(torch.nn.Module):
    def __init__(self, d, k, dilation):
        super().__init__()
        self.pad, self.conv = (k - 1) * dilation, torch.nn.Conv1d(d, d, k, dilation=dilation)

    def forward(self, x):
        return self.conv(F.pad(x.transpose(1, 2), (self.pad, 0))).transpose(1, 2)


class _Window(torch.nn.Module):
    """Causal attention that sees the w most recent positions (w = None: all of them)."""
    def __init__(self, d, w):
        super().__init__()
        self.mha, self.w = torch.nn.MultiheadAttention(d, 1, batch_first=True), w

    def forward(self, x):
        i, j = torch.arange(x.shape[1])[:, None], torch.arange(x.shape[1])[None, :]
        hidden = (j > i) | ((i - j >= self.w) if self.w else torch.zeros_like(j > i))
        return self.mha(x, x, x, attn_mask=hidden, need_weights=False)[0]


def _layer(g, d, T, kinds=("conv", "window", "stack", "attention", "pointwise")):
    """A hidden layer (or stack) and how far back its last output sees."""
    kind = _pick(g, kinds)
    if kind == "conv":
        k, dilation = _pick(g, (2, 3, 4, 5)), _pick(g, (1, 2, 3))
        return torch.nn.Sequential(_Conv(d, k, dilation)), max(j * dilation for j in range(k) if j * dilation < T)
    if kind == "window":
        w = _pick(g, (2, 3, 5, 8))
        return torch.nn.Sequential(_Window(d, w)), min(w - 1, T - 1)
    if kind == "stack":
        w, k = _pick(g, (2, 3, 4)), _pick(g, (2, 3))
        return torch.nn.Sequential(_Window(d, w), _Conv(d, k, 1), _Window(d, w)), min(2 * (w - 1) + k - 1, T - 1)
    if kind == "attention":
        return torch.nn.Sequential(_Window(d, None)), T - 1
    return torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.Tanh()), 0


@exercise("9.2.2", "Your measurement finds how far back the last output sees for convolutions, windowed and full "
                   "causal attention, stacks of them, and a layer that sees only its own position.")
def _(answer):
    g = _fresh()
    for k in range(1, 5):
        T, d = _pick(g, (12, 16, 20, 24)), _pick(g, (2, 4))
        with torch.random.fork_rng():
            torch.manual_seed(int(torch.randint(2**31, (1,), generator=g)))
            # Cases 1-2 see back 1 .. T - 2 positions, case 3 up to T - 1, and case 4 may be a layer that sees
            # only its own position: the first failing case then tells each mistake apart.
            kinds = (("conv", "window", "stack"), ("conv", "window", "stack"), ("conv", "window", "stack", "attention"),
                     ("conv", "window", "stack", "attention", "pointwise"))[k - 1]
            layer, want = _layer(g, d, T, kinds)
        case = f"case {k} of 4 (a hidden layer, T = {T}, d = {d})"
        got = _integer(call(answer, layer, T, d), case, "reach")
        compare_number(got, want, case, exact=True, what="reach", mistakes=[
            (T - 1 - want, "Return the distance back, T - 1 minus the earliest input that matters, not that input's index."),
            (want + 1, "Count distances: a layer whose last output sees only its own input has reach 0."),
            (0, "Differentiate the last output, position T - 1, with respect to the whole input."),
            (T - 1, "Differentiate the last output alone: an earlier output, or the sum of all outputs, sees other "
                    "inputs."),
        ], hint="x (1, T, d) with requires_grad; differentiate layer(x)[0, -1].sum(); the reach is T - 1 minus the "
                "first position whose gradient is not exactly zero.")


# 9.3.1: the content advantage that overrides ALiBi's penalty ---------------------------------------------

def _advantage(m, T, delta, others=True, penalty=True):
    dist = torch.arange(T, dtype=torch.float64)
    rest = torch.logsumexp(-m * dist[dist != delta], 0).item() if others else 0.0
    return (m * delta if penalty else 0.0) + rest


@exercise("9.3.1", "Your advantage gives the far key exactly half of the last query's weight, for steep and shallow "
                   "heads, short and long sequences.")
def _(answer):
    g = _fresh()
    for k in range(1, 5):
        m = 2.0 ** -_pick(g, (1, 2, 4, 6, 8))
        T = _pick(g, (16, 100, 1024, 4096))
        delta = int(torch.randint(1, T, (1,), generator=g))
        case = f"case {k} of 4 (slope {m:g}, T = {T}, a key {delta} back)"
        want = _advantage(m, T, delta)
        got = _real(call(answer, m, T, delta), case, "advantage")
        compare_number(got, want, case, what="advantage", mistakes=[
            (_advantage(m, T, delta, others=False), "The other T - 1 keys compete: half the weight means "
                                                     "exp(b - m delta) equals the sum of their weights."),
            (_advantage(m, T, delta, penalty=False), "The key's own bias, -m delta, counts against it too."),
        ], hint="Weights softmax over keys at distances 0 .. T - 1 with scores -m delta', plus b for the one key "
                "delta back: solve for the b that gives it one half.")


# 9.4.1: the residual stream's size, block by block --------------------------------------------------------

def _stream(blocks, x, inputs=False, reduce="rms", normalized=False):
    out = [x] if inputs else []
    with torch.no_grad():
        for block in blocks:
            x = block(x)
            out.append(block.norm1(x) if normalized else x)
    if reduce == "rms":
        return torch.stack([z.pow(2).mean().sqrt() for z in out])
    if reduce == "norm":
        return torch.stack([z.norm() for z in out])
    return torch.stack([z.std() for z in out])


@exercise("9.4.1", "Your measurement is the RMS of the residual stream after each block, for stacks of every depth "
                   "tried.")
def _(answer):
    from helpers.models import PreNormBlock
    g = _fresh()
    for k in range(1, 4):
        L, d, B, T = _pick(g, (2, 3, 5)), _pick(g, (8, 16)), _pick(g, (2, 3)), _pick(g, (4, 6))
        case = f"case {k} of 3 ({L} pre-norm blocks of width {d}, x of shape {(B, T, d)})"
        with torch.random.fork_rng():
            torch.manual_seed(int(torch.randint(2**31, (1,), generator=g)))
            blocks = torch.nn.Sequential(*[PreNormBlock(d, torch.nn.Linear(d, d)) for _ in range(L)])
            with torch.no_grad():
                for p in blocks.parameters():
                    p.mul_(2.0)                             # a stream that visibly grows
        x = 3 * torch.randn(B, T, d, generator=g) + 1      # a mean away from zero, so RMS and std differ
        want = _stream(blocks, x)
        x_copy = x.clone()
        got = call(answer, blocks, x_copy)
        _unchanged([x], [x_copy], case, "x")
        if isinstance(got, list | tuple) and all(isinstance(v, _numbers.Real | torch.Tensor) for v in got):
            raise Wrong(f"{case}: return a tensor of {L} numbers (torch.stack or torch.tensor), got a {type(got).__name__}")
        compare(got, want, case, what="RMS after each block", atol=1e-5, rtol=1e-4, mistakes=[
            (_stream(blocks, x, inputs=True), "One value per block, after it: leave out the input."),
            (_stream(blocks, x, reduce="norm"), "The RMS is the square root of the mean of the squares, not the norm."),
            (_stream(blocks, x, reduce="std"), "The RMS does not subtract the mean: sqrt(mean(x ** 2))."),
            (_stream(blocks, x, normalized=True), "Measure the stream itself, x after each block, not its normalized copy."),
        ], hint="x = block(x) for each block; after each, sqrt(mean(x ** 2)) over all entries.")


# 9.5.3: how many layers a sparse pattern needs to connect every pair --------------------------------------

def _diameter(pattern, hops=False, middle=False):
    T = pattern.shape[0]
    p = pattern.to(torch.float64)
    reach = p.clone()
    for n in range(1, T + 1):
        done = (reach[T // 2] > 0).all() if middle else (reach > 0).all()
        if done:
            return n - 1 if hops else n
        reach = ((reach @ p) > 0).to(torch.float64)
    return math.inf


def _pattern(g, T, kinds=("window", "strided", "global", "random", "causal", "blocks"), r=None):
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    kind = _pick(g, kinds)
    r = r or _pick(g, (1, 2, 3))
    window = (i - j).abs() <= r
    if kind == "strided":
        return window | ((i - j) % _pick(g, (3, 4, 5)) == 0)
    if kind == "global":
        n = _pick(g, (1, 2))
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
    g = _fresh()
    kinds = []
    for k in range(1, 7):
        T = _pick(g, (9, 12, 16, 20))
        # Case 1, a window of one neighbour on either side, tells the mistakes apart: T - 1 layers connect every
        # pair, T - 2 hops, T / 2 layers the middle token alone.
        pattern = _pattern(g, T, ("window",), r=1) if k == 1 else _pattern(g, T)
        if k == 6 and math.inf not in kinds:       # at least one pattern that never connects
            i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
            pattern = ((i - j).abs() <= 1) & (j <= i)
        want = _diameter(pattern)
        kinds.append(want)
        case = f"case {k} of 6 (a hidden {T} x {T} pattern)"
        copy_ = pattern.clone()
        got = _integer(call(answer, copy_), case, "number of layers", inf_ok=True)
        _unchanged([pattern], [copy_], case, "pattern")
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
        ], hint="Information from key j reaches query i after n layers where the boolean power pattern^n is True; "
                "find the smallest n at which it is True everywhere.")


# 9.A.1: the Jacobian of a softmax with a temperature ------------------------------------------------------

@exercise("9.A.1", "Your Jacobian equals autograd's for every temperature and length tried: (diag(p) - p p^T) / tau "
                   "with p = softmax(s / tau).")
def _(answer):
    g = _fresh()
    for k in range(1, 4):
        n, tau = _pick(g, (2, 5, 9)), _pick(g, (0.1, 0.5, 2.0, 7.0))
        case = f"case {k} of 3 ({n} scores, temperature {tau:g})"
        s = tau * torch.randn(n, generator=g, dtype=torch.float64)     # s / tau of unit scale: no saturated entries
        want = torch.autograd.functional.jacobian(lambda z, tau=tau: torch.softmax(z / tau, 0), s)
        p, p1 = torch.softmax(s / tau, 0), torch.softmax(s, 0)
        s_copy = s.clone()
        got = call(answer, s_copy, tau)
        _unchanged([s], [s_copy], case, "s")
        compare(got, want, case, what="Jacobian", atol=1e-6, rtol=1e-4, mistakes=[
            (torch.diag(p) - torch.outer(p, p), "The chain rule through s / tau gives a factor 1 / tau."),
            ((torch.diag(p) - torch.outer(p, p)) * tau, "The factor is 1 / tau, not tau."),
            ((torch.diag(p1) - torch.outer(p1, p1)) / tau, "Use p = softmax(s / tau), the probabilities at this temperature."),
            (torch.diag(p) / tau, "The off-diagonal terms -p_i p_j / tau are missing."),
        ], hint="J_ij = (p_i delta_ij - p_i p_j) / tau with p = softmax(s / tau).")


# 9.A.2: the gradient of a learned ALiBi slope, from the backward pass of Appendix C -----------------------

def _slope_forward(q, k, v, m):
    T = q.shape[-2]
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).to(q.dtype)
    s = q @ k.mT / q.shape[-1] ** 0.5 - m * dist
    s = s.masked_fill(dist < 0, float("-inf"))
    return torch.softmax(s, -1) @ v


def _slope_grad(q, k, v, m, d_out, variant=None):
    T = q.shape[-2]
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).to(q.dtype)
    s = (q @ k.mT / q.shape[-1] ** 0.5 - m * dist).masked_fill(dist < 0, float("-inf"))
    p = torch.softmax(s, -1)
    dp = d_out @ v.mT
    ds = p * (dp - (p * dp).sum(-1, keepdim=True)) if variant != "no_D" else p * dp
    if variant == "plus":
        return (ds * dist.clamp(min=0)).sum()
    if variant == "dp":
        return -(dp * dist.clamp(min=0)).sum()
    return -(ds * dist.clamp(min=0)).sum()


@exercise("9.A.2", "Your slope gradient equals autograd's: dL/dm = -sum_ij dS_ij (i - j), with dS from the softmax "
                   "backward of Appendix C.")
def _(answer):
    g = _fresh()
    for k in range(1, 4):
        T, d, m = _pick(g, (3, 6, 10)), _pick(g, (2, 4, 8)), _pick(g, (0.05, 0.25, 1.0))
        case = f"case {k} of 3 (T = {T}, d = {d}, slope {m:g})"
        q, k_, v, d_out = (torch.randn(T, d, generator=g, dtype=torch.float64) for _ in range(4))
        slope = torch.tensor(m, dtype=torch.float64, requires_grad=True)
        (_slope_forward(q, k_, v, slope) * d_out).sum().backward()
        want = slope.grad.item()
        copies = [t.clone() for t in (q, k_, v, d_out)]
        got = _real(call(answer, *copies[:3], m, copies[3]), case, "gradient")
        _unchanged([q, k_, v, d_out], copies, case, "q, k, v or d_out")
        compare_number(got, want, case, what="gradient", mistakes=[
            (_slope_grad(q, k_, v, m, d_out, "plus").item(), "The bias is -m (i - j): its derivative in m is -(i - j)."),
            (_slope_grad(q, k_, v, m, d_out, "no_D").item(), "dS_ij = P_ij (dP_ij - D_i): the row term "
                                                             "D_i = sum_k P_ik dP_ik is missing."),
            (_slope_grad(q, k_, v, m, d_out, "dp").item(), "Go through the softmax: the bias enters the scores S, so "
                                                           "use dS, not dP."),
        ], hint="dP = dO V^T, dS = P * (dP - rowsum(P * dP)), and dL/dm = sum_ij dS_ij * d S_ij / d m = "
                "-sum_ij dS_ij (i - j) over the visible pairs.")
