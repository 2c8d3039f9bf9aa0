"""Pictures of the mechanisms (issue 33): schematic figures drawn from the sizes the code uses.

Each function takes the arguments a section's code has (``T``, ``d``, ``d_k``, ``heads``, a tile size, the
weights it computed) and lays out one diagram, so that a change of shape redraws it. What a figure shows
is computed in its notebook; these functions only lay it out. Every figure is drawn in inches on one
frameless axes (``_canvas``) at most ``WIDTH`` inches wide, in the book's palette, with labels of at least
9 points (``SMALL``) and no randomness, so that its SVG is byte-stable under ``use_style``.

``WIDTH`` is the site's content column: the site shows a notebook's 100-dpi output, and a figure of 6.5
inches (670 pixels with the 0.1-inch margins of the tight bounding box) is shown at its natural size, not
shrunk, so a 9-point label keeps its 9-pixel capitals there as in JupyterLab. Sub- and superscripts are
set inline (``{\\sum}_i``, not a limit under the sign), at 70% of their label's size.

They live apart from ``helpers.diagrams``, which draws data (heat maps, curves); these draw boxes and arrows.
"""

from fractions import Fraction
from itertools import pairwise

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.collections import PatchCollection
from matplotlib.colors import to_rgb
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Circle, FancyBboxPatch, Rectangle
from matplotlib.textpath import text_to_path

from helpers.attention import causal_mask, padding_mask
from helpers.checks import integer, integers, positive_int
from helpers.diagrams import ATTENTION_COLOR, CROSS_COLOR, DARK_YELLOW, MLP_COLOR, text_color
from helpers.plotting import PALETTE
from helpers.positions import frequencies

SIZE, SMALL = 10, 9               # points: the book's font size, and the smallest label
WIDTH = 6.5                       # inches: the widest figure the site shows at its natural size (see above)
# One colour per head; the first avoid the colours of the query (vermillion), keys (sky) and values (orange) of
# 9.1 and 9.2.1, so that a head's colour does not read as one of those.
HEADS = [PALETTE["blue"], PALETTE["green"], PALETTE["purple"], DARK_YELLOW, "0.45", PALETTE["sky"], PALETTE["orange"],
         PALETTE["vermillion"]]
QUERY, KEY, VALUE = PALETTE["vermillion"], PALETTE["sky"], PALETTE["orange"]   # 9.1's colours, kept in 9.2
ALLOWED, LATER, PADDED = PALETTE["blue"], "white", "0.88"   # the chapter's masks: may attend; hidden (future); hidden (padding)


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


def _words(tokens, name, n, longest=8):
    """``tokens`` as a list of ``n`` strings of 1 to ``longest`` characters (a sentence's tokens, as labels)."""
    if isinstance(tokens, str) or not hasattr(tokens, "__len__") or len(tokens) != n \
            or not all(isinstance(t, str) and 0 < len(t) <= longest for t in tokens):
        raise ValueError(f"{name} must be a list of {n} strings of 1 to {longest} characters, got {tokens!r:.80}")
    return list(tokens)


def _width(text, size=SMALL):
    """How wide ``text`` (lines of text or mathtext) is set at ``size`` points, in inches."""
    prop = FontProperties(size=size)
    return max(text_to_path.get_text_width_height_descent(line, prop, ismath="$" in line)[0]
               for line in text.split("\n")) / 72


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
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle=f"round,pad=0,rounding_size={min(0.05, w / 4, h / 4):.4f}",
                                fc=color, ec="black", lw=1))
    if text:
        ax.text(x, y, text, ha="center", va="center", fontsize=size, color=text_color(color))


def _arrow(ax, start, end, color="black", lw=1.2, head=10):
    """An arrow from ``start`` to ``end`` (inches), drawn as a text-less annotation."""
    ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="-|>", color=color, lw=lw, shrinkA=0, shrinkB=0,
                                                          mutation_scale=head))


def _head(ax, start, end, color, lw=1.0, length=0.12, head=7):
    """An arrowhead at ``end`` of the line from ``start``: a short arrow over the line's last ``length`` inches.
    Returns where the head begins, for the line to stop there."""
    (x0, y0), (x1, y1) = start, end
    f = max(0.0, 1 - length / max(np.hypot(x1 - x0, y1 - y0), 1e-9))
    base = (x0 + f * (x1 - x0), y0 + f * (y1 - y0))
    _arrow(ax, base, end, color=color, lw=lw, head=head)
    return base


def _swatch(ax, x, y, color, text, hatch=None, hatchcolor=None):
    """A legend entry at ``(x, y)``: a square of ``color`` (hatched if asked), then ``text``; returns its right end."""
    ax.add_patch(Rectangle((x, y - 0.11), 0.22, 0.22, fc=color, ec="0.4", lw=0.8, hatch=hatch,
                           **({"hatchcolor": hatchcolor} if hatchcolor else {})))
    ax.text(x + 0.32, y, text, ha="left", va="center", fontsize=SMALL)
    return x + 0.32 + _width(text)


def _num(x, fmt=".2f"):
    """``x`` formatted with a true minus sign, as matplotlib writes tick labels."""
    return f"{x:{fmt}}".replace("-", "\u2212")


def _figures(x, digits=3):
    """``x`` to ``digits`` significant figures, trailing zeros kept (0.000400, not 0.0004); a whole number as
    it is (3, not 3.00), and one of ``digits`` or more digits without a point (123, not 123.)."""
    if float(x).is_integer():
        return _num(x, ",.0f")
    return _num(x, f"#.{digits}g").removesuffix(".")


def _shape(names, sizes):
    """``"(B, T, d)\\n= (2, 5, 16)"``: a tensor's shape in symbols, then in numbers, these on two lines if long."""
    numbers = [str(s) for s in sizes]
    if len(", ".join(numbers)) > 14:                  # wider than its column: split after the first half
        half = (len(numbers) + 1) // 2
        return f"({', '.join(names)})\n= ({', '.join(numbers[:half])},\n{', '.join(numbers[half:])})"
    return f"({', '.join(names)})\n= ({', '.join(numbers)})"


# 9.1 ---------------------------------------------------------------------------------------------------

BAR = 1.3                         # soft_lookup: inches of bar for a weight of 1


