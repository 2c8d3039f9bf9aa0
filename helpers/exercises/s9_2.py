"""Section 9.2's checkers, in exercise order: 9.2.1 padding and causal masks combined, 9.2.2 how far back a
layer sees, measured, 9.2.3 multi-query attention, 9.2.4 padding on the left, 9.2.5 a lookup trained on padded
batches (open: the outcome is measured). ``Training`` and ``learned``, which 9.3.5 uses too, ask whether an open
exercise's model was trained, not written by hand.

A hint names the mistake (and may point to the section's equation or figure), never the answer's formula or code."""


import torch
import torch.nn.functional as F

from helpers.attention import causal_mask, padding_mask
from helpers.exercises.judge import (
    Watch,
    Wrong,
    _graph_leaves,
    alone,
    as_integer,
    call,
    cases,
    compare,
    compare_number,
    exercise,
    fresh,
    generator,
    inside,
    parameters_of,
    pick,
    shuffled,
)
from helpers.runtime import threads

# 9.2.1: padding and causal masks combined -------------------------------------------------------------------

def _masks(lengths, T):
    j = torch.arange(T)
    causal = j[None, :] > j[:, None]                                   # (T, T): key after query
    pad_keys = j[None, None, :] >= torch.as_tensor(lengths)[:, None, None]   # (B, 1, T)
    pad_queries = j[None, :, None] >= torch.as_tensor(lengths)[:, None, None]
    return causal, pad_keys, pad_queries


# The section builds the combined mask on screen with its two helpers; the exercise asks for it without them.
_HELPERS = ("calls the chapter's padding_mask or causal_mask: the exercise asks you to build the mask without them, "
            "from the positions of the queries and keys and the lengths.")


def _padded(r):
    """Three hidden (lengths, T) cases of one to four sequences. T matters only where every sequence is shorter
    than T (else T = the longest length): the first case pads every sequence, so that an answer that takes T from
    the lengths fails every check."""
    hidden = []
    for k in range(3):
        T = r.integer(2, 8) if k == 0 else r.integer(1, 8)
        hidden.append(([r.integer(1, T - 1 if k == 0 else T) for _ in range(r.integer(1, 4))], T))
    return hidden


def _sized_by_lengths(got, lengths, T, case):
    """Wrong if ``got`` is a mask as long as the longest sequence rather than ``T`` (a students' review: T ignored got
    "No usual mistake fits")."""
    longest = max(lengths)
    if isinstance(got, torch.Tensor) and longest != T and tuple(got.shape) == (len(lengths), longest, longest):
        raise Wrong(f"{case}: the mask should have shape {(len(lengths), T, T)}, got {tuple(got.shape)}: yours is as "
                    f"long as the longest sequence, {longest}, but the batch is padded to T = {T}, which can be longer.")


