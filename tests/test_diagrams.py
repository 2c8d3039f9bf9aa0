"""The figures' drawing plumbing (helpers.diagrams): what each function draws, checked on its artists."""

import matplotlib.pyplot as plt
import pytest
import torch

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


def test_mask_grid_fills_the_allowed_pairs(ax):
    mask = causal_mask(4)
    mask_grid(ax, mask, "causal")
    assert torch.equal(torch.as_tensor(ax.images[0].get_array()), ~mask)
    assert ax.get_title() == "causal" and ax.get_xlabel() == "keys" and ax.get_ylabel() == "queries"
    assert len(ax.get_xticks(minor=True)) == 4 and list(ax.get_xticks()) == []
    with pytest.raises(ValueError, match="bool tensor"):
        mask_grid(ax, mask.float(), "floats")


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
        image, grid, sequence = fig.axes                          # the image, its patches, the token sequence
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
