"""Section 9.2's checkers, in exercise order: 9.2.1 padding and causal masks combined, 9.2.2 how far back a
layer sees, measured, 9.2.3 multi-query attention."""

import torch
import torch.nn.functional as F

from helpers.exercises.judge import as_integer, call, cases, compare, compare_number, exercise, fresh, generator, pick

# 9.2.1: padding and causal masks combined -------------------------------------------------------------------

def _masks(lengths, T):
    j = torch.arange(T)
    causal = j[None, :] > j[:, None]                                   # (T, T): key after query
    pad_keys = j[None, None, :] >= torch.as_tensor(lengths)[:, None, None]   # (B, 1, T)
    pad_queries = j[None, :, None] >= torch.as_tensor(lengths)[:, None, None]
    return causal, pad_keys, pad_queries


@exercise("9.2.1", "Your mask hides exactly the future and the padding keys, for every batch tried.")
def _(answer):
    r = fresh()
    # T matters only where every sequence is shorter than T (else T = the longest length): the first hidden case
    # pads every sequence, so that an answer that takes T from the lengths fails every check.
    hidden = []
    for k in range(3):
        T = r.integer(2, 8) if k == 0 else r.integer(1, 8)
        hidden.append(([r.integer(1, T - 1 if k == 0 else T) for _ in range(r.integer(1, 4))], T))
    for case, (lengths, T) in cases([([3, 5], 5), ([1, 4, 2], 4), ([6], 6)], hidden,
                                    lambda lengths, T: f"lengths {lengths}, T = {T}"):
        causal, pad_keys, pad_queries = _masks(lengths, T)
        want = causal | pad_keys
        off_by_one = torch.arange(T)[None, :] >= torch.arange(T)[:, None]
        pad_late = torch.arange(T)[None, None, :] > torch.as_tensor(lengths)[:, None, None]
        compare(call(answer, torch.tensor(lengths), T, case=case), want, case, what="mask", mistakes=[
            (~want, "True should mark what a query may NOT see (as nn.MultiheadAttention): your mask is inverted."),
            (off_by_one | pad_keys, "The diagonal is hidden: a query may attend to its own position "
                                    "(j > i is hidden, not j >= i)."),
            (causal | pad_queries, "You hid padding queries: pad the keys, j >= length, so the mask's last axis."),
            (causal & pad_keys.expand(-1, T, -1), "Combine the masks with |: a key is hidden if it is in the future OR padding."),
            (causal.expand(len(lengths), T, T), "The padding is missing: also hide keys j >= length."),
            (causal | pad_late, "Off by one in the padding: the real keys are 0 .. length - 1, so hide j >= length."),
            (~causal | pad_keys, "The causal part is reversed: hide the keys after the query (j > i), not those up to it."),
        ], hint="Hide key j from query i where j > i or j >= the sequence's length.")


# 9.2.2: how far back a layer sees, measured with gradients --------------------------------------------------

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


def _layer(g, d, T, kind):
    """A hidden layer (or stack) of the given kind, its sizes drawn from g, and how far back its last output sees."""
    if kind == "conv":
        k, dilation = pick(g, (2, 3, 4, 5)), pick(g, (1, 2, 3))
        conv = _Conv(d, k, dilation)
        with torch.no_grad():
            conv.conv.weight[..., -1] *= 0.1        # a weak tap at the output's own position: its largest gradient is
        return torch.nn.Sequential(conv), max(j * dilation for j in range(k) if j * dilation < T)   # farther back
    if kind == "window":
        w = pick(g, (2, 3, 5, 8))
        return torch.nn.Sequential(_Window(d, w)), min(w - 1, T - 1)
    if kind == "stack":
        w, k = pick(g, (2, 3, 4)), pick(g, (2, 3))
        return torch.nn.Sequential(_Window(d, w), _Conv(d, k, 1), _Window(d, w)), min(2 * (w - 1) + k - 1, T - 1)
    if kind == "attention":
        return torch.nn.Sequential(_Window(d, None)), T - 1
    if kind == "faint":
        # Four taps, at distances 3 dil (every weight FAINT: the reach), 2 dil (0.1), dil (0.3: the largest gradient)
        # and 0 (drawn, times 0.1), and a bias of 12: for d = 2 and a random normal input each output is 12 +- about
        # 0.5, never outside [8, 16), where a float32 ulp is 2^-20 = 9.5e-7. Moving the farthest input by 1, in one
        # channel or in both, moves every output by 4e-6 or 8e-6, 4 to 8 ulps: an exact comparison always sees it,
        # and so does a gradient test (the gradient there is 8e-6, not 0), while torch.allclose's default tolerance,
        # 1e-8 + 1e-5 |y| >= 8e-5, is 10 times larger and never does; a gradient threshold of 1e-4 misses it too
        # (summed over both channels the gradient is 1.6e-5), but sees the tap 2 dil back.
        # Dilated (2 or 3) in every run: the inputs it depends on are not contiguous, so counting them is not the reach.
        dilation = pick(g, (2, 3))
        conv = _Conv(d, 4, dilation)
        with torch.no_grad():
            weight = conv.conv.weight                               # (d, d, 4): tap 0 is the farthest input
            weight[..., 3] *= 0.1
            weight[..., 2], weight[..., 1], weight[..., 0] = 0.3, 0.1, _FAINT
            conv.conv.bias.fill_(12.0)
        return torch.nn.Sequential(conv), 3 * dilation
    return torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.Tanh()), 0


