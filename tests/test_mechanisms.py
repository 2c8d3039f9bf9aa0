"""Pictures of the mechanisms (helpers.mechanisms, issue 33): each figure's labels come from its arguments,
bad arguments are refused before a figure opens, the SVG is byte-stable, and at the book's settings no two
labels overlap, none leaves the figure and none is set below 9 points."""

import io
import itertools
import math

import matplotlib as mpl
import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.text import Annotation

from helpers import mechanisms, plotting
from helpers.attention import causal_mask, padding_mask
from helpers.plotting import PALETTE
from helpers.positions import frequencies

SCORES = torch.tensor([1.2, -0.3, 2.1, 0.4, -1.0])
WEIGHTS = torch.softmax(SCORES, 0)
# Each function at a typical size and at the largest (or most crowded) its layout takes.
CASES = {
    "soft_lookup": lambda: mechanisms.soft_lookup(WEIGHTS, [0.8, -0.5, 1.3, 0.1, -1.2], SCORES),
    "soft_lookup-8": lambda: mechanisms.soft_lookup(torch.full((8,), 1 / 8), torch.linspace(-10, 10, 8)),
    "encoder_decoder_attention": lambda: mechanisms.encoder_decoder_attention(6, torch.softmax(torch.arange(6.0), 0)),
    "encoder_decoder_attention-8": lambda: mechanisms.encoder_decoder_attention(8, step=12),
    "qkv_projection": lambda: mechanisms.qkv_projection(6, 8, 4),
    "qkv_projection-32": lambda: mechanisms.qkv_projection(32, 32, 32),
    "qkv_projection-1": lambda: mechanisms.qkv_projection(1, 1, 1),
    "multi_head_split": lambda: mechanisms.multi_head_split(2, 5, 16, 4),
    "multi_head_split-many": lambda: mechanisms.multi_head_split(128, 1024, 4096, 32),
    "multi_head_split-1": lambda: mechanisms.multi_head_split(1, 1, 1, 1),
    "masks_on_batch": lambda: mechanisms.masks_on_batch([6, 4], 6),
    "masks_on_batch-3x8": lambda: mechanisms.masks_on_batch([8, 1, 5], 8),
    "masks_on_batch-2": lambda: mechanisms.masks_on_batch([1], 2),
    "rope_rotation": lambda: mechanisms.rope_rotation(64, [0, 1, 2, 3]),
    "rope_rotation-far": lambda: mechanisms.rope_rotation(8, [0, 1, 5, 20, 100, 100_000], base=100, pairs=[0, 3]),
    "encoder_decoder_wiring": lambda: mechanisms.encoder_decoder_wiring(2),
    "encoder_decoder_wiring-3": lambda: mechanisms.encoder_decoder_wiring(3),
    "decoder_only_stack": lambda: mechanisms.decoder_only_stack(["Your", "journey", "starts", "with", "one", "step"], 2),
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
    "grouped_query_heads": lambda: mechanisms.grouped_query_heads(8),
    "grouped_query_heads-16": lambda: mechanisms.grouped_query_heads(16, [16, 4, 1]),
    "grouped_query_heads-1": lambda: mechanisms.grouped_query_heads(1),
    "vit_tokens": lambda: mechanisms.vit_tokens(49, 192),
    "vit_tokens-4": lambda: mechanisms.vit_tokens(4),
}


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
    """The figure's non-empty text labels (the arrows are annotations without text)."""
    return [t for ax in fig.axes for t in ax.texts if t.get_text().strip()] + [t for t in fig.texts if t.get_text().strip()]


def strings(fig):
    return [t.get_text() for t in labels(fig)]


def svg(fig):
    buffer = io.BytesIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


@pytest.mark.parametrize("case", CASES)
def test_each_figure_is_readable_at_the_sites_width(case, draw):
    """At most 10 inches wide (the site shows about 800 px), labels of 9 points or more, every label inside
    the figure, and no two labels' boxes overlapping, as the renderer lays them out."""
    fig = draw(CASES[case])
    assert isinstance(fig, Figure) and fig.get_size_inches()[0] <= 10
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    shown = [(t.get_text(), t.get_window_extent(renderer)) for t in labels(fig)]
    assert shown and min(t.get_fontsize() for t in labels(fig)) >= mechanisms.SMALL
    page = fig.bbox
    for text, box in shown:
        assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1 and page.y0 - 1 <= box.y0 and box.y1 <= page.y1 + 1, \
            f"{text!r} leaves the figure: {box.bounds} outside {page.bounds}"
    for (a, box_a), (b, box_b) in itertools.combinations(shown, 2):
        width = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
        height = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
        assert width <= 0.5 or height <= 0.5, f"{a!r} and {b!r} overlap ({width:.1f} x {height:.1f} px)"


