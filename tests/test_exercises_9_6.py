"""Section 9.6's exercises: 9.6.1 patch embedding as a strided convolution, 9.6.2 a relative position
bias inside a Swin window, 9.6.3 fine-tuning a ViT at a higher resolution.

Each checker accepts the notebook's reference solution and rejects the usual mistakes, each with its own
hint (exercises_common.py says how; the shared layout is tested in test_exercises_layout.py).
"""

import pytest
import torch
from exercises_common import (
    each_wrong_answer_is_rejected_with_its_own_message,
    ids,
    reference_solution_passes,
    solutions,
    starters,
    students_right_answers_pass_and_wrong_ones_get_their_message,
    untouched_starter_is_not_attempted,
    wrong_answers_fail_on_every_fresh_draw,
)

from helpers.exercises import verdict

# Wrong answers and right ones unlike the reference ---------------------------------------------------------------

def _patch_embed(img, W, b, P, channels_last=False, transposed=False, bias=True):
    C = img.shape[0]
    kernel = W.view(-1, P, P, C).permute(0, 3, 1, 2) if channels_last else W.view(-1, C, P, P)
    out = torch.nn.functional.conv2d(img[None], kernel, b if bias else None, stride=P)[0]   # (d, H/P, W/P)
    return (out.transpose(1, 2) if transposed else out).flatten(1).T


def _relative(w, stride=None, shift=True, key_minus_query=False):
    y, x = torch.arange(w * w) // w, torch.arange(w * w) % w
    dy, dx = y[:, None] - y[None, :], x[:, None] - x[None, :]
    if key_minus_query:
        dy, dx = -dy, -dx
    s = w - 1 if shift else 0
    return (dy + s) * (stride or 2 * w - 1) + (dx + s)


def _resize(pos, n_new, keep_cls=True, channels_first_reshape=False, transpose=False):
    n, d = int((pos.shape[0] - 1) ** 0.5), pos.shape[1]
    grid = pos[1:].reshape(d, n, n) if channels_first_reshape else pos[1:].reshape(n, n, d).permute(2, 0, 1)
    if transpose:
        grid = grid.transpose(1, 2)
    grid = torch.nn.functional.interpolate(grid[None], size=(n_new, n_new), mode="bilinear", align_corners=False)[0]
    return torch.cat([pos[:1], grid.flatten(1).T]) if keep_cls else grid.flatten(1).T


def _bilinear(grid, n_new):
    """Bilinear resizing as F.interpolate(align_corners=False) does it, by hand: grid (n, n, d)."""
    n = grid.shape[0]
    src = ((torch.arange(n_new, dtype=grid.dtype) + 0.5) * n / n_new - 0.5).clamp_min(0)
    i0 = src.floor().long().clamp_max(n - 1)
    i1 = (i0 + 1).clamp_max(n - 1)
    f = (src - i0)[:, None]
    rows = grid[i0] * (1 - f)[..., None] + grid[i1] * f[..., None]             # (n_new, n, d)
    return rows[:, i0] * (1 - f)[None] + rows[:, i1] * f[None]                 # (n_new, n_new, d)


def _relative_loops(w):
    index = torch.empty(w * w, w * w, dtype=torch.long)
    for a in range(w * w):
        for b in range(w * w):
            dy, dx = a // w - b // w, a % w - b % w
            index[a, b] = (dy + w - 1) * (2 * w - 1) + (dx + w - 1)
    return index


# Wrong answers: for each exercise, (the mistake, a piece of the hint that must name it).
WRONG = {
    "9.6.1": [
        (lambda img, W, b, P: _patch_embed(img, W, b, P, channels_last=True), "channel first"),
        (lambda img, W, b, P: _patch_embed(img, W, b, P, transposed=True), "do not transpose it"),
        (lambda img, W, b, P: _patch_embed(img, W, b, P, bias=False), "Add the bias"),
        (lambda img, W, b, P: _patch_embed(img, W, b, P).T, "one row per patch"),
    ],
    "9.6.2": [
        (lambda w: _relative(w, shift=False), "cannot be negative"),
        (lambda w: _relative(w, stride=w), "multiply by 2M - 1, not M"),
        (lambda w: _relative(w, key_minus_query=True), "the key's minus the query's"),
    ],
    "9.6.3": [
        (lambda pos, n_new: _resize(pos, n_new, channels_first_reshape=True), "mixes positions and features"),
        (lambda pos, n_new: _resize(pos, n_new, transpose=True), "The grid is transposed"),
        (lambda pos, n_new: _resize(pos, n_new, keep_cls=False), "Keep the class token"),
    ],
}