@exercise("9.2.1", "Your mask hides exactly the future and the padding keys, for every batch tried.")
def _(answer):
    for case, (lengths, T) in cases([([3, 5], 5), ([1, 4, 2], 4), ([6], 6)], _padded(fresh()),
                                    lambda lengths, T: f"lengths {lengths}, T = {T}"):
        causal, pad_keys, pad_queries = _masks(lengths, T)
        want = causal | pad_keys
        off_by_one = torch.arange(T)[None, :] >= torch.arange(T)[:, None]
        pad_late = torch.arange(T)[None, None, :] > torch.as_tensor(lengths)[:, None, None]
        got = call(answer, torch.tensor(lengths), T, case=case,
                   watch=Watch(inside(padding_mask, causal_mask), _HELPERS, half_refused=False))
        _sized_by_lengths(got, lengths, T, case)
        compare(got, want, case, what="mask", mistakes=[
            (~want, "True should mark what a query may NOT see (as nn.MultiheadAttention): your mask is inverted."),
            (off_by_one | pad_keys, "The diagonal is hidden: a query may attend to its own position."),
            (causal | pad_queries, "You hid the padding queries (rows of the mask): the padding mask hides keys, "
                                   "the columns, from every query."),
            (causal & pad_keys.expand(-1, T, -1), "You hid only the keys that are both in the future and padding: a "
                                                  "key is hidden if it is either."),
            (causal.expand(len(lengths), T, T), "The padding is missing: the padding keys are visible."),
            (pad_keys.expand(-1, T, -1), "The causal part is missing: every query sees the keys after it."),
            (causal | pad_late, "Off by one in the padding: the first padding key of each sequence is still visible."),
            (~causal | pad_keys, "The causal part is reversed: it hides the past and the query itself, not the future."),
            (causal.mT | pad_keys, "The causal part is transposed: it hides the keys before each query, not those "
                                   "after it."),
        ], hint="No usual mistake fits: compare one sequence's (T, T) slice with the combined grid of Figure 9.2.3.")


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
        # 0.5, never outside [8, 16), where a float32 rounding step is 2^-20 = 9.5e-7. The farthest input's weight is so
        # faint that only the gradient sees it: the gradient there is 2 FAINT = 2e-12, not 0, while changing that input
        # by any reasonable amount (fresh noise, or up to 100 in each channel) moves each output by 2e-10 or less, under
        # a four-thousandth of a rounding step: the float32 output does not change at all. A comparison of outputs,
        # exact or with torch.allclose's tolerance, and a gradient threshold such as 1e-4, all miss it on every draw and
        # find the tap 2 dil back; so does an answer right in exact arithmetic that changes the input in float32: the
        # exercise measures with the gradient, and the hint says why. (The faint weight was 4e-6, a change of 1 moving
        # the output by 4 to 8 rounding steps; but fresh noise sometimes changed the input by 0.1 or less, which moved
        # it by less than one, and a right answer that compared outputs failed 1 check in 20.)
        # Dilated (2 or 3) in every run: the inputs it depends on are not contiguous, so counting them is not the reach.
        dilation = pick(g, (2, 3))
        conv = _Conv(d, 4, dilation)
        with torch.no_grad():
            weight = conv.conv.weight                               # (d, d, 4): tap 0 is the farthest input
            weight[..., 3] *= 0.1
            weight[..., 2], weight[..., 1], weight[..., 0] = 0.3, 0.1, _FAINT
            conv.conv.bias.fill_(12.0)
        return torch.nn.Sequential(conv), 3 * dilation
    if kind == "channels":
        # A dilated convolution whose farthest tap skips input channel 0 and output channel 0 (d >= 2): the gradient of
        # one input channel, or of one output channel, misses it, where every other layer here mixes all channels.
        k, dilation = pick(g, (3, 4, 5)), pick(g, (1, 2))
        conv = _Conv(d, k, dilation)
        with torch.no_grad():
            conv.conv.weight[:, 0, 0] = 0.0
            conv.conv.weight[0, :, 0] = 0.0
        return torch.nn.Sequential(conv), (k - 1) * dilation
    return torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.Tanh()), 0


_FAINT = 1e-12                  # the faint tap's weights (see _layer)
# What a threshold, a tolerance, or a change of the input (exact in exact arithmetic) all give on the faint layer.
_TINY = ("A small effect is still a dependence: this layer's farthest input has a tiny weight, so tiny that changing "
         "that input moves the output by less than float32 rounds off, and the output does not change at all. Measure "
         "with the gradient, as the exercise asks: it is exactly zero only where there is no dependence. Count every "
         "gradient that is not exactly zero, with no threshold or tolerance such as torch.allclose's.")


_ONE_CHANNEL = ("That is the reach seen through one channel: this layer's farthest input reaches the last output "
                "through other channels only (not input channel 0, nor output channel 0). Count an input position when "
                "the gradient of any channel of the last output with respect to any of its channels is not zero.")


@exercise("9.2.2", "Your measurement finds how far back the last output sees for a convolution, one whose farthest "
                   "input has a faint weight, windowed and full causal attention, a stack of them, and a layer that "
                   "sees only its own position.")
