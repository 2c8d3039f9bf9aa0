"""The figures' drawing plumbing (helpers.diagrams): what each function draws, checked on its artists."""

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.colors import to_rgba
from matplotlib.lines import Line2D

from helpers import diagrams
from helpers.attention import causal_mask
from helpers.diagrams import annotated_heatmap, block_diagram, mask_grid, text_color, vit_input
from helpers.plotting import PALETTE


@pytest.fixture
def ax():
    fig, ax = plt.subplots()
    yield ax
    plt.close(fig)


def labels(ax):
    return {(t.get_position(), t.get_text()): t.get_color() for t in ax.texts}


def test_text_color_contrasts_with_the_background():
    assert text_color("black") == "white" and text_color("white") == "black"
    assert text_color("#440154") == "white"              # viridis' dark end
    assert text_color("#fde725") == "black"              # and its light end
    assert text_color(PALETTE["sky"]) == "black"


def test_annotated_heatmap_labels_every_cell_with_a_contrasting_color(ax):
    values = torch.tensor([[0.0, 0.25], [0.5, 1.0]])
    image = annotated_heatmap(ax, values, vmin=0, vmax=1)
    assert image is ax.images[0]
    assert labels(ax) == {((0, 0), "0.00"): "white", ((1, 0), "0.25"): "white",
                          ((0, 1), "0.50"): "black", ((1, 1), "1.00"): "black"}   # viridis: dark to light


def test_annotated_heatmap_takes_the_colormap_and_a_format(ax):
    annotated_heatmap(ax, [[-1.5, 0.0, 1.5]], fmt="{:+.1f}", cmap="PuOr_r", vmin=-1.5, vmax=1.5, fontsize=9)
    assert labels(ax) == {((0, 0), "-1.5"): "white", ((1, 0), "+0.0"): "black", ((2, 0), "+1.5"): "white"}
    assert {t.get_fontsize() for t in ax.texts} == {9}


def test_annotated_heatmap_leaves_nan_cells_blank_and_takes_a_label_function(ax):
    hidden = causal_mask(3)
    annotated_heatmap(ax, torch.ones(3, 3).masked_fill(hidden, float("nan")), cmap="Blues", vmin=0, vmax=1)
    assert sorted(t.get_position() for t in ax.texts) == [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)]
    ax.clear()
    annotated_heatmap(ax, hidden.float(), fmt=lambda h: "$-\\infty$" if h else "0")
    assert [t.get_text() for t in ax.texts] == ["0", "$-\\infty$", "$-\\infty$", "0", "0", "$-\\infty$", "0", "0", "0"]


def test_annotated_heatmap_scales_to_the_data_without_vmin_and_vmax(ax):
    annotated_heatmap(ax, [[10.0, 20.0]])
    assert [t.get_color() for t in ax.texts] == ["white", "black"]


def test_annotated_heatmap_rejects_what_is_not_a_matrix(ax):
    with pytest.raises(ValueError, match=r"non-empty \(rows, cols\) matrix, got shape \(3,\)"):
        annotated_heatmap(ax, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="format string or a function"):
        annotated_heatmap(ax, [[1.0]], fmt=3)


def test_heatmap_row_draws_one_panel_per_matrix_as_wide_as_its_columns():
    hidden = causal_mask(3)
    panels = [(torch.zeros(3, 3), "scores", "key $j$", dict(cmap="PuOr_r", vmin=-1, vmax=1)),
              (hidden.float(), "mask", "key $j$", diagrams.MASK_STYLE),
              (torch.ones(3, 3).masked_fill(hidden, float("nan")), "weights", "key $j$", dict(vmin=0, vmax=1)),
              (torch.ones(3, 2), "outputs", "value coordinate", {})]
    fig = diagrams.heatmap_row(panels, ylabel="query $i$", figsize=(8, 3))
    try:
        axes = fig.axes
        assert [a.get_title() for a in axes] == ["scores", "mask", "weights", "outputs"]
        assert [a.get_xlabel() for a in axes] == ["key $j$"] * 3 + ["value coordinate"]
        assert {a.get_ylabel() for a in axes} == {"query $i$"}
        assert [len(a.get_xticks()) for a in axes] == [3, 3, 3, 2] and all(len(a.get_yticks()) == 3 for a in axes)
        widths = [a.get_position().width for a in axes]
        assert widths[3] / widths[0] == pytest.approx(2 / 3, rel=0.05)        # as wide as its number of columns
        assert [t.get_text() for t in axes[1].texts] == ["0", "$-\\infty$", "$-\\infty$", "0", "0", "$-\\infty$", "0", "0", "0"]
        assert len(axes[2].texts) == 6                                         # hidden (NaN) cells are blank
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="at least one"):
        diagrams.heatmap_row([], ylabel="query")


