"""Pictures of the mechanisms (helpers.mechanisms, issue 33): each figure's labels come from its arguments,
bad arguments are refused before a figure opens, the SVG is byte-stable, and at the book's settings no two
labels overlap, none leaves the figure, and every label is legible where the site shows it: capitals at
least 9 pixels tall in the site's 672-pixel column, scripts at least 6, no limit set under a sign. The
chapter's colours hold throughout: blue where a query may attend, pale where a key is hidden, lines
legible on white; and what a figure sums up (a total, a share, a rounded sum) is what it draws."""

import io
import itertools
import math
import re
from fractions import Fraction

import matplotlib as mpl
import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.lines import Line2D
from matplotlib.patches import Circle, FancyBboxPatch, Rectangle
from matplotlib.text import Annotation
from matplotlib.textpath import text_to_path
from PIL import Image

from helpers import diagrams, mechanisms, plotting
from helpers.attention import causal_mask, padding_mask
from helpers.diagrams import _luminance
from helpers.plotting import PALETTE
from helpers.positions import frequencies
from helpers.vision import window_ids

SCORES = torch.tensor([1.2, -0.3, 2.1, 0.4, -1.0])
WEIGHTS = torch.softmax(SCORES, 0)
SENTENCE = "Your journey starts with one step".split()
SECOND = ["Take", "one", "small", "step", "<pad>", "<pad>"]
UNMASKED = torch.zeros(7, 7, dtype=torch.bool)
FAMILIES = {"encoder-only: self-attention": UNMASKED, "decoder-only: causal self-attention": causal_mask(5),
            "encoder–decoder: encoder self-attention": UNMASKED, "encoder–decoder: decoder causal self-attention": causal_mask(5),
            "encoder–decoder: cross-attention (decoder → encoder)": torch.zeros(5, 7, dtype=torch.bool)}
# 9.2's heat maps on its running example's shapes (six tokens, d_k = 4), and 9.5's and 9.6's data figures.
_G = torch.Generator().manual_seed(0)
_S = torch.randn(6, 6, generator=_G, dtype=torch.float64)
_A = torch.softmax(_S.masked_fill(causal_mask(6), float("-inf")), -1)
_Y = _A @ (torch.rand(6, 4, generator=_G, dtype=torch.float64) * 2.6 - 1.3)
_IMAGE = torch.rand(3, 224, 224, generator=_G)
_T = 32
_WINDOW = (torch.arange(_T)[:, None] - torch.arange(_T)[None, :]).abs() <= 2
_PATTERNS = {"sliding window": _WINDOW, "strided": _WINDOW | ((torch.arange(_T)[:, None] - torch.arange(_T)).remainder(8) == 0),
             "global tokens": _WINDOW | (torch.arange(_T)[:, None] < 2) | (torch.arange(_T)[None, :] < 2)}
_REACH = torch.stack([(torch.arange(_T) - 16).abs() <= 2 * n for n in range(1, 7)])
_REGULAR, _SHIFTED = window_ids(8, 8, 4), window_ids(8, 8, 4, shift=2)
_PHOTO = _IMAGE.permute(1, 2, 0)
# Each function at a typical size (the notebook's call) and at the largest (or most crowded) its layout takes.
CASES = {
    "soft_lookup": lambda: mechanisms.soft_lookup(WEIGHTS, [0.8, -0.5, 1.3, 0.1, -1.2], SCORES),
    "soft_lookup-8": lambda: mechanisms.soft_lookup(torch.full((8,), 1 / 8), torch.linspace(-10, 10, 8)),
    "encoder_decoder_attention": lambda: mechanisms.encoder_decoder_attention(6, torch.softmax(torch.arange(6.0), 0)),
    "encoder_decoder_attention-8": lambda: mechanisms.encoder_decoder_attention(8, step=12),
    "encoder_decoder_attention-2": lambda: mechanisms.encoder_decoder_attention(2),
    "qkv_projection": lambda: mechanisms.qkv_projection(6, 8, 4),
    "qkv_projection-tokens": lambda: mechanisms.qkv_projection(6, 8, 4, tokens=SENTENCE),
    "qkv_projection-32": lambda: mechanisms.qkv_projection(32, 32, 32),
    "qkv_projection-1": lambda: mechanisms.qkv_projection(1, 1, 1),
    "multi_head_split": lambda: mechanisms.multi_head_split(2, 5, 16, 4),
    "multi_head_split-many": lambda: mechanisms.multi_head_split(128, 1024, 4096, 32),
    "multi_head_split-1": lambda: mechanisms.multi_head_split(1, 1, 1, 1),
    "masks_on_batch": lambda: mechanisms.masks_on_batch([6, 4], 6),
    "masks_on_batch-tokens": lambda: mechanisms.masks_on_batch([6, 4], 6, tokens=[SENTENCE, SECOND]),
    "masks_on_batch-3x8": lambda: mechanisms.masks_on_batch([8, 1, 5], 8, tokens=[["abcdefgh"] * 8] * 3),
    "masks_on_batch-2": lambda: mechanisms.masks_on_batch([1], 2),
    "rope_rotation": lambda: mechanisms.rope_rotation(64, [0, 1, 2, 3]),
    "rope_rotation-far": lambda: mechanisms.rope_rotation(8, [0, 1, 5, 20, 100, 100_000], base=100, pairs=[0, 3]),
    "rope_rotation-1": lambda: mechanisms.rope_rotation(2, [7]),
    "encoder_decoder_wiring": lambda: mechanisms.encoder_decoder_wiring(1),
    "encoder_decoder_wiring-3": lambda: mechanisms.encoder_decoder_wiring(3),
    "decoder_only_stack": lambda: mechanisms.decoder_only_stack(SENTENCE, 2),
    "decoder_only_stack-8": lambda: mechanisms.decoder_only_stack(["abcdefgh"] * 8, 4),
    "online_softmax_tiles": lambda: mechanisms.online_softmax_tiles(16, 4),
    "online_softmax_tiles-6": lambda: mechanisms.online_softmax_tiles(64, 11),
    "online_softmax_tiles-1": lambda: mechanisms.online_softmax_tiles(1, 1),
    "online_softmax_tiles-listing": lambda: mechanisms.online_softmax_tiles(256, 64),
    "online_softmax_tiles-control": lambda: mechanisms.online_softmax_tiles(64, 8),
    "online_softmax_tiles-8": lambda: mechanisms.online_softmax_tiles(4096, 512),
    "online_softmax_tiles-7": lambda: mechanisms.online_softmax_tiles(100, 15),
    "kv_cache": lambda: mechanisms.kv_cache(6, prompt=3),
    "kv_cache-8": lambda: mechanisms.kv_cache(8, prompt=4),
    "kv_cache-1": lambda: mechanisms.kv_cache(1),
    "grouped_query_heads": lambda: mechanisms.grouped_query_heads(8, [8, 2, 1]),
    "grouped_query_heads-16": lambda: mechanisms.grouped_query_heads(16, [16, 4, 1]),
    "grouped_query_heads-1": lambda: mechanisms.grouped_query_heads(1),
    "vit_tokens": lambda: mechanisms.vit_tokens(196, 192, patch=16),
    "vit_tokens-4": lambda: mechanisms.vit_tokens(4),
    "transformer_block": lambda: diagrams.transformer_block(FAMILIES),
    "attention_maps": lambda: diagrams.attention_maps(SENTENCE, causal_mask(6), _A, _Y, scores=_S),
    "attention_maps-control": lambda: diagrams.attention_maps(SENTENCE, causal_mask(6), _A, _Y),
    "attention_maps-8": lambda: diagrams.attention_maps(["abcdefgh"] * 8, causal_mask(8), torch.eye(8), torch.ones(8, 8)),
    "vit_input": lambda: diagrams.vit_input(_IMAGE, 32),
    "vit_input-4": lambda: diagrams.vit_input(_IMAGE[:, :64, :64], 16),
    "sparse_patterns": lambda: diagrams.sparse_patterns(_PATTERNS, _REACH, 16),
    "shifted_windows": lambda: diagrams.shifted_windows(_PHOTO, _REGULAR, _SHIFTED, _SHIFTED.roll((-2, -2), (0, 1)), 2),
    "window_panels-2": lambda: diagrams.window_panels([(_PHOTO, _SHIFTED, "shift 2: 9 windows", True, None),
                                                       (_PHOTO, _SHIFTED.roll((-2, -2), (0, 1)),
                                                        "rolled by 2: 4 windows + mask", True, _REGULAR)]),
}
SITE, DPI = 672, 100          # the site's content column (px, a 1280-px window) and the notebooks' figure dpi
CAP = text_to_path.get_text_width_height_descent("H", FontProperties(size=100), False)[1] / 100   # capitals' height / size
# A limit set under a sign, as mathtext sets \sum_i and \max_j: about 4 px at the site; {\sum}_i sets it inline.
UNDER = re.compile(r"(?<!\{)\\(sum|prod|coprod|max|min|lim|liminf|limsup|sup|bigcup|bigcap)(?![A-Za-z])\s*[_^]")


