"""Drawing plumbing the figures share: annotated heatmaps, mask grids, the transformer block, the ViT input,
and the layout of the figures of 9.2, 9.5, 9.6 and 9.A (9.2's heat maps, the cost crossover, the sparse patterns,
Swin's windows, saturation, RoPE offsets). The figures of 9.2, 9.5 and 9.6 drawn here are laid out in inches,
``WIDTH`` wide, with labels of at least ``SMALL`` points, as ``helpers.mechanisms`` lays out its own.

What a figure shows is computed in its notebook; these functions only lay it out, so that a figure cell
reads as the call and the figure.
"""

import contextlib
from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.colors import ListedColormap, to_rgb
from matplotlib.font_manager import FontProperties
from matplotlib.legend_handler import HandlerTuple
from matplotlib.lines import Line2D
from matplotlib.patches import FancyBboxPatch, Rectangle
from matplotlib.textpath import text_to_path

from helpers.checks import floating, integer, positive_int, tensor
from helpers.plotting import PALETTE
from helpers.vision import patches, window_borders

SIZE, SMALL = 10, 9                                   # points: the book's font size, the smallest label (as in mechanisms)
WIDTH = 6.5                                           # inches: the site's column (see helpers.mechanisms)
DARK_YELLOW = "#A89200"                               # Okabe and Ito's yellow darkened: 3.1:1 against white, #F0E442 1.3:1
MAY_ATTEND, HIDDEN = PALETTE["blue"], "white"         # the chapter's mask colours (see MASK_STYLE)
# A block's sublayers in 9.4's diagrams: self-attention purple, cross-attention green, the MLP grey. Not the
# colours of the queries (vermillion), keys (sky) and values (orange) of 9.1 and 9.2 (helpers.mechanisms), nor
# the masks' blue, so that a box does not read as one of those.
ATTENTION_COLOR, CROSS_COLOR, MLP_COLOR = PALETTE["purple"], PALETTE["green"], "0.85"