def soft_lookup(weights, values, scores=None):
    """Figure: a query compared with ``n`` keys (2 to 8), the weights ``weights (n,)`` drawn as bars, and the
    values ``values (n,)`` (numbers) summed with those weights into the output. ``scores (n,)``, if given,
    are written beside the keys and must give ``weights`` through a softmax. The weights are written
    rounded to two decimals; where those do not add up to 1.00, the note under the bars says what they add
    to. Returns the figure."""
    weights = _distribution(weights, "weights")
    n = len(weights)
    values = _vector(values, "values", n)
    if scores is not None:
        scores = _vector(scores, "scores", n)
        if not np.allclose(np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum(), weights, atol=1e-3):
            raise ValueError("weights must be the softmax of scores (to 1e-3): pass the weights computed from them")
    written = [f"{w:.2f}" for w in weights]
    rounded = f"{sum(round(float(w) * 100) for w in written) / 100:.2f}"     # what the written weights add to
    row, W = 0.45, WIDTH
    H = n * row + (1.45 if rounded != "1.00" else 1.25)
    fig, ax = _canvas(W, H)
    ys = H - 1.0 - row * np.arange(n)
    mid, head = ys.mean(), H - 0.35
    x_q, x_k, x_s, x_bar, x_v, x_out = 0.35, 1.15, 2.05, 2.75, 5.0, 6.05
    v_texts = [f"$v_{{{i}}}$ = {_num(v)}" for i, v in enumerate(values, start=1)]
    v_w = max(1.0, max(_width(t, SIZE) for t in v_texts) + 0.14)
    for x, text in [(x_q, "query"), (x_k, "keys"), (x_s, "scores\n$s_i = q^\\top k_i$"),
                    (x_bar + 0.7, "weights $\\alpha_i$\n(softmax of the scores)"), (x_v, "values $v_i$"),
                    (x_out, "output\n${\\sum}_i\\,\\alpha_i v_i$")]:
        ax.text(x, head, text, ha="center", va="center", fontsize=SIZE)
    _box(ax, x_q, mid, 0.5, 0.4, "$q$", PALETTE["vermillion"])
    ax.add_patch(Circle((x_out, mid), 0.17, fc="white", ec="black", lw=1.2, zorder=3))
    ax.text(x_out, mid, "+", ha="center", va="center", fontsize=12, zorder=4)
    for i, (y, w, label, v_text) in enumerate(zip(ys, weights, written, v_texts, strict=True), start=1):
        ax.plot([x_q + 0.25, x_k - 0.225], [mid, y], color="0.6", lw=1)
        _box(ax, x_k, y, 0.45, 0.32, f"$k_{{{i}}}$", PALETTE["sky"])
        ax.text(x_s, y, f"$s_{{{i}}}$ = {_num(scores[i - 1])}" if scores is not None else f"$s_{{{i}}}$",
                ha="center", va="center", fontsize=SIZE)
        ax.add_patch(Rectangle((x_bar, y - 0.13), BAR * w, 0.26, fc=PALETTE["blue"], ec="none"))
        ax.text(x_bar + BAR * w + 0.08, y, label, ha="left", va="center", fontsize=SIZE)
        _box(ax, x_v, y, v_w, 0.32, v_text, PALETTE["orange"])
        ax.plot([x_v + v_w / 2, x_out - 0.17], [y, mid], color=PALETTE["blue"], lw=0.5 + 5 * w, solid_capstyle="butt")
    ax.plot([x_bar, x_bar], [ys[-1] - 0.2, ys[0] + 0.2], color="black", lw=1)
    ax.text(x_bar + 0.7, ys[-1] - 0.42, "they sum to one", ha="center", va="center", fontsize=SMALL)
    if rounded != "1.00":                                   # the two-decimal weights drawn add to 0.99 or 1.01
        ax.text(x_bar + 0.7, ys[-1] - 0.62, f"(rounded: {rounded})", ha="center", va="center", fontsize=SMALL)
    ax.text(x_out, mid - 0.4, f"= {_num(weights @ values)}", ha="center", va="center", fontsize=SIZE)
    return fig