@pytest.fixture(autouse=True)
def book_style():
    """The book's settings (use_style's rcParams), restored afterwards."""
    with mpl.rc_context(plotting.STYLE):
        yield


@pytest.fixture
def draw():
    """Call a drawing function; the figures it made are closed after the test."""
    made = []

    def call(make, *args, **kwargs):
        made.append(make(*args, **kwargs))
        return made[-1]

    yield call
    for fig in made:
        plt.close(fig)


def labels(fig):
    """The figure's non-empty text labels (the arrows are annotations without text), with the titles, axis labels
    and tick labels of any axes drawn with its axis (transformer_block's grids)."""
    found = list(fig.texts)
    for ax in fig.axes:
        found += ax.texts
        if ax.axison:
            found += [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.get_xticklabels(), *ax.get_yticklabels()]
    return [t for t in found if t.get_visible() and t.get_text().strip()]


def strings(fig):
    return [t.get_text() for t in labels(fig)]


def svg(fig):
    buffer = io.BytesIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def shown_width(fig):
    """The figure's width in pixels as a notebook shows it: its 100-dpi PNG, cut to the tight bounding box."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    return Image.open(buffer).size[0]


def script_depth(text):
    """How deep the deepest sub- or superscript of ``text``'s mathtext sits: 0 none, 1 ``x_i``, 2 ``x_{i_j}``."""
    deepest = 0
    for math_text in re.findall(r"\$([^$]*)\$", text):
        groups, pending, k = [0], None, 0
        while k < len(math_text):
            c = math_text[k]
            if c in "_^":
                pending = groups[-1] + 1
            elif c == "{":
                groups.append(pending if pending is not None else groups[-1])
                pending = None
            elif c == "}":
                groups.pop()
            elif not c.isspace():
                if pending is not None:
                    deepest = max(deepest, pending)
                    if c == "\\":                                        # a command: its whole name is the script
                        k += len(re.match(r"\\[A-Za-z]*", math_text[k:])[0]) - 1
                    pending = None
            deepest = max(deepest, groups[-1])
            k += 1
    return deepest


def test_script_depth_reads_mathtext():
    assert [script_depth(t) for t in ["plain", "$x$", "$s_i$", "$\\alpha_{t1}$", "$e^{x_i}$", "a $b$ and $c_{d_{e}}$"]] == \
        [0, 0, 1, 1, 2, 2]
    assert UNDER.search("$\\sum_i a$") and UNDER.search("$\\max_{j}$") and not UNDER.search("${\\sum}_i\\,a$")


@pytest.mark.parametrize("case", CASES)
def test_each_figure_is_readable_at_the_sites_width(case, draw):
    """At most WIDTH inches wide, so that the site shows its 100-dpi PNG at its natural size; labels of 9 points
    or more, capitals 9 pixels tall or more as shown there; scripts 6 pixels or more, none set under a sign;
    every label inside the figure, and no two labels' boxes overlapping, as the renderer lays them out."""
    fig = draw(CASES[case])
    assert isinstance(fig, Figure) and fig.get_size_inches()[0] <= mechanisms.WIDTH
    scale = min(1, SITE / shown_width(fig))                      # the site shrinks a wider PNG to its column
    texts = labels(fig)
    assert texts and min(t.get_fontsize() for t in texts) >= mechanisms.SMALL
    capitals = min(t.get_fontsize() for t in texts) * DPI / 72 * CAP * scale
    assert capitals >= 9, f"capitals {capitals:.1f} px tall at the site's width"
    for t in texts:
        assert not UNDER.search(t.get_text()), f"{t.get_text()!r} sets a limit under a sign: write it inline, {{\\sum}}_i"
        script = t.get_fontsize() * 0.7 ** script_depth(t.get_text()) * DPI / 72 * CAP * scale
        assert script >= 6, f"{t.get_text()!r}: scripts {script:.1f} px tall"
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    shown = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    page = fig.bbox
    for text, box in shown:
        assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1 and page.y0 - 1 <= box.y0 and box.y1 <= page.y1 + 1, \
            f"{text!r} leaves the figure: {box.bounds} outside {page.bounds}"
    for (a, box_a), (b, box_b) in itertools.combinations(shown, 2):
        width = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
        height = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
        assert width <= 0.5 or height <= 0.5, f"{a!r} and {b!r} overlap ({width:.1f} x {height:.1f} px)"


def _contrast(color):
    """WCAG contrast ratio of ``color`` against white."""
    return 1.05 / (_luminance(to_rgb(color)) + 0.05)


def _neutral(color):
    r, g, b = to_rgb(color)
    return max(r, g, b) - min(r, g, b) < 0.1


@pytest.mark.parametrize("case", CASES)
def test_each_figures_coloured_lines_are_legible_on_white(case, draw):
    """Every coloured line and arrow has at least 2:1 contrast with the white page (Okabe and Ito's yellow,
    #F0E442, has 1.3:1); grey lines may be light, as context."""
    fig = draw(CASES[case])
    colors = [line.get_color() for line in fig.findobj(Line2D) if line.get_linestyle() not in ("None", "")]
    colors += [a.arrow_patch.get_edgecolor() for a in fig.findobj(Annotation) if a.arrow_patch is not None]
    faint = {mpl.colors.to_hex(c) for c in colors if not _neutral(c) and _contrast(c) < 2}
    assert not faint, f"coloured lines too faint on white: {faint}"