def test_two_decimals_writes_no_negative_zero():
    assert [diagrams.two_decimals(v) for v in (-0.004, -0.0, 0.004, -0.006, 1.234, -1.5)] == \
        ["0.00", "0.00", "0.00", "-0.01", "1.23", "-1.50"]


def test_attention_maps_draws_9_2s_panels_labelled_with_the_tokens():
    """Figure 9.2.2 and 9.2's mask control: scores (if given), mask, weights blank where hidden, outputs."""
    tokens, hidden = ["a", "b", "c"], causal_mask(3)
    weights = torch.softmax(torch.zeros(3, 3).masked_fill(hidden, float("-inf")), -1)
    outputs = torch.tensor([[-0.001, 0.5], [1.0, -2.0], [0.0, 0.25]])
    fig = diagrams.attention_maps(tokens, hidden, weights, outputs, scores=torch.full((3, 3), -0.002))
    try:
        axes = fig.axes
        assert [a.get_title() for a in axes] == [r"scores $QK^\top/\sqrt{d_k}$", "mask $M$", "weights $A$",
                                                 "outputs $Y = AV$"]
        for left, right in (axes[:2], axes[2:]):                     # rows of two sharing their rows, the queries
            assert [t.get_text() for t in left.get_yticklabels()] == tokens and left.get_ylabel() == "query $i$"
            assert list(right.get_yticks()) == list(left.get_yticks()) and right.get_position().y0 == left.get_position().y0
        assert all([t.get_text() for t in a.get_xticklabels()] == tokens for a in axes[:3])
        assert axes[3].get_xlabel() == "value coordinate" and len(axes[3].get_xticks()) == 2
        blank = torch.from_numpy(axes[2].images[0].get_array().filled(float("nan"))).isnan()
        assert torch.equal(blank, hidden) and len(axes[2].texts) == 6            # hidden weights: blank, unlabelled
        assert [t.get_text() for t in axes[1].texts] == [diagrams.MASK_STYLE["fmt"](h) for h in hidden.flatten().tolist()]
        assert axes[0].images[0].get_clim() == axes[3].images[0].get_clim() == (-1.5, 1.5)
        assert axes[2].images[0].get_clim() == (0, 1)
        assert [t.get_text() for t in axes[3].texts] == ["0.00", "0.50", "1.00", "-2.00", "0.00", "0.25"]
        assert {t.get_text() for t in axes[0].texts} == {"0.00"}                    # -0.002: not -0.00
    finally:
        plt.close(fig)
    fig = diagrams.attention_maps(tokens, hidden, weights, outputs)                # no scores: three panels
    try:
        assert [a.get_title() for a in fig.axes] == ["mask $M$", "weights $A$", "outputs $Y = AV$"]
    finally:
        plt.close(fig)
    before = plt.get_fignums()
    for call, match in ((lambda: diagrams.attention_maps(tokens, hidden.float(), weights, outputs), "bool"),
                        (lambda: diagrams.attention_maps(tokens[:2], hidden, weights, outputs), r"\(2, 2\)"),
                        (lambda: diagrams.attention_maps(tokens, hidden, weights[:, :2], outputs), "weights must"),
                        (lambda: diagrams.attention_maps(tokens, hidden, weights, outputs[:2]), "outputs must"),
                        (lambda: diagrams.attention_maps(tokens, hidden, weights, outputs, scores=weights[:2]), "scores")):
        with pytest.raises(ValueError, match=match):
            call()
    assert plt.get_fignums() == before