def _(answer):
    g = generator()
    # One case of each kind, every check, so that the message holds for each run. Cases 1-5 see back 1 .. T - 2
    # positions, case 6 all T - 1 and case 7 none: the first failing case then tells each mistake apart.
    # Case 4 is a convolution whose farthest input has a tiny weight: dependence, not strength, counts. Case 5 is one
    # whose farthest tap skips input channel 0 and output channel 0: every channel counts.
    kinds = ("conv", "window", "stack", "faint", "channels", "attention", "pointwise")
    for k, kind in enumerate(kinds, 1):
        # (Not T = 16 for the faint layer: with dilation 3 its reach, 9, would be T - 1 - 6, and 6, the reach that a
        # comparison of float32 outputs finds, would also fit the hint for an answer that returns the input's index.)
        T, d = pick(g, (12, 20, 24) if kind == "faint" else (12, 16, 20, 24)), pick(g, (2, 4))
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
        if kind == "channels":
            with torch.enable_grad():
                (first,) = torch.autograd.grad(layer(x)[0, -1, 0], x)        # output channel 0 alone
            mistakes += [(T - 1 - int((grad[0, :, 0] != 0).nonzero()[0]), _ONE_CHANNEL),
                         (T - 1 - int((first[0].abs().sum(-1) > 0).nonzero()[0]), _ONE_CHANNEL)]
        if kind in ("conv", "faint"):                # (the conv and faint cases, earlier, tell these apart already)
            mistakes += [
                (int((size > 0).sum()) - 1, "That counts the inputs the last output depends on, minus one: a dilated "
                                            "convolution skips the inputs between its taps, so the reach is the distance "
                                            "to the farthest of them, T - 1 minus its position."),
                (T - 1 - int(size.argmax()), "That is the input with the largest gradient: the reach counts any "
                                             "dependence, however weak, so take the earliest position whose gradient "
                                             "is not exactly zero."),
                (T - 1 - int((size > 1e-4).nonzero()[0]), _TINY),
            ]
        case = f"case {k} of {len(kinds)} (a hidden layer, T = {T}, d = {d})"
        watch = Watch(half_refused=False)
        got = as_integer(call(answer, layer, T, d, case=case, watch=watch), case, "reach")
        if got != want and watch.half is not None:
            raise Wrong(f"{case}: expected {want}, got {got}. Your function computed with {watch.half} tensors: "
                        + ("the gradient underflows in float16, whose smallest number is about 6e-8, so a faint "
                           "dependence gives a gradient of exactly zero. " if watch.half == torch.float16 else
                           "they keep about 2 significant digits. ") + "Compute in float32 or float64.")
        compare_number(got, want, case, exact=True, what="reach", mistakes=mistakes,
                       hint="No usual mistake fits: measure on one layer you know first (the section's CausalConv with "
                            "kernel 3 reaches 2 back), differentiating output T - 1 alone.")


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
            (_mqa(x, Wq, Wk, Wv, H, scale=d ** -0.5), "The scores are scaled by the model's width d, not by the width "
                                                      "of one head, d_h."),
            (_mqa(x, Wq, Wk, Wv, H, scale=1 / (d // H)), "The scores are divided by the width of a head, d_h, not "
                                                         "by its square root."),
            (_mqa(x, Wq, Wk, Wv, H, scale=1.0), "The scores are not scaled (the section's equation divides them by the "
                                                "square root of a head's width)."),
            (_mqa(x, Wq, Wk, Wv, H, causal="diagonal"), "The mask hides the diagonal too, so the first token sees "
                                                        "nothing (NaN): a query may see its own key."),
            (_mqa(x, Wq, Wk, Wv, H, split=False), "The queries were cut into heads in the wrong order, which mixes tokens "
                                                  "into heads: each head takes a slice of every token's coordinates "
                                                  "(Figure 9.2.4)."),
            (_mqa(x, Wq, Wk, Wv, H, merge=False), "The heads' outputs were not put side by side: each token's output "
                                                  "should hold its own row of every head (Figure 9.2.4)."),
            (_mqa(x, Wq, Wk, Wv, H, dim=-2), "The softmax ran over the queries, so each key's weights sum to one "
                                             "instead of each query's."),
            (_mqa(x, Wq, Wk, Wv, H, causal="transposed"), "The mask is transposed: it hides the keys before each "
                                                          "query, not after it."),
            (_mqa(x, Wq.mT, Wk, Wv, H), "The query weights are transposed: the queries are x @ W_q, as the section's "
                                        "Q = X W_Q, not x @ W_q.T (a square W_q fits either way)."),
            (torch.full_like(want, float("nan")), "Every entry is NaN: a NaN in a row of scores makes its whole softmax "
                                                  "NaN. An additive mask made by multiplying by -inf holds NaN where it "
                                                  "should hold 0 (0 times -inf is NaN, not 0): put -inf only where a key "
                                                  "is hidden (masked_fill, or torch.where)."),
        ]
        compare(call(answer, x, Wq, Wk, Wv, H, case=case), want, case, mistakes=mistakes,
                hint="Every head's queries should attend to the one shared key head and value head: check your "
                     "shapes against Figure 9.2.4's, with one head of keys and values.")


# 9.2.4: padding on the left ---------------------------------------------------------------------------------

@exercise("9.2.4", "Your mask hides exactly the future and the padding keys at the start of each sequence, for every "
                   "batch tried.")
def _(answer):
    for case, (n_real, T) in cases([([5, 3], 5), ([2, 4, 1], 4), ([3], 6)], _padded(fresh()),
                                   lambda n_real, T: f"n_real {n_real}, T = {T}"):
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        start = (T - torch.as_tensor(n_real))[:, None, None]              # (B, 1, 1): each sequence's first real token
        causal, pad = j > i, j < start                                     # (T, T), (B, 1, T)
        want = causal | pad
        mistakes = [
            (~want, "True should mark what a query may NOT see (as nn.MultiheadAttention): your mask is inverted."),
            ((j >= i) | pad, "The diagonal is hidden: a query may attend to its own position."),
            (causal | (j >= torch.as_tensor(n_real)[:, None, None]),
             "That hides the keys after each sequence's real tokens, as for padding on the right: here the padding "
             "comes first, before the real tokens."),
            (causal | (i < start), "You hid the padding queries (rows of the mask): the padding mask hides keys, the "
                                   "columns, from every query."),
            (causal | (j <= start), "Off by one in the padding: the first real token is hidden too."),
            (causal | (j < start - 1), "Off by one in the padding: the last padding key is still visible."),
            (causal & pad, "You hid only the keys that are both in the future and padding: a key is hidden if it is "
                           "either."),
            (causal.expand(len(n_real), T, T), "The padding is missing: the padding keys are visible."),
            (pad.expand(-1, T, -1), "The causal part is missing: every query sees the keys after it."),
            ((j < i) | pad, "The causal part is reversed: it hides the past, not the future."),
            (want & ~((i == j) & (i < start)), "Your padded queries see themselves: a common way to avoid rows with "
                                               "no key, but this mask should hide every padding key, from every "
                                               "query (the cell after the exercise looks at those rows)."),
        ]
        got = call(answer, torch.tensor(n_real), T, case=case)
        _sized_by_lengths(got, n_real, T, case)
        compare(got, want, case, what="mask", mistakes=mistakes,
                hint="No usual mistake fits: draw one padded sequence's (T, T) mask by hand, the padding first, and "
                     "compare.")


# The open exercises (9.2.5 and 9.3.5): a model trained, not written by hand ---------------------------------------------

_BACKWARD = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)