def test_the_palettes_lines_are_legible_and_yellow_is_darkened():
    assert all(_contrast(c) >= 2 for c in mechanisms.HEADS + mechanisms.POSITIONS)
    assert PALETTE["yellow"] not in mechanisms.HEADS and _contrast(mechanisms.DARK_YELLOW) >= 3


@pytest.mark.parametrize("case", ["soft_lookup", "encoder_decoder_attention", "qkv_projection", "multi_head_split",
                                  "masks_on_batch", "rope_rotation", "encoder_decoder_wiring", "decoder_only_stack",
                                  "online_softmax_tiles", "kv_cache", "grouped_query_heads", "vit_tokens",
                                  "transformer_block", "attention_maps", "vit_input", "sparse_patterns",
                                  "shifted_windows"])
def test_each_figure_renders_to_the_same_svg_bytes(case, draw):
    assert svg(draw(CASES[case])) == svg(draw(CASES[case]))


@pytest.mark.parametrize("call", [
    lambda: mechanisms.encoder_decoder_attention(3, step=-1), lambda: mechanisms.qkv_projection(6, 8, 33),
    lambda: mechanisms.qkv_projection(6, 8, 4, tokens=SENTENCE[:5]),
    lambda: mechanisms.qkv_projection(6, 32, 16, tokens=SENTENCE),
    lambda: mechanisms.multi_head_split(2, 5, 16, 3), lambda: mechanisms.masks_on_batch([3], 2),
    lambda: mechanisms.masks_on_batch([6, 4], 6, tokens=[SENTENCE]),
    lambda: mechanisms.masks_on_batch([6], 6, tokens=[["a"] * 5]),
    lambda: mechanisms.rope_rotation(8, [0], pairs=[9]), lambda: mechanisms.encoder_decoder_wiring(True),
    lambda: mechanisms.decoder_only_stack(["a", 3], 2), lambda: mechanisms.online_softmax_tiles(8, 0),
    lambda: mechanisms.kv_cache(2, prompt=0), lambda: mechanisms.grouped_query_heads(8, [8, 4, 2, 1]),
    lambda: mechanisms.vit_tokens(4, d=-1), lambda: mechanisms.vit_tokens(4, patch=0),
    lambda: diagrams.transformer_block({"no family": UNMASKED}), lambda: diagrams.transformer_block({"a: b": UNMASKED.float()}),
])
def test_a_refused_call_leaves_no_figure_open(call):
    before = plt.get_fignums()
    with pytest.raises(ValueError):
        call()
    assert plt.get_fignums() == before


# The chapter's colours: blue where a query may attend (and, for weights, the larger the bluer), pale where hidden.
BLUE = mpl.colors.to_rgba(PALETTE["blue"])


def _pale(color):
    return _luminance(to_rgb(color)) > 0.6


def test_every_mask_is_blue_where_a_query_may_attend_and_pale_where_a_key_is_hidden(draw):
    style = diagrams.MASK_STYLE                                # 9.2's mask panel: 1 where hidden
    norm = mpl.colors.Normalize(style["vmin"], style["vmax"])
    assert style["cmap"](norm(0)) == BLUE and _pale(style["cmap"](norm(1)))
    assert [style["fmt"](h) for h in (0, 1)] == ["0", "$-\\infty$"]
    fig = draw(mechanisms.masks_on_batch, [6, 4], 6)
    faces = [tuple(c) for coll in fig.axes[0].collections for c in coll.get_facecolors()]
    assert BLUE in faces and all(c == BLUE or _pale(c) for c in faces)
    swatches = {t.get_text(): p.get_facecolor() for t, p in zip(
        [t for t in fig.axes[0].texts if t.get_text().startswith(("may", "hidden"))],
        [p for p in fig.axes[0].patches if p.get_width() == pytest.approx(0.22)], strict=True)}
    assert swatches["may attend"] == BLUE and all(_pale(c) for name, c in swatches.items() if name.startswith("hidden"))
    assert "hidden: a padded key\n(later or not)" in swatches                  # padding wins where both hide
    fig = draw(diagrams.transformer_block, FAMILIES)
    grids = [ax for ax in fig.axes if ax.images]
    for ax in grids:
        image = ax.images[0]
        assert image.cmap(image.norm(1)) == BLUE and _pale(image.cmap(image.norm(0)))   # mask_grid draws ~mask
    legend = {t.get_text() for t in fig.texts}
    assert "blue: may attend" in legend and BLUE in [p.get_facecolor() for p in fig.artists if isinstance(p, Rectangle)]


def test_masks_on_batch_draws_padding_over_the_future_and_hatches_it(draw):
    fig = draw(mechanisms.masks_on_batch, [6, 4], 6)
    hatched = [coll for coll in fig.axes[0].collections if coll.get_hatch()]
    padded = sum(len(coll.get_facecolors()) for coll in hatched)
    assert padded == 2 * 6 * 2 and all(_pale(c) for coll in hatched for c in coll.get_facecolors())   # keys 4, 5
    assert all(mpl.colors.to_rgba(c) == mpl.colors.to_rgba(mechanisms.PADDED) for coll in hatched
               for c in coll.get_facecolors())


def test_soft_lookup_writes_the_numbers_it_is_given(draw):
    fig = draw(CASES["soft_lookup"])
    texts = strings(fig)
    assert {"$s_{1}$ = 1.20", "$s_{2}$ = \u22120.30", "$v_{3}$ = 1.30", "0.58", "= 0.90", "they sum to one"} <= set(texts)
    assert "output\n${\\sum}_i\\,\\alpha_i v_i$" in texts                       # the sum's index inline
    bars = [p for p in fig.axes[0].patches if isinstance(p, Rectangle) and p.get_facecolor() == BLUE]
    assert [round(p.get_width() / mechanisms.BAR, 6) for p in bars] == [round(w, 6) for w in WEIGHTS.tolist()]
    fig = draw(mechanisms.soft_lookup, [0.5, 0.5], [1.0, 3.0])
    assert {"$s_{1}$", "$s_{2}$", "= 2.00"} <= set(strings(fig)) and "$k_{3}$" not in strings(fig)


@pytest.mark.parametrize("scores", [[1.0, 2.0, 3.0, 0.0, -1.5], [1.2, -0.3, 2.1, 0.4, -1.0], [0.0, 0.0, 0.0], [5.0, 0.0],
                                    [0.3, 0.1, -0.2, 0.05, 0.4, -0.1, 0.2]])
def test_soft_lookup_says_what_its_rounded_weights_add_to(scores, draw):
    """The weights written under 'they sum to one' add to what the figure says: 1.00, or the rounded sum it names."""
    weights = torch.softmax(torch.tensor(scores, dtype=torch.float64), 0)
    texts = strings(draw(mechanisms.soft_lookup, weights, torch.zeros(len(scores)), torch.tensor(scores)))
    written = [float(t) for t in texts if re.fullmatch(r"\d\.\d\d", t)]
    assert len(written) == len(scores) and "they sum to one" in texts
    total = f"{sum(round(w * 100) for w in written) / 100:.2f}"
    notes = [t for t in texts if t.startswith("(rounded")]
    assert notes == ([] if total == "1.00" else [f"(rounded: {total})"])
    if scores[:5] == [1.0, 2.0, 3.0, 0.0, -1.5]:                                # 9.1's example: 0.09 + ... + 0.01
        assert notes == ["(rounded: 1.01)"]