def _luminance(rgb):
    """WCAG relative luminance of an sRGB colour with components in [0, 1]."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb[:3]]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def _axes(ax):
    """``ax`` itself, if it is a matplotlib ``Axes`` (as ``plt.subplots`` gives)."""
    if not isinstance(ax, Axes):
        raise ValueError(f"ax must be a matplotlib Axes, got {type(ax).__name__}")
    return ax


def text_color(background):
    """"white" or "black", whichever contrasts more with ``background`` (WCAG contrast ratio)."""
    rgb = to_rgb(background)
    if not all(0 <= c <= 1 for c in rgb):                   # matplotlib lets NaN components through
        raise ValueError(f"background must be a colour with components in [0, 1], got {background!r}")
    lum = _luminance(rgb)
    return "white" if (1.0 + 0.05) / (lum + 0.05) > (lum + 0.05) / 0.05 else "black"


def _matrix(values, name="values"):
    """``values`` (a tensor, array or nested list) as a non-empty ``(rows, cols)`` float64 array."""
    if values.is_complex() if isinstance(values, torch.Tensor) else np.iscomplexobj(values):
        raise ValueError(f"{name} must be real numbers, got complex ones: draw their .abs() or .real")
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().to(torch.float64).numpy()          # bfloat16 has no NumPy twin
    try:
        values = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name} must be a matrix of real numbers: {error}") from None
    if values.ndim != 2 or not values.size:
        raise ValueError(f"{name} must be a non-empty (rows, cols) matrix, got shape {values.shape}")
    return values


@contextlib.contextmanager
def _closed_on_error(fig):
    """Close ``fig`` if drawing it fails, so that a refused call leaves no figure open."""
    try:
        yield fig
    except BaseException:
        plt.close(fig)
        raise


def annotated_heatmap(ax, values, fmt="{:.2f}", fontsize=7, **style):
    """Draw ``values (rows, cols)`` on ``ax`` with ``imshow(**style)`` and write each value in its cell.

    ``fmt`` is a format string (``"{:.2f}"``) or a function from the value to its label. Each label is
    white or black, whichever contrasts more with its cell's colour, taken from the colormap. NaN
    cells, which ``imshow`` leaves blank, get no label: mask a matrix with NaN to hide cells. Infinite
    cells are blank too, but labelled, in the colour that contrasts with the blank. Complex values are
    refused (``imshow`` would drop their imaginary part). Returns the image, for a colorbar.
    """
    _axes(ax)
    values = _matrix(values)
    label = fmt.format if isinstance(fmt, str) else fmt
    if not callable(label):
        raise ValueError(f"fmt must be a format string or a function, got {fmt!r}")
    image = ax.imshow(values, **style)
    # A blank cell shows the colormap's "bad" colour (transparent by default) over the axes' background;
    # the colormap's colour of -inf (its "under" colour) is not what shows, and could hide the label.
    bad, face = image.cmap(np.nan), to_rgb(ax.get_facecolor())
    blank = text_color([c * bad[3] + f * (1 - bad[3]) for c, f in zip(bad[:3], face, strict=True)])
    for (i, j), v in np.ndenumerate(values):
        if not np.isnan(v):
            color = text_color(image.cmap(image.norm(v))) if np.isfinite(v) else blank
            try:
                text = label(v)
            except (TypeError, ValueError, IndexError, KeyError) as error:
                raise ValueError(f"fmt {fmt!r} cannot format the value {v}: {error}") from None
            ax.text(j, i, text, ha="center", va="center", fontsize=fontsize, color=color)
    return image


def mask_grid(ax, mask, title):
    """Draw a boolean ``mask (queries, keys)`` as a grid, blue where attention is allowed (``False``), white
    where it is hidden: the chapter's colours for masks (``MAY_ATTEND``, ``HIDDEN``).

    True means hidden, as in ``helpers.attention.causal_mask``.
    """
    _axes(ax)
    if tensor(mask, "mask").dim() != 2 or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a (queries, keys) bool tensor, got {mask.dtype} of shape {tuple(mask.shape)}")
    ax.imshow((~mask).cpu().numpy(), cmap=ListedColormap([HIDDEN, MAY_ATTEND]), vmin=0, vmax=1)
    ax.set_xticks([])                                    # no major ticks: one at 2.5 would hide that gridline
    ax.set_yticks([])
    ax.set_xticks(np.arange(mask.shape[1]) - 0.5, minor=True)
    ax.set_yticks(np.arange(mask.shape[0]) - 0.5, minor=True)
    ax.grid(which="minor", color="0.75", lw=0.5)
    ax.tick_params(which="both", length=0, labelbottom=False, labelleft=False)
    for spine in ax.spines.values():                     # a closed frame, as masks_on_batch draws: hidden cells end somewhere
        spine.set(visible=True, linewidth=1, color="black")
    ax.set_title(title, fontsize=SMALL)
    ax.set_xlabel("keys", fontsize=SMALL, labelpad=2)
    ax.set_ylabel("queries", fontsize=SMALL, labelpad=2)


# The chapter's colours for attention: blue where a query may attend to a key (and, in the weights' Blues, the
# larger a weight the bluer), white where a key is hidden. The mask panel of 9.2's weights figure and its mask
# control keep them: blue where a key is visible (0 added to its score), white where it is hidden (-inf
# added), as mask_grid and masks_on_batch draw a later key. Pass MASK_STYLE to annotated_heatmap with a 0/1
# mask matrix, 1 where a key is hidden.
MASK_STYLE = dict(cmap=ListedColormap([MAY_ATTEND, HIDDEN]), vmin=0, vmax=1, fontsize=SMALL,
                  fmt=lambda hidden: "$-\\infty$" if hidden else "0")


def _text_width(text, size):
    """How wide one line of ``text`` is set at ``size`` points, in inches."""
    return text_to_path.get_text_width_height_descent(text, FontProperties(size=size), ismath="$" in text)[0] / 72


def _wrapped(text, width, size=SMALL):
    """``text`` on as few lines as keep each within ``width`` inches at ``size`` points (breaking at spaces)."""
    lines = []
    for word in text.split():
        if lines and _text_width(f"{lines[-1]} {word}", size) <= width:
            lines[-1] += f" {word}"
        else:
            lines.append(word)
    return "\n".join(lines)


def transformer_block(families):
    """Figure 9.4.1: a pre-normalization transformer block (``block_diagram``) and, right of it, the masks of
    the families of transformers (``mask_grid``), every grid at one cell size, under one legend (blue: may
    attend).

    ``families`` maps ``"family: panel"`` to a ``(queries, keys)`` bool mask (True hides a key), in the order
    drawn, as ``"encoder–decoder: cross-attention (decoder → encoder)"``: the panels of one family (the text
    before the first colon) sit side by side under one heading, and the families fill rows, a family that
    does not fit on a row starting the next. The figure is 6.5 inches wide, the site's column (see
    ``helpers.mechanisms``). Returns the figure.
    """
    groups = {}
    for name, mask in families.items():
        family, colon, panel = str(name).partition(":")
        if not colon or not family.strip() or not panel.strip():
            raise ValueError(f"each name must read 'family: panel', got {name!r}")
        if tensor(mask, "mask").dim() != 2 or mask.dtype != torch.bool:
            raise ValueError(f"{name!r}: a mask must be a (queries, keys) bool tensor, got {mask.dtype} "
                             f"of shape {tuple(mask.shape)}")
        groups.setdefault(" ".join(family.split()), []).append((" ".join(panel.split()), mask))
    if not groups:
        raise ValueError("families must hold at least one 'family: panel' mask")
    W, left, right, label, gap, between = 6.5, 2.45, 6.45, 0.22, 0.25, 0.45     # inches
    space = right - left

    def width(row, u):
        """How wide a row of families is with cells of ``u`` inches: each grid, the queries' label left of it."""
        return sum(sum(m.shape[1] * u + label for _, m in groups[f]) + gap * (len(groups[f]) - 1) for f in row) \
            + between * (len(row) - 1)

    rows, u = [], 0.2
    for family in groups:                                   # a family starts a new row where it does not fit
        if rows and width([*rows[-1], family], u) <= space:
            rows[-1].append(family)
        else:
            rows.append([family])
    while max(width(row, u) for row in rows) > space:
        u *= 0.95
    titles = {f: [_wrapped(p, max(m.shape[1] * u + gap + 0.05, 0.9)) for p, m in groups[f]] for f in groups}
    lines = [max(t.count("\n") + 1 for f in row for t in titles[f]) for row in rows]
    grids = [max(m.shape[0] for f in row for _, m in groups[f]) * u for row in rows]
    heights = [0.3 + 0.16 * n + 0.1 + g + 0.3 for n, g in zip(lines, grids, strict=True)]   # heading, titles, grid, keys
    H = sum(heights) + 0.2 * (len(rows) - 1) + 0.5
    fig = plt.figure(figsize=(W, H))
    with _closed_on_error(fig):
        block_diagram(fig.add_axes((0.05 / W, 0.1 / H, 2.2 / W, (H - 0.2) / H)))
        top = H - 0.05
        for row, n, height in zip(rows, lines, heights, strict=True):
            (_, last), title = groups[row[-1]][-1], titles[row[-1]][-1]
            beyond = max(0, max(_text_width(t, SMALL) for t in title.split("\n")) - last.shape[1] * u) / 2   # its title's
            x = min(left + (space - width(row, u)) / 2, W - 0.05 - beyond - width(row, u))
            grid_top = top - 0.3 - 0.16 * n - 0.1
            for family in row:
                start = x
                for (_, mask), title in zip(groups[family], titles[family], strict=True):
                    x += label
                    ax = fig.add_axes((x / W, (grid_top - mask.shape[0] * u) / H, mask.shape[1] * u / W, mask.shape[0] * u / H))
                    mask_grid(ax, mask, title)
                    x += mask.shape[1] * u + gap
                x -= gap
                fig.text((start + x) / 2 / W, (top - 0.12) / H, family, ha="center", va="center", fontsize=SIZE)
                fig.add_artist(Line2D([start / W, x / W], [(top - 0.26) / H] * 2, color="0.5", lw=0.8))
                x += between
            top -= height + 0.2
        x = left + 0.3
        for color, text in [(MAY_ATTEND, "blue: may attend"), (HIDDEN, "white: hidden")]:
            fig.add_artist(Rectangle((x / W, 0.12 / H), 0.2 / W, 0.2 / H, fc=color, ec="0.4", lw=0.8))
            fig.text((x + 0.28) / W, 0.22 / H, text, ha="left", va="center", fontsize=SMALL)
            x += 0.28 + _text_width(text, SMALL) + 0.4
    return fig


