"""Drawing plumbing the figures share: annotated heatmaps, mask grids, the transformer block, the ViT input.

What a figure shows is computed in its notebook; these functions only lay it out, so that a figure cell
reads as the call and the figure.
"""

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import ListedColormap, to_rgb
from matplotlib.patches import FancyBboxPatch

from helpers.checks import positive_int, tensor
from helpers.plotting import PALETTE
from helpers.vision import patches


def _luminance(rgb):
    """WCAG relative luminance of an sRGB colour with components in [0, 1]."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb[:3]]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def text_color(background):
    """"white" or "black", whichever contrasts more with ``background`` (WCAG contrast ratio)."""
    lum = _luminance(to_rgb(background))
    return "white" if (1.0 + 0.05) / (lum + 0.05) > (lum + 0.05) / 0.05 else "black"


def annotated_heatmap(ax, values, fmt="{:.2f}", fontsize=7, **style):
    """Draw ``values (rows, cols)`` on ``ax`` with ``imshow(**style)`` and write each value in its cell.

    ``fmt`` is a format string (``"{:.2f}"``) or a function from the value to its label. Each label is
    white or black, whichever contrasts more with its cell's colour, taken from the colormap. NaN
    cells, which ``imshow`` leaves blank, get no label: mask a matrix with NaN to hide cells. Returns
    the image, for a colorbar.
    """
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    values = np.asarray(values, dtype=float)
    if values.ndim != 2 or not values.size:
        raise ValueError(f"values must be a non-empty (rows, cols) matrix, got shape {values.shape}")
    label = fmt.format if isinstance(fmt, str) else fmt
    if not callable(label):
        raise ValueError(f"fmt must be a format string or a function, got {fmt!r}")
    image = ax.imshow(values, **style)
    for (i, j), v in np.ndenumerate(values):
        if not np.isnan(v):
            color = text_color(image.cmap(image.norm(v)))
            ax.text(j, i, label(v), ha="center", va="center", fontsize=fontsize, color=color)
    return image


def mask_grid(ax, mask, title):
    """Draw a boolean ``mask (queries, keys)`` as a grid, filled where attention is allowed (``False``).

    True means hidden, as in ``helpers.attention.causal_mask``.
    """
    if tensor(mask, "mask").dim() != 2 or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a (queries, keys) bool tensor, got {mask.dtype} of shape {tuple(mask.shape)}")
    ax.imshow((~mask).numpy(), cmap=ListedColormap(["white", PALETTE["blue"]]), vmin=0, vmax=1)
    ax.set_xticks([])                                    # no major ticks: one at 2.5 would hide that gridline
    ax.set_yticks([])
    ax.set_xticks(np.arange(mask.shape[1]) - 0.5, minor=True)
    ax.set_yticks(np.arange(mask.shape[0]) - 0.5, minor=True)
    ax.grid(which="minor", color="0.75", lw=0.5)
    ax.tick_params(which="both", length=0, labelbottom=False, labelleft=False)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("keys", fontsize=8, labelpad=2)
    ax.set_ylabel("queries", fontsize=8, labelpad=2)


def block_diagram(ax):
    """A pre-normalization transformer block on ``ax``, bottom to top, in axes units.

    The residual stream runs up the left from the input $x$ to the output $x'$; two branches leave it,
    LayerNorm then multi-head attention and LayerNorm then MLP, each added back at a plus sign.
    """
    ax.set(xlim=(0, 1), ylim=(0, 1), aspect="auto")
    ax.axis("off")
    stream_x, box_x = 0.25, 0.68

    def box(y, height, text, color):
        ax.add_patch(FancyBboxPatch((box_x - 0.2, y - height / 2), 0.4, height, boxstyle="round,pad=0.01",
                                    fc=color, ec="black", lw=1))
        ax.text(box_x, y, text, ha="center", va="center")

    def arrow(start, end):
        ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="-|>", color="black", lw=1.2))

    arrow((stream_x, 0.04), (stream_x, 0.96))                              # the residual stream
    ax.text(stream_x, 0.015, "$x$ (embeddings)", ha="center", va="center")
    ax.text(stream_x, 0.985, "$x'$", ha="center", va="center")
    for y0, layer, color in [(0.12, "multi-head\nattention", PALETTE["sky"]), (0.55, "MLP", PALETTE["orange"])]:
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
    """A figure of a ViT's input: ``img (3, S, S)`` on its grid of ``P x P`` patches, the patches pulled
    apart in raster order, and the token sequence, a class token followed by the flattened patches.

    Laid out in inches for up to 7 x 7 patches (the sequence in lines of 25 tokens); returns the figure.
    """
    if tensor(img, "img").dim() != 3 or img.shape[0] != 3 or img.shape[1] != img.shape[2]:
        raise ValueError(f"img must be a square RGB image (3, S, S), got shape {tuple(img.shape)}")
    P, S = positive_int(P, "P"), img.shape[-1]
    tokens = patches(img, P)                                 # (n * n, 3, P, P) in raster order; checks P
    n = S // P
    if n > 7:
        raise ValueError(f"the layout fits up to 7 x 7 patches, got {n} x {n}: take a larger P")
    W, H = 8.0, 6.0                                          # figure size in inches
    fig = plt.figure(figsize=(W, H))

    def box(x, y, w, h):
        """Axes placed in inches from the figure's bottom left corner."""
        return fig.add_axes((x / W, y / H, w / W, h / H))

    ax = box(0.45, 2.3, 3.3, 3.3)                            # the image on its grid
    ax.imshow(img.permute(1, 2, 0).numpy())
    for x in range(P, S, P):
        ax.axhline(x - 0.5, color="white", lw=1)
        ax.axvline(x - 0.5, color="white", lw=1)
    ax.set(xticks=range(0, S + 1, P), yticks=range(0, S + 1, P), title=f"the image on a {n} x {n} grid")
    ax.set_xlabel("pixels", fontsize=8, labelpad=1)
    ax.tick_params(labelsize=7)

    # The patches and the sequence are drawn on two axes in inches, each patch an image placed by its
    # extent: one axes per patch (99 of them) would take most of the figure's drawing time.
    grid = box(4.45, 2.3, 3.3, 3.3)                          # the patches pulled apart
    side, gap = 3.3 / n - 0.06, 0.06
    for i in range(n * n):
        r, c = divmod(i, n)
        x, y = c * (side + gap), 3.3 - (r + 1) * (side + gap) + gap
        grid.imshow(tokens[i].permute(1, 2, 0).numpy(), extent=(x, x + side, y, y + side))
        grid.text(x + 0.02, y + side - 0.02, str(i + 1), color="white", fontsize=6, va="top", ha="left",
                  bbox=dict(boxstyle="square,pad=0.1", fc="black", ec="none", alpha=0.6))
    grid.set(xlim=(0, 3.3), ylim=(0, 3.3), title=f"{n * n} patches of {P} x {P} pixels, in raster order")
    grid.set_axis_off()

    fig.text(0.45 / W, 1.68 / H, f"the token sequence: a learned class token, then the {n * n} flattened patches")
    sequence = box(0.45, 0.25, 7.4, 1.2)                     # in lines of 25 tokens
    side, gap = 0.27, 0.025
    cls = torch.tensor(to_rgb(cls_color), dtype=img.dtype)
    for i in range(n * n + 1):
        r, c = divmod(i, 25)
        x, y = c * (side + gap), 0.9 - r * 0.75
        sequence.imshow((cls.expand(P, P, 3) if i == 0 else tokens[i - 1].permute(1, 2, 0)).numpy(),
                        extent=(x, x + side, y, y + side))
        if i == 0:
            sequence.text(x + side / 2, y + side / 2, "cls", ha="center", va="center", fontsize=7)
        if i % 5 == 0 or i == n * n:
            sequence.text(x + side / 2, y - 0.04, str(i), ha="center", va="top", fontsize=7)
    sequence.set(xlim=(0, 7.4), ylim=(0, 1.2))
    sequence.set_axis_off()
    fig.text(0.45 / W, 0.1 / H, "position in the sequence (token 0 is the class token, token i is patch i)", fontsize=8)
    return fig
