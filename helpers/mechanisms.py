"""Pictures of the mechanisms (issue 33): schematic figures drawn from the sizes the code uses.

Each function takes the arguments a section's code has (``T``, ``d``, ``d_k``, ``heads``, a tile size, the
weights it computed) and lays out one diagram, so that a change of shape redraws it. What a figure shows
is computed in its notebook; these functions only lay it out. Every figure is drawn in inches on one
frameless axes (``_canvas``), in the book's palette, with labels of at least 9 points (``SMALL``) and no
randomness, so that its SVG is byte-stable under ``use_style``.

They live apart from ``helpers.diagrams``, which draws data (heat maps, curves); these draw boxes and arrows.
"""

from fractions import Fraction
from itertools import pairwise

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.collections import PatchCollection
from matplotlib.colors import to_rgb
from matplotlib.patches import Circle, FancyBboxPatch, Rectangle

from helpers.attention import causal_mask, padding_mask
from helpers.checks import integer, integers, positive_int
from helpers.diagrams import text_color
from helpers.plotting import PALETTE
from helpers.positions import frequencies

SIZE, SMALL = 10, 9               # points: the book's font size, and the smallest label (legible at the site's width)
HEADS = [PALETTE[c] for c in ("blue", "orange", "green", "purple", "sky", "vermillion", "yellow")] + ["0.45"]   # per head


def _count(value, name, low, high):
    """An int in ``low..high``, the range the layout fits."""
    value = integer(value, name)
    if not low <= value <= high:
        raise ValueError(f"{name} must be from {low} to {high} (the layout's size), got {value}")
    return value


def _vector(values, name, n=None, low=2, high=8):
    """``values`` (a tensor, array or list of real numbers) as a finite 1-D float64 array of ``n`` (or low..high) entries."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().to(torch.float64).numpy()
    try:
        values = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a list or 1-D tensor of real numbers, got {values!r:.60}") from None
    if values.ndim != 1 or not np.isfinite(values).all():
        raise ValueError(f"{name} must be a 1-D list of finite numbers, got shape {values.shape}")
    if n is not None and len(values) != n:
        raise ValueError(f"{name} must have {n} entries, one per key, got {len(values)}")
    if n is None and not low <= len(values) <= high:
        raise ValueError(f"{name} must have {low} to {high} entries (the layout's size), got {len(values)}")
    return values


def _distribution(values, name, n=None):
    """``_vector``'s array, which must also be a distribution: what a softmax gives."""
    values = _vector(values, name, n)
    if (values < 0).any() or abs(values.sum() - 1) > 1e-3:
        raise ValueError(f"{name} must be non-negative and sum to one (a softmax's output), got sum {values.sum():.4f}")
    return values


def _canvas(width, height):
    """A ``width x height`` inch figure whose one frameless axes measures in inches from the bottom left."""
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set(xlim=(0, width), ylim=(0, height))
    ax.set_axis_off()
    return fig, ax


def _tint(color, amount=0.35):
    """``color`` mixed with white: a pale fill that black text reads on."""
    return tuple(amount * c + (1 - amount) for c in to_rgb(color))


def _box(ax, x, y, w, h, text="", color="white", size=SIZE):
    """A rounded box centred at ``(x, y)``, ``w x h`` inches, with ``text`` in the contrasting colour."""
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0,rounding_size=0.05",
                                fc=color, ec="black", lw=1))
    if text:
        ax.text(x, y, text, ha="center", va="center", fontsize=size, color=text_color(color))


def _arrow(ax, start, end, color="black", lw=1.2):
    """An arrow from ``start`` to ``end`` (inches), drawn as a text-less annotation."""
    ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="-|>", color=color, lw=lw, shrinkA=0, shrinkB=0,
                                                          mutation_scale=10))


def _num(x, fmt=".2f"):
    """``x`` formatted with a true minus sign, as matplotlib writes tick labels."""
    return f"{x:{fmt}}".replace("-", "\u2212")


def _shape(names, sizes):
    """``"(B, T, d)\\n= (2, 5, 16)"``: a tensor's shape in symbols, then in numbers, these on two lines if long."""
    numbers = [str(s) for s in sizes]
    if len(", ".join(numbers)) > 14:                  # wider than its column: split after the first half
        half = (len(numbers) + 1) // 2
        return f"({', '.join(names)})\n= ({', '.join(numbers[:half])},\n{', '.join(numbers[half:])})"
    return f"({', '.join(names)})\n= ({', '.join(numbers)})"


# 9.1 ---------------------------------------------------------------------------------------------------


def soft_lookup(weights, values, scores=None):
    """Figure: a query compared with ``n`` keys (2 to 8), the weights ``weights (n,)`` drawn as bars, and the
    values ``values (n,)`` (numbers) summed with those weights into the output. ``scores (n,)``, if given,
    are written beside the keys and must give ``weights`` through a softmax. Returns the figure."""
    weights = _distribution(weights, "weights")
    n = len(weights)
    values = _vector(values, "values", n)
    if scores is not None:
        scores = _vector(scores, "scores", n)
        if not np.allclose(np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum(), weights, atol=1e-3):
            raise ValueError("weights must be the softmax of scores (to 1e-3): pass the weights computed from them")
    row, W = 0.45, 8.6
    H = n * row + 1.2
    fig, ax = _canvas(W, H)
    ys = H - 1.0 - row * np.arange(n)
    mid, head = ys.mean(), H - 0.35
    for x, text in [(0.55, "query"), (1.7, "keys"), (2.75, "scores\n$s_i = q^\\top k_i$"),
                    (4.55, "weights $\\alpha_i$\n(softmax of the scores)"), (6.35, "values $v_i$"),
                    (7.75, "output\n$\\sum_i \\alpha_i v_i$")]:
        ax.text(x, head, text, ha="center", va="center", fontsize=SIZE)
    _box(ax, 0.55, mid, 0.6, 0.4, "$q$", PALETTE["vermillion"])
    ax.add_patch(Circle((7.75, mid), 0.17, fc="white", ec="black", lw=1.2, zorder=3))
    ax.text(7.75, mid, "+", ha="center", va="center", fontsize=12, zorder=4)
    for i, (y, w, v) in enumerate(zip(ys, weights, values, strict=True), start=1):
        ax.plot([0.85, 1.45], [mid, y], color="0.6", lw=1)
        _box(ax, 1.7, y, 0.5, 0.32, f"$k_{{{i}}}$", PALETTE["sky"])
        ax.text(2.75, y, f"$s_{{{i}}}$ = {_num(scores[i - 1])}" if scores is not None else f"$s_{{{i}}}$",
                ha="center", va="center", fontsize=SIZE)
        ax.add_patch(Rectangle((3.55, y - 0.13), 2.0 * w, 0.26, fc=PALETTE["blue"], ec="none"))
        ax.text(3.55 + 2.0 * w + 0.08, y, f"{w:.2f}", ha="left", va="center", fontsize=SIZE)
        _box(ax, 6.35, y, 1.0, 0.32, f"$v_{{{i}}}$ = {_num(v)}", PALETTE["orange"])
        ax.plot([6.85, 7.58], [y, mid], color=PALETTE["blue"], lw=0.5 + 5 * w, solid_capstyle="butt")
    ax.plot([3.55, 3.55], [ys[-1] - 0.2, ys[0] + 0.2], color="black", lw=1)
    ax.text(4.55, ys[-1] - 0.42, "they sum to one", ha="center", va="center", fontsize=SMALL)
    ax.text(7.75, mid - 0.4, f"= {_num(weights @ values)}", ha="center", va="center", fontsize=SIZE)
    return fig


