"""Section 9.6's checkers, in exercise order: 9.6.1 patch embedding as a strided convolution, 9.6.2 a relative
position bias inside a Swin window, 9.6.3 fine-tuning a ViT at a higher resolution."""

import torch
import torch.nn.functional as F

from helpers.exercises.judge import call, cases, compare, exercise, fresh

# 9.6.1: patch embedding as a strided convolution ------------------------------------------------------------

@exercise("9.6.1", "Your tokens match the linear map of flattened patches, in the same raster order.")
def _(answer):
    r = fresh()
    hidden = []
    for _ in range(2):
        P = r.integer(1, 4)
        hidden.append((r.integer(1, 3), P * r.integer(1, 4), P * r.integer(1, 4), P, r.integer(1, 6)))
    for case, (C, H, W, P, d) in cases([(3, 8, 8, 4, 5), (1, 6, 9, 3, 4), (2, 4, 8, 2, 6)], hidden,
                                       lambda C, H, W, P, d: f"image {(C, H, W)}, patches {P} x {P}, d = {d}"):
        img, W_lin, b = r.randn(C, H, W), r.randn(d, C * P * P), r.randn(d)
        grid = img.unfold(1, P, P).unfold(2, P, P)                     # (C, H/P, W/P, P, P)
        flat = grid.permute(1, 2, 0, 3, 4).reshape(-1, C * P * P)       # raster order, each patch as (C, P, P)
        want = flat @ W_lin.T + b
        channels_last = grid.permute(1, 2, 3, 4, 0).reshape(-1, C * P * P) @ W_lin.T + b
        columns = grid.permute(2, 1, 0, 3, 4).reshape(-1, C * P * P) @ W_lin.T + b
        compare(call(answer, img, W_lin, b, P, case=case), want, case, what="tokens", mistakes=[
            (want.T, "Return one row per patch, (number of patches, d): transpose the (d, patches) output."),
            (channels_last, "Reshape the weight to (d, C, P, P): a patch flattens channel first, as in the helpers' patches."),
            (columns, "The patches go in raster order, row by row: flatten the (H/P, W/P) grid, do not transpose it."),
            (want - b, "Add the bias."),
        ], hint="nn.functional.conv2d(img[None], W_lin.view(d, C, P, P), b, stride=P), then flatten the grid into rows.")


# 9.6.2: a relative position bias inside a Swin window -------------------------------------------------------

@exercise("9.6.2", "Your index gives each relative offset its own entry of the table, and pairs of tokens with equal "
                   "offsets the same entry.")
def _(answer):
    r = fresh()
    # The first hidden window is never a shown one nor M = 1 (whose index, [[0]], a table's fallback of zeros
    # gets right), so that a table of the shown cases fails on every check; the second is any M up to 9.
    for case, M in cases([2, 3, 7], [r.choice([4, 5, 6, 8, 9]), r.integer(1, 9)], lambda M: f"window {M} x {M}"):
        y, x = torch.div(torch.arange(M * M), M, rounding_mode="floor"), torch.arange(M * M) % M
        dy, dx = y[:, None] - y[None, :], x[:, None] - x[None, :]          # query minus key
        want = (dy + M - 1) * (2 * M - 1) + (dx + M - 1)
        compare(call(answer, M, case=case), want, case, what="index", mistakes=[
            (dy * (2 * M - 1) + dx, "Shift the offsets by M - 1 so that they start at 0: an index cannot be negative."),
            ((dy + M - 1) * M + (dx + M - 1), "Each row offset has 2M - 1 column offsets: multiply by 2M - 1, not M, "
                                                "or different offsets share an entry."),
            (want.T, "Offsets are the query's position minus the key's: yours are the key's minus the query's."),
            ((dx + M - 1) * (2 * M - 1) + (dy + M - 1), "Rows first: the index is (dy + M - 1)(2M - 1) + (dx + M - 1)."),
        ], hint="index[a, b] = (dy + M - 1)(2M - 1) + (dx + M - 1), dy and dx query minus key.")


# 9.6.3: fine-tuning a ViT at a higher resolution ------------------------------------------------------------

@exercise("9.6.3", "Your resized table keeps the class token and interpolates the grid of patch positions.")
def _(answer):
    r = fresh()
    hidden = []
    for _ in range(2):
        n = r.integer(1, 6)
        hidden.append((n, n + r.integer(1, 6), r.integer(1, 6)))
    for case, (n, n_new, d) in cases([(2, 3, 4), (4, 6, 3), (14, 24, 8)], hidden,
                                     lambda n, n_new, d: f"{n} x {n} grid to {n_new} x {n_new}, d = {d}"):
        pos = r.randn(1 + n * n, d)

        def resize(grid, n_new=n_new):                                    # (d, n, n) -> (n_new^2, d)
            grid = F.interpolate(grid[None], size=(n_new, n_new), mode="bilinear", align_corners=False)[0]
            return grid.flatten(1).T

        grid = pos[1:].reshape(n, n, d).permute(2, 0, 1)                  # (d, n, n)
        want = torch.cat([pos[:1], resize(grid)])
        compare(call(answer, pos, n_new, case=case), want, case, what="table", mistakes=[
            (torch.cat([pos[:1], resize(pos[1:].reshape(d, n, n))]),
             "Reshape to (n, n, d) and then move d first: reshape(d, n, n) mixes positions and features."),
            (torch.cat([pos[:1], resize(grid.transpose(1, 2))]),
             "The grid is transposed: the first spatial axis is the row, in raster order."),
            (resize(grid), "Keep the class token: row 0 of the table, unchanged, before the grid."),
            (resize(pos[:n * n].reshape(n, n, d).permute(2, 0, 1)),
             "Row 0 is the class token, not a patch: interpolate rows 1 .. n^2 only."),
        ], hint="Row 0 is the class token, kept as it is; rows 1.. are an n x n grid in raster order, interpolated "
                "bilinearly (align_corners=False) to n_new x n_new.")