@pytest.mark.parametrize(("args", "message"), [
    (([0.5, 0.6], [1, 2]), "weights must be non-negative and sum to one"),
    (([1.0], [1]), "weights must have 2 to 8 entries"),
    (([0.5, 0.5], [1, 2, 3]), "values must have 2 entries"),
    (([0.5, float("nan")], [1, 2]), "weights must be a 1-D list of finite numbers"),
    ((WEIGHTS, torch.zeros(5), SCORES + torch.arange(5.0)), "weights must be the softmax of scores"),
    ((["a", "b"], [1, 2]), "weights must be a list or 1-D tensor of real numbers"),
])
def test_soft_lookup_refuses_what_it_would_draw_wrong(args, message):
    before = plt.get_fignums()
    with pytest.raises(ValueError, match=message):
        mechanisms.soft_lookup(*args)
    assert plt.get_fignums() == before


def _position(fig, text):
    return next(t.get_position() for t in fig.axes[0].texts if t.get_text() == text)


def test_encoder_decoder_attention_draws_one_state_per_input_and_its_weight(draw):
    fig = draw(mechanisms.encoder_decoder_attention, 5)
    texts = strings(fig)
    assert [f"$h_{{{j}}}$" for j in range(5)] == [t for t in texts if t.startswith("$h_")]   # from 0, as 9.1's code
    assert [f"$x_{{{j}}}$" for j in range(5)] == [t for t in texts if t.startswith("$x_")]
    assert {"$s_{t-1}$", "$s_{t}$", "context $c_{t}$", "$\\alpha_{t0}$", "$\\alpha_{t4}$", "previous output $y_{t-1}$",
            "output layer", "next output $y_{t}$"} <= set(texts)
    assert "$c_{t} = {\\sum}_i\\, \\alpha_{ti}h_i$" in texts                      # sums written inline
    weights = torch.tensor([0.1, 0.6, 0.3])
    fig = draw(mechanisms.encoder_decoder_attention, 3, weights, step=4)
    texts = strings(fig)
    assert {"$s_{3}$", "$s_{4}$", "0.10", "0.60", "0.30", "next output $y_{4}$", "previous output $y_{3}$"} <= set(texts)
    assert "$h_{2}$" in texts and "$h_{3}$" not in texts
    widths = [line.get_linewidth() for line in fig.axes[0].lines if line.get_color() == PALETTE["blue"]]
    assert widths == pytest.approx([0.6 + 6 * w for w in weights.tolist()])          # thicker where the weight is larger


def test_encoder_decoder_attention_scores_before_it_weighs_and_wires_the_decoder(draw):
    """Each line from h_i meets the query's dot first, then its weight, then an arrowhead into the sum; the
    dashed query line stops at the last dot; s_t reads s_{t-1}, y_{t-1} and c_t; the output layer reads s_t
    and c_t and gives y_t."""
    fig = draw(mechanisms.encoder_decoder_attention, 6)
    ax = fig.axes[0]
    plus = next(p for p in ax.patches if isinstance(p, Circle))
    (cx, cy), r = plus.center, plus.radius
    dots = sorted((line.get_xdata()[0], line.get_ydata()[0]) for line in ax.lines if line.get_marker() == "o")
    weights = [t.get_position() for t in ax.texts if t.get_text().startswith("$\\alpha_{t") and len(t.get_text()) < 16]
    assert len(dots) == len(weights) == 6 and len({round(y, 9) for _, y in dots}) == 1       # on the query's line
    assert all(dot_y < w_y < cy - r for (_, dot_y), (_, w_y) in zip(dots, weights, strict=True))
    arrows = [a for a in ax.texts if isinstance(a, Annotation)]
    into_plus = [a for a in arrows if math.dist(a.xy, (cx, cy)) == pytest.approx(r)]
    assert len(into_plus) == 6 and all(a.arrowprops["color"] == PALETTE["blue"] for a in into_plus)
    dashed = next(line for line in ax.lines if line.get_linestyle() == "--")
    assert dashed.get_xdata()[-1] == pytest.approx(dots[-1][0]) and dashed.get_ydata()[-1] == pytest.approx(dots[-1][1])
    s_t, layer = _position(fig, "$s_{t}$"), _position(fig, "output layer")
    ends = [a.xy for a in arrows]
    assert sum(abs(x - s_t[0]) <= 0.41 and abs(y - s_t[1]) <= 0.22 for x, y in ends) == 3      # s_{t-1}, y_{t-1}, c_t
    assert sum(abs(x - layer[0]) <= 0.48 and abs(y - layer[1]) <= 0.18 for x, y in ends) == 2  # s_t, and c_t around it
    bypass = next(line for line in ax.lines if line.get_color() == "black" and len(line.get_xdata()) == 3)
    assert bypass.get_ydata()[0] == pytest.approx(cy) and bypass.get_ydata()[-1] == pytest.approx(layer[1])


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(T_in=1), "T_in must be from 2 to 8"), (dict(T_in=9), "T_in must be from 2 to 8"),
    (dict(T_in=3, weights=[0.5, 0.5]), "weights must have 3 entries"), (dict(T_in=3, step=0), "step must be a positive int"),
])
def test_encoder_decoder_attention_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        mechanisms.encoder_decoder_attention(**kwargs)


def test_qkv_projection_writes_the_shapes_and_draws_them_to_scale(draw):
    texts = strings(draw(mechanisms.qkv_projection, 6, 8, 4))
    assert texts.count("$T\\times d$ = 6 × 8") == 1
    assert texts.count("$d\\times d_k$ = 8 × 4") == 3 and texts.count("$T\\times d_k$ = 6 × 4") == 3
    assert not set(SENTENCE) & set(texts)
    fig = draw(mechanisms.qkv_projection, 10, 8, 2)
    assert "$T\\times d_k$ = 10 × 2" in strings(fig) and "$T\\times d_k$ = 6 × 4" not in strings(fig)
    frames = [p for p in fig.axes[0].patches if isinstance(p, Rectangle) and p.get_edgecolor()[:3] == (0, 0, 0)]
    ratios = sorted({(round(p.get_height() / p.get_width(), 6)) for p in frames})
    assert ratios == [10 / 8, 8 / 2, 10 / 2]                          # X (10 x 8), each W (8 x 2), each output (10 x 2)