def _attention_example(T=6, d_v=4):
    g = torch.Generator().manual_seed(0)
    hidden = causal_mask(T)
    scores = torch.randn(T, T, generator=g, dtype=torch.float64)
    weights = torch.softmax(scores.masked_fill(hidden, float("-inf")), -1)
    return hidden, scores, weights, weights @ (torch.rand(T, d_v, generator=g, dtype=torch.float64) * 2.6 - 1.3)


def test_attention_maps_fit_the_sites_column_with_every_number_inside_its_cell():
    """Figure 9.2.2 at the book's settings: 6.5 inches wide (the site shows it unshrunk), its four panels in two
    rows of two, every cell the same size, every number at 9 points and inside its cell with room to spare."""
    import matplotlib as mpl

    from helpers import plotting

    hidden, scores, weights, outputs = _attention_example()
    tokens = "Your journey starts with one step".split()
    with mpl.rc_context(plotting.STYLE):
        fig = diagrams.attention_maps(tokens, hidden, weights, outputs, scores=scores)
        try:
            assert fig.get_size_inches()[0] == diagrams.WIDTH
            axes, (W, H) = fig.axes, fig.get_size_inches()
            cells = {(round(a.get_position().width * W / a.images[0].get_array().shape[1], 6),
                      round(a.get_position().height * H / a.images[0].get_array().shape[0], 6)) for a in axes}
            assert len(cells) == 1
            (u, _), = cells
            assert axes[0].get_position().y0 == axes[1].get_position().y0 > axes[2].get_position().y1
            fig.canvas.draw()
            renderer = fig.canvas.get_renderer()
            numbers = [t for a in axes for t in a.texts]
            assert len(numbers) == 36 + 36 + 21 + 24 and {t.get_fontsize() for t in numbers} == {diagrams.SMALL}
            for text in numbers:                                   # at most the cell's width less 0.06 inch
                assert text.get_window_extent(renderer).width <= (u - 0.06) * fig.dpi, text.get_text()
            assert all(s.get_visible() for a in axes for s in a.spines.values())      # white cells end at a frame
        finally:
            plt.close(fig)
        fig = diagrams.attention_maps(["abcdefgh"] * 8, causal_mask(8), torch.eye(8), torch.ones(8, 8))
        try:                                                       # too narrow for the numbers: the cells stay bare
            assert fig.get_size_inches()[0] == diagrams.WIDTH and not any(a.texts for a in fig.axes)
        finally:
            plt.close(fig)


def test_attention_maps_draw_hidden_keys_white_in_the_mask_and_blank_in_the_weights():
    from matplotlib.colors import to_rgba

    hidden, scores, weights, outputs = _attention_example(4, 2)
    fig = diagrams.attention_maps(list("abcd"), hidden, weights, outputs)
    try:
        mask, shown = fig.axes[0], fig.axes[1]
        image = mask.images[0]
        drawn = image.cmap(image.norm(image.get_array()))
        assert torch.equal(torch.from_numpy((drawn == to_rgba("white")).all(-1)), hidden)
        assert torch.equal(torch.from_numpy((drawn == to_rgba(PALETTE["blue"])).all(-1)), ~hidden)
        assert to_rgba(shown.get_facecolor()) == to_rgba("white")            # blank weights show the white axes
    finally:
        plt.close(fig)