def encoder_decoder_attention(T_in, weights=None, step=None):
    """Figure: Bahdanau's attention at one output step. The encoder reads ``x_0..x_{T_in-1}`` (2 to 8) into
    states ``h_i``; the previous decoder state ``s_{t-1}`` scores every ``h_i`` (a dot on each line); the
    weights ``alpha_ti`` (``weights (T_in,)``, drawn as line widths, else symbols), written between the
    dot and the sum, sum the states into the context ``c_t``. The next decoder state ``s_t`` reads
    ``s_{t-1}``, the previous output ``y_{t-1}`` and ``c_t``; the output layer reads ``s_t`` and ``c_t`` and
    gives the next output ``y_t``. ``step`` (an int >= 1) writes ``t`` as a number. The letters are
    section 9.1's: ``i`` for an encoder position, counted from 0 as in its code, ``e_ti``, ``alpha_ti``. Returns
    the figure."""
    T_in = _count(T_in, "T_in", 2, 8)
    if weights is not None:
        weights = _distribution(weights, "weights", T_in)
    if step is None:
        t, before = "t", "t-1"
    else:
        step = positive_int(step, "step")
        t, before = str(step), str(step - 1)
    sub = (lambda i: f"{t}{i}") if step is None else (lambda i: f"{t},{i}")     # alpha_ti, or alpha_3,i
    W, H = WIDTH, 5.95
    fig, ax = _canvas(W, H)
    xs = np.linspace(1.85, 6.15, T_in)
    bw = min(0.5, xs[1] - xs[0] - 0.22)
    y_x, y_h, xc, y_c, r, y_s, y_o = 0.22, 0.95, (xs[0] + xs[-1]) / 2, 3.35, 0.2, 4.15, 4.9
    x_s, f_dot = 0.5, 0.18                                   # the previous decoder state; where the dots sit

    def height(f):
        """The height a fraction ``f`` of the way up from the encoder states to the sum: the dots' row, the weights'."""
        return y_h + 0.2 + f * (y_c - r - y_h - 0.2)

    labels = [f"$\\alpha_{{{sub(j)}}}$" if weights is None else _num(weights[j]) for j in range(T_in)]
    fs = [0.45] * T_in                                       # where along its line each weight is written
    if max(_width(label) for label in labels) + 0.06 > (xs[1] - xs[0]) * (1 - fs[0]):
        fs = [0.36 if j % 2 else 0.58 for j in range(T_in)]  # staggered, where the lines are too close
    ax.text(0.1, y_h, "encoder states\n(a recurrent\nnetwork)", ha="left", va="center", fontsize=SIZE)
    for j, (x, f, label) in enumerate(zip(xs, fs, labels, strict=True)):   # j counts the boxes from 0; the letter is i
        _box(ax, x, y_h, bw, 0.4, f"$h_{{{j}}}$", PALETTE["sky"])
        ax.text(x, y_x, f"$x_{{{j}}}$", ha="center", va="center", fontsize=SIZE)
        _arrow(ax, (x, y_x + 0.17), (x, y_h - 0.2))
        if j < T_in - 1:
            _arrow(ax, (x + bw / 2, y_h), (xs[j + 1] - bw / 2, y_h))
        share = 1.2 if weights is None else 0.6 + 6 * weights[j]
        start = np.array([x, y_h + 0.2])
        towards = np.array([xc, y_c]) - start
        end = np.array([xc, y_c]) - r * towards / np.hypot(*towards)          # on the circle, towards its centre
        base = _head(ax, start, end, PALETTE["blue"], lw=1, head=6 + 1.2 * share)
        ax.plot([start[0], base[0]], [start[1], base[1]], color=PALETTE["blue"], lw=share, solid_capstyle="butt", zorder=1)
        dot, at = (start + (height(g) - start[1]) / (end[1] - start[1]) * (end - start) for g in (f_dot, f))   # on the line
        ax.plot(dot[0], dot[1], "o", ms=6, color=PALETTE["vermillion"], zorder=2)
        ax.text(at[0], at[1], label, ha="center", va="center", fontsize=SMALL, zorder=3,
                bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none"))
    y_bus, last_dot = height(f_dot), dot[0]
    ax.plot([x_s, x_s, last_dot], [y_s - 0.21, y_bus, y_bus], color=PALETTE["vermillion"], lw=1.5, ls="--", zorder=1)
    ax.text(x_s + 0.1, (y_bus + y_s) / 2 + 0.25, f"query $s_{{{before}}}$\nscores every $h_i$", ha="left", va="center",
            fontsize=SIZE)
    ax.text(x_s + 0.1, height(max(fs)), f"weights $\\alpha_{{{sub('i')}}}$", ha="left", va="center", fontsize=SIZE)
    ax.add_patch(Circle((xc, y_c), r, fc="white", ec="black", lw=1.2, zorder=3))
    ax.text(xc, y_c, "+", ha="center", va="center", fontsize=12, zorder=4)
    ax.text(xc - r - 0.1, y_c + 0.05, f"context $c_{{{t}}}$", ha="right", va="center", fontsize=SIZE)
    _box(ax, x_s, y_s, 0.7, 0.42, f"$s_{{{before}}}$", PALETTE["vermillion"])
    _box(ax, xc, y_s, 0.8, 0.42, f"$s_{{{t}}}$", PALETTE["vermillion"])
    ax.text(x_s + 0.45, y_s + 0.17, "decoder state", ha="left", va="center", fontsize=SIZE)
    _arrow(ax, (x_s + 0.35, y_s), (xc - 0.4, y_s))
    _arrow(ax, (xc, y_c + r), (xc, y_s - 0.21))
    ax.text(xc - 0.55, y_s + 0.55, f"previous output $y_{{{before}}}$", ha="right", va="center", fontsize=SIZE)
    _arrow(ax, (xc - 0.5, y_s + 0.5), (xc - 0.22, y_s + 0.21))
    _box(ax, xc, y_o, 0.95, 0.34, "output layer", "white", SMALL)
    _arrow(ax, (xc, y_s + 0.21), (xc, y_o - 0.17))
    x_by = xc + 0.8                                           # the context also reaches the output layer
    ax.plot([xc + r, x_by, x_by], [y_c, y_c, y_o], color="black", lw=1.2)
    _arrow(ax, (x_by, y_o), (xc + 0.475, y_o))
    _arrow(ax, (xc, y_o + 0.17), (xc, y_o + 0.42))
    ax.text(xc, y_o + 0.56, f"next output $y_{{{t}}}$", ha="center", va="center", fontsize=SIZE)
    for y, text in [(H - 0.3, f"$e_{{{sub('i')}}} = w^\\top\\tanh(Ws_{{{before}}} + Uh_i)$"),
                    (H - 0.68, f"$\\alpha_{{{sub('i')}}} = \\exp e_{{{sub('i')}}}\\,/\\,{{\\sum}}_j\\, \\exp e_{{{sub('j')}}}$"),
                    (H - 1.06, f"$c_{{{t}}} = {{\\sum}}_i\\, \\alpha_{{{sub('i')}}}h_i$")]:
        ax.text(0.1, y, text, ha="left", va="center", fontsize=SIZE)    # SIZE: their subscripts read at the site's width
    ax.text(0.1, y_x, "inputs", ha="left", va="center", fontsize=SIZE)
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


def _row_labels(ax, right, top, u, tokens):
    """``tokens`` written right-aligned at ``right``, one per ``u``-inch row from ``top`` down."""
    for i, token in enumerate(tokens):
        ax.text(right, top - (i + 0.5) * u, token, ha="right", va="center", fontsize=SMALL)


def qkv_projection(T, d, d_k, tokens=None):
    """Figure: queries, keys and values projected from one sequence: ``X (T, d)`` times ``W_Q``, ``W_K``, ``W_V``
    ``(d, d_k)`` gives ``Q``, ``K``, ``V`` ``(T, d_k)``, each matrix drawn to scale (up to 32 rows and columns)
    with its shape written under it, in 9.1's colours: the queries' row vermillion, the keys' sky, the values'
    orange (``QUERY``, ``KEY``, ``VALUE``). ``tokens`` (``T`` strings of up to 8 characters), if given, label the
    rows of ``X``, ``Q``, ``K`` and ``V``, one token a row; the rows are then drawn 0.16 inch tall, which
    needs ``d + 2 d_k`` and ``T`` to be small (the running example's 8 + 2·4 and 6 fit). Returns the figure."""
    T, d, d_k = (_count(v, name, 1, 32) for v, name in ((T, "T"), (d, "d"), (d_k, "d_k")))
    rows = [("Q", "queries:\nwhat each token\nlooks for", QUERY), ("K", "keys:\nwhat each token\nis matched on", KEY),
            ("V", "values:\nwhat each token\npasses on", VALUE)]
    glosses = max(_width(m, SIZE) for _, m, _ in rows)
    labels = 0 if tokens is None else max(_width(t) for t in _words(tokens, "tokens", T)) + 0.08
    x_shape, w_shape, o_shape = (_width(f"{a}\\times {b}$ = {p} × {q}") for a, b, p, q in
                                 (("$T", "d", T, d), ("$d", "d_k", d, d_k), ("$T", "d_k", T, d_k)))

    def columns(u):
        """The centres of X, the W's and the outputs, where the glosses start, and where they end."""
        x_X = max(0.1 + labels + d * u / 2, 0.1 + max(_width("$X$: the sequence", SIZE), x_shape) / 2)
        x_W = max(x_X + d * u / 2 + 0.7 + d_k * u / 2, x_X + (x_shape + w_shape) / 2 + 0.15)
        x_out = max(x_W + d_k * u + 0.34 + labels, x_W + (w_shape + o_shape) / 2 + 0.15)
        x_text = x_out + max(d_k * u + 0.06, _width("$Q = XW_Q$", SIZE), o_shape) / 2 + 0.12
        return x_X, x_W, x_out, x_text, x_text + glosses

    u = 0.16 if tokens is not None else min(0.14, 0.85 / max(T, d))
    while columns(u)[-1] > WIDTH - 0.05 and tokens is None:
        u *= 0.95
    if tokens is not None and (columns(u)[-1] > WIDTH - 0.05 or T > 12):
        raise ValueError(f"tokens label rows 0.16 inch tall, which fit T up to 12 and a narrow d + 2 d_k; got T = {T},"
                         f" d = {d}, d_k = {d_k}: leave tokens out")
    *centres, end = columns(u)
    x_X, x_W, x_out, x_text = (x + (WIDTH - 0.05 - end) / 2 for x in centres)   # centred on the page
    row = max(T, d) * u + 0.7
    W, H = WIDTH, 3 * row + 0.15
    fig, ax = _canvas(W, H)
    ys = H - row / 2 - 0.1 - row * np.arange(3)
    *_, right, top = _matrix(ax, x_X, ys[1], T, d, u, "0.5")
    if tokens is not None:
        _row_labels(ax, x_X - d * u / 2 - 0.06, top, u, tokens)
    ax.text(x_X, top + 0.15, "$X$: the sequence", ha="center", va="bottom", fontsize=SIZE)
    ax.text(x_X, ys[1] - T * u / 2 - 0.12, f"$T\\times d$ = {T} × {d}", ha="center", va="top", fontsize=SMALL)
    for y, (name, meaning, color) in zip(ys, rows, strict=True):
        _arrow(ax, (right + 0.08, ys[1]), (x_W - d_k * u / 2 - 0.32, y), color="0.4")
        ax.text(x_W - d_k * u / 2 - 0.17, y, "×", ha="center", va="center", fontsize=12)
        *_, w_right, w_top = _matrix(ax, x_W, y, d, d_k, u, color)
        ax.text(x_W, w_top + 0.08, f"$W_{name}$", ha="center", va="bottom", fontsize=SIZE)
        ax.text(x_W, y - d * u / 2 - 0.08, f"$d\\times d_k$ = {d} × {d_k}", ha="center", va="top", fontsize=SMALL)
        ax.text(w_right + 0.17, y, "=", ha="center", va="center", fontsize=12)
        *_, o_right, o_top = _matrix(ax, x_out, y, T, d_k, u, color)
        if tokens is not None:
            _row_labels(ax, x_out - d_k * u / 2 - 0.06, o_top, u, tokens)
        ax.text(x_out, o_top + 0.08, f"${name} = XW_{name}$", ha="center", va="bottom", fontsize=SIZE)
        ax.text(x_out, y - T * u / 2 - 0.08, f"$T\\times d_k$ = {T} × {d_k}", ha="center", va="top", fontsize=SMALL)
        ax.text(x_text, y, meaning, ha="left", va="center", fontsize=SIZE)
    return fig


def _heads_shown(heads, most=6):
    """The heads drawn as rows: all of them, or the first two, an ellipsis (None) and the last."""
    return list(range(heads)) if heads <= most else [0, 1, None, heads - 1]


def multi_head_split(B, T, d, heads):
    """Figure: multi-head attention's reshapes. ``x (B, T, d)`` is projected to ``q, k, v (B, T, d)``, split
    along ``d`` into ``heads`` heads, all of them ``(B, H, T, d/H)``, attended in each head, concatenated back to
    ``(B, T, d)`` and projected by ``W_O``; each tensor's shape is written under it, in symbols and in numbers.
    ``d`` runs down the tensors, all drawn as tall: the input's height is marked ``d`` at its left side, where
    no arrow crosses the mark, and the first head's stripe of ``q, k, v`` is marked ``d/H``. The letters are
    section 9.2's: ``H`` heads, head ``h``. Up to 6 heads are drawn, more as the first two, an ellipsis and the
    last. Returns the figure."""
    B, T, d = positive_int(B, "B"), positive_int(T, "T"), positive_int(d, "d")
    heads = positive_int(heads, "heads")
    if d % heads:
        raise ValueError(f"heads must divide d (each head gets d/H coordinates), got d = {d} and heads = {heads}")
    shown = _heads_shown(heads)
    row, W = 0.46, WIDTH
    stack = len(shown) * row
    whole, split = ("B", "T", "d"), ("B", "H", "T", "d/H")
    columns = [("input $x$", whole, (B, T, d)), ("$q, k, v$ (each)", whole, (B, T, d)),
               ("split into heads", split, (B, heads, T, d // heads)), ("heads' outputs", split, (B, heads, T, d // heads)),
               ("concatenated", whole, (B, T, d)), ("output", whole, (B, T, d))]
    under = [f"{name}\n" + _shape(names, sizes) for name, names, sizes in columns]
    H = stack + 1.2 + 0.17 * max(text.count("\n") + 1 for text in under)
    fig, ax = _canvas(W, H)
    top = H - 0.8
    ys = top - row / 2 - row * np.arange(len(shown))
    xs = [0.55, 1.5, 2.65, 3.8, 4.95, 6.0]
    split_label = f"$d/H$ = {d // heads}"                         # written on the first head's stripe
    striped, boxed = max(0.7, _width(split_label) + 0.1), 0.85    # widths: the split tensors, each head's boxes
    for x, text in zip(xs, under, strict=True):
        ax.text(x, top - stack - 0.12, text, ha="center", va="top", fontsize=SMALL)
    steps = ["project by\n$W_Q, W_K, W_V$", f"split $d$ into\n$H$ = {heads} head{'s' if heads > 1 else ''}",
             "attention\nin each head", "concatenate\nthe heads", "project\nby $W_O$"]
    for x, text in zip([(a + b) / 2 for a, b in pairwise(xs)], steps, strict=True):
        ax.text(x, H - 0.38, text, ha="center", va="center", fontsize=SMALL)
    x_d = xs[0] - 0.2 - 0.1                                     # d, measured down the input's left side
    ax.annotate("", xy=(x_d, top), xytext=(x_d, top - stack), arrowprops=dict(arrowstyle="|-|", mutation_scale=2.5,
                                                                              lw=0.8, shrinkA=0, shrinkB=0))
    if _width(f"$d$ = {d}") + 0.1 <= stack:                     # upright beside the line
        ax.text(x_d - 0.04, top - stack / 2, f"$d$ = {d}", ha="center", va="bottom", fontsize=SMALL, rotation=90,
                rotation_mode="anchor")
    else:                                                        # one short head: over the line's top end
        ax.text(x_d - 0.05, top + 0.15, f"$d$ = {d}", ha="left", va="center", fontsize=SMALL)
    for x in (xs[0], xs[5]):
        _box(ax, x, top - stack / 2, 0.4, stack, "", "0.85")
    for x in (xs[1], xs[4]):
        ax.add_patch(Rectangle((x - striped / 2, top - stack), striped, stack, fc="none", ec="black", lw=1, zorder=3))
    _arrow(ax, (xs[0] + 0.2, top - stack / 2), (xs[1] - striped / 2, top - stack / 2))
    _arrow(ax, (xs[4] + striped / 2, top - stack / 2), (xs[5] - 0.2, top - stack / 2))
    for k, (y, head) in enumerate(zip(ys, shown, strict=True)):
        if head is None:
            for x in xs[1:5]:
                ax.text(x, y, "⋮", ha="center", va="center", fontsize=SIZE)
            continue
        color = HEADS[k % len(HEADS)]
        for x in (xs[1], xs[4]):                                  # the head's d/H coordinates of the whole tensor
            ax.add_patch(Rectangle((x - striped / 2, y - row / 2), striped, row, fc=_tint(color, 0.6), ec="none"))
        if k == 0:
            ax.text(xs[1], y, split_label, ha="center", va="center", fontsize=SMALL, zorder=4)
        _box(ax, xs[2], y, boxed, row - 0.1, f"$q_{{{head + 1}}}, k_{{{head + 1}}}, v_{{{head + 1}}}$", _tint(color, 0.6), SMALL)
        _box(ax, xs[3], y, boxed, row - 0.1, f"head {head + 1}", _tint(color, 0.6), SMALL)
        _arrow(ax, (xs[1] + striped / 2, y), (xs[2] - boxed / 2, y), lw=1)
        _arrow(ax, (xs[2] + boxed / 2, y), (xs[3] - boxed / 2, y), lw=1)
        _arrow(ax, (xs[3] + boxed / 2, y), (xs[4] - striped / 2, y), lw=1)
    return fig


def masks_on_batch(lengths, T, tokens=None):
    """Figure: what the masks hide on a batch of sequences of ``lengths`` (1 to 3 of them, each 1..T) padded
    to ``T`` (2 to 8) tokens: for each sequence, the causal mask, the padding mask and the two combined, as
    grids of queries (rows) and keys (columns), each cell allowed (blue) or hidden (pale: white for a later
    key, hatched grey for a padded one; a key both later and padded is drawn padded, which hides it
    whatever the query). The masks are ``helpers.attention``'s ``causal_mask`` and ``padding_mask``.
    ``tokens``, a list of one list of ``T`` strings (up to 8 characters) per sequence, label the rows and
    columns, a padded position reading ``<pad>``; without it they are numbered from 0. Returns the figure."""
    T = _count(T, "T", 2, 8)
    lengths = integers(lengths, "lengths")
    if lengths.dim() != 1 or not 1 <= len(lengths) <= 3 or ((lengths < 1) | (lengths > T)).any():
        raise ValueError(f"lengths must list 1 to 3 sequence lengths, each from 1 to T = {T}, got {lengths.tolist()}")
    B = len(lengths)
    if tokens is None:
        names = [[str(p) for p in range(T)] for _ in range(B)]
    else:
        if isinstance(tokens, str) or not hasattr(tokens, "__len__") or len(tokens) != B:
            raise ValueError(f"tokens must list one list of T = {T} strings per sequence ({B}), got {tokens!r:.80}")
        names = [_words(seq, f"tokens[{b}]", T) for b, seq in enumerate(tokens)]
        names = [[t if p < n else "<pad>" for p, t in enumerate(seq)] for seq, n in zip(names, lengths.tolist(), strict=True)]
    causal, pad = causal_mask(T), padding_mask(lengths, T).expand(-1, T, T)       # True hides the key
    tick = max(_width(t) for seq in names for t in seq) + 0.08                    # the tick labels' room
    rotated = tokens is not None                                                   # keys' words read upwards
    titles = ["causal: no key\nafter the query", "padding: no\npadded key", "padding + causal"]
    left = 0.1 + 0.22 + tick
    u = min(0.28, (WIDTH - left - 2 * 0.3 - 0.1) / (3 * T))
    panel, below = T * u, (tick if rotated else 0.2) + 0.3                         # under a panel: ticks, "keys"
    gap = max(0.3, max(_width(t, SIZE) for t in titles) + 0.12 - panel)           # room for the titles
    pitch = 0.35 + panel + below + 0.15                                            # a sequence's row of panels
    W, H = WIDTH, 0.8 + B * pitch + 0.5
    fig, ax = _canvas(W, H)
    colors = {0: ALLOWED, 1: LATER, 2: PADDED}                                     # allowed, hidden (later, padded)
    for c, title in enumerate(titles):
        ax.text(left + c * (panel + gap) + panel / 2, H - 0.35, title, ha="center", va="center", fontsize=SIZE)
    for b, n in enumerate(lengths.tolist()):
        y0 = H - 0.8 - b * pitch - 0.35 - panel                                    # the panels' bottom
        ax.text(0.1, y0 + panel + 0.17, f"sequence {b + 1}, length {n}", ha="left", va="center", fontsize=SIZE)
        reasons = [causal.long(), 2 * pad[b].long(), torch.where(pad[b], 2, causal.long())]
        for c, reason in enumerate(reasons):
            x0 = left + c * (panel + gap)
            for padded in (False, True):          # one collection each, not T*T patches: adding a patch recomputes limits
                cells = [(Rectangle((x0 + j * u, y0 + panel - (i + 1) * u), u, u), colors[r])
                         for (i, j), r in np.ndenumerate(reason.numpy()) if (r == 2) == padded]
                if cells:
                    ax.add_collection(PatchCollection([cell for cell, _ in cells], facecolors=[f for _, f in cells],
                                                      edgecolors="0.6", linewidths=0.5, hatch="////" if padded else None,
                                                      **({"hatchcolor": "0.6"} if padded else {})), autolim=False)
            ax.add_patch(Rectangle((x0, y0), panel, panel, fc="none", ec="black", lw=1))
            for p, name in enumerate(names[b]):                                    # positions; padding's in dark grey
                shade = "0.35" if p >= n else "black"
                ax.text(x0 + (p + 0.5) * u, y0 - 0.05, name, ha="center", va="top", fontsize=SMALL, color=shade,
                        rotation=90 if rotated else 0)
                if c == 0:                                                          # the rows are the same in all three
                    ax.text(x0 - 0.06, y0 + panel - (p + 0.5) * u, name, ha="right", va="center", fontsize=SMALL,
                            color=shade)
            ax.text(x0 + panel / 2, y0 - below + 0.2, "keys", ha="center", va="center", fontsize=SMALL)
        ax.text(left - tick - 0.12, y0 + panel / 2, "queries", ha="center", va="center", fontsize=SMALL, rotation=90)
    x = 0.1
    for color, text, hatch in [(ALLOWED, "may attend", None), (LATER, "hidden: a later key", None),
                               (PADDED, "hidden: a padded key\n(later or not)", "////")]:
        x = _swatch(ax, x, 0.3, color, text, hatch, "0.6" if hatch else None) + 0.35
    return fig


# 9.3 ---------------------------------------------------------------------------------------------------

POSITIONS = [PALETTE["black"], PALETTE["orange"], PALETTE["blue"], PALETTE["purple"], PALETTE["green"], PALETTE["vermillion"]]
COUNTS = {2: "both", 3: "all three", 4: "all four", 5: "all five", 6: "all six"}


def _overlapping(tips, positions, within):
    """The groups of ``positions`` whose arrow ``tips`` lie within ``within`` inches of one another (chained)."""
    order = sorted(range(len(tips)), key=lambda k: np.arctan2(tips[k][1], tips[k][0]))
    groups, current = [], [order[0]]
    for a, b in pairwise(order):
        if np.hypot(*(np.subtract(tips[a], tips[b]))) < within:
            current.append(b)
        else:
            groups.append(current)
            current = [b]
    groups.append(current)
    if len(groups) > 1 and np.hypot(*np.subtract(tips[groups[0][0]], tips[groups[-1][-1]])) < within:
        groups[0] = groups.pop() + groups[0]                       # the circle closes: the last group meets the first
    return [sorted(positions[k] for k in g) for g in groups if len(g) > 1]


def rope_rotation(d, positions, base=10000.0, pairs=None):
    """Figure: RoPE as rotations. For a few coordinate pairs ``j`` of a width-``d`` vector (``pairs``, up to 4;
    by default the first, the last and two between), a circle shows the pair at each of ``positions`` (up to
    6 ints >= 0), turned by ``t * omega_j`` from where it points at position 0, with ``omega_j = base^(-2j/d)``
    from ``helpers.positions.frequencies``: ``t`` is a position, as in section 9.3 and ``positions.rope``.
    Frequencies and angles are written to three significant figures (a whole number as it is). Arrows whose
    tips fall within a pixel of one another are named under their circle ("all four overlap").
    A note states why the score of a query at ``m`` and a key at ``n`` depends only on ``n - m``. Returns
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
    positions = positions.tolist()
    entries = [f"$t$ = {t:,}" for t in positions]
    per_line = max(1, int((WIDTH - 0.95) // (max(_width(e) for e in entries) + 0.55)))
    legend_lines = -(-len(entries) // per_line)
    note = ("Pair $j$ turns by the angle $t\\,\\omega_j$ at position $t$, with $\\omega_j$ = "
            f"{base:g}$^{{-2j/d}}$ and $d$ = {d}:\nfast for the first pairs, slow for the last. "
            "A query at $m$ and a key at $n$ are turned\napart by $(n-m)\\,\\omega_j$ in every pair, "
            "so their score $(R_mq)^\\top(R_nk) = q^\\top R_{n-m}k$\ndepends on the positions only through $n - m$.")
    W, r = WIDTH, 0.66
    H = 2 * r + 3.4 + 0.3 * (legend_lines - 1)
    fig, ax = _canvas(W, H)
    step, cy = W / len(pairs), H - 1.0 - r
    last = max(positions)
    for k, j in enumerate(pairs):
        cx = step * (k + 0.5)
        ax.add_patch(Circle((cx, cy), r, fc="none", ec="0.75", lw=1))
        ax.plot([cx - r, cx + r], [cy, cy], color="0.85", lw=0.8)
        ax.plot([cx, cx], [cy - r, cy + r], color="0.85", lw=0.8)
        tips = []
        for t, color in zip(positions, POSITIONS, strict=False):
            angle = t * omega[j]
            tips.append((r * np.cos(angle), r * np.sin(angle)))
            _arrow(ax, (cx, cy), (cx + tips[-1][0], cy + tips[-1][1]), color=color, lw=1.6)
        ax.text(cx, H - 0.5, f"pair $j$ = {j}\n(coordinates {2 * j}, {2 * j + 1})\n$\\omega_{{{j}}}$ = {_figures(omega[j])} rad"
                "\nper position", ha="center", va="center", fontsize=SMALL)
        turned = last * omega[j]
        ax.text(cx, cy - r - 0.3, f"angle at $t$ = {last:,}:\n{_figures(turned) if turned < 999.5 else _num(turned, ',.0f')} rad",
                ha="center", va="center", fontsize=SMALL)
        groups = _overlapping(tips, positions, within=0.01)      # a pixel at the notebooks' 100 dpi
        if groups:
            ax.text(cx, cy - r - 0.62, "\n".join(
                f"({COUNTS[len(g)]} overlap)" if len(g) == len(positions) else
                f"($t$ = {', '.join(f'{t:,}' for t in g)} overlap)" for g in groups),
                ha="center", va="top", fontsize=SMALL)
    y = cy - r - 1.1
    ax.text(0.1, y, "position:", ha="left", va="center", fontsize=SMALL)
    wide = max(_width(e) for e in entries) + 0.55
    for i, (entry, color) in enumerate(zip(entries, POSITIONS, strict=False)):
        x, line = 0.95 + (i % per_line) * wide, i // per_line
        ax.plot([x, x + 0.3], [y - 0.3 * line] * 2, color=color, lw=2)
        ax.text(x + 0.38, y - 0.3 * line, entry, ha="left", va="center", fontsize=SMALL)
    ax.text(0.1, y - 0.3 * (legend_lines - 1) - 0.35, note, ha="left", va="top", fontsize=SMALL, linespacing=1.6)
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
    self-attention and an MLP; decoder blocks hold causal self-attention, cross-attention and an MLP. Both
    inputs are token embeddings plus positions. The encoder's output, the memory, reaches every decoder
    block's cross-attention as keys and values; its queries come from the decoder. The last decoder block feeds
    the output layer, which gives the next-token logits. Residual connections and normalization are left out.
    The sublayers take ``block_diagram``'s colours (``helpers.diagrams.ATTENTION_COLOR``, ``CROSS_COLOR``,
    ``MLP_COLOR``), not those of the queries, keys and values. Returns the figure."""
    n = _count(n_layers, "n_layers", 1, 3)
    enc = [("self-attention", ATTENTION_COLOR), ("MLP", MLP_COLOR)]
    dec = [("causal self-attention", ATTENTION_COLOR), ("cross-attention", CROSS_COLOR), ("MLP", MLP_COLOR)]
    pitch, crosses = 1.65, []
    W, H = WIDTH, 1.42 + n * pitch
    fig, ax = _canvas(W, H)
    x_enc, x_dec, x_bus, w_enc, w_dec = 1.55, 4.7, 3.15, 1.8, 2.0
    ax.text(x_enc, 0.22, "source tokens + positions", ha="center", va="center", fontsize=SIZE)
    ax.text(x_dec, 0.22, "start symbol + target so far + positions", ha="center", va="center", fontsize=SIZE)
    below_enc = below_dec = 0.36
    for layer in range(n):
        y = 0.6 + layer * pitch
        (_, _), enc_top = _block(ax, x_enc, y + 0.23, w_enc, enc)
        (_, cross, _), dec_top = _block(ax, x_dec, y, w_dec, dec)
        _arrow(ax, (x_enc, below_enc), (x_enc, y + 0.23))
        _arrow(ax, (x_dec, below_dec), (x_dec, y))
        below_enc, below_dec = enc_top, dec_top
        ax.text(x_enc - w_enc / 2 - 0.06, (y + 0.23 + enc_top) / 2, f"encoder\nblock {layer + 1}", ha="right",
                va="center", fontsize=SMALL)
        ax.text(x_dec + w_dec / 2 + 0.06, y + (dec_top - y) / 2, f"decoder\nblock {layer + 1}", ha="left", va="center",
                fontsize=SMALL)
        crosses.append(cross)
        _arrow(ax, (x_bus, cross), (x_dec - (w_dec - 0.3) / 2, cross), color=PALETTE["green"], lw=1.5)
        ax.text((x_bus + x_dec - (w_dec - 0.3) / 2) / 2, cross + 0.14, "$K, V$", ha="center", va="center", fontsize=SMALL)
        ax.text(x_dec + 0.1, cross - 0.23, "$Q$", ha="left", va="center", fontsize=SMALL)
    y_mem = below_enc + 0.25
    ax.plot([x_enc, x_enc, x_bus, x_bus], [below_enc, y_mem, y_mem, crosses[0]],
            color=PALETTE["green"], lw=1.5)
    ax.text(x_enc, y_mem + 0.18, "memory: the encoder's output", ha="center", va="center", fontsize=SIZE)
    y_out = below_dec + 0.37                                  # the output layer, over the last decoder block
    _arrow(ax, (x_dec, below_dec), (x_dec, y_out - 0.15))
    _box(ax, x_dec, y_out, 1.1, 0.3, "output layer", "white", SMALL)
    _arrow(ax, (x_dec, y_out + 0.15), (x_dec, y_out + 0.37))
    ax.text(x_dec, y_out + 0.52, "next-token logits", ha="center", va="center", fontsize=SIZE)
    return fig


def decoder_only_stack(tokens, n_layers):
    """Figure: a decoder-only transformer of ``n_layers`` (1 to 4) reading ``tokens`` (2 to 8 short labels),
    one column per position. Each block's output at a position reads that position and every earlier one
    (causal), never a later one: grey lines, and vermillion ones with arrowheads into the last
    position, whose prediction is the token to generate. The top of each column predicts the next token.
    Returns the figure."""
    n = _count(n_layers, "n_layers", 1, 4)
    if isinstance(tokens, str) or not 2 <= len(tokens) <= 8 or not all(isinstance(t, str) and 0 < len(t) <= 8 for t in tokens):
        raise ValueError(f"tokens must be a list of 2 to 8 strings of 1 to 8 characters, got {tokens!r:.80}")
    T, pitch = len(tokens), 1.0
    W, H = WIDTH, 1.6 + n * pitch
    fig, ax = _canvas(W, H)
    xs = np.linspace(1.45, 6.1, T)
    bw, bh = min(0.62, xs[1] - xs[0] - 0.15), 0.34
    words = [*tokens, *tokens[1:], "?"]
    size = SIZE if max(_width(t, SIZE) for t in words) <= xs[1] - xs[0] - 0.08 else SMALL
    levels = [0.75 + k * pitch for k in range(n + 1)]            # the embeddings, then each block's output
    for k, y in enumerate(levels):
        ax.text(0.1, y, "embeddings" if k == 0 else f"block {k}", ha="left", va="center", fontsize=SIZE)
        for i, x in enumerate(xs):
            if k:
                for j in range(i + 1):                         # position i reads positions 0..i of the level below
                    start, end = (xs[j], levels[k - 1] + bh / 2), (x, y - bh / 2)
                    if i == T - 1:
                        ax.plot(*zip(start, end, strict=True), lw=1.3, zorder=2, color=PALETTE["vermillion"])
                        _head(ax, start, end, PALETTE["vermillion"], lw=1, length=0.1, head=6)
                    else:
                        ax.plot(*zip(start, end, strict=True), lw=0.8, zorder=1, color="0.6")
            # a block purple, as 9.4's self-attention sublayers (helpers.diagrams); sky is 9.1's and 9.2's keys
            _box(ax, x, y, bw, bh, "", PALETTE["purple"] if k else "0.85")
    for i, (x, token) in enumerate(zip(xs, tokens, strict=True)):
        ax.text(x, 0.22, token, ha="center", va="center", fontsize=size)
        _arrow(ax, (x, 0.36), (x, levels[0] - bh / 2), lw=1)
        _arrow(ax, (x, levels[-1] + bh / 2), (x, levels[-1] + bh / 2 + 0.3), lw=1)
        ahead = tokens[i + 1] if i + 1 < T else "?"
        ax.text(x, levels[-1] + bh / 2 + 0.45, ahead, ha="center", va="center", fontsize=size,
                color=PALETTE["vermillion"] if i + 1 == T else "black")
    ax.text(0.1, 0.22, "tokens", ha="left", va="center", fontsize=SIZE)
    ax.text(0.1, levels[-1] + bh / 2 + 0.45, "next-token\nprediction", ha="left", va="center", fontsize=SIZE)
    return fig


# 9.5 ---------------------------------------------------------------------------------------------------


def online_softmax_tiles(T_k, tile):
    """Figure: the online softmax of one query over ``T_k`` keys (up to 4,096) visited in tiles of ``tile`` keys
    (1 to 8 tiles; the last may be shorter). The state starts at ``m_0 = -inf``, ``l_0 = 0``, ``acc_0 = 0``;
    after each tile ``b`` the running maximum ``m_b``, normalizer ``l_b`` and weighted sum ``acc_b`` are
    updated, what was accumulated rescaled by ``exp(m_{b-1} - m_b)``; the update rules, as in the section's
    loop, are written once, with ``n`` for a key of tile ``b`` (the loop's ``j`` is where a tile starts).
    The tiles are one colour in alternating shades. Returns the figure."""
    T_k, tile = _count(T_k, "T_k", 1, 4096), positive_int(tile, "tile")
    tiles = -(-T_k // tile)
    if tiles > 8:
        raise ValueError(f"the layout fits up to 8 tiles, got {tiles} (T_k = {T_k}, tile = {tile}): take a larger tile")
    W, H, x0, x1 = WIDTH, 4.3, 1.2, WIDTH - 0.1
    fig, ax = _canvas(W, H)
    u, y_keys, y_state = (x1 - x0) / T_k, H - 0.4, H - 1.85
    pitch = min(tile, T_k) * u                                   # a whole tile's width
    spans = [(b * tile, min((b + 1) * tile, T_k) - 1) for b in range(tiles)]
    keys = [f"{first}–{last}" if first < last else f"{first}" for first, last in spans]
    named = [("keys " if first < last else "key ") + k for (first, last), k in zip(spans, keys, strict=True)]
    forms = [lambda b: f"tile {b + 1}: {named[b]}", lambda b: f"tile {b + 1}\n{named[b]}",
             lambda b: f"tile {b + 1}\n{keys[b]}", lambda b: f"tile {b + 1}"]
    middles = [x0 + (first + last + 1) * u / 2 for first, last in spans]

    def fits(form):
        """Whether every tile's label, in ``form``, stays clear of its neighbours' and inside the figure."""
        halves = [_width(form(b)) / 2 for b in range(tiles)]
        return middles[-1] + halves[-1] <= W - 0.02 and all(
            b - a >= ha + hb + 0.06 for (a, ha), (b, hb) in pairwise(zip(middles, halves, strict=True)))

    form = next((f for f in forms if fits(f)), forms[-1])      # one form for all the tiles
    states = [f"$m_{{{b}}}, l_{{{b}}}$\nacc$_{{{b}}}$" for b in range(1, tiles + 1)]
    bw = min(0.8, max(pitch - 0.4, min(pitch - 0.14, max(_width(t) for t in states) + 0.1))) if tiles > 1 else 0.8
    ax.text(0.1, y_keys, "scores of\none query", ha="left", va="center", fontsize=SIZE)
    if form is forms[-1]:                                        # the tiles too narrow for their keys: say it once
        ax.text(0.1, y_keys - 0.5, f"{tile:,} keys a tile", ha="left", va="center", fontsize=SMALL)
    shades = [_tint(PALETTE["blue"], 0.3), _tint(PALETTE["blue"], 0.55)]
    x_start, start_w = 0.55, 0.95
    centres = []
    for b, (first, last) in enumerate(spans):
        left, right = x0 + first * u, x0 + (last + 1) * u
        color = shades[b % 2]
        if u >= 0.04:                                            # a cell per key, where they are wide enough to see
            for n in range(first, last + 1):
                ax.add_patch(Rectangle((x0 + n * u, y_keys - 0.17), u, 0.34, fc=color, ec="white", lw=1))
        else:
            ax.add_patch(Rectangle((left, y_keys - 0.17), right - left, 0.34, fc=color, ec="white", lw=1))
        if u >= 0.3:
            for n in range(first, last + 1):
                ax.text(x0 + (n + 0.5) * u, y_keys, f"$s_{{{n}}}$", ha="center", va="center", fontsize=SMALL)
        ax.plot([left + 0.04, left + 0.04, right - 0.04, right - 0.04],                # the tile's bracket
                [y_keys - 0.25, y_keys - 0.3, y_keys - 0.3, y_keys - 0.25], color="black", lw=1)
        centres.append((left + right) / 2)
        ax.text(centres[-1], y_keys - 0.5, form(b), ha="center", va="center", fontsize=SMALL)
        _arrow(ax, (centres[-1], y_keys - 0.72), (centres[-1], y_state + 0.3), lw=1)
    _box(ax, x_start, y_state, start_w, 0.72, "$m_0 = -\\infty$\n$l_0 = 0$\nacc$_0 = 0$", "white", SMALL)
    ax.text(x_start, y_state + 0.52, "start", ha="center", va="center", fontsize=SMALL)
    factors = [f"×exp$(m_{{{k - 1}}}{{-}}m_{{{k}}})$" for k in range(1, tiles + 1)]
    stagger = max(_width(f) for f in factors) + 0.1 > pitch         # neighbours' factors would touch
    ends = [x_start + start_w / 2] + [x + bw / 2 for x in centres]  # where each link starts
    reach = 0.0                                                      # the right end of the last factor, if in the way
    for k, (x, text) in enumerate(zip(centres, states, strict=True)):
        _box(ax, x, y_state, bw, 0.6, text, PALETTE["sky"], SMALL)
        _arrow(ax, (ends[k], y_state), (x - bw / 2, y_state), lw=1.2)
        low = 0.25 if stagger and (tiles - k - 1) % 2 else 0
        middle = (ends[k] + x - bw / 2) / 2
        ax.text(middle, y_state - 0.5 - low, factors[k], ha="center", va="center", fontsize=SMALL,
                color=PALETTE["vermillion"])
        reach = middle + _width(factors[k]) / 2 if not low else reach
    rules = ["$m_b = \\max(m_{b-1},\\ {\\max}_{n \\in b}\\, s_n)$",
             "$l_b = \\exp(m_{b-1} - m_b)\\, l_{b-1} + {\\sum}_{n \\in b}\\, \\exp(s_n - m_b)$",
             "acc$_b = \\exp(m_{b-1} - m_b)\\,$acc$_{b-1} + {\\sum}_{n \\in b}\\, \\exp(s_n - m_b)\\, v_n$"]
    ax.text(0.1, 1.5, "after tile $b$ (keys $n$), as in the section's loop:", ha="left", va="center", fontsize=SIZE)
    for k, rule in enumerate(rules):
        ax.text(0.3, 1.1 - 0.42 * k, rule, ha="left", va="center", fontsize=SIZE)
    output = f"output: acc$_{{{tiles}}}$ / $l_{{{tiles}}}$,\nthe softmax-weighted\nsum of the values"
    half = _width(output) / 2
    x_out = W - 0.05 - half                                          # right of the rules
    x = min(max(centres[-1], reach + 0.06), centres[-1] + bw / 2 - 0.04)    # down from the last state, clear of its factor
    _arrow(ax, (x, y_state - 0.3), (min(max(x, x_out - half + 0.1), x_out + half - 0.1), 1.12), lw=1.2)
    ax.text(x_out, 1.05, output, ha="center", va="top", fontsize=SMALL)
    return fig


def kv_cache(steps, prompt=1):
    """Figure: generation with and without the key–value cache, ``steps`` (1 to 8) steps after a prompt of
    ``prompt`` tokens (1 to 4), for one layer. Row ``t`` holds the context's tokens at step ``t``, the prompt's
    hatched; with the cache the step computes the new token's key and value and reads the others from the
    cache (step 1, the prompt, computes them all), without it the step computes them all again. The work
    per step and in total is counted in keys and values computed per layer. Returns the figure."""
    steps, prompt = _count(steps, "steps", 1, 8), _count(prompt, "prompt", 1, 4)
    longest = prompt + steps - 1
    left, count, gap = 1.15, 0.8, 0.25
    panel = (WIDTH - left - 2 * count - gap - 0.05) / 2
    u, row = min(0.3, panel / longest), 0.36
    titles = ["with the cache: one new\nkey and value per step", "without it: the whole\nprefix again each step"]
    panel = longest * u
    slot = max(panel, max(_width(t, SIZE) for t in titles) - count + 0.1, _width("tokens of the context →") + 0.1)
    x_left, x_right = left, left + slot + count + gap
    W, H = WIDTH, steps * row + 1.95
    fig, ax = _canvas(W, H)
    top = H - 1.0
    for x0, title in zip((x_left, x_right), titles, strict=True):
        ax.text(x0 + slot / 2, H - 0.35, title, ha="center", va="center", fontsize=SIZE)
        ax.text(x0 + slot + count / 2, top + 0.25, "computed\nper layer", ha="center", va="center", fontsize=SMALL)
    for t in range(1, steps + 1):
        y = top - (t - 0.5) * row
        n = prompt + t - 1                                      # tokens in the context at step t
        ax.text(0.1, y, "step 1: prompt" if t == 1 else f"step {t}", ha="left", va="center", fontsize=SMALL)
        for x0, cached in ((x_left, True), (x_right, False)):
            new = n if t == 1 or not cached else 1              # step 1 reads the whole prompt either way
            for j in range(n):
                fresh = j >= n - new
                ax.add_patch(Rectangle((x0 + j * u, y - row / 2 + 0.04), u, row - 0.08, ec="white", lw=1,
                                       fc=PALETTE["blue"] if fresh else "0.8", hatch="///" if j < prompt else None))
            ax.text(x0 + slot + count / 2, y, str(new), ha="center", va="center", fontsize=SMALL)
    bottom = top - steps * row
    totals = [prompt + steps - 1, sum(prompt + t - 1 for t in range(1, steps + 1))]
    for x0, total in zip((x_left, x_right), totals, strict=True):
        ax.text(x0 + slot / 2, bottom - 0.12, "tokens of the context →", ha="center", va="top", fontsize=SMALL)
        ax.text(x0 + slot + count / 2, bottom - 0.12, f"total {total}", ha="center", va="top", fontsize=SMALL)
    x = 0.1
    for color, text, hatch in [(PALETTE["blue"], "key and value computed this step", None),
                               ("0.8", "read from the cache", None), ("white", "a prompt token", "///")]:
        x = _swatch(ax, x, 0.25, color, text, hatch, "0.3" if hatch else None) + 0.3
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
    head ``h // (H / G)``. Every key–value head is drawn the size of a query head, under the middle of its
    group, so that a panel's key–value boxes are its cache; each panel gives the cache's size against
    multi-head's. Returns the figure."""
    H_q = _count(query_heads, "query_heads", 1, 16)
    groups = _kv_choices(H_q) if kv_heads is None else integers(kv_heads, "kv_heads").reshape(-1).tolist()
    if not 1 <= len(groups) <= 3 or any(g < 1 or H_q % g for g in groups):
        raise ValueError(f"kv_heads must be 1 to 3 counts, each dividing query_heads = {H_q}, got {kv_heads!r}")
    left, W, panel_h = 1.15, WIDTH, 2.2
    width = (W - left - 0.05) / len(groups)
    fig, ax = _canvas(W, panel_h + 0.95)
    y_q, y_kv, tall = panel_h, 0.85, 0.34
    ax.text(0.1, y_q, "query heads", ha="left", va="center", fontsize=SIZE)
    ax.text(0.1, y_kv, "key–value\nheads", ha="left", va="center", fontsize=SIZE)
    for k, G in enumerate(groups):
        x0 = left + k * width
        step = (width - 0.2) / H_q
        size = min(0.3, step - 0.05)
        middle = x0 + H_q * step / 2
        kind = "multi-head" if G == H_q else "multi-query" if G == 1 else "grouped-query"
        ax.text(middle, panel_h + 0.6, f"{kind}\n$H$ = {H_q}, $G$ = {G}", ha="center", va="center", fontsize=SIZE)
        per = H_q // G
        for g in range(G):
            xg = x0 + (g * per + per / 2) * step
            color = HEADS[g % len(HEADS)]
            _box(ax, xg, y_kv, size, tall, "", color)
            for h in range(g * per, (g + 1) * per):
                xh = x0 + (h + 0.5) * step
                ax.plot([xh, xg], [y_q - tall / 2, y_kv + tall / 2], color=color, lw=1.2, zorder=1)
                _box(ax, xh, y_q, size, tall, "", _tint(color, 0.6))
        share = Fraction(G, H_q)
        ax.text(middle, 0.36, "cache as large as\nmulti-head's" if share == 1 else
                f"cache {share} of\nmulti-head's", ha="center", va="center", fontsize=SMALL)
    return fig


# 9.6 ---------------------------------------------------------------------------------------------------


def vit_tokens(n_patches, d=None, patch=None, channels=3):
    """Figure: a vision transformer's input sequence. Each of ``n_patches`` patches, flattened into a vector
    (drawn as a thin bar; of ``channels · patch · patch`` numbers, written out if ``patch`` is given), is
    projected by one matrix ``E`` to a token; a learned class token goes first; a learned position embedding
    is added to every token, the class token's included; the ``n_patches + 1`` tokens (of width ``d``, if
    given) enter the encoder, and the class token's final state, through a LayerNorm, feeds the classifier.
    Up to 7 patches are drawn, more as the first three, an ellipsis and the last. Returns the figure."""
    N, d = positive_int(n_patches, "n_patches"), d if d is None else positive_int(d, "d")
    patch, channels = patch if patch is None else positive_int(patch, "patch"), positive_int(channels, "channels")
    shown = list(range(1, N + 1)) if N <= 7 else [1, 2, 3, None, N]
    cols = [0, *shown]                                          # 0: the class token
    W, H, x0 = WIDTH, 4.3, 1.25
    fig, ax = _canvas(W, H)
    pitch = (W - 0.5 - x0) / (len(cols) - 0.5)                 # the last column's boxes end 0.45 inch from the edge
    xs = x0 + pitch * (np.arange(len(cols)) + 0.5)
    y_patch, y_proj, y_tok, y_enc = 0.75, 1.5, 2.25, 3.15
    for y, text in [(y_patch, "patches,\nflattened"), (y_proj, "linear\nprojection"), (y_tok, "position\nembedding\n+ token"),
                    (y_enc, "encoder")]:
        ax.text(0.1, y, text, ha="left", va="center", fontsize=SIZE)
    side, gap = 0.28, 0.22                                     # a token's and a position's box; from the plus to each
    patches_x = [x + gap for x, c in zip(xs, cols, strict=True) if c]
    _box(ax, (patches_x[0] + patches_x[-1]) / 2, y_proj, patches_x[-1] - patches_x[0] + 0.4, 0.36,
         "the same matrix $E$ for every patch", "0.9", SMALL)
    flat = "each bar: a patch flattened" + ("" if patch is None else
                                            f", {channels * patch * patch} = {channels}·{patch}·{patch} numbers")
    ax.text((patches_x[0] + patches_x[-1]) / 2, 0.18, flat, ha="center", va="center", fontsize=SMALL)
    for x, c in zip(xs, cols, strict=True):
        xt = x + gap                                             # the token, right of its position embedding
        if c is None:
            for y in (y_patch, y_tok):
                ax.text(x, y, "…", ha="center", va="center", fontsize=SIZE)
            continue
        if c:
            shade = str(0.3 + 0.25 * (c % 3))                   # neighbouring patches differ
            ax.add_patch(Rectangle((xt - 0.05, y_patch - 0.3), 0.1, 0.6, fc=shade, ec="black", lw=0.8))
            ax.text(xt - 0.1, y_patch, str(c), ha="right", va="center", fontsize=SMALL)
            _arrow(ax, (xt, y_patch + 0.3), (xt, y_proj - 0.18), lw=1)
            _arrow(ax, (xt, y_proj + 0.18), (xt, y_tok - 0.22), lw=1)
        else:
            ax.text(xt, y_proj, "learned,\nno patch", ha="center", va="center", fontsize=SMALL)
        _box(ax, x - gap, y_tok, side + 0.06, 0.44, str(c), PALETTE["green"], SMALL)   # room for "196"
        ax.text(x, y_tok, "+", ha="center", va="center", fontsize=SIZE)
        _box(ax, xt, y_tok, side, 0.44, "cls" if c == 0 else "", PALETTE["orange"] if c == 0 else PALETTE["sky"], SMALL)
        _arrow(ax, (x, y_tok + 0.22), (x, y_enc - 0.3), lw=1)
    width = xs[-1] - xs[0] + 0.8
    shape = f"{N} + 1 = {N + 1} tokens" + ("" if d is None else f" of width $d$ = {d}: ({N + 1}, {d})")
    _box(ax, (xs[0] + xs[-1]) / 2, y_enc, width, 0.6, f"transformer encoder\n{shape}", "0.9", SIZE)
    _arrow(ax, (xs[0], y_enc + 0.3), (xs[0], y_enc + 0.65), lw=1)
    ax.text(xs[0] - 0.25, y_enc + 0.85, "class token's final state → LayerNorm → classifier", ha="left", va="center",
            fontsize=SIZE)
    return fig