def test_qkv_projection_colours_queries_keys_and_values_as_9_1_does(draw):
    """Figure 9.2.1 draws the queries vermillion, the keys sky and the values orange, as 9.1's soft_lookup draws the
    query, the keys and the values: each W and its product in the tint of 9.1's colour, ruled in that colour."""
    lookup = draw(CASES["soft_lookup"]).axes[0]
    boxes = [p for p in lookup.patches if isinstance(p, FancyBboxPatch)]

    def colour_of(prefix):
        """The face colour of soft_lookup's box holding the label that starts with ``prefix``."""
        x, y = next(t.get_position() for t in lookup.texts if t.get_text().startswith(prefix))
        return next(p.get_facecolor() for p in boxes if p.get_x() < x < p.get_x() + p.get_width()
                    and p.get_y() < y < p.get_y() + p.get_height())

    assert [colour_of(p) for p in ("$q$", "$k_{1}$", "$v_{1}$")] == \
        [mpl.colors.to_rgba(c) for c in (mechanisms.QUERY, mechanisms.KEY, mechanisms.VALUE)]
    ax = draw(mechanisms.qkv_projection, 6, 8, 4, tokens=SENTENCE).axes[0]
    frames = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_edgecolor()[:3] == (0, 0, 0)]
    rows = sorted({round(p.get_y() + p.get_height() / 2, 6) for p in frames[1:]}, reverse=True)   # Q's row on top
    for y, prefix in zip(rows, ("$q$", "$k_{1}$", "$v_{1}$"), strict=True):
        faces = {p.get_facecolor()[:3] for p in frames[1:] if round(p.get_y() + p.get_height() / 2, 6) == y}
        assert faces == {mechanisms._tint(colour_of(prefix)[:3])}
    rules = {mpl.colors.to_hex(line.get_color()) for line in ax.lines}
    assert {mpl.colors.to_hex(c) for c in (mechanisms.QUERY, mechanisms.KEY, mechanisms.VALUE)} <= rules
    assert not {mpl.colors.to_hex(PALETTE[c]) for c in ("blue", "green")} & rules          # 9.2.1's colours before


def test_the_first_heads_take_no_colour_of_queries_keys_or_values():
    """A head's colour should not read as the query's, the keys' or the values': the first five avoid them."""
    assert not {mechanisms.QUERY, mechanisms.KEY, mechanisms.VALUE} & set(mechanisms.HEADS[:5])
    assert len(set(mechanisms.HEADS)) == len(mechanisms.HEADS) == 8


def test_qkv_projection_labels_the_rows_of_x_q_k_and_v_with_the_tokens(draw):
    fig = draw(mechanisms.qkv_projection, 6, 8, 4, tokens=SENTENCE)
    words = [t for t in fig.axes[0].texts if t.get_text() in SENTENCE]
    assert len(words) == 4 * 6 and [t.get_text() for t in words] == SENTENCE * 4
    frames = [p for p in fig.axes[0].patches if isinstance(p, Rectangle) and p.get_edgecolor()[:3] == (0, 0, 0)]
    tall = {round(p.get_height(), 6) for p in frames if round(p.get_height() / p.get_width(), 6) in (6 / 8, 6 / 4)}
    assert tall == {round(6 * 0.16, 6)}                                  # rows as tall as a label
    for k in range(4):                                                   # each matrix's words, one per row, top down
        ys = [t.get_position()[1] for t in words[6 * k: 6 * (k + 1)]]
        assert all(a - b == pytest.approx(0.16) for a, b in itertools.pairwise(ys))


@pytest.mark.parametrize(("args", "message"), [((6, 8, 0), "d_k must be from 1 to 32"), ((33, 8, 4), "T must be from 1 to 32"),
                                               ((6, 8.0, 4), "d must be an int, got 8.0")])
def test_qkv_projection_refuses_bad_sizes(args, message):
    with pytest.raises(ValueError, match=message):
        mechanisms.qkv_projection(*args)


def test_multi_head_split_writes_every_tensors_shape_with_the_sections_letters(draw):
    texts = strings(draw(mechanisms.multi_head_split, 2, 5, 16, 4))
    assert texts.count("input $x$\n(B, T, d)\n= (2, 5, 16)") == 1
    assert texts.count("split into heads\n(B, H, T, d/H)\n= (2, 4, 5, 4)") == 1     # all the heads: not one head's shape
    assert not any(t.startswith("per head") for t in texts)
    assert {"split $d$ into\n$H$ = 4 heads", "$d$ = 16", "$d/H$ = 4"} <= set(texts)
    assert not any("(B, h" in t or "$h$" in t for t in texts)                 # H heads; h is a head's index
    assert [t for t in texts if t.startswith("head ")] == ["head 1", "head 2", "head 3", "head 4"]
    texts = strings(draw(mechanisms.multi_head_split, 1, 3, 64, 8))
    assert "split into heads\n(B, H, T, d/H)\n= (1, 8, 3, 8)" in texts and "$d/H$ = 8" in texts
    assert [t for t in texts if t.startswith("head ")] == ["head 1", "head 2", "head 8"] and texts.count("⋮") == 4


def test_multi_head_split_marks_d_down_the_side_the_heads_split(draw):
    """The stripes split q, k, v from top to bottom, so d is marked along that side: a bar as tall as the tensors,
    left of the input (the first box), labelled upright beside it; not above a box, where it would read as its
    width, and crossed by no arrow."""
    fig = draw(mechanisms.multi_head_split, 2, 5, 16, 4)
    ax = fig.axes[0]
    box = next(p for p in ax.patches if isinstance(p, Rectangle) and p.get_facecolor()[3] == 0)    # q, k, v's outline
    bottom, top = box.get_y(), box.get_y() + box.get_height()
    left = min(p.get_x() for p in ax.patches)                                  # the input's box, the first
    label = next(t for t in ax.texts if t.get_text() == "$d$ = 16")
    assert label.get_rotation() == 90
    bar = next(a for a in ax.texts if isinstance(a, Annotation) and a.arrowprops["arrowstyle"] == "|-|")
    (x0, y0), (x1, y1) = bar.xyann, bar.xy
    assert x0 == x1 < left and sorted((y0, y1)) == pytest.approx([bottom, top])
    for a in ax.texts:                                                         # no arrow runs across the bar
        if isinstance(a, Annotation) and a is not bar:
            (xa, ya), (xb, yb) = a.xyann, a.xy
            assert not (min(xa, xb) <= x0 <= max(xa, xb) and bottom <= min(ya, yb) <= top), (a.xyann, a.xy)
    fig.canvas.draw()
    shown = label.get_window_extent(fig.canvas.get_renderer()).transformed(ax.transData.inverted())
    assert shown.x1 <= x0 and bottom <= shown.y0 < shown.y1 <= top             # beside the bar, within its span
    assert shown.height > shown.width                                          # upright
    heads = [t for t in ax.texts if t.get_text() == "$d/H$ = 4"]
    assert len(heads) == 1 and bottom < heads[0].get_position()[1] < top


def test_multi_head_split_needs_heads_that_divide_d():
    with pytest.raises(ValueError, match="heads must divide d .* got d = 10 and heads = 4"):
        mechanisms.multi_head_split(2, 5, 10, 4)
    with pytest.raises(ValueError, match="heads must be a positive int, got 0"):
        mechanisms.multi_head_split(2, 5, 16, 0)