def test_cost_crossover_draws_the_counts_against_the_model():
    lengths = [16, 64, 256]
    counts = {w: [(24 * T * w * w, 4 * T * T * w) for T in lengths] for w in (8, 32)}
    fig = diagrams.cost_crossover(lengths, counts, d=8)
    try:
        left, right = fig.axes
        model_linear, model_attention = left.lines[:2]
        assert list(model_linear.get_ydata()) == [24 * T * 64 for T in lengths]
        assert list(model_attention.get_ydata()) == [4 * T * T * 8 for T in lengths]
        counted = [list(line.get_ydata()) for line in left.lines[2:] if line.get_linestyle() == "None" and len(line.get_ydata())]
        assert counted == [[lin for lin, _ in counts[8]], [att for _, att in counts[8]]]
        assert [line.get_xdata()[0] for line in left.lines if line.get_linestyle() == "--"] == [48]   # T = 6d
        points = [line for line in right.lines if line.get_marker() not in ("None", "", None)]
        assert len(points) == 2 and all(len(line.get_xdata()) == 3 for line in points)
        for line in points:                                                  # every count on T / (T + 6d)
            ratio = line.get_xdata()
            assert list(line.get_ydata()) == pytest.approx(list(ratio / (ratio + 6)))
        assert left.get_yscale() == "log" and right.get_ylabel() == "scores and weighted sums' share"
        assert any("counted" in t.get_text() for t in left.get_legend().get_texts())
        # The legend's "counted" entry shows the markers the points are drawn with, circles and squares.
        legend_marks = {(line.get_marker(), line.get_color()) for line in left.get_legend().findobj(Line2D)}
        drawn_marks = {(line.get_marker(), line.get_color()) for line in left.lines[2:4]}
        assert {m for m, _ in drawn_marks} == {"o", "s"} and drawn_marks <= legend_marks
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="no counts for the width d = 16"):
        diagrams.cost_crossover(lengths, counts, d=16)
    with pytest.raises(ValueError, match="one \\(linear, attention\\) pair per length"):
        diagrams.cost_crossover(lengths[:2], counts, d=8)


def test_saturation_panels_label_both_axes_and_mark_the_scaled_norm():
    sigmas = torch.tensor([0.5, 1.0, 4.0])
    p_max = torch.tensor([[0.1, 0.2, 0.1], [0.3, 0.4, 0.5], [0.9, 0.99, 0.95]])
    norm = torch.tensor([[0.1, 0.1, 0.1], [0.2, 0.4, 0.3], [0.05, 0.01, 0.03]])
    eps = 1 - p_max
    fig = diagrams.saturation_panels(sigmas, p_max, norm, eps, marks={1: "scaled", 4: "$d_k=16$"})
    try:
        left, right = fig.axes
        assert left.get_ylabel() and left.get_xlabel() and right.get_ylabel() and right.get_xlabel()
        horizontal = [line for line in left.lines if len(set(line.get_ydata())) == 1 and line.get_linestyle() == ":"]
        assert [line.get_ydata()[0] for line in horizontal] == [pytest.approx(0.3)]   # the mean norm at sigma 1
        median = [line for line in left.lines if line.get_label() == "median $\\|J\\|_F$"][0]
        assert list(median.get_ydata()) == pytest.approx([0.1, 0.3, 0.03])
        assert {t.get_text() for t in left.texts} == {"scaled", "$d_k=16$"}
        assert horizontal[0].get_label() == "mean $\\|J\\|_F$ at $\\sigma=1$"      # named in the legend
        assert left.get_title() and right.get_title()
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="sigmas must be"):
        diagrams.saturation_panels(sigmas, p_max[:2], norm, eps, marks={})


def test_saturation_panels_draw_the_threshold_only_when_given():
    sigmas = torch.tensor([0.5, 1.0, 4.0])
    p_max = torch.tensor([[0.1, 0.2, 0.1], [0.3, 0.4, 0.5], [0.9, 0.99, 0.95]])
    norm = torch.tensor([[0.1, 0.1, 0.1], [0.2, 0.4, 0.3], [0.05, 0.01, 0.03]])
    for saturated, expected in ((None, []), (0.05, [0.05])):
        fig = diagrams.saturation_panels(sigmas, p_max, norm, 1 - p_max, marks={}, saturated=saturated)
        try:
            left = fig.axes[0]
            lines = [line for line in left.lines if line.get_linestyle() == "-."]
            assert [line.get_ydata()[0] for line in lines] == pytest.approx(expected)
            assert all(line.get_label() == "saturated below 0.05" for line in lines)   # named in the legend
        finally:
            plt.close(fig)