def _leaves(roots):
    """The leaf tensors that require a gradient in the autograd graphs of ``roots`` (a tensor or a sequence of them)."""
    roots = [roots] if isinstance(roots, torch.Tensor) else list(roots) if isinstance(roots, tuple | list) else []
    return [leaf for root in roots for leaf in _graph_leaves(root)]


class Training:
    """A ``Watch`` refusal that refuses nothing: it notes the answer's backward passes (``backward``,
    ``torch.autograd.backward`` or ``torch.autograd.grad``) and, the first time a pass reaches a leaf tensor (a
    parameter), that tensor as it was before any step, so that afterwards one can tell which of them training changed."""

    def __init__(self):
        self.passes, self.before = 0, {}

    def __call__(self, func, args, kwargs):
        if func in _BACKWARD:
            self.passes += 1
            roots = args[0] if args else kwargs.get("tensors", kwargs.get("outputs"))
            extra = (args[1] if len(args) > 1 else kwargs.get("inputs")) if func is torch.autograd.grad else None
            for leaf in _leaves(roots) + _leaves(extra if extra is not None else []):
                if id(leaf) not in self.before:
                    self.before[id(leaf)] = (leaf, leaf.detach().clone())
        return False

    def changed(self, tensors):
        """Whether training changed one of ``tensors``: a tensor a backward pass reached and that differs from what it
        was then, or (a copy made after training, such as ``copy.deepcopy(model)``) one that differs from every tensor
        of its shape that a backward pass reached."""
        def differ(a, b):
            return a.shape != b.shape or not torch.equal(a.detach().double(), b.double())
        for t in tensors:
            if id(t) in self.before and self.before[id(t)][0] is t:
                if differ(t, self.before[id(t)][1]):
                    return True
                continue
            same_shape = [b for _, b in self.before.values() if b.shape == t.shape]
            if same_shape and all(differ(t, b) for b in same_shape):
                return True
        return False