def test_masks_on_batch_fills_the_cells_the_books_masks_allow(draw):
    lengths, T = [6, 4], 6
    fig = draw(mechanisms.masks_on_batch, lengths, T)
    causal, pad = causal_mask(T), padding_mask(torch.tensor(lengths), T)
    allowed = sum(int((~m).sum()) for b in range(2) for m in (causal, pad[b].expand(T, T), causal | pad[b]))
    cells = [tuple(c) for coll in fig.axes[0].collections for c in coll.get_facecolors()]
    assert allowed == 141 and len(cells) == 2 * 3 * T * T and cells.count(BLUE) == allowed
    assert {"sequence 2, length 4", "padding + causal"} <= set(strings(fig))
    grey = [t.get_text() for t in labels(fig) if t.get_color() == "0.35"]   # sequence 2's padded positions
    assert sorted(grey) == ["4"] * 4 + ["5"] * 4                              # rows once, columns under each panel


def test_masks_on_batch_labels_rows_and_columns_with_the_tokens_and_pad(draw):
    fig = draw(mechanisms.masks_on_batch, torch.tensor([6, 4]), 6, tokens=[SENTENCE, ["Take", "one", "small", "step", "x", "y"]])
    texts = [t for t in labels(fig)]
    for word in SENTENCE:
        assert sum(t.get_text() == word for t in texts if t.get_rotation() == 90) >= 3      # the keys, under each panel
    pads = [t for t in texts if t.get_text() == "<pad>"]                   # what the caller wrote there, shown as padding
    assert len(pads) == 2 * 4 and {t.get_color() for t in pads} == {"0.35"} and _contrast("0.35") >= 4.5
    assert not {"x", "y"} & {t.get_text() for t in texts}


@pytest.mark.parametrize(("args", "message"), [(([7, 4], 6), "each from 1 to T = 6"), (([0], 6), "each from 1 to T"),
                                               (([2] * 4, 6), "1 to 3 sequence lengths"), (([2], 9), "T must be from 2 to 8"),
                                               (([2.0], 6), "lengths must be integers")])
def test_masks_on_batch_refuses_lengths_it_cannot_draw(args, message):
    with pytest.raises(ValueError, match=message):
        mechanisms.masks_on_batch(*args)


def test_rope_rotation_turns_each_pair_by_position_times_its_frequency(draw):
    d, positions = 16, [0, 1, 3]
    fig = draw(mechanisms.rope_rotation, d, positions, base=100.0)
    omega = frequencies(d, 100.0).tolist()
    texts = strings(fig)
    pairs = [int(t.split("\n")[0].split("= ")[1]) for t in texts if t.startswith("pair $j$")]
    assert pairs == [0, 2, 5, 7]                                      # the first, the last and two between
    assert "pair $j$ = 7\n(coordinates 14, 15)\n$\\omega_{7}$ = 0.0178 rad\nper position" in texts
    assert [t for t in texts if t.startswith("$t$ = ")] == ["$t$ = 0", "$t$ = 1", "$t$ = 3"]   # t, as section 9.3
    arrows = [a for a in fig.axes[0].texts if isinstance(a, Annotation) and not a.get_text()]
    assert len(arrows) == len(pairs) * len(positions)
    for (j, t), a in zip(itertools.product(pairs, positions), arrows, strict=True):
        (x1, y1), (x0, y0) = a.xy, a.xyann
        turned = math.atan2(y1 - y0, x1 - x0) % (2 * math.pi)
        assert turned == pytest.approx(t * omega[j] % (2 * math.pi), abs=1e-9)
    assert any("depends on the positions only through $n - m$" in t for t in texts)


def test_rope_rotation_writes_three_significant_figures(draw):
    """9.3's figure: every frequency and angle to three significant figures, trailing zeros kept (0.000400 at
    t = 3 for pair 31, not 0.0004); a whole number as it is (1 rad, 3 rad)."""
    texts = strings(draw(mechanisms.rope_rotation, 64, [0, 1, 2, 3]))
    angles = [t.split("\n")[1] for t in texts if t.startswith("angle at")]
    assert angles == ["3 rad", "0.169 rad", "0.00711 rad", "0.000400 rad"]
    rates = [t.split("\n")[2].split("= ")[1] for t in texts if t.startswith("pair $j$")]
    assert rates == ["1 rad", "0.0562 rad", "0.00237 rad", "0.000133 rad"]


def _fill(ax, text):
    """The face colour of the box on ``ax`` whose label is ``text``: the patch whose extent holds the label."""
    x, y = next(t.get_position() for t in ax.texts if t.get_text() == text)
    boxes = [p for p in ax.patches if p.get_extents().contains(*ax.transData.transform((x, y)))]
    return min(boxes, key=lambda p: p.get_extents().width).get_facecolor()


def test_the_blocks_sublayers_avoid_the_colours_of_queries_keys_and_values(draw):
    """Figures 9.4.1 and 9.4.2 fill the attention and the MLP in colours of their own, the same in both: not
    9.1's vermillion, sky and orange (queries, keys, values), nor the masks' blue."""
    taken = {mpl.colors.to_rgba(c) for c in (mechanisms.QUERY, mechanisms.KEY, mechanisms.VALUE, mechanisms.ALLOWED)}
    block = draw(diagrams.transformer_block, FAMILIES).axes[0]
    wiring = draw(mechanisms.encoder_decoder_wiring, 1).axes[0]
    fills = {"attention": {_fill(block, "multi-head\nattention"), _fill(wiring, "self-attention"),
                           _fill(wiring, "causal self-attention")},
             "MLP": {_fill(block, "MLP"), _fill(wiring, "MLP")}, "cross": {_fill(wiring, "cross-attention")}}
    assert all(len(colors) == 1 for colors in fills.values()) and not set.union(*fills.values()) & taken
    assert len(set.union(*fills.values())) == 3