def test_saturation_panels_scatter_the_first_vectors_with_their_exact_norms():
    """The right panel may show fewer vectors than the left averages, with norms computed another way."""
    sigmas = torch.tensor([0.5, 1.0, 4.0])
    p_max = torch.tensor([[0.1, 0.2, 0.1], [0.3, 0.4, 0.5], [0.9, 0.99, 0.95]])
    norm = torch.tensor([[0.1, 0.1, 0.1], [0.2, 0.4, 0.3], [0.05, 0.01, 0.03]])
    eps, exact = 1 - p_max[:, :2], norm[:, :2] * 1.01
    fig = diagrams.saturation_panels(sigmas, p_max, norm, eps, marks={}, exact=exact)
    try:
        left, right = fig.axes
        dots = [line for line in right.lines if line.get_linestyle() == "None"][0]
        assert sorted(dots.get_ydata()) == pytest.approx(sorted(exact.flatten().tolist()))
        assert "3 queries" in left.get_title() and "first 2 queries" in right.get_title()
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="eps and exact must be"):
        diagrams.saturation_panels(sigmas, p_max, norm, eps, marks={}, exact=exact[:, :1])
    with pytest.raises(ValueError, match="M <= N"):
        diagrams.saturation_panels(sigmas, p_max, norm, torch.ones(3, 4) / 2, marks={})


def test_offset_panels_label_the_colour_bar_and_plot_every_score():
    T = 5
    S = torch.arange(T)[None, :] - torch.arange(T)[:, None]                  # constant along each diagonal
    offsets = torch.linspace(1 - T, T - 1, 50)
    fig = diagrams.offset_panels(S.double(), offsets, offsets, at_zero=0.0)
    try:
        left, right, colorbar = fig.axes
        assert colorbar.get_ylabel() == "score"
        scores = [line for line in right.lines if line.get_label() == f"all {T * T:,} scores"][0]
        assert len(scores.get_xdata()) == T * T and list(scores.get_xdata()) == list(scores.get_ydata())
        assert left.get_xlabel() == "key position $n$" and left.get_ylabel() == "query position $m$"
        assert left.get_title() and right.get_title()
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="square"):
        diagrams.offset_panels(torch.zeros(3, 4), offsets, offsets, at_zero=0.0)


def test_mask_grid_fills_the_allowed_pairs(ax):
    mask = causal_mask(4)
    mask_grid(ax, mask, "causal")
    assert torch.equal(torch.as_tensor(ax.images[0].get_array()), ~mask)
    assert ax.get_title() == "causal" and ax.get_xlabel() == "keys" and ax.get_ylabel() == "queries"
    assert len(ax.get_xticks(minor=True)) == 4 and list(ax.get_xticks()) == []
    assert all(spine.get_visible() for spine in ax.spines.values())       # closed: the hidden cells end somewhere
    with pytest.raises(ValueError, match="bool tensor"):
        mask_grid(ax, mask.float(), "floats")


def test_mask_grid_labels_its_grid_at_the_books_smallest_size(ax):
    mask_grid(ax, causal_mask(3), "causal")
    assert min(t.get_fontsize() for t in (ax.title, ax.xaxis.label, ax.yaxis.label)) >= diagrams.SMALL == 9


def test_mask_style_paints_visible_keys_blue_and_hidden_keys_pale(ax):
    """The chapter's colours, as masks_on_batch, mask_grid and the weights' Blues use them: blue where a query
    may attend (a key whose score gets 0), pale where a key is hidden (-inf); each cell's label reads on it."""
    from matplotlib.colors import to_rgba

    hidden = causal_mask(3).float()
    annotated_heatmap(ax, hidden, **diagrams.MASK_STYLE)
    image = ax.images[0]
    colors = {(t.get_text(), tuple(image.cmap(image.norm(v)))) for t, v in zip(ax.texts, hidden.flatten().tolist(), strict=True)}
    assert {c for text, c in colors if text == "0"} == {to_rgba(PALETTE["blue"])}
    assert all(diagrams._luminance(c) > 0.8 for text, c in colors if text != "0")
    assert {c for text, c in colors if text != "0"} == {to_rgba("white")}     # as masks_on_batch and mask_grid
    assert {(t.get_text(), t.get_color()) for t in ax.texts} == {("0", "white"), ("$-\\infty$", "black")}
    assert {t.get_fontsize() for t in ax.texts} == {9}