def trained(model, inputs, training, case, told):
    """The parameters ``model``'s outputs on ``inputs`` are computed from, or Wrong unless there are some and its
    training (``training``, the ``Training`` watched while the answer ran) changed them. ``told`` ends each message."""
    weights = parameters_of(model, *inputs)
    if not weights:
        raise Wrong(f"{case}: the model you returned has no parameters that its outputs are computed from. {told}")
    if not training.changed(weights):
        ran = ("no backward pass ran in your function" if training.passes == 0 else
               "training changed none of the parameters that the model's outputs are computed from")
        raise Wrong(f"{case}: {ran}. Train the model you return on the examples: a loss, its backward pass, and "
                    f"optimizer steps on that model's parameters. {told}")
    return weights


def learned(model, inputs, training, score, level, case, told):
    """Wrong unless ``model`` computes its outputs with parameters that its training (``training``, the ``Training``
    watched while the answer ran) changed, and unless ``score()``, its held-out accuracy, falls below ``level`` when
    the entries of each of those parameters are shuffled. ``told`` ends each message: what the exercise asks for."""
    weights = trained(model, inputs, training, case, told)
    with shuffled(weights, torch.Generator().manual_seed(fresh().integer(0, 2 ** 31 - 1))):
        try:
            still = score()
        except Wrong:                                         # it no longer runs: its parameters were what it used
            still = 0.0
    if still >= level:
        raise Wrong(f"{case}: with the entries of each of its parameters shuffled, the model is still right on "
                    f"{still:.0%} of the new examples: what it does is written in its code, not learned. {told}")


# 9.2.5: a lookup trained on padded batches (open: the outcome is measured) -------------------------------------------

LEVEL = 0.9     # held-out accuracy: the reference 0.995 or more in 197 checks of 200, 0.969 at worst; a model that sees
                # the padding about 0.5; a guess 1 / values


def lookups(N, keys, values, slots, generator):
    """``N`` lookups, each a query and 1 .. ``slots`` (key, value) pairs, padded to ``slots`` pairs with leftovers.

    Returns ``tokens (N, slots + 1)``, ``lengths (N,)`` (real tokens: the query and its pairs) and ``answers (N,)``.
    A pair is one token, ``key * values + value``; the query for key ``q`` is the token ``keys * values + q``, so
    the vocabulary has ``keys * values + keys`` tokens and there are ``values`` answers. An example's pairs have
    distinct keys, one of them the query's, whose value is the answer. The padding holds leftover pairs, among them
    (where there is room) a stale pair with the query's key and another value.
    """
    if not 1 <= slots <= keys:
        raise ValueError(f"an example holds 1 to slots pairs of distinct keys, so slots must be 1 .. keys = {keys}, got {slots}")
    g = generator
    key = torch.rand(N, keys, generator=g).argsort(-1)[:, :slots]            # (N, slots) distinct keys
    value = torch.randint(values, (N, slots), generator=g)
    n = torch.randint(1, slots + 1, (N,), generator=g)                        # real pairs in each example
    which = (torch.rand(N, generator=g) * n).long()                           # the pair that answers
    query, answer = key.gather(1, which[:, None])[:, 0], value.gather(1, which[:, None])[:, 0]
    leftover = torch.randint(keys * values, (N, slots), generator=g)
    stale = query * values + (answer + torch.randint(1, values, (N,), generator=g)) % values
    room = n + (torch.rand(N, generator=g) * (slots - n)).long()              # a padding slot, where there is one
    leftover = leftover.scatter(1, room.clamp(max=slots - 1)[:, None], stale[:, None])
    real = torch.arange(slots)[None, :] < n[:, None]
    pairs = torch.where(real, key * values + value, leftover)
    return torch.cat([(keys * values + query)[:, None], pairs], 1), n + 1, answer