def heatmap_row(panels, ylabel, figsize=None):
    """A row of annotated heat maps sharing their rows: ``panels`` is a list of ``(values, title, xlabel,
    style)``, ``style`` the keyword arguments of ``annotated_heatmap`` (NaN cells stay blank). Each panel
    is as wide as its number of columns, ticks every row and column, and labels its rows ``ylabel``
    (each panel may be read alone). Returns the figure."""
    if not panels:
        raise ValueError("panels must list at least one (values, title, xlabel, style)")
    panels = [(_matrix(values, f"panels[{k}]'s values"), *rest) for k, (values, *rest) in enumerate(panels)]
    widths = [values.shape[1] for values, *_ in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=figsize, width_ratios=widths, squeeze=False)
    with _closed_on_error(fig):
        for ax, (values, title, xlabel, style) in zip(axes[0], panels, strict=True):
            annotated_heatmap(ax, values, **style)
            rows, cols = values.shape
            ax.set(title=title, xlabel=xlabel, ylabel=ylabel, xticks=range(cols), yticks=range(rows))
        fig.tight_layout()
    return fig


def two_decimals(v):
    """``v`` written to 2 decimals, a small negative number as 0.00 (not -0.00)."""
    return f"{round(v, 2) + 0.0:.2f}"


# 9.2's attention heat maps: scores and outputs on one diverging scale, weights from 0 (white) to 1 (blue).
SIGNED_STYLE = dict(cmap="PuOr_r", vmin=-1.5, vmax=1.5, fmt=two_decimals)
WEIGHT_STYLE = dict(cmap="Blues", vmin=0, vmax=1, fmt=two_decimals)