@pytest.mark.parametrize("case", ["soft_lookup", "encoder_decoder_attention", "qkv_projection", "multi_head_split",
                                  "masks_on_batch", "rope_rotation", "encoder_decoder_wiring", "decoder_only_stack",
                                  "online_softmax_tiles", "kv_cache", "grouped_query_heads", "vit_tokens"])
def test_each_figure_renders_to_the_same_svg_bytes(case, draw):
    assert svg(draw(CASES[case])) == svg(draw(CASES[case]))


@pytest.mark.parametrize("call", [
    lambda: mechanisms.encoder_decoder_attention(3, step=-1), lambda: mechanisms.qkv_projection(6, 8, 33),
    lambda: mechanisms.multi_head_split(2, 5, 16, 3), lambda: mechanisms.masks_on_batch([3], 2),
    lambda: mechanisms.rope_rotation(8, [0], pairs=[9]), lambda: mechanisms.encoder_decoder_wiring(True),
    lambda: mechanisms.decoder_only_stack(["a", 3], 2), lambda: mechanisms.online_softmax_tiles(8, 0),
    lambda: mechanisms.kv_cache(2, prompt=0), lambda: mechanisms.grouped_query_heads(8, [8, 4, 2, 1]),
    lambda: mechanisms.vit_tokens(4, d=-1),
])
def test_a_refused_call_leaves_no_figure_open(call):
    before = plt.get_fignums()
    with pytest.raises(ValueError):
        call()
    assert plt.get_fignums() == before


def test_soft_lookup_writes_the_numbers_it_is_given(draw):
    fig = draw(CASES["soft_lookup"])
    texts = strings(fig)
    assert {"$s_{1}$ = 1.20", "$s_{2}$ = \u22120.30", "$v_{3}$ = 1.30", "0.58", "= 0.90", "they sum to one"} <= set(texts)
    blue = mpl.colors.to_rgba(PALETTE["blue"])
    bars = [p for p in fig.axes[0].patches if isinstance(p, Rectangle) and p.get_facecolor() == blue]
    assert [round(p.get_width() / 2, 6) for p in bars] == [round(w, 6) for w in WEIGHTS.tolist()]   # bars as long as the weights
    fig = draw(mechanisms.soft_lookup, [0.5, 0.5], [1.0, 3.0])
    assert {"$s_{1}$", "$s_{2}$", "= 2.00"} <= set(strings(fig)) and "$k_{3}$" not in strings(fig)


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


def test_encoder_decoder_attention_draws_one_state_per_input_and_its_weight(draw):
    fig = draw(mechanisms.encoder_decoder_attention, 5)
    texts = strings(fig)
    assert [f"$h_{{{j}}}$" for j in range(1, 6)] == [t for t in texts if t.startswith("$h_")]
    assert {"$s_{t-1}$", "$s_{t}$", "context $c_{t}$", "$\\alpha_{t5}$"} <= set(texts)
    weights = torch.tensor([0.1, 0.6, 0.3])
    fig = draw(mechanisms.encoder_decoder_attention, 3, weights, step=4)
    texts = strings(fig)
    assert {"$s_{3}$", "$s_{4}$", "0.10", "0.60", "0.30", "next output $y_{4}$"} <= set(texts) and "$h_{4}$" not in texts
    widths = [line.get_linewidth() for line in fig.axes[0].lines if line.get_color() == PALETTE["blue"]]
    assert widths == pytest.approx([0.6 + 6 * w for w in weights.tolist()])          # thicker where the weight is larger


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
    fig = draw(mechanisms.qkv_projection, 10, 8, 2)
    assert "$T\\times d_k$ = 10 × 2" in strings(fig) and "$T\\times d_k$ = 6 × 4" not in strings(fig)
    frames = [p for p in fig.axes[0].patches if isinstance(p, Rectangle) and p.get_edgecolor()[:3] == (0, 0, 0)]
    ratios = sorted({(round(p.get_height() / p.get_width(), 6)) for p in frames})
    assert ratios == [10 / 8, 8 / 2, 10 / 2]                          # X (10 x 8), each W (8 x 2), each output (10 x 2)


@pytest.mark.parametrize(("args", "message"), [((6, 8, 0), "d_k must be from 1 to 32"), ((33, 8, 4), "T must be from 1 to 32"),
                                               ((6, 8.0, 4), "d must be an int, got 8.0")])