_TRAIN = ("The exercise asks for a model built around self-attention whose parameters (an embedding, the attention's "
          "projections, a readout) are trained on the examples, not for a rule written by hand.")


def _answers(model, tokens, lengths, case, what):
    """The model's logits for a batch, checked: a float tensor (B, classes), finite."""
    try:
        with torch.no_grad():
            out = model(tokens.clone(), lengths.clone())
    except Exception as error:  # noqa: BLE001 (told to the reader as the error it is)
        text = str(error).strip().splitlines()
        raise Wrong(f"{case}: the model you returned raised {type(error).__name__} on {what} (tokens of shape "
                    f"{tuple(tokens.shape)}): {text[0] if text else ''}") from None
    if isinstance(out, tuple | list) and out and isinstance(out[0], torch.Tensor):
        raise Wrong(f"{case}: the model should return the logits alone, a tensor, got a {type(out).__name__}")
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        kind = f"a {out.dtype} tensor" if isinstance(out, torch.Tensor) else type(out).__name__
        raise Wrong(f"{case}: the model should return float logits, got {kind}")
    return out.detach()


# What computes attention, by name: PyTorch's functions, and any softmax over the tokens (the answer's own attention).
_ATTENTION = ("scaled_dot_product_attention", "multi_head_attention_forward", "_native_multi_head_attention",
              "_transformer_encoder_layer_fwd")


def _attends(model, tokens, lengths):
    """Whether ``model(tokens, lengths)`` computes attention: PyTorch's (``nn.MultiheadAttention``,
    ``F.scaled_dot_product_attention``) or a softmax over a dimension as long as the tokens'. The tokens should be
    longer than there are classes, so that a softmax over the logits is no softmax over the tokens."""
    T, seen = tokens.shape[1], []

    def note(func, args, kwargs):
        name = getattr(func, "__name__", "")
        if any(a in name for a in _ATTENTION):
            seen.append(name)
        elif "softmax" in name and args and isinstance(args[0], torch.Tensor) and args[0].dim():
            dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
            if isinstance(dim, int) and -args[0].dim() <= dim < args[0].dim() and args[0].shape[dim] == T:
                seen.append(name)
        return False                                 # refuses nothing: it only notes
    try:
        with torch.no_grad(), Watch(note, "", half_refused=False):
            model(tokens.clone(), lengths.clone())
    except Exception:  # noqa: BLE001 (an error of the model's is told by the checks that call it, not here)
        return True
    return bool(seen)


def _attention_in(model, tokens, lengths, case):
    """Wrong unless ``model`` computes attention (a students' review: a bag of the real tokens' embeddings and an MLP
    passed). ``tokens`` should be wider than there are classes."""
    if not _attends(model, tokens, lengths):
        raise Wrong(f"{case}: the model computes no attention over the tokens: the exercise asks for a model built "
                    "around self-attention (nn.MultiheadAttention, F.scaled_dot_product_attention, or your own "
                    "softmax over the tokens' scores).")


def _same(a, b):
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=1e-4,
                                                 atol=1e-5 * max(a.abs().max().item(), 1.0))


@exercise("9.2.5", f"Your model answers at least {LEVEL:.0%} of the held-out lookups right, and its answers do not "
                   "depend on what the padding holds or on how much of it there is.", time_limit=60)
def _(answer):
    # One thread: a model this small gains nothing from more, and on a busy machine their waiting for each other
    # multiplied the training time by ten; one thread also keeps the arithmetic the same whatever the machine has.
    with threads(1):
        _lookup(answer)