def attention_maps(tokens, hidden, weights, outputs, scores=None):
    """9.2's heat maps of masked self-attention on one sequence of ``T = len(tokens)`` tokens: the ``scores (T,
    T)``, if given; the mask ``hidden (T, T)``, bool, True where a key is hidden, drawn as the 0 or -inf added
    to the scores (``MASK_STYLE``: blue, or white where hidden); the ``weights (T, T)``, blank (white) where
    hidden; and the ``outputs (T, d_v)``. Scores and outputs share ``SIGNED_STYLE``'s scale, the weights take
    ``WEIGHT_STYLE``'s, each value written by ``two_decimals`` at the book's smallest size, ``SMALL``.

    The panels fill rows of two, in that order (scores and mask, then weights and outputs), every cell the
    same size, the figure ``WIDTH`` inches wide (the site's column, see ``helpers.mechanisms``). The two
    panels of a row share their rows, the queries: the tokens label them left of the row's first panel, and
    the key columns under each panel. Where the cells are too narrow for the numbers (more than about 7
    tokens), the cells are left unwritten. Returns the figure; its axes are the panels, in order."""
    tokens = [str(t) for t in tokens]
    T = len(tokens)
    if tensor(hidden, "hidden").dtype != torch.bool or tuple(hidden.shape) != (T, T):
        raise ValueError(f"hidden must be a ({T}, {T}) bool tensor, one row and one column a token,"
                         f" got {hidden.dtype} of shape {tuple(hidden.shape)}")
    for name, values in (("scores", scores), ("weights", weights), ("outputs", outputs)):
        if values is None and name != "scores":
            raise ValueError(f"{name} must be a matrix, got None")
        shape = None if values is None else _matrix(values, name).shape
        if shape is not None and (shape[0] != T or (name != "outputs" and shape[1] != T)):
            raise ValueError(f"{name} must have {T} rows{'' if name == 'outputs' else f' and {T} columns'},"
                             f" one a token, got shape {shape}")
    blank = _matrix(weights).copy()
    blank[hidden.cpu().numpy()] = np.nan                                 # NaN: a blank cell
    panels = [] if scores is None else [(_matrix(scores), r"scores $QK^\top/\sqrt{d_k}$", "key $j$", SIGNED_STYLE)]
    panels += [(hidden.cpu().numpy().astype(float), "mask $M$", "key $j$", MASK_STYLE),
               (blank, "weights $A$", "key $j$", WEIGHT_STYLE),
               (_matrix(outputs), "outputs $Y = AV$", "value coordinate", SIGNED_STYLE)]
    rows = [panels[k:k + 2] for k in range(0, len(panels), 2)]
    tick = max(_text_width(t, SMALL) for t in tokens) + 0.1             # the tokens' room, with the ticks' pad
    left, gap, right = 0.05 + 0.22 + tick, 0.2, WIDTH - 0.05             # the queries' label and tokens; between panels
    u = min(0.5, (right - left - gap) / max(sum(v.shape[1] for v, *_ in row) for row in rows))     # a cell, inches
    widest = max(_text_width(two_decimals(v), SMALL) for values, *_ in panels for v in values[np.isfinite(values)])
    legible = u >= widest + 0.08                                          # the numbers fit their cells
    height = 0.3 + T * u + max(tick, 0.25) + 0.3                          # a row: title, cells, key labels, "key j"
    fig = plt.figure(figsize=(WIDTH, len(rows) * height))
    with _closed_on_error(fig):
        H = len(rows) * height
        for r, row in enumerate(rows):
            bottom, x = H - r * height - 0.3 - T * u, left
            for k, (values, title, xlabel, style) in enumerate(row):
                cols = values.shape[1]
                ax = fig.add_axes((x / WIDTH, bottom / H, cols * u / WIDTH, T * u / H))
                annotated_heatmap(ax, values, **{**style, "fontsize": SMALL})
                if not legible:
                    for text in list(ax.texts):
                        text.remove()
                ax.set_title(title, fontsize=SIZE, pad=4)
                ax.set_xlabel(xlabel, fontsize=SIZE, labelpad=3)
                ax.set_yticks(range(T), tokens if k == 0 else [""] * T)
                if k == 0:
                    ax.set_ylabel("query $i$", fontsize=SIZE, labelpad=3)
                if xlabel.startswith("key"):
                    ax.set_xticks(range(cols), tokens, rotation=90)
                else:
                    ax.set_xticks(range(cols))
                ax.tick_params(labelsize=SMALL, length=2)
                for spine in ax.spines.values():                          # a frame: white cells end somewhere
                    spine.set(visible=True, linewidth=0.8, color="0.3")
                x += cols * u + gap
    return fig


def cost_crossover(lengths, counts, d):
    """9.2's cost figure: FLOPs counted per forward pass of a transformer block against the cost model.

    ``counts[w]`` lists ``(linear, attention)`` FLOPs for each length in ``lengths`` at width ``w``; the
    left panel draws width ``d`` (points) with the model's $24Td^2$ and $4T^2d$ (lines), the right the
    attention share of every width against $T/d$ with the model $T/(T + 6d)$. Returns the figure.
    """
    if d not in counts:
        raise ValueError(f"no counts for the width d = {d}; counts has {sorted(counts)}")
    if len(counts) > 4:
        raise ValueError(f"the right panel shows up to 4 widths, got {len(counts)}")
    if any(len(c) != len(lengths) for c in counts.values()):
        raise ValueError("each width's counts must have one (linear, attention) pair per length")
    for w, pairs in counts.items():
        for pair in pairs:                                  # the share att / (lin + att) needs a positive sum
            if not (pair[0] >= 0 and pair[1] >= 0 and pair[0] + pair[1] > 0):
                raise ValueError(f"counts[{w}] must hold (linear, attention) FLOP counts, >= 0 and not both 0,"
                                 f" got {pair}")
    fig, (left, right) = plt.subplots(1, 2)
    with _closed_on_error(fig):
        T = np.asarray(lengths, dtype=float)
        left.plot(T, 24 * T * d**2, color=PALETTE["blue"], label="$24Td^2$ (projections, MLP)")
        left.plot(T, 4 * T**2 * d, color=PALETTE["vermillion"], label="$4T^2d$ (scores, weighted sum)")
        (counted_linear,) = left.plot(T, [lin for lin, _ in counts[d]], "o", ms=4, color=PALETTE["blue"])
        (counted_attention,) = left.plot(T, [att for _, att in counts[d]], "s", ms=4, color=PALETTE["vermillion"])
        left.axvline(6 * d, color="gray", ls="--", lw=1)
        left.text(6 * d * 1.15, 24 * 6 * d**3 / 4, "$T = 6d$", color="gray")
        left.set(xscale="log", yscale="log", xlabel="sequence length $T$", ylabel=f"FLOPs per forward pass ($d = {d}$)")
        handles, labels = left.get_legend_handles_labels()
        # One legend entry shows both markers, the circles and the squares the points are drawn with.
        left.legend(handles + [(counted_linear, counted_attention)], labels + ["counted by FlopCounterMode"],
                    handler_map={tuple: HandlerTuple(ndivide=None)}, loc="upper left", fontsize=8)
        ratio = np.logspace(np.log10(T.min() / max(counts)) - 0.2, np.log10(T.max() / min(counts)) + 0.2, 200)
        right.plot(ratio, ratio / (ratio + 6), color="gray", lw=1, label="model $T/(T + 6d)$")
        marks = [("o", 9, "blue"), ("^", 6, "orange"), ("s", 3, "green"), ("D", 2, "purple")]   # nested: overlaps stay visible
        for (w, pairs), (marker, size, color) in zip(sorted(counts.items()), marks[:len(counts)], strict=True):
            share = [att / (lin + att) for lin, att in pairs]
            right.plot(T / w, share, marker, ms=size, mfc="none", mew=1.2, color=PALETTE[color], label=f"counted, $d = {w}$")
        right.axvline(6, color="gray", ls="--", lw=1)
        right.axhline(0.5, color="gray", ls=":", lw=1)
        right.set(xscale="log", xlabel="$T / d$", ylabel="scores and weighted sums' share", ylim=(0, 1))
        right.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
    return fig