@pytest.mark.parametrize(("families", "message"), [
    ({"causal": causal_mask(3)}, "must read 'family: panel', got 'causal'"),
    ({"decoder-only: causal": causal_mask(3).float()}, "a mask must be a \\(queries, keys\\) bool tensor"),
    ({}, "at least one"),
])
def test_transformer_block_names_what_it_cannot_draw(families, message):
    before = plt.get_fignums()
    with pytest.raises(ValueError, match=message):
        diagrams.transformer_block(families)
    assert plt.get_fignums() == before


def test_block_diagram_draws_both_sublayers_on_the_residual_stream(ax):
    block_diagram(ax)
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("LayerNorm") == 2 and texts.count("+") == 2
    assert {"multi-head\nattention", "MLP", "residual stream"} <= set(texts)
    assert len(ax.patches) == 4 and not ax.axison


def test_vit_input_shows_the_image_its_patches_and_the_token_sequence():
    img = torch.rand(3, 64, 64)
    fig = vit_input(img, 16)
    try:
        assert fig.get_size_inches()[0] == diagrams.WIDTH
        image, grid, sequence = fig.axes                          # the image, its patches, the token sequence
        assert min(t.get_fontsize() for t in [*fig.texts, *grid.texts, *sequence.texts, image.xaxis.label,
                                              *image.get_xticklabels(), *image.get_yticklabels()]) >= diagrams.SMALL
        assert len(grid.images) == 16 and len(sequence.images) == 1 + 16          # 4 x 4 patches; cls + 16 tokens
        assert torch.equal(torch.as_tensor(grid.images[0].get_array()), img[:, :16, :16].permute(1, 2, 0))
        assert torch.equal(torch.as_tensor(sequence.images[-1].get_array()), img[:, 48:, 48:].permute(1, 2, 0))
        assert [t.get_text() for t in grid.texts] == [str(i) for i in range(1, 17)]             # raster order
        assert [t.get_text() for t in sequence.texts] == ["cls", "0", "5", "10", "15", "16"]
        x0, _, y0, _ = grid.images[0].get_extent()
        x1, _, y1, _ = grid.images[1].get_extent()
        x4, _, y4, _ = grid.images[4].get_extent()
        assert x1 > x0 and y1 == y0 and x4 == x0 and y4 < y0        # patch 2 right of patch 1, patch 5 below it
        assert image.get_title() == "the image on a 4 x 4 grid"
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="up to 7 x 7"):
        vit_input(torch.rand(3, 64, 64), 8)
    with pytest.raises(ValueError, match="must divide"):
        vit_input(img, 24)
    with pytest.raises(ValueError, match="square RGB"):
        vit_input(torch.rand(3, 64, 32), 16)


# Issue 23 and the probe that followed it.
def test_annotated_heatmap_refuses_complex_values(ax):
    import numpy as np

    for values in (np.array([[1 + 1j, 2.0]]), torch.tensor([[1 + 1j]])):
        with pytest.raises(ValueError, match="values must be real numbers, got complex"):
            annotated_heatmap(ax, values)          # the imaginary part was dropped with only a warning


def test_annotated_heatmap_takes_half_precision_and_names_bad_values_and_formats(ax):
    annotated_heatmap(ax, torch.tensor([[0.25, 0.5]], dtype=torch.bfloat16))    # "unsupported ScalarType" before
    assert [t.get_text() for t in ax.texts] == ["0.25", "0.50"]
    with pytest.raises(ValueError, match="values must be a matrix of real numbers"):
        annotated_heatmap(ax, [["a", "b"]])
    with pytest.raises(ValueError, match=r"fmt '\{:d\}' cannot format the value 0.5"):
        annotated_heatmap(ax, [[0.5]], fmt="{:d}")
    with pytest.raises(ValueError, match="ax must be a matplotlib Axes, got NoneType"):
        annotated_heatmap(None, [[0.5]])


def test_mask_grid_and_block_diagram_name_what_is_not_an_axes():
    with pytest.raises(ValueError, match="ax must be a matplotlib Axes"):
        mask_grid(None, causal_mask(3), "causal")
    with pytest.raises(ValueError, match="ax must be a matplotlib Axes"):
        block_diagram("ax")


