"""Image plumbing for section 9.6: a real photograph, cut into patches or into windows of patches.

The photograph is the portrait of Grace Hopper that matplotlib ships in its sample data, so nothing
is downloaded.
"""

import matplotlib.cbook as cbook
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from helpers.checks import integer, integers, positive_int, tensor


def sample_image(size=224, top=0):
    """Grace Hopper's portrait as a float tensor ``(3, size, size)`` with values in ``[0, 1]``.

    The 600 x 512 photograph is cropped to its 512 x 512 square starting at row ``top`` (the face is
    near the top) and resized with antialiasing to ``size x size``; its values are multiples of 1/255.
    """
    size, top = positive_int(size, "size"), integer(top, "top")
    with cbook.get_sample_data("grace_hopper.jpg") as f:
        img = torch.from_numpy(plt.imread(f).copy())               # (600, 512, 3) uint8
    H, W, _ = img.shape
    if not 0 <= top <= H - W:
        raise ValueError(f"top must lie in 0..{H - W} so that the square fits, got {top}")
    img = img[top:top + W].permute(2, 0, 1).double() / 255         # (3, 512, 512)
    img = F.interpolate(img[None], size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]
    # Resized in float64 and rounded to 8-bit levels, so that every CPU gives the same pixels: in float32
    # the kernels of different instruction sets differ in the last bit, which would churn the figures.
    return ((img.clamp(0, 1) * 255).round() / 255).float()


def patches(img, P):
    """Cut ``img (C, H, W)`` into non-overlapping ``P x P`` patches in raster order: ``(H/P * W/P, C, P, P)``."""
    P = positive_int(P, "P")
    if tensor(img, "img").dim() != 3:
        raise ValueError(f"img must be (C, H, W), got shape {tuple(img.shape)}")
    C, H, W = img.shape
    if H % P or W % P:
        raise ValueError(f"patch size {P} must divide the image's height {H} and width {W}")
    grid = img.unfold(1, P, P).unfold(2, P, P)                     # (C, H/P, W/P, P, P)
    return grid.permute(1, 2, 0, 3, 4).reshape(-1, C, P, P)


def window_partition(x, w):
    """Group a grid of tokens ``x (B, H, W, C)`` into ``w x w`` windows: ``(B * H/w * W/w, w * w, C)``.

    Windows are in raster order within each image, and tokens in raster order within each window, as in
    the Swin transformer. ``window_merge`` undoes it.
    """
    w = positive_int(w, "w")
    if tensor(x, "x").dim() != 4:
        raise ValueError(f"x must be (B, H, W, C), got shape {tuple(x.shape)}")
    B, H, W, C = x.shape
    if H % w or W % w:
        raise ValueError(f"window size {w} must divide the grid's height {H} and width {W}")
    x = x.reshape(B, H // w, w, W // w, w, C).transpose(2, 3)      # (B, H/w, W/w, w, w, C)
    return x.reshape(B * (H // w) * (W // w), w * w, C)            # sizes, not -1: B or C may be 0


def window_merge(windows, w, H, W):
    """Inverse of ``window_partition``: ``(B * H/w * W/w, w * w, C) -> (B, H, W, C)``."""
    w, H, W = positive_int(w, "w"), positive_int(H, "H"), positive_int(W, "W")
    if tensor(windows, "windows").dim() != 3 or windows.shape[1] != w * w:
        raise ValueError(f"windows must be (n, {w * w}, C), got shape {tuple(windows.shape)}")
    if H % w or W % w or windows.shape[0] % ((H // w) * (W // w)):
        raise ValueError(f"{windows.shape[0]} windows of size {w} do not tile a {H} x {W} grid")
    B, C = windows.shape[0] // ((H // w) * (W // w)), windows.shape[-1]
    x = windows.reshape(B, H // w, W // w, w, w, C).transpose(2, 3)    # (B, H/w, w, W/w, w, C)
    return x.reshape(B, H, W, C)


def window_ids(H, W, w, shift=0):
    """``(H, W)`` integer map: which window each grid position falls in.

    With ``shift = 0`` the windows are the regular ``w x w`` tiling. With ``shift = s`` the window
    borders move by ``s`` positions down and right, as in Swin's shifted layers: the windows that stick
    out of the grid are cut off, so there are ``(H/w + 1) x (W/w + 1)`` of them, some smaller.
    """
    H, W, w, shift = positive_int(H, "H"), positive_int(W, "W"), positive_int(w, "w"), integer(shift, "shift")
    if H % w or W % w:
        raise ValueError(f"window size {w} must divide the grid's height {H} and width {W}")
    if not 0 <= shift < w:
        raise ValueError(f"shift must lie in 0..{w - 1}, got {shift}")
    rows = (torch.arange(H) + (w - shift) % w) // w                # window row of each grid row
    cols = (torch.arange(W) + (w - shift) % w) // w
    return rows[:, None] * (W // w + (shift > 0)) + cols[None, :]


def window_borders(ids):
    """Line segments ``[((x0, y0), (x1, y1)), ...]`` between grid cells of ``ids (H, W)`` that differ.

    Cell ``(i, j)`` covers ``[j, j + 1] x [i, i + 1]`` (x to the right, y down, as ``imshow`` draws it);
    the outer frame is included, so each window is drawn as a closed outline. ``ids`` holds integers
    (any, negative ones too).
    """
    if tensor(ids, "ids").dim() != 2:
        raise ValueError(f"ids must be an (H, W) map, got shape {tuple(ids.shape)}")
    ids = integers(ids, "ids").tolist()
    H, W = len(ids), len(ids[0]) if ids else 0
    if not H or not W:
        return []                                       # an empty map has no windows to outline
    segments = []
    for i in range(H + 1):                              # horizontal borders between rows i - 1 and i
        for j in range(W):
            if i in (0, H) or ids[i - 1][j] != ids[i][j]:
                segments.append(((j, i), (j + 1, i)))
    for i in range(H):                                  # vertical borders between columns j - 1 and j
        for j in range(W + 1):
            if j in (0, W) or ids[i][j - 1] != ids[i][j]:
                segments.append(((j, i), (j, i + 1)))
    return segments