def test_qkv_projection_refuses_bad_sizes(args, message):
    with pytest.raises(ValueError, match=message):
        mechanisms.qkv_projection(*args)


def test_multi_head_split_writes_every_tensors_shape(draw):
    texts = strings(draw(mechanisms.multi_head_split, 2, 5, 16, 4))
    assert texts.count("input $x$\n(B, T, d)\n= (2, 5, 16)") == 1
    assert texts.count("per head\n(B, h, T, d/h)\n= (2, 4, 5, 4)") == 1
    assert [t for t in texts if t.startswith("head ")] == ["head 1", "head 2", "head 3", "head 4"]
    texts = strings(draw(mechanisms.multi_head_split, 1, 3, 64, 8))
    assert "per head\n(B, h, T, d/h)\n= (1, 8, 3, 8)" in texts
    assert [t for t in texts if t.startswith("head ")] == ["head 1", "head 2", "head 8"] and texts.count("⋮") == 4


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
    blue = mpl.colors.to_rgba(PALETTE["blue"])
    cells = [tuple(c) for coll in fig.axes[0].collections for c in coll.get_facecolors()]
    assert allowed == 141 and len(cells) == 2 * 3 * T * T and cells.count(blue) == allowed
    assert {"sequence 2\nlength 4", "padding + causal"} <= set(strings(fig))
    grey = [t.get_text() for t in labels(fig) if t.get_color() == "0.5"]      # sequence 2's padded positions, 3 panels x 2 axes
    assert sorted(grey) == ["4"] * 6 + ["5"] * 6


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
    assert "pair $j$ = 7\n(coordinates 14, 15)\n$\\omega_{7}$ = 0.0178 rad" in texts
    arrows = [a for a in fig.axes[0].texts if isinstance(a, Annotation) and not a.get_text()]
    assert len(arrows) == len(pairs) * len(positions)
    for (j, m), a in zip(itertools.product(pairs, positions), arrows, strict=True):
        (x1, y1), (x0, y0) = a.xy, a.xyann
        turned = math.atan2(y1 - y0, x1 - x0) % (2 * math.pi)
        assert turned == pytest.approx(m * omega[j] % (2 * math.pi), abs=1e-9)
    assert any("depends on the positions only through $n - m$" in t for t in texts)


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
    texts = strings(draw(mechanisms.online_softmax_tiles, 64, 11))
    assert "tile 6\nkeys 55–63" in texts and not [t for t in texts if t.startswith("$s_")]   # cells too narrow to label
    with pytest.raises(ValueError, match="up to 8 tiles, got 10"):
        mechanisms.online_softmax_tiles(64, 7)
    with pytest.raises(ValueError, match="T_k must be from 1 to 4096"):
        mechanisms.online_softmax_tiles(4097, 1024)


def test_kv_cache_counts_one_new_key_per_step_against_the_whole_prefix(draw):
    steps, prompt = 5, 2
    fig = draw(mechanisms.kv_cache, steps, prompt=prompt)
    texts = strings(fig)
    counts = [t.get_text() for t in sorted(labels(fig), key=lambda t: (t.get_position()[0], -t.get_position()[1]))
              if t.get_text().isdigit()]
    assert counts == ["2", "1", "1", "1", "1", "2", "3", "4", "5", "6"]          # with the cache, then without
    assert {"total 6", "total 20", "step 5"} <= set(texts) and "step 6" not in texts
    blue = mpl.colors.to_rgba(PALETTE["blue"])
    assert sum(p.get_facecolor() == blue for p in fig.axes[0].patches) == 6 + 20 + 1      # the legend's square too
    for kwargs in (dict(steps=0), dict(steps=9), dict(steps=3, prompt=5)):
        with pytest.raises(ValueError, match="must be from 1 to"):
            mechanisms.kv_cache(**kwargs)


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


def test_vit_tokens_prepends_the_class_token_and_gives_every_token_a_position(draw):
    texts = strings(draw(mechanisms.vit_tokens, 4))
    assert "transformer encoder\n4 + 1 = 5 tokens" in texts and "…" not in texts
    positions = sorted(int(t) for t in texts if t.isdigit())
    assert positions == [0, 1, 1, 2, 2, 3, 3, 4, 4]                   # position embeddings 0..4, patches 1..4
    texts = strings(draw(mechanisms.vit_tokens, 196, 768))
    assert "transformer encoder\n196 + 1 = 197 tokens of width $d$ = 768: (197, 768)" in texts
    assert texts.count("…") == 2 and "196" in texts and "cls" in texts
    for args in ((0,), (4, 0)):
        with pytest.raises(ValueError, match="must be a positive int"):
            mechanisms.vit_tokens(*args)