def test_rope_rotation_names_the_arrows_that_overlap_from_their_angles(draw):
    texts = strings(draw(mechanisms.rope_rotation, 64, [0, 1, 2, 3]))           # 9.3's figure: pairs 0, 10, 21, 31
    assert texts.count("(all four overlap)") == 2                               # pairs 21 and 31, within a pixel
    fig = draw(mechanisms.rope_rotation, 8, [0, 1, 1_000_000], base=1e8, pairs=[0, 3])
    notes = [(t.get_position()[0], t.get_text()) for t in fig.axes[0].texts if "overlap" in t.get_text()]
    assert notes == [(pytest.approx(mechanisms.WIDTH * 3 / 4), "($t$ = 0, 1 overlap)")]   # pair 3 turns 1e-6 rad a step
    arrows = [a for a in fig.axes[0].texts if isinstance(a, Annotation)]
    colors = [a.arrowprops["color"] for a in arrows[:3]]
    assert len(set(colors)) == 3 and PALETTE["vermillion"] not in colors[:4]     # orange and vermillion never both


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    ((7, [0, 1]), {}, "d must be a positive even int"), ((8, [0, 1]), dict(base=1.0), "base must be greater than 1"),
    ((8, [0, 0]), {}, "distinct ints >= 0"), ((8, [-1, 2]), {}, "distinct ints >= 0"),
    ((8, list(range(7))), {}, "1 to 6 distinct"), ((8, [0, 1]), dict(pairs=[4]), r"from 0 to d/2 - 1 = 3"),
])
def test_rope_rotation_refuses_bad_arguments(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        mechanisms.rope_rotation(*args, **kwargs)


def test_encoder_decoder_wiring_sends_the_memory_to_every_cross_attention(draw):
    for n in (1, 3):
        texts = strings(draw(mechanisms.encoder_decoder_wiring, n))
        assert texts.count("cross-attention") == texts.count("$K, V$") == texts.count("$Q$") == n
        assert texts.count("self-attention") == texts.count("causal self-attention") == n
        assert f"decoder\nblock {n}" in texts and f"encoder\nblock {n + 1}" not in texts
        assert [t for t in texts if t.startswith(("source", "start", "next"))] == [
            "source tokens + positions", "start symbol + target so far + positions", "next-token logits"]
        assert texts.count("output layer") == 1                                # the decoder's, under the logits
    for bad in (0, 4):
        with pytest.raises(ValueError, match="n_layers must be from 1 to 3"):
            mechanisms.encoder_decoder_wiring(bad)


def test_decoder_only_stack_connects_each_position_to_itself_and_the_earlier_ones(draw):
    tokens = ["Your", "journey", "starts", "with"]
    fig = draw(mechanisms.decoder_only_stack, tokens, 3)
    texts = strings(fig)
    columns = [t for t in labels(fig) if t.get_position()[0] > 1]                    # not the row names on the left
    top = sorted((t for t in columns if t.get_position()[1] == max(c.get_position()[1] for c in columns)),
                 key=lambda t: t.get_position()[0])
    assert [t.get_text() for t in top] == ["journey", "starts", "with", "?"]          # each column predicts the next token
    assert {"block 3", "embeddings"} <= set(texts) and "block 4" not in texts
    lines = [line for line in fig.axes[0].lines if isinstance(line, Line2D)]
    assert len(lines) == 3 * (4 * 5 // 2)                              # per block, position i reads positions 0..i
    assert all(line.get_xdata()[0] <= line.get_xdata()[1] for line in lines)           # never a later position
    assert len(fig.axes[0].patches) == 4 * 4                          # the boxes only: 9.4's check counts them


def test_decoder_only_stack_heads_the_lines_into_the_generating_position(draw):
    fig = draw(mechanisms.decoder_only_stack, SENTENCE, 2)
    ax = fig.axes[0]
    red = [line for line in ax.lines if line.get_color() == PALETTE["vermillion"]]
    grey = [line for line in ax.lines if line.get_color() != PALETTE["vermillion"]]
    assert len(red) == 2 * 6 and {line.get_color() for line in grey} == {"0.6"}       # mid grey (0.8 was too faint)
    heads = [a for a in ax.texts if isinstance(a, Annotation) and a.arrowprops["color"] == PALETTE["vermillion"]]
    assert sorted(a.xy for a in heads) == sorted((line.get_xdata()[1], line.get_ydata()[1]) for line in red)


@pytest.mark.parametrize(("args", "message"), [
    (("abc", 2), "tokens must be a list"), ((["a"], 2), "2 to 8 strings"), ((["a"] * 9, 2), "2 to 8 strings"),
    ((["a", "b"], 5), "n_layers must be from 1 to 4"), ((["a", "toolongtoken"], 2), "1 to 8 characters"),
])
def test_decoder_only_stack_refuses_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        mechanisms.decoder_only_stack(*args)


def test_online_softmax_tiles_draws_one_state_and_one_rescale_per_tile(draw):
    texts = strings(draw(mechanisms.online_softmax_tiles, 10, 4))               # tiles of 4, 4 and 2 keys
    assert [t for t in texts if t.startswith("tile")] == ["tile 1: keys 0–3", "tile 2: keys 4–7", "tile 3: keys 8–9"]
    assert "$m_{3}, l_{3}$\nacc$_{3}$" in texts and "$m_{4}, l_{4}$\nacc$_{4}$" not in texts
    assert [t for t in texts if t.startswith("×exp")] == [f"×exp$(m_{{{b}}}{{-}}m_{{{b + 1}}})$" for b in range(3)]
    assert [t for t in texts if t.startswith("$s_")] == [f"$s_{{{j}}}$" for j in range(10)]
    assert "$m_0 = -\\infty$\n$l_0 = 0$\nacc$_0 = 0$" in texts                  # the start, as the first factor names it
    texts = strings(draw(mechanisms.online_softmax_tiles, 64, 11))
    assert "tile 6\nkeys 55–63" in texts and not [t for t in texts if t.startswith("$s_")]   # cells too narrow to label
    texts = strings(draw(mechanisms.online_softmax_tiles, 4096, 512))
    assert "512 keys a tile" in texts and "tile 8" in texts                     # too narrow for the keys: said once
    with pytest.raises(ValueError, match="up to 8 tiles, got 10"):
        mechanisms.online_softmax_tiles(64, 7)
    with pytest.raises(ValueError, match="T_k must be from 1 to 4096"):
        mechanisms.online_softmax_tiles(4097, 1024)


@pytest.mark.parametrize(("T_k", "tile"), [(256, 64), (100, 15), (10, 4), (64, 8)])
def test_online_softmax_tiles_cover_every_key_once_and_say_so(T_k, tile, draw):
    fig = draw(mechanisms.online_softmax_tiles, T_k, tile)
    texts = strings(fig)
    spans = [tuple(map(int, m.groups())) for t in texts if (m := re.search(r"(\d+)–(\d+)$", t))]
    assert sum(b - a + 1 for a, b in spans) == T_k and spans[0][0] == 0 and spans[-1][1] == T_k - 1
    assert not any(re.search(r"[_ ]j\b|\{j|s_j|v_j", t) for t in texts)        # the loop's j is a tile's start, not a key
    ax = fig.axes[0]
    tiles = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_y() > 3]
    hues = {mpl.colors.rgb_to_hsv(p.get_facecolor()[:3])[0].round(2) for p in tiles}
    assert len(hues) == 1 and len({p.get_facecolor() for p in tiles}) == 2     # one colour, two shades
    output = next(t for t in ax.texts if t.get_text().startswith("output:"))
    fig.canvas.draw()
    box = output.get_window_extent(fig.canvas.get_renderer()).transformed(ax.transData.inverted())
    arrow = max((a for a in ax.texts if isinstance(a, Annotation)), key=lambda a: a.xyann[1] - a.xy[1])
    assert box.x0 < arrow.xy[0] < box.x1 and 0 < arrow.xy[1] - box.y1 < 0.15    # it points at the text


def test_kv_cache_counts_one_new_key_per_step_against_the_whole_prefix(draw):
    steps, prompt = 5, 2
    fig = draw(mechanisms.kv_cache, steps, prompt=prompt)
    texts = strings(fig)
    counts = [t.get_text() for t in sorted(labels(fig), key=lambda t: (t.get_position()[0], -t.get_position()[1]))
              if t.get_text().isdigit()]
    assert counts == ["2", "1", "1", "1", "1", "2", "3", "4", "5", "6"]          # with the cache, then without
    assert {"total 6", "total 20", "step 5", "step 1: prompt"} <= set(texts) and "step 6" not in texts
    assert texts.count("computed\nper layer") == 2
    cells = [p for p in fig.axes[0].patches if p.get_y() > 0.5]
    assert sum(p.get_facecolor() == BLUE for p in cells) == 6 + 20
    assert sum(bool(p.get_hatch()) for p in cells) == 2 * steps * prompt        # the prompt's tokens, in every row
    for kwargs in (dict(steps=0), dict(steps=9), dict(steps=3, prompt=5)):
        with pytest.raises(ValueError, match="must be from 1 to"):
            mechanisms.kv_cache(**kwargs)


@pytest.mark.parametrize(("steps", "prompt"), [(6, 3), (8, 4), (1, 1), (3, 2)])
def test_kv_cache_totals_add_up_what_each_step_computes(steps, prompt, draw):
    fig = draw(mechanisms.kv_cache, steps, prompt=prompt)
    ax = fig.axes[0]
    totals = sorted((t.get_position()[0], int(t.get_text().split()[1])) for t in ax.texts if t.get_text().startswith("total"))
    for x, total in totals:                                                    # each panel's column of counts
        column = [int(t.get_text()) for t in ax.texts if t.get_text().isdigit() and t.get_position()[0] == x]
        assert len(column) == steps and sum(column) == total
    cells = [p for p in ax.patches if p.get_y() > 0.5]
    assert sum(p.get_facecolor() == BLUE for p in cells) == sum(total for _, total in totals)


def test_grouped_query_heads_maps_query_head_h_to_key_value_head_h_over_the_group_size(draw):
    fig = draw(mechanisms.grouped_query_heads, 8)
    texts = strings(fig)
    assert [t for t in texts if "$G$" in t] == ["multi-head\n$H$ = 8, $G$ = 8", "grouped-query\n$H$ = 8, $G$ = 2",
                                                "multi-query\n$H$ = 8, $G$ = 1"]
    assert {"cache as large as\nmulti-head's", "cache 1/4 of\nmulti-head's", "cache 1/8 of\nmulti-head's"} <= set(texts)
    lines = fig.axes[0].lines
    assert len(lines) == 3 * 8
    for panel, G in enumerate((8, 2, 1)):
        ends = [line.get_xdata()[1] for line in lines[8 * panel: 8 * (panel + 1)]]
        assert len(set(ends)) == G and all(ends[h] == ends[(h // (8 // G)) * (8 // G)] for h in range(8))
    assert [t for t in strings(draw(mechanisms.grouped_query_heads, 7)) if "$G$" in t] == [
        "multi-head\n$H$ = 7, $G$ = 7", "multi-query\n$H$ = 7, $G$ = 1"]                   # a prime: no group between
    assert [t for t in strings(draw(mechanisms.grouped_query_heads, 16, 4)) if "$G$" in t] == ["grouped-query\n$H$ = 16, $G$ = 4"]
    with pytest.raises(ValueError, match="each dividing query_heads = 8, got 3"):
        mechanisms.grouped_query_heads(8, 3)
    with pytest.raises(ValueError, match="query_heads must be from 1 to 16"):
        mechanisms.grouped_query_heads(17)


@pytest.mark.parametrize(("H", "groups"), [(8, [8, 2, 1]), (16, [16, 4, 1]), (6, [6, 3, 2])])
def test_grouped_query_heads_draws_each_cache_as_large_as_it_says(H, groups, draw):
    """Every key-value box is the size of a query box, so a panel's key-value area against multi-head's is G/H,
    the share written under it."""
    fig = draw(mechanisms.grouped_query_heads, H, groups)
    ax = fig.axes[0]
    boxes = [p for p in ax.patches if isinstance(p, FancyBboxPatch)]
    kv = [p for p in boxes if p.get_y() < 1.5]
    query = [p for p in boxes if p.get_y() >= 1.5]
    assert len(query) == H * len(groups) and len(kv) == sum(groups)
    assert {(round(p.get_width(), 6), round(p.get_height(), 6)) for p in boxes} == \
        {(round(query[0].get_width(), 6), round(query[0].get_height(), 6))}
    shares = [t.get_text() for t in ax.texts if t.get_text().startswith("cache")]
    for G, share in zip(groups, shares, strict=True):
        said = Fraction(1) if "as large as" in share else Fraction(share.split()[1])
        assert said == Fraction(G, H)                                          # kv area G boxes against H boxes
    colors = {line.get_color() for line in ax.lines}
    assert PALETTE["yellow"] not in colors


def test_vit_tokens_prepends_the_class_token_and_gives_every_token_a_position(draw):
    texts = strings(draw(mechanisms.vit_tokens, 4))
    assert "transformer encoder\n4 + 1 = 5 tokens" in texts and "…" not in texts
    positions = sorted(int(t) for t in texts if t.isdigit())
    assert positions == [0, 1, 1, 2, 2, 3, 3, 4, 4]                   # position embeddings 0..4, patches 1..4
    assert "each bar: a patch flattened" in texts
    fig = draw(mechanisms.vit_tokens, 196, 768, patch=16)
    texts = strings(fig)
    assert "transformer encoder\n196 + 1 = 197 tokens of width $d$ = 768: (197, 768)" in texts
    assert texts.count("…") == 2 and "196" in texts and "cls" in texts
    assert "each bar: a patch flattened, 768 = 3·16·16 numbers" in texts
    assert "class token's final state → LayerNorm → classifier" in texts
    bars = [p for p in fig.axes[0].patches if isinstance(p, Rectangle)]
    assert len(bars) == 4 and all(p.get_height() >= 4 * p.get_width() for p in bars)   # thin bars, not squares
    assert "each bar: a patch flattened, 192 = 3·8·8 numbers" in strings(draw(mechanisms.vit_tokens, 4, patch=8))
    for args in ((0,), (4, 0)):
        with pytest.raises(ValueError, match="must be a positive int"):
            mechanisms.vit_tokens(*args)


def test_transformer_block_draws_every_grid_at_one_cell_size_under_its_familys_heading(draw):
    fig = draw(diagrams.transformer_block, FAMILIES)
    assert fig.get_size_inches()[0] <= mechanisms.WIDTH
    grids = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in grids] == ["self-attention", "causal\nself-attention", "encoder\nself-attention",
                                                "decoder causal\nself-attention", "cross-attention\n(decoder → encoder)"]
    size = fig.get_size_inches()
    cells = {(round(ax.get_position().width * size[0] / ax.images[0].get_array().shape[1], 6),
              round(ax.get_position().height * size[1] / ax.images[0].get_array().shape[0], 6)) for ax in grids}
    assert len(cells) == 1 and len(set(next(iter(cells)))) == 1                # one square cell size for all five
    headings = {t.get_text(): t.get_position() for t in fig.texts if t.get_fontsize() == mechanisms.SIZE}
    assert set(headings) == {"encoder-only", "decoder-only", "encoder–decoder"}
    bottom = [ax for ax in grids if ax.get_position().y1 < headings["encoder–decoder"][1]]
    assert len(bottom) == 3                                                    # one heading over the three panels
    left, right = min(ax.get_position().x0 for ax in bottom), max(ax.get_position().x1 for ax in bottom)
    assert left < headings["encoder–decoder"][0] < right
    assert {ax.get_xlabel() for ax in grids} == {"keys"} and {ax.get_ylabel() for ax in grids} == {"queries"}
    assert min(t.get_fontsize() for t in labels(fig)) >= mechanisms.SMALL
    assert len([ax for ax in fig.axes if not ax.axison]) == 1                  # the block diagram