@pytest.mark.parametrize(("img", "message"), [
    (torch.full((3, 32, 32), 255, dtype=torch.uint8), "img must be a real floating-point tensor"),   # a black class token before
    (torch.full((3, 32, 32), 2.0), r"img's values must lie in \[0, 1\]"),
    (torch.full((3, 32, 32), float("nan")), r"img's values must lie in \[0, 1\]"),
])
def test_vit_input_refuses_images_it_would_draw_wrong(img, message):
    with pytest.raises(ValueError, match=message):
        vit_input(img, 16)


def test_vit_input_draws_half_precision_images():
    img = torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    fig = vit_input(img, 16)                        # "Got unsupported ScalarType BFloat16" before
    try:
        assert torch.equal(torch.as_tensor(fig.axes[1].images[0].get_array()), img[:, :16, :16].float().permute(1, 2, 0))
    finally:
        plt.close(fig)


def test_text_color_refuses_nan_components():
    with pytest.raises(ValueError, match=r"background must be a colour with components in \[0, 1\]"):
        text_color((float("nan"), 0.0, 0.0))            # was "black"


# The review that passed bad input to the helpers.
def test_annotated_heatmap_labels_infinite_cells_readably():
    """imshow leaves +-inf cells blank, but -inf's label took the colormap's dark "under" colour: white
    on white. Both labels are dark on the blank (white) cell, in the drawn pixels too."""
    import numpy as np

    fig, ax = plt.subplots(figsize=(2, 2), dpi=100)
    try:
        annotated_heatmap(ax, [[0.5, float("-inf")], [-0.3, float("inf")]], fontsize=14)
        assert [t.get_color() for t in ax.texts][1::2] == ["black", "black"]
        fig.canvas.draw()
        pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3]
        for j, i in [(1, 0), (1, 1)]:                                # the infinite cells' centres
            x, y = ax.transData.transform((j, i))
            row, col = round(pixels.shape[0] - y), round(x)
            cell = pixels[row - 8:row + 8, col - 15:col + 15]
            assert cell.min() < 100                                   # some dark pixels: the label shows
    finally:
        plt.close(fig)


@pytest.mark.parametrize("values", [[[1.0, 2.0], [3.0, 4.0]], __import__("numpy").eye(2)])
def test_heatmap_row_takes_what_annotated_heatmap_takes(values):
    fig = diagrams.heatmap_row([(values, "t", "x", {})], "y")        # a list raised AttributeError ('shape')
    try:
        assert [t.get_text() for t in fig.axes[0].texts][:2] == ["1.00", "2.00" if isinstance(values, list) else "0.00"]
    finally:
        plt.close(fig)


def test_heatmap_row_names_a_panel_that_is_not_a_matrix_and_leaves_no_figure_open():
    before = plt.get_fignums()
    with pytest.raises(ValueError, match=r"panels\[1\]'s values must be a non-empty \(rows, cols\) matrix, got shape \(3,\)"):
        diagrams.heatmap_row([(torch.ones(3, 3), "a", "x", {}), (torch.rand(3), "b", "x", {})], "y")   # was IndexError
    with pytest.raises(ValueError, match="fmt"):
        diagrams.heatmap_row([(torch.ones(2, 2), "a", "x", {"fmt": "{:d}"})], "y")
    assert plt.get_fignums() == before


def test_cost_crossover_refuses_before_drawing():
    before = plt.get_fignums()
    with pytest.raises(ValueError, match="up to 4 widths, got 5"):
        diagrams.cost_crossover([16, 32], {w: [(1, 1), (2, 2)] for w in (1, 2, 3, 4, 5)}, 1)
    assert plt.get_fignums() == before                                # the left panel's figure was left open
    with pytest.raises(ValueError, match=r"counts\[4\] must hold \(linear, attention\) FLOP counts.*got \(0, 0\)"):
        diagrams.cost_crossover([16, 32], {4: [(0, 0), (2, 2)]}, 4)  # was ZeroDivisionError
    assert plt.get_fignums() == before


def test_saturation_panels_names_marks_that_are_not_a_dict():
    before = plt.get_fignums()
    with pytest.raises(ValueError, match=r"marks must be a dict \{sigma: label\}, got list \[1\]"):
        diagrams.saturation_panels([1, 2], [[0.5], [0.6]], [[0.1], [0.2]], [[0.5], [0.4]], [1])
    assert plt.get_fignums() == before