def saturation_panels(sigmas, p_max, norm, eps, marks, exact=None, saturated=None):
    """Appendix A's figure: softmax saturation against the spread ``sigmas (S,)`` of the scores.

    ``p_max`` and ``norm`` are ``(S, N)``: the largest weight and the Jacobian's Frobenius norm of N score
    vectors at each spread. ``eps (S, M)`` is ``1 - p_max`` of the first M of them (M <= N) and ``exact
    (S, M)`` their norms (default ``norm[:, :M]``). Left: the mean largest weight, the mean and median
    norm, a dotted line at the mean norm at spread 1, a dash-dotted grey line at the norm ``saturated``
    below which a query counts as saturated (if given), and a vertical line at each ``{sigma: label}`` of
    ``marks``. Right: each of the M vectors' norm against its ``eps`` (those above 1e-12, below which both
    are rounding noise) between the bounds ``p_max * eps`` and ``4 * eps``. Returns the figure.
    """
    sigmas, p_max, norm, eps = (torch.as_tensor(t, dtype=torch.float64) for t in (sigmas, p_max, norm, eps))
    if sigmas.dim() != 1 or not p_max.shape == norm.shape == (len(sigmas), p_max.shape[-1]):
        raise ValueError("sigmas must be (S,) and p_max, norm (S, N)")
    exact = norm[:, :eps.shape[-1]] if exact is None else torch.as_tensor(exact, dtype=torch.float64)
    if not eps.shape == exact.shape == (len(sigmas), eps.shape[-1]) or eps.shape[-1] > norm.shape[-1]:
        raise ValueError("eps and exact must be (S, M), M <= N")
    if not isinstance(marks, Mapping):
        raise ValueError(f"marks must be a dict {{sigma: label}}, got {type(marks).__name__} {marks!r:.60}")
    fig, (left, right) = plt.subplots(1, 2)
    left.plot(sigmas, p_max.mean(1), color=PALETTE["vermillion"], marker="o", ms=3, label="mean largest weight $p_{\\max}$")
    left.plot(sigmas, norm.mean(1), color=PALETTE["blue"], marker="s", ms=3, label="mean $\\|J\\|_F$")
    left.plot(sigmas, norm.median(1).values, color=PALETTE["blue"], ls="--", lw=1, label="median $\\|J\\|_F$")
    at_one = norm[torch.argmin((sigmas - 1).abs())].mean()
    left.axhline(at_one, color=PALETTE["blue"], ls=":", lw=1, label="mean $\\|J\\|_F$ at $\\sigma=1$")
    if saturated is not None:
        left.axhline(saturated, color="gray", ls="-.", lw=1, label=f"saturated below {saturated:g}")
    for sigma, text in marks.items():
        left.axvline(sigma, color="gray", ls=":", lw=1)
        left.text(sigma * 1.08, 0.4, text, fontsize=8, color="gray", rotation=90, va="bottom")
    left.set(xscale="log", xlabel="spread of the scores $\\sigma$", ylabel="mean or median over the queries",
             ylim=(0, 1.05), title=f"{norm.shape[-1]:,} queries at each $\\sigma$")
    left.legend(loc="upper left", fontsize=8)
    keep = eps > 1e-12
    right.loglog(eps[keep], exact[keep], ".", ms=2, alpha=0.3, color=PALETTE["blue"], label="one query at one $\\sigma$")
    e = torch.logspace(-12, 0, 50).clamp_max(float(eps.max()))
    right.loglog(e, 4 * e, color=PALETTE["black"], lw=1, label="$4\\varepsilon$")
    right.loglog(e, e * (1 - e), color=PALETTE["black"], lw=1, ls="--", label="$p_{\\max}\\varepsilon$")
    right.set(xlabel="$\\varepsilon = 1 - p_{\\max}$", ylabel="$\\|J\\|_F$",
              title=f"the first {eps.shape[-1]:,} queries, every $\\sigma$")
    right.legend(fontsize=8, markerscale=4)
    fig.tight_layout()
    return fig


def offset_panels(S, offsets, curve, at_zero):
    """Appendix B's figure: a RoPE score matrix ``S (T, T)`` (query position m, key position n) as a heat map,
    and its entries against the offset n - m over the closed form ``curve`` drawn at ``offsets``, with
    the score ``at_zero`` at offset 0 marked. Returns the figure."""
    S = torch.as_tensor(S)
    if S.dim() != 2 or S.shape[0] != S.shape[1]:
        raise ValueError(f"S must be a square (T, T) matrix, got shape {tuple(S.shape)}")
    T = S.shape[0]
    fig, (left, right) = plt.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.7]}, layout="constrained")
    image = left.imshow(S)
    left.set(xlabel="key position $n$", ylabel="query position $m$", title="score of query $m$ and key $n$")
    fig.colorbar(image, ax=left, shrink=0.8, label="score")
    m, n = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    right.plot(offsets, curve, color=PALETTE["black"], lw=0.8, label="closed form")
    right.plot((n - m).flatten(), S.flatten(), "o", ms=3, alpha=0.3, color=PALETTE["orange"], label=f"all {T * T:,} scores")
    right.plot(0, at_zero, "s", color=PALETTE["blue"], label="offset 0: $q^\\top k$")
    right.set(xlabel="offset $n - m$", ylabel="score $(R_mq)^\\top(R_nk)$", title="the same scores against the offset")
    right.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=3)
    return fig