_FAINT = 4e-6                   # the faint tap's weights (see _layer)


@exercise("9.2.2", "Your measurement finds how far back the last output sees for a convolution, one whose farthest "
                   "input has a faint weight, windowed and full causal attention, a stack of them, and a layer that "
                   "sees only its own position.")
def _(answer):
    g = generator()
    # One case of each kind, every check, so that the message holds for each run. Cases 1-4 see back 1 .. T - 2
    # positions, case 5 all T - 1 and case 6 none: the first failing case then tells each mistake apart.
    # Case 4 is a convolution whose farthest input has a tiny weight: dependence, not strength, counts.
    kinds = ("conv", "window", "stack", "faint", "attention", "pointwise")
    for k, kind in enumerate(kinds, 1):
        T, d = pick(g, (12, 16, 20, 24)), pick(g, (2, 4))
        d = 2 if kind == "faint" else d             # (the faint case's margins, in _layer, are worked out for d = 2)
        with torch.random.fork_rng():
            torch.manual_seed(int(torch.randint(2**31, (1,), generator=g)))
            layer, want = _layer(g, d, T, kind)
        # What each mistake gives on this layer, from the gradient at a random input of our own: the last input that
        # matters is the output's own (T - 1) for every layer here; a convolution's gradient is the same for every
        # input, so its largest one and those above a threshold are the answer's too.
        x = torch.randn(1, T, d, generator=g, requires_grad=True)
        with torch.enable_grad():
            (grad,) = torch.autograd.grad(layer(x)[0, -1].sum(), x)
        size = grad[0].abs().sum(-1)                                       # (T,)
        mistakes = [
            (T - 1 - want, "Return the distance back, T - 1 minus the earliest input that matters, not that input's index."),
            (want + 1, "Count distances: a layer whose last output sees only its own input has reach 0."),
            (T - 1, "Differentiate the last output alone: an earlier output, or the sum of all outputs, sees other "
                    "inputs."),
            (T - 1 - int((size > 0).nonzero()[-1]), "That is the distance to the nearest input the last output depends "
                                                      "on, its own: the reach is to the farthest, the earliest position "
                                                      "whose gradient is not exactly zero (not the latest such position, "
                                                      "nor the one with the largest gradient)."),
        ]
        if kind in ("conv", "faint"):
            mistakes += [
                (int((size > 0).sum()) - 1, "That counts the inputs the last output depends on, minus one: a dilated "
                                            "convolution skips the inputs between its taps, so the reach is the distance "
                                            "to the farthest of them, T - 1 minus its position."),
                (T - 1 - int(size.argmax()), "That is the input with the largest gradient: the reach counts any "
                                             "dependence, however weak, so take the earliest position whose gradient "
                                             "is not exactly zero."),
                (T - 1 - int((size > 1e-4).nonzero()[0]), "A small effect is still a dependence: this layer's farthest "
                                                            "input has a tiny weight, so count every gradient (or change "
                                                            "of the output) that is not exactly zero, with no threshold or "
                                                            "tolerance such as torch.allclose's."),
            ]
        case = f"case {k} of {len(kinds)} (a hidden layer, T = {T}, d = {d})"
        got = as_integer(call(answer, layer, T, d, case=case), case, "reach")
        compare_number(got, want, case, exact=True, what="reach", mistakes=mistakes,
                       hint="x (1, T, d) with requires_grad; differentiate layer(x)[0, -1].sum(); the reach is T - 1 "
                            "minus the first position whose gradient is not exactly zero.")


