import pytest
import torch

from helpers.vision import patches, sample_image, window_borders, window_ids, window_merge, window_partition


def test_sample_image_is_a_square_rgb_tensor_in_unit_range():
    img = sample_image(64)
    assert img.shape == (3, 64, 64) and img.dtype == torch.float32
    assert 0 <= img.min() and img.max() <= 1 and img.std() > 0.1


def test_patches_are_the_image_in_raster_order():
    img = torch.arange(2 * 6 * 9, dtype=torch.float32).view(2, 6, 9)
    p = patches(img, 3)
    assert p.shape == (6, 2, 3, 3)
    assert torch.equal(p[4], img[:, 3:6, 3:6])                    # second row of patches, second column
    rows = torch.cat([torch.cat(list(p[r * 3:(r + 1) * 3]), dim=2) for r in range(2)], dim=1)
    assert torch.equal(rows, img)


def test_window_partition_groups_neighbours_and_merge_undoes_it():
    x = torch.randn(2, 8, 12, 5)
    win = window_partition(x, 4)
    assert win.shape == (2 * 2 * 3, 16, 5)
    assert torch.equal(win[4], x[0, 4:8, 4:8].reshape(16, 5))     # image 0, window row 1, column 1
    assert torch.equal(window_merge(win, 4, 8, 12), x)


def test_window_ids_regular_and_shifted():
    ids = window_ids(8, 8, 4)
    assert ids.unique().numel() == 4 and (ids[:4, :4] == 0).all() and (ids[4:, 4:] == 3).all()
    shifted = window_ids(8, 8, 4, shift=2)
    counts = torch.bincount(shifted.flatten())
    assert counts.tolist() == [4, 8, 4, 8, 16, 8, 4, 8, 4]         # the 3 x 3 windows of Swin's figure
    # A regular window's tokens, rolled by the shift, are one shifted window or a union of cut-off ones.
    assert torch.equal(window_ids(8, 8, 4, shift=2).roll((-2, -2), (0, 1))[:4, :4].unique(), torch.tensor([4]))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: sample_image(0), "positive int"),
        (lambda: sample_image(32, top=200), "top must lie"),
        (lambda: patches(torch.randn(3, 10, 10), 4), "must divide"),
        (lambda: patches(torch.randn(10, 10), 5), r"\(C, H, W\)"),
        (lambda: window_partition(torch.randn(1, 6, 6, 2), 4), "must divide"),
        (lambda: window_partition(torch.randn(6, 6, 2), 3), r"\(B, H, W, C\)"),
        (lambda: window_merge(torch.randn(4, 9, 2), 3, 6, 9), "do not tile"),
        (lambda: window_ids(8, 8, 4, shift=4), "shift must lie"),
        (lambda: patches(torch.randn(3, 8, 8), 4.0), "P must be a positive int, got 4.0"),
        (lambda: patches([[[0.0]]], 1), "img must be a torch.Tensor"),
        (lambda: window_partition(torch.randn(1, 6, 6, 2), True), "w must be a positive int, got True"),
        (lambda: window_ids(8, 8, 4, shift=0.5), "shift must be an int"),
    ],
)
def test_bad_arguments_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_window_borders_outline_each_window():
    assert len(window_borders(torch.zeros(3, 5, dtype=torch.long))) == 2 * (3 + 5)     # just the frame
    ids = window_ids(4, 4, 2)
    segments = window_borders(ids)
    assert len(segments) == 4 * 4 + 2 * 4                  # the frame plus one inner line each way
    assert ((2, 0), (2, 1)) in segments and ((0, 2), (1, 2)) in segments
    with pytest.raises(ValueError, match=r"\(H, W\)"):
        window_borders(torch.zeros(4))


def test_window_borders_draw_the_frame_whatever_the_ids():
    assert len(window_borders(torch.full((2, 2), -1))) == 2 * (2 + 2)      # -1 matched the padding: no frame
    assert window_borders(torch.tensor([[-1, 0]])) == window_borders(torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="ids must be integers"):
        window_borders(torch.tensor([[0.2, 0.7]]))      # both became window 0: the border between them was lost


def test_windows_of_empty_batches_and_channels_and_of_strided_grids():
    for x in (torch.randn(0, 4, 4, 2), torch.randn(1, 4, 4, 0)):
        win = window_partition(x, 2)                   # C = 0: "the unspecified dimension size -1 can be any value"
        assert win.shape == (4 * x.shape[0], 4, x.shape[-1])
        assert torch.equal(window_merge(win, 2, 4, 4), x)
    x = torch.randn(1, 4, 4, 3).transpose(1, 2)                     # not contiguous
    assert torch.equal(window_merge(window_partition(x, 2), 2, 4, 4), x)
    w = torch.randn(4, 3, 4).transpose(1, 2)                        # not contiguous
    assert torch.equal(window_partition(window_merge(w, 2, 4, 4), 2), w)


def test_window_borders_of_an_empty_map_are_none():
    assert window_borders(torch.zeros(0, 5, dtype=torch.long)) == window_borders(torch.zeros(3, 0, dtype=torch.long)) == []