def block_diagram(ax):
    """A pre-normalization transformer block on ``ax``, bottom to top, in axes units.

    The residual stream runs up the left from the input $x$ to the output $x'$; two branches leave it,
    LayerNorm then multi-head attention and LayerNorm then MLP, each added back at a plus sign. The
    attention is drawn ``ATTENTION_COLOR`` (purple), the MLP ``MLP_COLOR`` (grey), as ``encoder_decoder_wiring`` draws them.
    """
    _axes(ax).set(xlim=(0, 1), ylim=(0, 1), aspect="auto")
    ax.axis("off")
    stream_x, box_x = 0.25, 0.68

    def box(y, height, text, color):
        ax.add_patch(FancyBboxPatch((box_x - 0.2, y - height / 2), 0.4, height, boxstyle="round,pad=0.01",
                                    fc=color, ec="black", lw=1))
        ax.text(box_x, y, text, ha="center", va="center", color=text_color(color))

    def arrow(start, end):
        ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="-|>", color="black", lw=1.2))

    arrow((stream_x, 0.04), (stream_x, 0.96))                              # the residual stream
    ax.text(stream_x, 0.015, "$x$ (embeddings)", ha="center", va="center")
    ax.text(stream_x, 0.97, "$x'$", ha="center", va="bottom")                 # clear of the arrowhead
    for y0, layer, color in [(0.12, "multi-head\nattention", ATTENTION_COLOR), (0.55, "MLP", MLP_COLOR)]:
        ax.plot([stream_x, box_x, box_x], [y0, y0, y0 + 0.05], color="black", lw=1.2)
        box(y0 + 0.09, 0.07, "LayerNorm", "white")
        arrow((box_x, y0 + 0.125), (box_x, y0 + 0.175))
        box(y0 + 0.23, 0.1, layer, color)
        ax.plot([box_x, box_x], [y0 + 0.29, y0 + 0.36], color="black", lw=1.2)
        arrow((box_x, y0 + 0.36), (stream_x + 0.035, y0 + 0.36))            # added back to the stream
        ax.plot(stream_x, y0 + 0.36, "o", ms=16, mfc="white", mec="black", mew=1.2, zorder=3)
        ax.text(stream_x, y0 + 0.36, "+", ha="center", va="center", fontsize=12, zorder=4)
    ax.text(0.02, 0.5, "residual stream", rotation=90, ha="center", va="center", color="0.3")