# Students at the exercises (REVIEW.md, brief 2): wrong attempts not in WRONG, and right answers unlike the
# reference. Each attempt is (answer, a piece of the message it must get); None marks a right answer.
STUDENTS = {
    "9.6.1": [
        (lambda img, W, b, P: torch.einsum("chpwq,dcpq->hwd", img.reshape(img.shape[0], img.shape[1] // P, P,
                                                                          img.shape[2] // P, P), W.view(len(b), -1, P, P))
         .flatten(0, 1) + b, None),                                                                   # einsum over patches
        (lambda img, W, b, P: (torch.nn.functional.conv2d(img[None].float(), W.view(len(b), img.shape[0], P, P).float(),
                                                          b.float(), stride=P)[0].flatten(1).T), None),   # float32
        (lambda img, W, b, P: torch.nn.functional.conv2d(img[None], W.view(len(b), img.shape[0], P, P), b, stride=P)[0]
         .flatten(1), "one row per patch"),
        (lambda img, W, b, P: torch.nn.functional.conv2d(img[None], W.view(len(b), img.shape[0], P, P), b)[0].flatten(1).T,
         "should have shape"),                                                                        # stride forgotten
    ],
    "9.6.2": [
        (_relative_loops, None),
        (lambda w: (lambda c: (c[:, None] - c[None] + w - 1) @ torch.tensor([2 * w - 1, 1]))(
            torch.stack(torch.meshgrid(torch.arange(w), torch.arange(w), indexing="ij")).flatten(1).T), None),  # meshgrid
        (lambda w: _relative_loops(w).int(), None),                                                   # int32 indexes too
        (lambda w: (lambda c: (c[:, None] - c[None] + w - 1) @ torch.tensor([2 * w - 1, 1]))(
            torch.stack(torch.meshgrid(torch.arange(w), torch.arange(w), indexing="xy")).flatten(1).T),
         "Rows first"),
        (lambda w: _relative_loops(w).tolist(), "should be a torch.Tensor, got list"),
        (lambda w: _relative_loops(w).to(torch.uint8), "should be integers (torch.long), got torch.uint8"),
    ],
    "9.6.3": [
        (lambda pos, n_new: torch.cat([pos[:1], _bilinear(pos[1:].reshape(int((len(pos) - 1) ** 0.5), -1, pos.shape[1]),
                                                          n_new).flatten(0, 1)]), None),              # by hand
        (lambda pos, n_new: torch.cat([pos[:1], torch.nn.Upsample(size=(n_new, n_new), mode="bilinear")(
            pos[1:].float().T.reshape(1, pos.shape[1], int((len(pos) - 1) ** 0.5), -1))[0].flatten(1).T.double()]), None),
        (lambda pos, n_new: torch.cat([pos[:1], torch.nn.functional.interpolate(
            pos[1:].T.reshape(1, pos.shape[1], int((len(pos) - 1) ** 0.5), -1), size=(n_new, n_new), mode="bilinear",
            align_corners=True)[0].flatten(1).T]), "align_corners=False"),
        (lambda pos, n_new: torch.cat([pos[:1], torch.nn.functional.interpolate(
            pos[1:].T.reshape(1, pos.shape[1], int((len(pos) - 1) ** 0.5), -1), size=(n_new, n_new), mode="nearest")[0]
            .flatten(1).T]), "align_corners=False"),
        (lambda pos, n_new: torch.cat([pos[:1], torch.nn.functional.interpolate(
            pos[1:].T.reshape(1, pos.shape[1], int((len(pos) - 1) ** 0.5), -1), size=(n_new, n_new), mode="bicubic",
            align_corners=False)[0].flatten(1).T]), "align_corners=False"),
    ],
}


# The tests every section runs (exercises_common.py) ---------------------------------------------------------------

@pytest.mark.parametrize("case", solutions("9.6"), ids=ids)
def test_reference_solution_passes(case, monkeypatch):
    reference_solution_passes(case, monkeypatch)


@pytest.mark.parametrize("case", starters("9.6"), ids=ids)
def test_untouched_starter_is_not_attempted(case, monkeypatch):
    untouched_starter_is_not_attempted(case, monkeypatch)


@pytest.mark.parametrize("number", sorted(WRONG))
def test_each_wrong_answer_is_rejected_with_its_own_message(number):
    each_wrong_answer_is_rejected_with_its_own_message(number, WRONG[number])


@pytest.mark.parametrize("number", sorted(STUDENTS))
def test_students_right_answers_pass_and_wrong_ones_get_their_message(number):
    students_right_answers_pass_and_wrong_ones_get_their_message(number, STUDENTS[number])


@pytest.mark.parametrize("number", sorted(set(WRONG) & set(STUDENTS)))
def test_wrong_answers_fail_on_every_fresh_draw(number):
    wrong_answers_fail_on_every_fresh_draw(number, WRONG[number])


# This section's own tests -----------------------------------------------------------------------------------------

def test_9_6_2_a_table_of_the_shown_windows_never_passes():
    """The hidden windows were drawn from 1 .. 9, so a table of the shown M = 2, 3, 7 passed 1 check in 9."""
    table = {M: _relative_loops(M) for M in (2, 3, 7)}

    def relative_index(M):
        return table[M].clone() if M in table else torch.zeros(M * M, M * M, dtype=torch.long)
    assert not any(verdict("9.6.2", relative_index, seed=seed)[0] for seed in range(60))
    assert not any(verdict("9.6.2", relative_index)[0] for _ in range(20))