# 9.2.3: multi-query attention -------------------------------------------------------------------------------

def _mqa(x, Wq, Wk, Wv, heads, causal=True, split=True, scale=None, merge=True, dim=-1):
    B, T, d = x.shape
    q = (x @ Wq).view(B, T, heads, d // heads).transpose(1, 2) if split else (x @ Wq).view(B, heads, T, d // heads)
    k, v = (x @ Wk)[:, None], (x @ Wv)[:, None]                        # (B, 1, T, d_h): one head, shared
    s = q @ k.mT * (scale or (d // heads) ** -0.5)
    if causal:
        ones = torch.ones(T, T, dtype=torch.bool)
        hide = {"diagonal": torch.triu(ones, 0), "transposed": torch.tril(ones, -1)}.get(causal, torch.triu(ones, 1))
        s = s.masked_fill(hide, float("-inf"))
    y = torch.softmax(s, dim) @ v                                      # (B, H, T, d_h)
    return y.transpose(1, 2).reshape(B, T, d) if merge else y.reshape(B, T, d)


@exercise("9.2.3", "Your multi-query attention equals multi-head attention whose heads all use the same key and value "
                   "weights, causally, for every shape tried.")
def _(answer):
    r = fresh()
    hidden = []
    for _ in range(2):
        H = r.integer(1, 4)
        hidden.append((r.integer(1, 3), r.integer(1, 7), H * r.choice([2, 3, 5, 6, 8]), H))
    # Head widths 4, 8, 6 and 5: an answer that reads a notebook's d_k or hard-codes one fails.
    for case, (B, T, d, H) in cases([(2, 5, 8, 2), (1, 6, 16, 2), (2, 4, 18, 3), (1, 3, 5, 1)], hidden,
                                    lambda B, T, d, H: f"B = {B}, T = {T}, d = {d}, {H} head{'s' * (H > 1)} of width {d // H}"):
        x, Wq, Wk, Wv = r.randn(B, T, d), r.randn(d, d), r.randn(d, d // H), r.randn(d, d // H)
        # Multi-head attention with every head's key and value weights equal to the shared ones.
        Wk_all, Wv_all = Wk.repeat(1, H), Wv.repeat(1, H)
        q, kk, v = ((x @ W).view(B, T, H, d // H).transpose(1, 2) for W in (Wq, Wk_all, Wv_all))
        s = (q @ kk.mT / (d // H) ** 0.5).masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        want = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, d)
        mistakes = [
            (_mqa(x, Wq, Wk, Wv, H, causal=False), "Later tokens leak into earlier ones: add the causal mask."),
            (_mqa(x, Wq, Wk, Wv, H, scale=d ** -0.5), "Scale by 1/sqrt(d_h), the width of one head, not 1/sqrt(d)."),
            (_mqa(x, Wq, Wk, Wv, H, scale=1.0), "The scores are not scaled: divide them by sqrt(d_h), the width of one head."),
            (_mqa(x, Wq, Wk, Wv, H, causal="diagonal"), "The mask hides the diagonal too, so the first token sees nothing (NaN): "
                                                 "hide only the keys after the query, triu(..., diagonal=1)."),
            (_mqa(x, Wq, Wk, Wv, H, split=False), "Split the queries into heads with view(B, T, H, d_h).transpose(1, 2), "
                                                  "not view(B, H, T, d_h): that mixes tokens into heads."),
            (_mqa(x, Wq, Wk, Wv, H, merge=False), "Put the heads back with transpose(1, 2) before the reshape to (B, T, d)."),
            (_mqa(x, Wq, Wk, Wv, H, dim=-2), "The softmax runs over the keys, the last axis (dim=-1): each query's "
                                             "weights sum to one, not each key's."),
            (_mqa(x, Wq, Wk, Wv, H, causal="transposed"), "The mask is transposed: it hides the keys before each query. "
                                                          "Hide those after it, j > i: triu(..., diagonal=1)."),
        ]
        compare(call(answer, x, Wq, Wk, Wv, H, case=case), want, case, mistakes=mistakes,
                hint="Every head's queries attend to the same keys x Wk and values x Wv; d_h = d / heads.")