def test_sparse_patterns_draws_each_pattern_and_the_reach_under_them():
    T = 16
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    window = (i - j).abs() <= 1
    patterns = {"sliding window": window, "global tokens": window | (i < 1) | (j < 1)}
    reach = torch.stack([(torch.arange(T) - 8).abs() <= n for n in range(1, 4)])
    fig = diagrams.sparse_patterns(patterns, reach, 8)
    try:
        assert fig.get_size_inches()[0] == diagrams.WIDTH
        *grids, below = fig.axes
        assert [a.get_title() for a in grids] == list(patterns)
        for ax, p in zip(grids, patterns.values(), strict=True):
            assert torch.equal(torch.as_tensor(ax.images[0].get_array()), p)
            assert ax.images[0].cmap(1.0) == to_rgba(PALETTE["blue"]) and list(ax.get_xticks()) == [0, 8, 15]
        assert torch.equal(torch.as_tensor(below.images[0].get_array()), reach)
        assert [t.get_text() for t in below.get_yticklabels()] == ["1", "2", "3"]       # layers counted from 1
        assert below.get_position().y1 < min(a.get_position().y0 for a in grids)       # under the patterns
        assert "reaches token 8" in below.get_title()
        assert min(t.get_fontsize() for a in fig.axes for t in (a.title, a.xaxis.label, *a.get_xticklabels())) >= 9
    finally:
        plt.close(fig)
    before = plt.get_fignums()
    for call, match in ((lambda: diagrams.sparse_patterns({"a": window.float()}, reach, 8), "bool"),
                        (lambda: diagrams.sparse_patterns(patterns, reach[:, :4], 8), "reach must be"),
                        (lambda: diagrams.sparse_patterns(patterns, reach, 16), "token must be a position from 0 to 15"),
                        (lambda: diagrams.sparse_patterns(dict.fromkeys("abcd", window), reach, 8), "1 to 3")):
        with pytest.raises(ValueError, match=match):
            call()
    assert plt.get_fignums() == before


def test_shifted_windows_outline_the_masks_pieces_in_dark_yellow_under_the_regular_windows():
    """Figure 9.6.3: the regular windows and the shifted ones in thick white; the rolled panel outlines the mask's
    pieces in dashed dark yellow (3.1:1 on white, where Okabe and Ito's yellow has 1.3:1), 2 points wide, under
    the regular windows' white, and numbers the shifted windows; the image rolled with the grid."""
    from matplotlib.collections import LineCollection

    from helpers.vision import window_borders, window_ids

    image = torch.rand(64, 64, 3, generator=torch.Generator().manual_seed(0))
    regular, shifted = window_ids(8, 8, 4), window_ids(8, 8, 4, shift=2)
    rolled = shifted.roll((-2, -2), dims=(0, 1))
    fig = diagrams.shifted_windows(image, regular, shifted, rolled, 2)
    try:
        assert fig.get_size_inches()[0] == diagrams.WIDTH
        left, middle, right = fig.axes
        assert [sorted(t.get_text() for t in a.texts) for a in fig.axes] == [[], [str(w) for w in range(9)],
                                                                             [str(w) for w in range(9)]]
        masks, windows = (c for c in right.collections if isinstance(c, LineCollection))
        assert to_rgba(masks.get_colors()[0]) == to_rgba(diagrams.DARK_YELLOW) != to_rgba(PALETTE["yellow"])
        assert masks.get_linewidths()[0] >= 2 and masks.get_linestyles()[0][1] is not None          # dashed
        assert len(masks.get_segments()) == len(window_borders(rolled))
        assert to_rgba(windows.get_colors()[0]) == to_rgba("white") and windows.get_linewidths()[0] == 3
        assert right.collections.index(masks) < right.collections.index(windows)                  # white on top
        assert torch.equal(torch.as_tensor(right.images[0].get_array()), image.roll((-16, -16), dims=(0, 1)))
        assert min(t.get_fontsize() for a in fig.axes for t in (*a.texts, a.xaxis.label, *a.get_xticklabels())) >= 9
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="1 to 3"):
        diagrams.window_panels([])