def vit_input(img, P, cls_color=PALETTE["orange"]):
    """A figure of a ViT's input in three panels: top left, ``img (3, S, S)`` on its grid of ``P x P`` patches;
    top right, the patches pulled apart and numbered from 1 in raster order; below, the token sequence, a
    class token (position 0) followed by the flattened patches (position i is patch i), in lines of 25 tokens.

    ``img`` holds real floating-point values in ``[0, 1]``, as ``helpers.vision.sample_image`` gives
    (convert 8-bit images with ``img / 255``). Laid out in inches, ``WIDTH`` wide (the site's column), for up
    to 7 x 7 patches, every label at least ``SMALL`` points; returns the figure, its axes the three panels.
    """
    if floating(img, "img").dim() != 3 or img.shape[0] != 3 or img.shape[1] != img.shape[2]:
        raise ValueError(f"img must be a square RGB image (3, S, S), got shape {tuple(img.shape)}")
    if not ((img >= 0) & (img <= 1)).all():
        raise ValueError("img's values must lie in [0, 1] (and not be NaN), as imshow draws them")
    if img.dtype in (torch.float16, torch.bfloat16):
        img = img.float()                                    # NumPy and imshow take float32
    img = img.detach().cpu()
    P, S = positive_int(P, "P"), img.shape[-1]
    tokens = patches(img, P)                                 # (n * n, 3, P, P) in raster order; checks P
    n = S // P
    if n > 7:
        raise ValueError(f"the layout fits up to 7 x 7 patches, got {n} x {n}: take a larger P")
    per_line, pitch, side = 25, 0.24, 0.21                   # the sequence: tokens a line, inches a token, a token's side
    lines = -(-(n * n + 1) // per_line)
    panel, x_image, x_grid = 2.75, 0.45, WIDTH - 0.1 - 2.75  # the top panels' side and left edges
    y_sequence = 0.2 + lines * 0.55                          # the sequence's top, over its footnote
    y_panel = y_sequence + 0.35 + 0.55                       # the top panels' bottom, over the sequence's heading and
                                                             # the image's tick labels
    W, H = WIDTH, y_panel + panel + 0.55
    fig = plt.figure(figsize=(W, H))

    def box(x, y, w, h):
        """Axes placed in inches from the figure's bottom left corner."""
        return fig.add_axes((x / W, y / H, w / W, h / H))

    with _closed_on_error(fig):
        ax = box(x_image, y_panel, panel, panel)             # the image on its grid
        ax.imshow(img.permute(1, 2, 0).numpy())
        for x in range(P, S, P):
            ax.axhline(x - 0.5, color="white", lw=1)
            ax.axvline(x - 0.5, color="white", lw=1)
        ax.set(xticks=range(0, S + 1, P), yticks=range(0, S + 1, P))
        ax.set_title(f"the image on a {n} x {n} grid", fontsize=SIZE)
        ax.set_xlabel("pixels", fontsize=SMALL, labelpad=2)
        ax.tick_params(labelsize=SMALL, length=2, pad=2)

        # The patches and the sequence are drawn on two axes in inches, each patch an image placed by its
        # extent: one axes per patch (99 of them) would take most of the figure's drawing time.
        grid = box(x_grid, y_panel, panel, panel)            # the patches pulled apart
        gap = 0.06
        cut = panel / n - gap
        for i in range(n * n):
            r, c = divmod(i, n)
            x, y = c * (cut + gap), panel - (r + 1) * (cut + gap) + gap
            grid.imshow(tokens[i].permute(1, 2, 0).numpy(), extent=(x, x + cut, y, y + cut))
            grid.text(x + 0.02, y + cut - 0.02, str(i + 1), color="white", fontsize=SMALL, va="top", ha="left",
                      bbox=dict(boxstyle="square,pad=0.1", fc="black", ec="none", alpha=0.6))
        grid.set(xlim=(0, panel), ylim=(0, panel))
        grid.set_title(f"its {n * n} patches of {P} x {P} pixels,\nnumbered in raster order", fontsize=SIZE)
        grid.set_axis_off()

        fig.text(x_image / W, (y_sequence + 0.1) / H, f"the token sequence: a learned class token, then the {n * n}"
                 " flattened patches", fontsize=SIZE, va="bottom")
        height = lines * 0.55
        sequence = box(x_image, y_sequence - height, per_line * pitch, height)
        cls = torch.tensor(to_rgb(cls_color), dtype=img.dtype)
        for i in range(n * n + 1):
            r, c = divmod(i, per_line)
            x, y = c * pitch, height - side - r * 0.55
            sequence.imshow((cls.expand(P, P, 3) if i == 0 else tokens[i - 1].permute(1, 2, 0)).numpy(),
                            extent=(x, x + side, y, y + side))
            if i == 0:
                sequence.text(x + side / 2, y + side / 2, "cls", ha="center", va="center", fontsize=SMALL,
                              color=text_color(cls_color))
            if i % 5 == 0 or i == n * n:
                sequence.text(x + side / 2, y - 0.03, str(i), ha="center", va="top", fontsize=SMALL)
        sequence.set(xlim=(0, per_line * pitch), ylim=(0, height))
        sequence.set_axis_off()
        fig.text(x_image / W, 0.1 / H, "position in the sequence (token 0 is the class token, token i is patch i)",
                 fontsize=SMALL)
    return fig


def _inch_axes(fig, x, y, w, h):
    """Axes placed in inches from the bottom left corner of ``fig``."""
    W, H = fig.get_size_inches()
    return fig.add_axes((x / W, y / H, w / W, h / H))


def _frame(ax):
    """All four spines, thin and dark: a panel's white cells end somewhere."""
    for spine in ax.spines.values():
        spine.set(visible=True, linewidth=0.8, color="0.3")


def sparse_patterns(patterns, reach, token):
    """9.5's figure of sparse attention: each of ``patterns`` (a dict of up to 3 names to ``(T, T)`` bool
    patterns, True where a query, the row, may attend to a key, the column) as a grid, blue where a score is
    computed, side by side; and under them, as wide as the figure, ``reach (layers, T)``, bool: row ``n - 1``
    True at the positions whose information reaches position ``token`` after ``n`` windowed layers, in
    orange. Ticks at the first, the ``token``-th and the last position. ``WIDTH`` wide, every label at least
    ``SMALL`` points. Returns the figure, its axes the patterns in order, then the reach."""
    if not isinstance(patterns, Mapping) or not 1 <= len(patterns) <= 3:
        raise ValueError(f"patterns must be a dict of 1 to 3 names to (T, T) bool patterns, got {patterns!r:.60}")
    grids = [tensor(p, f"patterns[{name!r}]") for name, p in patterns.items()]
    T = grids[0].shape[-1]
    if any(g.dtype != torch.bool or tuple(g.shape) != (T, T) for g in grids):
        raise ValueError(f"every pattern must be a ({T}, {T}) bool tensor, got "
                         f"{[(str(g.dtype), tuple(g.shape)) for g in grids]}")
    if tensor(reach, "reach").dtype != torch.bool or reach.dim() != 2 or reach.shape[1] != T or not 1 <= len(reach) <= 12:
        raise ValueError(f"reach must be a (layers, {T}) bool tensor, 1 to 12 layers, got {reach.dtype} of shape"
                         f" {tuple(reach.shape)}")
    token = integer(token, "token")
    if not 0 <= token < T:
        raise ValueError(f"token must be a position from 0 to {T - 1}, got {token}")
    ticks = sorted({0, token, T - 1})
    left, gap, right = 0.55, 0.4, WIDTH - 0.05                 # "query position" and its ticks; between panels
    side = (right - left - gap * 2) / 3                         # three squares fill the width; fewer keep their size
    row = 0.2                                                    # inches per layer of the reach
    y_reach = 0.55                                               # its bottom, over its ticks and "position"
    y_grids = y_reach + len(reach) * row + 0.3 + 0.6            # their bottom, over the reach's title and their ticks
    fig = plt.figure(figsize=(WIDTH, y_grids + side + 0.3))
    with _closed_on_error(fig):
        blue, orange = ListedColormap(["white", PALETTE["blue"]]), ListedColormap(["white", PALETTE["orange"]])
        for k, (name, grid) in enumerate(zip(patterns, grids, strict=True)):
            ax = _inch_axes(fig, left + k * (side + gap), y_grids, side, side)
            ax.imshow(grid.cpu().numpy(), cmap=blue, vmin=0, vmax=1)
            ax.set_title(name, fontsize=SIZE, pad=4)
            ax.set_xlabel("key position", fontsize=SIZE, labelpad=2)
            ax.set(xticks=ticks, yticks=ticks)
            if k == 0:
                ax.set_ylabel("query position", fontsize=SIZE, labelpad=2)
            ax.tick_params(labelsize=SMALL, length=2, pad=2)
            _frame(ax)
        ax = _inch_axes(fig, left, y_reach, right - left, len(reach) * row)
        ax.imshow(reach.cpu().numpy(), cmap=orange, vmin=0, vmax=1, aspect="auto")
        ax.set_title(f"the positions whose information reaches token {token}, after 1 to {len(reach)} windowed layers",
                     fontsize=SIZE, pad=4)
        ax.set_xlabel("position", fontsize=SIZE, labelpad=2)
        ax.set_ylabel("layers", fontsize=SIZE, labelpad=2)
        ax.set(xticks=ticks, yticks=range(len(reach)), yticklabels=range(1, len(reach) + 1))
        ax.tick_params(labelsize=SMALL, length=2, pad=2)
        _frame(ax)
    return fig


SWIN_LINES = dict(colors="white", linewidths=3)                            # a window's border
MASK_LINES = dict(colors=DARK_YELLOW, linewidths=2, linestyles=(0, (3, 2)))   # a masked piece's border, dashed


def window_panel(ax, image, ids, title, numbered=True, regular=None):
    """One panel of 9.6's Swin figures on ``ax``: ``image (H, W, 3)`` on the ``n x n`` grid of patches that
    ``ids (n, n)`` numbers by window (``helpers.vision.window_ids``). Without ``regular``, the windows of
    ``ids`` are outlined in thick white lines; with it (the regular windows' ids), ``ids`` are shifted windows
    rolled into the regular ones: their pieces are outlined in dashed dark-yellow lines (the mask's borders)
    under the regular windows' thick white ones. ``numbered`` writes each window's number at its middle.
    Ticks every two patches, at the book's smallest size."""
    _axes(ax)
    n = ids.shape[0]
    ax.imshow(torch.as_tensor(image).detach().cpu().numpy(), extent=(0, n, n, 0))
    ax.add_collection(LineCollection(window_borders(ids), **(SWIN_LINES if regular is None else MASK_LINES)))
    if regular is not None:
        ax.add_collection(LineCollection(window_borders(regular), **SWIN_LINES))
    if numbered:
        for w in ids.unique().tolist():
            rows, cols = (ids == w).nonzero(as_tuple=True)
            ax.text(cols.float().mean() + 0.5, rows.float().mean() + 0.5, str(w), ha="center", va="center",
                    fontsize=SMALL, color="black", bbox=dict(boxstyle="circle,pad=0.2", fc="white", ec="none", alpha=0.85))
    ax.set(xticks=range(0, n + 1, 2), yticks=range(0, n + 1, 2), xlim=(0, n), ylim=(n, 0))
    ax.set_title(title, fontsize=SIZE, pad=4)
    ax.set_xlabel("patch column", fontsize=SIZE, labelpad=2)
    ax.tick_params(labelsize=SMALL, length=2, pad=2)


def window_panels(panels):
    """A row of ``window_panel``s, ``panels`` a list of 1 to 3 ``(image, ids, title, numbered, regular)``, every
    panel the same size, at most ``WIDTH`` wide; the first labels its rows. Returns the figure."""
    if not 1 <= len(panels) <= 3:
        raise ValueError(f"panels must list 1 to 3 (image, ids, title, numbered, regular), got {len(panels)}")
    left, gap = 0.5, 0.3                                          # "patch row" and its ticks; between panels
    side = min(2.5, (WIDTH - 0.05 - left - 2 * gap) / 3 if len(panels) == 3 else (WIDTH - 0.05 - left - gap) / 2)
    lines = max(title.count("\n") + 1 for _, _, title, *_ in panels)
    fig = plt.figure(figsize=(left + len(panels) * side + (len(panels) - 1) * gap + 0.05, 0.6 + side + 0.12 + 0.19 * lines))
    with _closed_on_error(fig):
        for k, (image, ids, title, numbered, regular) in enumerate(panels):
            ax = _inch_axes(fig, left + k * (side + gap), 0.6, side, side)
            window_panel(ax, image, ids, title, numbered, regular)
        fig.axes[0].set_ylabel("patch row", fontsize=SIZE, labelpad=2)
    return fig


def shifted_windows(image, regular, shifted, rolled, shift):
    """Figure 9.6.3 (``window_panels``): ``image (H, W, 3)`` on its grid of patches, three times. Left, the
    ``regular`` windows; middle, the ``shifted`` ones (borders moved by ``shift`` patches), numbered; right,
    the image and the shifted windows rolled ``shift`` patches up and left (``rolled``, numbered, the pieces
    outlined in dashed dark yellow) inside the regular windows. Returns the figure."""
    cell = image.shape[0] // regular.shape[0]                       # pixels a patch
    moved = image.roll((-shift * cell, -shift * cell), dims=(0, 1))    # the image rolled with the grid
    return window_panels([(image, regular, "layer $l$:\nregular windows", False, None),
                          (image, shifted, "layer $l+1$:\nshifted windows", True, None),
                          (moved, rolled, "rolled:\n4 windows + mask", True, regular)])