def _lookup(answer):
    r = fresh()
    keys, values = r.choice([6, 7, 8]), r.choice([4, 5, 6])
    slots = r.integer(5, keys)
    vocab = keys * values + keys
    case = (f"the check (drawn at random: {keys} keys, {values} values, 1 to {slots} pairs an example; "
            f"vocab = {vocab}, classes = {values})")
    draw = torch.Generator().manual_seed(r.integer(0, 2**31 - 1))
    tokens, lengths, answers = lookups(2000, keys, values, slots, draw)
    training = Training()
    with torch.random.fork_rng():
        torch.manual_seed(r.integer(0, 2**31 - 1))          # the answer's own draws (its initialization, its batches)
        model = call(answer, tokens, lengths, answers, vocab, values, case=case,
                     watch=Watch(training, "", half_refused=False))
    if not callable(model):
        raise Wrong(f"{case}: return the trained model (called as model(tokens, lengths), it gives logits), got "
                    f"{type(model).__name__}")
    if isinstance(model, torch.nn.Module):
        model.eval()
    x, n, y = lookups(1000, keys, values, slots, draw)                     # held out
    logits = _answers(model, x, n, case, "held-out lookups")
    if logits.shape != (1000, values):
        raise Wrong(f"{case}: for tokens of shape {tuple(x.shape)} the logits should have shape {(1000, values)}, one "
                    f"row of {values} per lookup, got {tuple(logits.shape)}")
    if not logits.isfinite().all():
        raise Wrong(f"{case}: the model's logits are not all finite: did training diverge (a learning rate too high), "
                    "or does a row of the mask hide every key?")
    # Padding may not matter: other leftovers, and more padding, give the same logits.
    padded = torch.arange(x.shape[1])[None, :] >= n[:, None]
    other = torch.where(padded, torch.randint(keys * values, x.shape, generator=draw), x)
    if not _same(_answers(model, other, n, case, "the same lookups with other leftovers"), logits):
        first = padded & (torch.arange(x.shape[1])[None, :] == n[:, None])   # each example's first padding slot
        later = torch.where(padded & ~first, other, x)
        if _same(_answers(model, later, n, case, "the same lookups with other leftovers"), logits):
            raise Wrong(f"{case}: the answers changed when the first padding slot of each example changed: off by one, "
                        "the model still sees it (lengths counts the query and its pairs, the real tokens).")
        raise Wrong(f"{case}: the answers changed when only the padding changed: the model reads the leftovers, "
                    "whose leftover pairs can carry the query's key. Hide the padding keys from the attention (the "
                    "positions from lengths on), and read the answer from real positions only.")
    wider = torch.cat([x, torch.randint(keys * values, (1000, 3), generator=draw)], 1)
    if not _same(_answers(model, wider, n, case, "the same lookups with 3 more padding slots"), logits):
        raise Wrong(f"{case}: the answers changed when 3 more padding slots were added: the padded positions still "
                    "count (a zeroed token still gets a score and a share of the weight). Hide them from the "
                    "attention instead.")
    right = logits.argmax(-1) == y
    accuracy = right.double().mean().item()
    if accuracy >= LEVEL:
        # Right often enough: unless each lookup's answer depends on the rest of its batch.
        alone(lambda t, k: _answers(model, t, k, case, "one held-out lookup alone"), (x, n), logits, case,
              "held-out lookup")
        # ... and unless it was written by hand rather than trained: what a trained model does lives in parameters
        # that its training changed, and with their entries shuffled it is near a guess.
        learned(model, (x[:8], n[:8]), training,
                lambda: (_answers(model, x, n, case, "held-out lookups").argmax(-1) == y).double().mean().item(),
                LEVEL, case, _TRAIN)
        _attention_in(model, wider[:8], n[:8], case)
        return
    _attention_in(model, wider[:8], n[:8], case)          # below the level too: no attention is told first
    shown = f"held-out accuracy {accuracy:.1%}, below the level {LEVEL:.0%}"
    last = x.gather(1, (n - 1)[:, None])[:, 0] == (x[:, 0] - keys * values) * values + y    # answer in the last real slot
    if last.any() and (~last).any() and right[last].double().mean() < 0.5 and right[~last].double().mean() >= LEVEL:
        raise Wrong(f"{case}: {shown}: it fails where the answer is the last real pair, so the mask hides it: off by "
                    "one (lengths counts the query and its pairs).")
    if accuracy < 1 / values + 0.15:
        raise Wrong(f"{case}: {shown}, about a guess among {values} values: the model has not learned. Does it train "
                    "(a loss, backward, an optimizer step, in a loop), and is it the trained model you return?")
    raise Wrong(f"{case}: {shown}: it has learned part of the lookup. Read the answer where the query attends "
                "(its own output), and train longer or with another learning rate.")