def encoder_decoder_attention(T_in, weights=None, step=None):
    """Figure: Bahdanau's attention at one output step. The encoder reads ``x_1..x_T_in`` (2 to 8) into
    states ``h_i``; the previous decoder state ``s_{t-1}`` scores every ``h_i``; the weights ``alpha_ti``
    (``weights (T_in,)``, drawn as line widths, else symbols) sum the states into the context ``c_t``, which
    feeds the next decoder state ``s_t``. ``step`` (an int >= 1) writes ``t`` as a number. The letters are
    section 9.1's: ``i`` for an encoder position, ``e_ti``, ``alpha_ti``. Returns the figure."""
    T_in = _count(T_in, "T_in", 2, 8)
    if weights is not None:
        weights = _distribution(weights, "weights", T_in)
    t, before = ("t", "t-1") if step is None else (str(positive_int(step, "step")), str(step - 1))
    sub = (lambda i: f"{t}{i}") if step is None else (lambda i: f"{t},{i}")     # alpha_ti, or alpha_3,i
    W, H = 8.6, 4.9
    fig, ax = _canvas(W, H)
    xs, y_h, y_bus, xc, y_c, y_s = np.linspace(3.4, 8.0, T_in), 1.15, 2.1, 5.7, 3.1, 4.05
    ax.text(0.15, y_h, "encoder states\n(a recurrent network)", ha="left", va="center", fontsize=SIZE)
    for j, x in enumerate(xs, start=1):                   # j counts the boxes; the figure's letter is i
        _box(ax, x, y_h, 0.55, 0.4, f"$h_{{{j}}}$", PALETTE["sky"])
        ax.text(x, 0.25, f"$x_{{{j}}}$", ha="center", va="center", fontsize=SIZE)
        _arrow(ax, (x, 0.42), (x, y_h - 0.2))
        if j < T_in:
            _arrow(ax, (x + 0.275, y_h), (xs[j] - 0.275, y_h))
        share = 1.2 if weights is None else 0.6 + 6 * weights[j - 1]
        ax.plot([x, xc], [y_h + 0.2, y_c - 0.2], color=PALETTE["blue"], lw=share, solid_capstyle="butt", zorder=1)
        f = (y_bus - y_h - 0.2) / (y_c - y_h - 0.4)              # where the line crosses the query's bus
        ax.plot(x + f * (xc - x), y_bus, "o", ms=6, color=PALETTE["vermillion"], zorder=2)
        f = 0.28 / (y_c - y_h - 0.4)
        label = f"$\\alpha_{{{sub(j)}}}$" if weights is None else _num(weights[j - 1])
        ax.text(x + f * (xc - x), y_h + 0.48, label, ha="center", va="center", fontsize=SMALL, zorder=3,
                bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none"))
    ax.plot([0.9, 0.9, xs[-1] + 0.3], [y_s - 0.21, y_bus, y_bus], color=PALETTE["vermillion"], lw=1.5, ls="--", zorder=1)
    ax.text(1.0, (y_s + y_bus) / 2, f"query $s_{{{before}}}$\nscores every $h_i$", ha="left", va="center", fontsize=SIZE)
    ax.add_patch(Circle((xc, y_c), 0.2, fc="white", ec="black", lw=1.2, zorder=3))
    ax.text(xc, y_c, "+", ha="center", va="center", fontsize=12, zorder=4)
    ax.text(xc + 0.3, y_c - 0.05, f"context $c_{{{t}}}$", ha="left", va="center", fontsize=SIZE)
    _box(ax, 0.9, y_s, 0.8, 0.42, f"$s_{{{before}}}$", PALETTE["vermillion"])
    _box(ax, xc, y_s, 0.8, 0.42, f"$s_{{{t}}}$", PALETTE["vermillion"])
    ax.text(0.9, y_s + 0.45, "decoder state", ha="center", va="center", fontsize=SIZE)
    _arrow(ax, (1.3, y_s), (xc - 0.4, y_s))
    _arrow(ax, (xc, y_c + 0.2), (xc, y_s - 0.21))
    _arrow(ax, (xc, y_s + 0.21), (xc, y_s + 0.5))
    ax.text(xc, y_s + 0.65, f"next output $y_{{{t}}}$", ha="center", va="center", fontsize=SIZE)
    for y, text in [(4.5, f"$e_{{{sub('i')}}} = w^\\top\\tanh(Ws_{{{before}}} + Uh_i)$"),
                    (4.05, f"$\\alpha_{{{sub('i')}}} = \\exp e_{{{sub('i')}}}\\,/\\,\\sum_j \\exp e_{{{sub('j')}}}$"),
                    (3.6, f"$c_{{{t}}} = \\sum_i \\alpha_{{{sub('i')}}}h_i$")]:
        ax.text(6.45, y, text, ha="left", va="center", fontsize=SMALL)
    ax.text(0.15, 0.25, "inputs", ha="left", va="center", fontsize=SIZE)
    ax.text(0.15, y_h + 0.55, f"weights $\\alpha_{{{sub('i')}}}$", ha="left", va="center", fontsize=SIZE)
    return fig


# 9.2 ---------------------------------------------------------------------------------------------------


def _matrix(ax, x, y, rows, cols, u, color):
    """A ``rows x cols`` matrix of ``u``-inch cells centred at ``(x, y)``, its cells ruled when they are large enough."""
    left, bottom = x - cols * u / 2, y - rows * u / 2
    ax.add_patch(Rectangle((left, bottom), cols * u, rows * u, fc=_tint(color), ec="black", lw=1))
    if u >= 0.06:
        grid = dict(color=color, lw=0.4)
        for c in range(1, cols):
            ax.plot([left + c * u] * 2, [bottom, bottom + rows * u], **grid)
        for r in range(1, rows):
            ax.plot([left, left + cols * u], [bottom + r * u] * 2, **grid)
    return left, bottom, left + cols * u, bottom + rows * u


def qkv_projection(T, d, d_k):
    """Figure: queries, keys and values projected from one sequence: ``X (T, d)`` times ``W_Q``, ``W_K``, ``W_V``
    ``(d, d_k)`` gives ``Q``, ``K``, ``V`` ``(T, d_k)``, each matrix drawn to scale (up to 32 rows and columns)
    with its shape written under it. Returns the figure."""
    T, d, d_k = (_count(v, name, 1, 32) for v, name in ((T, "T"), (d, "d"), (d_k, "d_k")))
    u = min(0.14, 0.85 / max(T, d))                             # a row's tallest matrix is at most 0.85 inch
    row = max(T, d) * u + 0.7
    W, H = 8.6, 3 * row + 0.15
    fig, ax = _canvas(W, H)
    ys = H - row / 2 - 0.1 - row * np.arange(3)
    x_X, x_W, x_out = 1.1, 3.4, 5.2
    *_, right, top = _matrix(ax, x_X, ys[1], T, d, u, "0.5")
    ax.text(x_X, top + 0.15, "$X$: the sequence", ha="center", va="bottom", fontsize=SIZE)
    ax.text(x_X, ys[1] - T * u / 2 - 0.12, f"$T\\times d$ = {T} × {d}", ha="center", va="top", fontsize=SMALL)
    rows = [("Q", "queries: what each token looks for", "blue"), ("K", "keys: what each token is matched on", "orange"),
            ("V", "values: what each token passes on", "green")]
    for y, (name, meaning, color) in zip(ys, rows, strict=True):
        _arrow(ax, (right + 0.08, ys[1]), (x_W - d_k * u / 2 - 0.45, y), color="0.4")
        ax.text(x_W - d_k * u / 2 - 0.22, y, "×", ha="center", va="center", fontsize=12)
        *_, w_right, w_top = _matrix(ax, x_W, y, d, d_k, u, PALETTE[color])
        ax.text(x_W, w_top + 0.08, f"$W_{name}$", ha="center", va="bottom", fontsize=SIZE)
        ax.text(x_W, y - d * u / 2 - 0.08, f"$d\\times d_k$ = {d} × {d_k}", ha="center", va="top", fontsize=SMALL)
        ax.text((w_right + x_out - d_k * u / 2) / 2, y, "=", ha="center", va="center", fontsize=12)
        *_, o_right, o_top = _matrix(ax, x_out, y, T, d_k, u, PALETTE[color])
        ax.text(x_out, o_top + 0.08, f"${name} = XW_{name}$", ha="center", va="bottom", fontsize=SIZE)
        ax.text(x_out, y - T * u / 2 - 0.08, f"$T\\times d_k$ = {T} × {d_k}", ha="center", va="top", fontsize=SMALL)
        ax.text(6.2, y, meaning.replace(": ", ":\n"), ha="left", va="center", fontsize=SIZE)
    return fig


def _heads_shown(heads, most=6):
    """The heads drawn as rows: all of them, or the first two, an ellipsis (None) and the last."""
    return list(range(heads)) if heads <= most else [0, 1, None, heads - 1]


def multi_head_split(B, T, d, heads):
    """Figure: multi-head attention's reshapes. ``x (B, T, d)`` is projected to ``q, k, v (B, T, d)``, split
    along ``d`` into ``heads`` heads ``(B, h, T, d/h)``, attended in each head, concatenated back to
    ``(B, T, d)`` and projected by ``W_O``; each tensor's shape is written under it, in symbols and in numbers.
    Up to 6 heads are drawn, more as the first two, an ellipsis and the last. Returns the figure."""
    B, T, d = positive_int(B, "B"), positive_int(T, "T"), positive_int(d, "d")
    heads = positive_int(heads, "heads")
    if d % heads:
        raise ValueError(f"heads must divide d (each head gets d/h coordinates), got d = {d} and heads = {heads}")
    shown = _heads_shown(heads)
    row, W = 0.46, 8.8
    stack = len(shown) * row
    whole, split = ("B", "T", "d"), ("B", "h", "T", "d/h")
    columns = [("input $x$", whole, (B, T, d)), ("$q, k, v$ (each)", whole, (B, T, d)),
               ("per head", split, (B, heads, T, d // heads)), ("heads' outputs", split, (B, heads, T, d // heads)),
               ("concatenated", whole, (B, T, d)), ("output", whole, (B, T, d))]
    under = [f"{name}\n" + _shape(names, sizes) for name, names, sizes in columns]
    H = stack + 1.25 + 0.17 * max(text.count("\n") + 1 for text in under)
    fig, ax = _canvas(W, H)
    top = H - 0.85
    ys = top - row / 2 - row * np.arange(len(shown))
    xs = [0.55, 2.0, 3.55, 5.1, 6.65, 8.2]
    for x, text in zip(xs, under, strict=True):
        ax.text(x, top - stack - 0.12, text, ha="center", va="top", fontsize=SMALL)
    steps = ["project by\n$W_Q, W_K, W_V$", f"split $d$ into\n$h$ = {heads} head{'s' if heads > 1 else ''}",
             "attention\nin each head", "concatenate\nthe heads", "project\nby $W_O$"]
    for x, text in zip([(a + b) / 2 for a, b in pairwise(xs)], steps, strict=True):
        ax.text(x, H - 0.38, text, ha="center", va="center", fontsize=SMALL)
    for x in (xs[0], xs[5]):
        _box(ax, x, top - stack / 2, 0.5, stack, "", "0.85")
    for x in (xs[1], xs[4]):
        ax.add_patch(Rectangle((x - 0.25, top - stack), 0.5, stack, fc="none", ec="black", lw=1, zorder=3))
    _arrow(ax, (xs[0] + 0.25, top - stack / 2), (xs[1] - 0.25, top - stack / 2))
    _arrow(ax, (xs[4] + 0.25, top - stack / 2), (xs[5] - 0.25, top - stack / 2))
    for k, (y, head) in enumerate(zip(ys, shown, strict=True)):
        if head is None:
            for x in xs[1:5]:
                ax.text(x, y, "⋮", ha="center", va="center", fontsize=SIZE)
            continue
        color = HEADS[k % len(HEADS)]
        for x in (xs[1], xs[4]):                                  # the head's d/h coordinates of the whole tensor
            ax.add_patch(Rectangle((x - 0.25, y - row / 2), 0.5, row, fc=_tint(color, 0.6), ec="none"))
        _box(ax, xs[2], y, 1.0, row - 0.1, f"$q_{{{head + 1}}}, k_{{{head + 1}}}, v_{{{head + 1}}}$", _tint(color, 0.6), SMALL)
        _box(ax, xs[3], y, 1.0, row - 0.1, f"head {head + 1}", _tint(color, 0.6), SMALL)
        _arrow(ax, (xs[1] + 0.25, y), (xs[2] - 0.5, y), lw=1)
        _arrow(ax, (xs[2] + 0.5, y), (xs[3] - 0.5, y), lw=1)
        _arrow(ax, (xs[3] + 0.5, y), (xs[4] - 0.25, y), lw=1)
    return fig


def masks_on_batch(lengths, T):
    """Figure: what the masks hide on a batch of sequences of ``lengths`` (1 to 3 of them, each 1..T) padded
    to ``T`` (2 to 8) tokens: for each sequence, the causal mask, the padding mask and the two combined, as
    grids of queries (rows) and keys (columns), each cell allowed or hidden, and why. The masks are
    ``helpers.attention``'s ``causal_mask`` and ``padding_mask``. Returns the figure."""
    T = _count(T, "T", 2, 8)
    lengths = integers(lengths, "lengths")
    if lengths.dim() != 1 or not 1 <= len(lengths) <= 3 or ((lengths < 1) | (lengths > T)).any():
        raise ValueError(f"lengths must list 1 to 3 sequence lengths, each from 1 to T = {T}, got {lengths.tolist()}")
    causal, pad = causal_mask(T), padding_mask(lengths, T).expand(-1, T, T)       # True hides the key
    B = len(lengths)
    u = max(min(0.28, 2.0 / T, (5.9 - (B - 1) * 0.8) / (B * T)), 1.2 / T)    # at most 7.5 inches tall, as wide as a title
    gap, left, panel = 0.6, 1.6, T * u
    W, H = left + 3 * panel + 2 * gap + 0.2, 1.6 + B * panel + (B - 1) * 0.8
    fig, ax = _canvas(W, H)
    colors = {0: PALETTE["blue"], 1: "white", 2: "0.75"}        # allowed, hidden (the future), hidden (padding)
    titles = ["causal: no key\nafter the query", "padding: no\npadded key", "padding + causal"]
    for c, title in enumerate(titles):
        ax.text(left + c * (panel + gap) + panel / 2, H - 0.35, title, ha="center", va="center", fontsize=SIZE)
    for b, n in enumerate(lengths.tolist()):
        y0 = H - 0.75 - panel - b * (panel + 0.8)                   # the panels' bottom
        ax.text(0.1, y0 + panel / 2, f"sequence {b + 1}\nlength {n}", ha="left", va="center", fontsize=SIZE)
        reasons = [causal.long(), 2 * pad[b].long(), torch.where(pad[b], 2, causal.long())]
        for c, reason in enumerate(reasons):
            x0 = left + c * (panel + gap)
            cells = [(Rectangle((x0 + j * u, y0 + panel - (i + 1) * u), u, u), colors[r])
                     for (i, j), r in np.ndenumerate(reason.numpy())]
            # One collection, not T*T patches: adding a patch recomputes the axes' limits, which were set.
            ax.add_collection(PatchCollection([c for c, _ in cells], facecolors=[f for _, f in cells],
                                              edgecolors="0.6", linewidths=0.5), autolim=False)
            ax.add_patch(Rectangle((x0, y0), panel, panel, fc="none", ec="black", lw=1))
            for p in range(T):                                      # positions; padding's in grey
                shade = "0.5" if p >= n else "black"
                ax.text(x0 + (p + 0.5) * u, y0 - 0.04, str(p), ha="center", va="top", fontsize=SMALL, color=shade)
                ax.text(x0 - 0.05, y0 + panel - (p + 0.5) * u, str(p), ha="right", va="center", fontsize=SMALL, color=shade)
            ax.text(x0 + panel / 2, y0 - 0.27, "keys", ha="center", va="top", fontsize=SMALL)
            ax.text(x0 - 0.22, y0 + panel / 2, "queries", ha="right", va="center", fontsize=SMALL, rotation=90)
    legend = [(PALETTE["blue"], "may attend"), ("white", "hidden: a later key"), ("0.75", "hidden: a padded key")]
    for k, (color, text) in enumerate(legend):
        x = 0.2 + k * W / 3
        ax.add_patch(Rectangle((x, 0.12), 0.22, 0.22, fc=color, ec="0.4", lw=0.8))
        ax.text(x + 0.32, 0.23, text, ha="left", va="center", fontsize=SMALL)
    return fig


# 9.3 ---------------------------------------------------------------------------------------------------


def rope_rotation(d, positions, base=10000.0, pairs=None):
    """Figure: RoPE as rotations. For a few coordinate pairs ``j`` of a width-``d`` vector (``pairs``, up to 4;
    by default the first, the last and two between), a circle shows the pair at each of ``positions`` (up to
    6 ints >= 0), turned by ``m * omega_j`` from where it points at position 0, with ``omega_j = base^(-2j/d)``
    from ``helpers.positions.frequencies``. A note states why the score depends only on ``n - m``. Returns
    the figure."""
    omega = frequencies(d, base).numpy()                         # checks d (even) and base (> 1)
    positions = integers(positions, "positions")
    if positions.dim() != 1 or not 1 <= len(positions) <= 6 or (positions < 0).any() or len(positions.unique()) < len(positions):
        raise ValueError(f"positions must list 1 to 6 distinct ints >= 0, got {positions.tolist()}")
    half = len(omega)
    pairs = sorted(set(np.linspace(0, half - 1, min(4, half)).round().astype(int).tolist())) if pairs is None else pairs
    pairs = integers(pairs, "pairs").tolist()
    if not 1 <= len(pairs) <= 4 or not all(0 <= j < half for j in pairs):
        raise ValueError(f"pairs must list 1 to 4 pair indices from 0 to d/2 - 1 = {half - 1}, got {pairs}")
    W, r = 8.8, 0.78
    H = 2 * r + 2.35
    fig, ax = _canvas(W, H)
    colors = [PALETTE[c] for c in ("blue", "orange", "green", "vermillion", "purple", "sky")]
    step, cy = W / len(pairs), H - 0.8 - r
    last = int(positions.max())
    for k, j in enumerate(pairs):
        cx = step * (k + 0.5)
        ax.add_patch(Circle((cx, cy), r, fc="none", ec="0.75", lw=1))
        ax.plot([cx - r, cx + r], [cy, cy], color="0.85", lw=0.8)
        ax.plot([cx, cx], [cy - r, cy + r], color="0.85", lw=0.8)
        for m, color in zip(positions.tolist(), colors, strict=False):
            angle = m * omega[j]
            _arrow(ax, (cx, cy), (cx + r * np.cos(angle), cy + r * np.sin(angle)), color=color, lw=1.6)
        ax.text(cx, H - 0.4, f"pair $j$ = {j}\n(coordinates {2 * j}, {2 * j + 1})\n$\\omega_{{{j}}}$ = {omega[j]:.3g} rad",
                ha="center", va="center", fontsize=SMALL)
        turned = last * omega[j]
        ax.text(cx, cy - r - 0.2, f"angle at $m$ = {last:,}: {_num(turned, '.3g' if turned < 1000 else ',.0f')} rad",
                ha="center", va="center", fontsize=SMALL)
    y = cy - r - 0.55
    ax.text(0.15, y, "position:", ha="left", va="center", fontsize=SMALL)
    for i, (m, color) in enumerate(zip(positions.tolist(), colors, strict=False)):
        x = 1.0 + i * 1.05
        ax.plot([x, x + 0.3], [y, y], color=color, lw=2)
        ax.text(x + 0.38, y, f"$m$ = {m:,}", ha="left", va="center", fontsize=SMALL)
    ax.text(0.15, y - 0.65, f"Pair $j$ turns by the angle $m\\,\\omega_j$ at position $m$, with "
            f"$\\omega_j$ = {base:g}$^{{-2j/d}}$ and $d$ = {d}: fast for the first pairs, slow for the last.\n"
            "A query at $m$ and a key at $n$ are turned apart by $(n-m)\\,\\omega_j$ in every pair,\n"
            "so their score $(R_mq)^\\top(R_nk) = q^\\top R_{n-m}k$ depends on the positions only through $n - m$.",
            ha="left", va="center", fontsize=SMALL, linespacing=1.6)
    return fig


# 9.4 ---------------------------------------------------------------------------------------------------


def _block(ax, x, y, w, sublayers):
    """A block frame centred at ``x`` from ``y`` up, holding ``sublayers`` ``[(text, colour)]`` bottom to top,
    joined by arrows; returns the sublayers' centres' heights and the frame's top."""
    h, gap, pad = 0.28, 0.18, 0.09
    height = len(sublayers) * h + (len(sublayers) - 1) * gap + 2 * pad
    ax.add_patch(FancyBboxPatch((x - w / 2, y), w, height, boxstyle="round,pad=0,rounding_size=0.08",
                                fc="0.95", ec="0.5", lw=1))
    centres = [y + pad + h / 2 + k * (h + gap) for k in range(len(sublayers))]
    for k, (c, (text, color)) in enumerate(zip(centres, sublayers, strict=True)):
        _box(ax, x, c, w - 0.3, h, text, color, SMALL)
        if k:
            _arrow(ax, (x, centres[k - 1] + h / 2), (x, c - h / 2), lw=1)
    return centres, y + height


def encoder_decoder_wiring(n_layers):
    """Figure: an encoder–decoder transformer of ``n_layers`` (1 to 3) blocks a side. Encoder blocks hold
    self-attention and an MLP; decoder blocks hold causal self-attention, cross-attention and an MLP. The
    encoder's output, the memory, reaches every decoder block's cross-attention as keys and values; its
    queries come from the decoder. Residual connections and normalization are left out. Returns the figure."""
    n = _count(n_layers, "n_layers", 1, 3)
    enc = [("self-attention", PALETTE["sky"]), ("MLP", PALETTE["orange"])]
    dec = [("causal self-attention", PALETTE["sky"]), ("cross-attention", PALETTE["green"]), ("MLP", PALETTE["orange"])]
    pitch, crosses = 1.65, []
    W, H = 8.4, 0.95 + n * pitch
    fig, ax = _canvas(W, H)
    x_enc, x_dec, x_bus = 2.3, 6.0, 4.15
    ax.text(x_enc, 0.22, "source tokens + positions", ha="center", va="center", fontsize=SIZE)
    ax.text(x_dec, 0.22, "start symbol + target so far", ha="center", va="center", fontsize=SIZE)
    below_enc = below_dec = 0.36
    for layer in range(n):
        y = 0.6 + layer * pitch
        (_, _), enc_top = _block(ax, x_enc, y + 0.23, 2.1, enc)
        (_, cross, _), dec_top = _block(ax, x_dec, y, 2.3, dec)
        _arrow(ax, (x_enc, below_enc), (x_enc, y + 0.23))
        _arrow(ax, (x_dec, below_dec), (x_dec, y))
        below_enc, below_dec = enc_top, dec_top
        ax.text(x_enc - 1.15, (y + 0.23 + enc_top) / 2, f"encoder\nblock {layer + 1}", ha="right",
                va="center", fontsize=SMALL)
        ax.text(x_dec + 1.25, y + (dec_top - y) / 2, f"decoder\nblock {layer + 1}", ha="left", va="center", fontsize=SMALL)
        crosses.append(cross)
        _arrow(ax, (x_bus, cross), (x_dec - 1.0, cross), color=PALETTE["green"], lw=1.5)
        ax.text((x_bus + x_dec - 1.0) / 2, cross + 0.14, "$K, V$", ha="center", va="center", fontsize=SMALL)
        ax.text(x_dec + 0.1, cross - 0.23, "$Q$", ha="left", va="center", fontsize=SMALL)
    y_mem = below_enc + 0.25
    ax.plot([x_enc, x_enc, x_bus, x_bus], [below_enc, y_mem, y_mem, crosses[0]],
            color=PALETTE["green"], lw=1.5)
    ax.text(x_enc, y_mem + 0.18, "memory: the encoder's output", ha="center", va="center", fontsize=SIZE)
    _arrow(ax, (x_dec, below_dec), (x_dec, below_dec + 0.25))
    ax.text(x_dec, below_dec + 0.4, "next-token logits", ha="center", va="center", fontsize=SIZE)
    return fig


def decoder_only_stack(tokens, n_layers):
    """Figure: a decoder-only transformer of ``n_layers`` (1 to 4) reading ``tokens`` (2 to 8 short labels),
    one column per position. Each block's output at a position reads that position and every earlier one
    (causal), never a later one; the top of each column predicts the next token, which for the last
    position is the one to generate. Returns the figure."""
    n = _count(n_layers, "n_layers", 1, 4)
    if isinstance(tokens, str) or not 2 <= len(tokens) <= 8 or not all(isinstance(t, str) and 0 < len(t) <= 8 for t in tokens):
        raise ValueError(f"tokens must be a list of 2 to 8 strings of 1 to 8 characters, got {tokens!r:.80}")
    T, pitch = len(tokens), 1.0
    W, H = 8.6, 1.6 + n * pitch
    fig, ax = _canvas(W, H)
    xs, bw, bh = np.linspace(1.9, 8.0, T), 0.62, 0.34
    levels = [0.75 + k * pitch for k in range(n + 1)]            # the embeddings, then each block's output
    for k, y in enumerate(levels):
        ax.text(0.15, y, "embeddings" if k == 0 else f"block {k}", ha="left", va="center", fontsize=SIZE)
        for i, x in enumerate(xs):
            if k:
                for j in range(i + 1):                         # position i reads positions 0..i of the level below
                    last = i == T - 1
                    ax.plot([xs[j], x], [levels[k - 1] + bh / 2, y - bh / 2], lw=1.3 if last else 0.7, zorder=1,
                            color=PALETTE["vermillion"] if last else "0.65")
            _box(ax, x, y, bw, bh, "", PALETTE["sky"] if k else "0.85")
    for i, (x, token) in enumerate(zip(xs, tokens, strict=True)):
        ax.text(x, 0.22, token, ha="center", va="center", fontsize=SIZE)
        _arrow(ax, (x, 0.36), (x, levels[0] - bh / 2), lw=1)
        _arrow(ax, (x, levels[-1] + bh / 2), (x, levels[-1] + bh / 2 + 0.3), lw=1)
        ahead = tokens[i + 1] if i + 1 < T else "?"
        ax.text(x, levels[-1] + bh / 2 + 0.45, ahead, ha="center", va="center", fontsize=SIZE,
                color=PALETTE["vermillion"] if i + 1 == T else "black")
    ax.text(0.15, 0.22, "tokens", ha="left", va="center", fontsize=SIZE)
    ax.text(0.15, levels[-1] + bh / 2 + 0.45, "next-token\nprediction", ha="left", va="center", fontsize=SIZE)
    return fig


# 9.5 ---------------------------------------------------------------------------------------------------


def online_softmax_tiles(T_k, tile):
    """Figure: the online softmax of one query over ``T_k`` keys (up to 4,096) visited in tiles of ``tile`` keys
    (1 to 8 tiles; the last may be shorter). After each tile the running maximum ``m``, normalizer ``l`` and
    weighted sum ``acc`` are updated, what was accumulated rescaled by ``exp(m_old - m_new)``; the update
    rules, as in the section's loop, are written once. Returns the figure."""
    T_k, tile = _count(T_k, "T_k", 1, 4096), positive_int(tile, "tile")
    tiles = -(-T_k // tile)
    if tiles > 8:
        raise ValueError(f"the layout fits up to 8 tiles, got {tiles} (T_k = {T_k}, tile = {tile}): take a larger tile")
    W, H, x0, x1 = 8.8, 4.3, 1.75, 8.65
    fig, ax = _canvas(W, H)
    u, y_keys, y_state = (x1 - x0) / T_k, H - 0.4, H - 1.85
    wide, narrow = tile * u > 1.5, tile * u < 1.2
    bw = min(0.8, (min(tile, T_k) + T_k - (tiles - 1) * tile) / 2 * u - 0.25 if tiles > 1 else 0.8)  # room for the arrows
    ax.text(0.1, y_keys, "scores of\none query", ha="left", va="center", fontsize=SIZE)
    state = [(0.75, "start: $m = -\\infty$,\n$l = 0$, acc = 0")]
    for b in range(tiles):
        first, last = b * tile, min((b + 1) * tile, T_k) - 1
        left, right = x0 + first * u, x0 + (last + 1) * u
        color = _tint(HEADS[b % len(HEADS)], 0.5)
        if u >= 0.04:                                            # a cell per key, where they are wide enough to see
            for j in range(first, last + 1):
                ax.add_patch(Rectangle((x0 + j * u, y_keys - 0.17), u, 0.34, fc=color, ec="white", lw=1))
        else:
            ax.add_patch(Rectangle((left, y_keys - 0.17), right - left, 0.34, fc=color, ec="white", lw=1))
        if u >= 0.3:
            for j in range(first, last + 1):
                ax.text(x0 + (j + 0.5) * u, y_keys, f"$s_{{{j}}}$", ha="center", va="center", fontsize=SMALL)
        ax.plot([left + 0.04, left + 0.04, right - 0.04, right - 0.04],                # the tile's bracket
                [y_keys - 0.25, y_keys - 0.3, y_keys - 0.3, y_keys - 0.25], color="black", lw=1)
        centre = (left + right) / 2
        keys = f"{first}–{last}" if first < last else f"{first}"
        keys = keys if narrow and len(str(last)) > 2 else ("keys " if first < last else "key ") + keys
        ax.text(centre, y_keys - 0.5, f"tile {b + 1}" + (": " if wide else "\n") + keys, ha="center", va="center",
                fontsize=SMALL)
        _arrow(ax, (centre, y_keys - 0.72), (centre, y_state + 0.3), lw=1)
        state.append((centre, f"$m_{{{b + 1}}}, l_{{{b + 1}}}$\nacc$_{{{b + 1}}}$"))
    for k, (x, text) in enumerate(state):
        _box(ax, x, y_state, bw if k else 1.3, 0.6, text, PALETTE["sky"] if k else "white", SMALL)
        if k:
            before = state[k - 1][0] + (bw / 2 if k > 1 else 0.65)
            _arrow(ax, (before, y_state), (x - bw / 2, y_state), lw=1.2)
            low = 0.25 if not wide and (tiles - k) % 2 else 0           # staggered where the tiles are narrow
            ax.text((state[k - 1][0] + x) / 2, y_state - 0.45 - low, f"×exp$(m_{{{k - 1}}}{{-}}m_{{{k}}})$", ha="center",
                    va="center", fontsize=SMALL, color=PALETTE["vermillion"])
    rules = ["$m_b = \\max(m_{b-1},\\ \\max_{j \\in b}\\ s_j)$",
             "$l_b = \\exp(m_{b-1} - m_b)\\, l_{b-1} + \\sum_{j \\in b} \\exp(s_j - m_b)$",
             "acc$_b = \\exp(m_{b-1} - m_b)\\,$acc$_{b-1} + \\sum_{j \\in b} \\exp(s_j - m_b)\\, v_j$"]
    ax.text(0.1, 1.5, "after tile $b$, as in the section's loop:", ha="left", va="center", fontsize=SIZE)
    for k, rule in enumerate(rules):
        ax.text(0.3, 1.1 - 0.42 * k, rule, ha="left", va="center", fontsize=SIZE)
    x = state[-1][0] + (bw / 2 - 0.1 if tiles > 1 else 0)        # clear of the last rescale factor
    _arrow(ax, (x, y_state - 0.3), (x, 1.2), lw=1.2)
    ax.text(min(x + 0.45, x1), 1.05, f"output: acc$_{{{tiles}}}$ / $l_{{{tiles}}}$,\nthe softmax-weighted\nsum of the values",
            ha="right", va="top", fontsize=SMALL)
    return fig


def kv_cache(steps, prompt=1):
    """Figure: generation with and without the key–value cache, ``steps`` (1 to 8) steps after a prompt of
    ``prompt`` tokens (1 to 4). Row ``t`` holds the context's tokens at step ``t``; with the cache the step
    computes the new token's key and value and reads the others from the cache, without it the step computes
    them all again. The work per step and in total is counted in keys and values computed. Returns the figure."""
    steps, prompt = _count(steps, "steps", 1, 8), _count(prompt, "prompt", 1, 4)
    longest = prompt + steps - 1
    u, row, gap = min(0.3, 2.6 / longest), 0.36, 0.5
    panel = longest * u
    x_left, x_right = 1.0, 1.0 + panel + 1.3 + gap
    W, H = x_right + panel + 1.3, steps * row + 1.75
    fig, ax = _canvas(W, H)
    top = H - 0.85
    titles = ["with the cache: one new\nkey and value per step", "without it: the whole\nprefix again each step"]
    for x0, title in zip((x_left, x_right), titles, strict=True):
        ax.text(x0 + panel / 2, H - 0.35, title, ha="center", va="center", fontsize=SIZE)
        ax.text(x0 + panel + 0.65, top + 0.2, "computed", ha="center", va="center", fontsize=SMALL)
    for t in range(1, steps + 1):
        y = top - (t - 0.5) * row
        n = prompt + t - 1                                      # tokens in the context at step t
        ax.text(0.1, y, f"step {t}", ha="left", va="center", fontsize=SMALL)
        for x0, cached in ((x_left, True), (x_right, False)):
            new = n if t == 1 or not cached else 1              # step 1 reads the whole prompt either way
            for j in range(n):
                fresh = j >= n - new
                ax.add_patch(Rectangle((x0 + j * u, y - row / 2 + 0.04), u, row - 0.08, ec="white", lw=1,
                                       fc=PALETTE["blue"] if fresh else "0.8"))
            ax.text(x0 + panel + 0.65, y, str(new), ha="center", va="center", fontsize=SMALL)
    bottom = top - steps * row
    totals = [prompt + steps - 1, sum(prompt + t - 1 for t in range(1, steps + 1))]
    for x0, total in zip((x_left, x_right), totals, strict=True):
        ax.text(x0 + panel / 2, bottom - 0.12, "tokens of the context →", ha="center", va="top", fontsize=SMALL)
        ax.text(x0 + panel + 0.65, bottom - 0.12, f"total {total}", ha="center", va="top", fontsize=SMALL)
    legend = [(PALETTE["blue"], "key and value computed this step"), ("0.8", "read from the cache")]
    for k, (color, text) in enumerate(legend):
        x = 0.15 + k * 3.4
        ax.add_patch(Rectangle((x, 0.12), 0.22, 0.22, fc=color, ec="0.4", lw=0.8))
        ax.text(x + 0.32, 0.23, text, ha="left", va="center", fontsize=SMALL)
    return fig


def _kv_choices(H):
    """The key–value head counts drawn by default: ``H`` (multi-head), a divisor near ``sqrt(H)`` (grouped), 1."""
    between = [g for g in range(2, H) if H % g == 0]
    middle = [min(between, key=lambda g: (abs(g - H**0.5), g))] if between else []
    return sorted({H, *middle, 1}, reverse=True)


def grouped_query_heads(query_heads, kv_heads=None):
    """Figure: which key–value head each query head reads. ``query_heads`` H (1 to 16) share ``kv_heads`` G
    heads, an int or a list of up to 3 (each dividing H), one panel each; by default H (multi-head
    attention), a divisor near sqrt(H) (grouped-query) and 1 (multi-query). Query head ``h`` reads key–value
    head ``h // (H / G)``; each panel gives the cache's size against multi-head's. Returns the figure."""
    H_q = _count(query_heads, "query_heads", 1, 16)
    groups = _kv_choices(H_q) if kv_heads is None else integers(kv_heads, "kv_heads").reshape(-1).tolist()
    if not 1 <= len(groups) <= 3 or any(g < 1 or H_q % g for g in groups):
        raise ValueError(f"kv_heads must be 1 to 3 counts, each dividing query_heads = {H_q}, got {kv_heads!r}")
    left, W, panel_h = 1.45, 8.8, 2.2
    width = (W - left - 0.1) / len(groups)
    fig, ax = _canvas(W, panel_h + 0.95)
    y_q, y_kv = panel_h, 0.85
    ax.text(0.1, y_q, "query heads", ha="left", va="center", fontsize=SIZE)
    ax.text(0.1, y_kv, "key–value\nheads", ha="left", va="center", fontsize=SIZE)
    for k, G in enumerate(groups):
        x0 = left + k * width
        step = (width - 0.35) / H_q
        size = min(0.34, step - 0.06)
        kind = "multi-head" if G == H_q else "multi-query" if G == 1 else "grouped-query"
        ax.text(x0 + width / 2 - 0.15, panel_h + 0.6, f"{kind}\n$H$ = {H_q}, $G$ = {G}", ha="center", va="center", fontsize=SIZE)
        per = H_q // G
        for g in range(G):
            xg = x0 + (g * per + per / 2) * step
            color = HEADS[g % len(HEADS)]
            _box(ax, xg, y_kv, per * step - 0.06, 0.34, "", color)
            for h in range(g * per, (g + 1) * per):
                xh = x0 + (h + 0.5) * step
                ax.plot([xh, xg], [y_q - 0.17, y_kv + 0.17], color=color, lw=1.2, zorder=1)
                _box(ax, xh, y_q, size, 0.34, "", _tint(color, 0.6))
        share = Fraction(G, H_q)
        ax.text(x0 + width / 2 - 0.15, 0.36, "cache as large as\nmulti-head's" if share == 1 else
                f"cache {share} of\nmulti-head's", ha="center", va="center", fontsize=SMALL)
    return fig


# 9.6 ---------------------------------------------------------------------------------------------------


def vit_tokens(n_patches, d=None):
    """Figure: a vision transformer's input sequence. Each of ``n_patches`` patches (flattened) is projected
    by one matrix ``E`` to a token; a learned class token goes first; a learned position embedding is added
    to every token, the class token's included; the ``n_patches + 1`` tokens (of width ``d``, if given)
    enter the encoder, and the class token's final state feeds the classifier. Up to 7 patches are drawn,
    more as the first three, an ellipsis and the last. Returns the figure."""
    N, d = positive_int(n_patches, "n_patches"), d if d is None else positive_int(d, "d")
    shown = list(range(1, N + 1)) if N <= 7 else [1, 2, 3, None, N]
    cols = [0, *shown]                                          # 0: the class token
    W, H, x0 = 8.8, 4.1, 2.1
    fig, ax = _canvas(W, H)
    pitch = (W - x0 - 0.1) / len(cols)
    xs = x0 + pitch * (np.arange(len(cols)) + 0.5)
    y_patch, y_proj, y_tok, y_enc = 0.45, 1.2, 2.05, 3.0
    for y, text in [(y_patch, "patches,\nflattened"), (y_proj, "linear projection"), (y_tok, "position embedding\n+ token"),
                    (y_enc, "encoder")]:
        ax.text(0.1, y, text, ha="left", va="center", fontsize=SIZE)
    patches_x = [x + 0.27 for x, c in zip(xs, cols, strict=True) if c]
    _box(ax, (patches_x[0] + patches_x[-1]) / 2, y_proj, patches_x[-1] - patches_x[0] + 0.7, 0.36,
         "the same matrix $E$ for every patch", "0.9", SMALL)
    for x, c in zip(xs, cols, strict=True):
        xt = x + 0.27                                            # the token, right of its position embedding
        if c is None:
            for y in (y_patch, y_tok):
                ax.text(x, y, "…", ha="center", va="center", fontsize=SIZE)
            continue
        if c:
            shade = str(0.3 + 0.25 * (c % 3))                   # neighbouring patches differ
            ax.add_patch(Rectangle((xt - 0.2, y_patch - 0.2), 0.4, 0.4, fc=shade, ec="black", lw=0.8))
            ax.text(xt, y_patch, str(c), ha="center", va="center", fontsize=SMALL, color=text_color(shade))
            _arrow(ax, (xt, y_patch + 0.2), (xt, y_proj - 0.18), lw=1)
            _arrow(ax, (xt, y_proj + 0.18), (xt, y_tok - 0.22), lw=1)
        else:
            ax.text(xt, y_proj, "learned,\nno patch", ha="center", va="center", fontsize=SMALL)
        _box(ax, x - 0.27, y_tok, 0.34, 0.44, str(c), PALETTE["green"], SMALL)
        ax.text(x, y_tok, "+", ha="center", va="center", fontsize=SIZE)
        _box(ax, xt, y_tok, 0.36, 0.44, "cls" if c == 0 else "", PALETTE["orange"] if c == 0 else PALETTE["sky"], SMALL)
        _arrow(ax, (x, y_tok + 0.22), (x, y_enc - 0.3), lw=1)
    width = xs[-1] - xs[0] + 0.8
    shape = f"{N} + 1 = {N + 1} tokens" + ("" if d is None else f" of width $d$ = {d}: ({N + 1}, {d})")
    _box(ax, (xs[0] + xs[-1]) / 2, y_enc, width, 0.6, f"transformer encoder\n{shape}", "0.9", SIZE)
    _arrow(ax, (xs[0], y_enc + 0.3), (xs[0], y_enc + 0.65), lw=1)
    ax.text(xs[0] - 0.25, y_enc + 0.85, "class token's final state → classifier", ha="left", va="center", fontsize=SIZE)
    return fig
