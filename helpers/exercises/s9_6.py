"""Section 9.6's checkers, in exercise order: 9.6.1 patch embedding with the channels last, 9.6.2 a relative
position bias inside a Swin window, 9.6.3 fine-tuning a ViT at a higher resolution, 9.6.5 a ViT that finds a square
(9.6.4 is answered in words). The images of 9.6.4 and 9.6.5 are drawn here too (``quadrant_images``, ``bar_images``),
so that the notebook's experiment and the check draw the same kind, and the experiment's training runs here
(``fit``, ``held_out_accuracy``) on one thread, as the check's does, with its baseline (``without_positions``)."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from helpers.exercises.judge import (
    Unwatched,
    Wrong,
    alone,
    call,
    cases,
    compare,
    exercise,
    fresh,
    generator,
    parameters_of,
    shuffled,
)
from helpers.runtime import threads

# 9.6.1: patch embedding with the channels last ---------------------------------------------------------------

def _embedded(img, W_lin, b, order, columns=False, step=None):
    """The linear map of ``img``'s patches, each flattened in ``order`` (its axes channel, row, column are 2, 3, 4:
    channels last is (3, 4, 2)), in raster order or, with ``columns``, column by column; with ``step`` 1, every
    P x P window of the image, overlapping (a convolution without its stride)."""
    C, H, W = img.shape
    P = int(round((W_lin.shape[1] / C) ** 0.5))
    grid = img.unfold(1, P, step or P).unfold(2, P, step or P)             # (C, H/P, W/P, P, P)
    cells = grid.permute(2, 1, 0, 3, 4) if columns else grid.permute(1, 2, 0, 3, 4)
    return cells.permute(0, 1, *order).reshape(-1, C * P * P) @ W_lin.T + b


@exercise("9.6.1", "Your tokens match the linear map of patches flattened with the channels last, in raster order.")
def _(answer):
    r = fresh()
    hidden = []
    for _ in range(2):
        P = r.integer(1, 4)
        hidden.append((r.integer(1, 3), P * r.integer(1, 4), P * r.integer(1, 4), P, r.integer(1, 6)))
    # The shown cases have several channels, patches of several pixels and a grid that is not square, so that reading
    # W channel first, swapping a patch's rows and columns, or transposing the grid fails on every check.
    for case, (C, H, W, P, d) in cases([(3, 8, 8, 4, 5), (2, 6, 9, 3, 4), (3, 4, 8, 2, 6)], hidden,
                                       lambda C, H, W, P, d: f"image {(C, H, W)}, patches {P} x {P}, d = {d}"):
        img, W_lin, b = r.randn(C, H, W), r.randn(d, P * P * C), r.randn(d)

        def tokens(order, columns=False, step=None, img=img, W_lin=W_lin, b=b):
            return _embedded(img, W_lin, b, order, columns, step)

        want = tokens((3, 4, 2))                                         # row, column, channel: channels last
        n = (H // P) * (W // P)
        got = call(answer, img, W_lin, b, P, case=case)
        shape = (f"Return one row per patch, ({n}, {d}) here: {n} patches, each a token of d = {d} numbers."
                 if isinstance(got, torch.Tensor) and got.shape != want.shape else None)
        compare(got, want, case, what="tokens", mistakes=[
            (want.T, "Return one row per patch, (number of patches, d): yours has one column per patch."),
            (want.T.reshape(d, H // P, W // P), "Return one row per patch, (number of patches, d): yours is the "
                                                "convolution's grid, (d, rows, columns), with the patches still on "
                                                "the last two axes."),
            (want[None], "Return the tokens of the one image, (number of patches, d), without a batch axis."),
            (want.T.reshape(-1, d), "Your tokens mix patches and features: the convolution's output lists one feature "
                                    "for every patch before the next feature, so its patches must be moved to the first "
                                    "axis, not reshaped into rows."),
            (tokens((3, 4, 2), step=1), "There are more tokens than patches: the patches do not overlap, so the kernel "
                                        "moves a whole patch, P pixels, at each step."),
            (want + b, "The bias is added twice."),
            (tokens((2, 3, 4)), "Your kernel reads each row of W channel first, but W lists a patch pixel by pixel "
                                "with the channels last: the axes of your kernel are in the wrong order."),
            (tokens((4, 3, 2)), "Within each patch your rows and columns are swapped: W runs along a patch's rows "
                                "first, then its columns."),
            (tokens((3, 4, 2), columns=True), "The patches go in raster order, row by row: yours go column by column."),
            (want - b, "The bias is missing."),
        ], hint=shape or "Compare the order in which a row of W lists a patch's numbers with the order of the axes "
                         "of a convolution's kernel, (d, C, P, P).")


# 9.6.2: a relative position bias inside a Swin window -------------------------------------------------------

@exercise("9.6.2", "Your index gives each relative offset its own entry of the table, and pairs of tokens with equal "
                   "offsets the same entry.")
def _(answer):
    r = fresh()
    # The first hidden window is never a shown one nor M = 1 (whose index, [[0]], a table's fallback of zeros
    # gets right), so that a table of the shown cases fails on every check; the second is any M up to 9; the third
    # is from 10 to 20, so that a table of the windows seen in a few checks (a students' review: those up to 9
    # passed 16 checks in 20) fails too.
    hidden = [r.choice([4, 5, 6, 8, 9]), r.integer(1, 9), r.integer(10, 20)]
    for case, M in cases([2, 3, 7], hidden, lambda M: f"window {M} x {M}"):
        y, x = torch.div(torch.arange(M * M), M, rounding_mode="floor"), torch.arange(M * M) % M
        dy, dx = y[:, None] - y[None, :], x[:, None] - x[None, :]          # query minus key
        want = (dy + M - 1) * (2 * M - 1) + (dx + M - 1)
        got, size = call(answer, M, case=case), (2 * M - 1) ** 2
        past = (isinstance(got, torch.Tensor) and got.shape == want.shape and not got.is_floating_point()
                and not got.is_complex() and got.dtype != torch.bool and int(got.max()) >= size)
        compare(got, want, case, what="index", mistakes=[
            (dy * (2 * M - 1) + dx, "Some of your indices are negative: the offsets start at -(M - 1), but the table's "
                                    "entries start at 0."),
            ((dy + M - 1) * M + (dx + M - 1), "Different offsets share an entry: one row offset of the table holds more "
                                               "column offsets than your index steps over."),
            (want.T, "Offsets are the query's position minus the key's: yours are the key's minus the query's."),
            ((dx + M - 1) * (2 * M - 1) + (dy + M - 1), "Your rows and columns are swapped: the table lists the offsets "
                                                         "with the row offset first."),
        ], hint=f"Some of your indices are past the table's end: it has (2M - 1)^2 = {size} entries, so an index "
                f"must stay below {size}. Work one pair out by hand: two tokens of the window, their offset, and where "
                "the table lists that offset (entry 0 is the offset (-(M - 1), -(M - 1)))." if past else
                "Work one pair out by hand: two tokens of the window, their rows and columns, their offset, and where "
                "the table lists that offset (entry 0 is the offset (-(M - 1), -(M - 1))).")


# 9.6.3: fine-tuning a ViT at a higher resolution ------------------------------------------------------------

@exercise("9.6.3", "Your resized table keeps the class token and interpolates the grid of patch positions.")
def _(answer):
    r = fresh()
    hidden = []
    for _ in range(2):
        n = r.integer(1, 6)
        hidden.append((n, n + r.integer(1, 6), r.integer(1, 6)))
    # The fourth shown case is one where a scale factor of n_new / n falls short: 13 * (15 / 13) is 14.999... in
    # floating point, and F.interpolate rounds the size it gives down, to 14 (so do 11 to 15 and 11 or 13 to 30).
    for case, (n, n_new, d) in cases([(2, 3, 4), (4, 6, 3), (14, 24, 8), (13, 15, 5)], hidden,
                                     lambda n, n_new, d: f"{n} x {n} grid to {n_new} x {n_new}, d = {d}"):
        pos = r.randn(1 + n * n, d)
        short = math.floor(n * (n_new / n))                               # the side a scale factor gives

        def resize(grid, n_new=n_new, rows=True, mode="bilinear", corners=False):    # (d, n, n) -> (n_new^2, d)
            grid = F.interpolate(grid[None], size=(n_new, n_new), mode=mode,
                                 align_corners=None if mode == "nearest" else corners)[0]
            return grid.flatten(1).T if rows else grid.reshape(-1, grid.shape[0])

        grid = pos[1:].reshape(n, n, d).permute(2, 0, 1)                  # (d, n, n)
        want = torch.cat([pos[:1], resize(grid)])
        got = call(answer, pos, n_new, case=case)
        hint = ("Compare with what the exercise asks: row 0 unchanged; the grid's rows and columns back in raster "
                "order; bilinear interpolation with align_corners=False.")
        if short != n_new and isinstance(got, torch.Tensor) and tuple(got.shape) == (1 + short * short, d):
            hint = (f"Your grid is {short} x {short}, not {n_new} x {n_new}: a scale factor of n_new / n, multiplied "
                    f"back by n in floating point, gives {n * (n_new / n)!r}, which F.interpolate rounds down. Ask "
                    "for the size you want instead of a scale factor.")
        compare(got, want, case, what="table", mistakes=[
            (torch.cat([pos[:1], resize(pos[1:].reshape(d, n, n))]),
             "Your grid mixes positions and features: each row of the table is one position's d features, and a "
             "reshape straight to (d, n, n) scrambles them."),
            (torch.cat([pos[:1], resize(grid.transpose(1, 2))]),
             "The grid is transposed: the first spatial axis is the row, in raster order."),
            (torch.cat([pos[:1], resize(grid, rows=False)]),
             "Your new rows mix positions and features: the resized grid, (d, n_new, n_new), holds one feature for "
             "every position before the next feature, so a reshape straight to rows scrambles them."),
            (want[None], "Return the table itself, (1 + n_new^2, d), without a batch axis."),
            (resize(grid), "The class token's row is missing: keep the table's row 0 before the grid."),
            (resize(pos[:n * n].reshape(n, n, d).permute(2, 0, 1)),
             "Your grid starts at row 0, the class token's, which is no patch: the grid is rows 1 .. n^2."),
            # another interpolation (a students' review: these got the general hint)
            (torch.cat([pos[:1], resize(grid, corners=True)]),
             "You interpolate with align_corners=True, which pins the grid's corner cells to the new grid's corners: "
             "the exercise asks for align_corners=False, which treats each position as the centre of its cell."),
            (torch.cat([pos[:1], resize(grid, mode="bicubic")]),
             "This is bicubic interpolation: the exercise asks for bilinear."),
            (torch.cat([pos[:1], resize(grid, mode="nearest")]),
             "This is nearest-neighbour: each new position copies one old one. The exercise asks for bilinear "
             "interpolation, which mixes the four nearest."),
        ], hint=hint)


# 9.6.4 and 9.6.5: the images --------------------------------------------------------------------------------

SIDE = 16                  # pixels a side; the quadrants are 8 x 8, whole 4 x 4 or 8 x 8 patches


def quadrant_images(n, generator):
    """``n`` images ``(n, 3, 16, 16)`` of noise with a 3 x 3 square of one random colour inside one quadrant, and
    the quadrants ``(n,)``: 0 top left, 1 top right, 2 bottom left, 3 bottom right. The square's place within its
    quadrant is drawn the same way in each, so only where the quadrant is tells them apart."""
    labels = torch.randint(4, (n,), generator=generator)
    images = 0.2 * torch.randn(n, 3, SIDE, SIDE, generator=generator)
    colour = 0.5 + 0.5 * torch.rand(n, 3, generator=generator)
    corner = torch.randint(8 - 3 + 1, (n, 2), generator=generator)        # the square's top left within its quadrant
    top, left = 8 * torch.div(labels, 2, rounding_mode="floor") + corner[:, 0], 8 * (labels % 2) + corner[:, 1]
    pixels = torch.arange(SIDE)
    rows = (pixels >= top[:, None]) & (pixels < top[:, None] + 3)                  # (n, 16)
    columns = (pixels >= left[:, None]) & (pixels < left[:, None] + 3)
    square = (rows[:, :, None] & columns[:, None, :]).float()                       # (n, 16, 16)
    return images + colour[:, :, None, None] * square[:, None], labels


def bar_images(n, generator):
    """``n`` images ``(n, 3, 16, 16)`` of noise with a bar 6 pixels long and 1 wide, of one random colour, anywhere,
    and its orientation ``(n,)``: 0 horizontal, 1 vertical."""
    labels = torch.randint(2, (n,), generator=generator)
    images = 0.2 * torch.randn(n, 3, SIDE, SIDE, generator=generator)
    colour = 0.5 + 0.5 * torch.rand(n, 3, generator=generator)
    start = torch.randint(SIDE - 6 + 1, (n,), generator=generator)                 # along the bar
    line = torch.randint(SIDE, (n,), generator=generator)                          # across it
    pixels = torch.arange(SIDE)
    along = (pixels >= start[:, None]) & (pixels < start[:, None] + 6)             # (n, 16)
    across = pixels == line[:, None]
    bar = torch.where(labels[:, None, None].bool(), along[:, :, None] & across[:, None, :],
                      across[:, :, None] & along[:, None, :]).float()              # (n, 16, 16): row, column
    return images + colour[:, :, None, None] * bar[:, None], labels


def fit(model, images, labels, steps=300, lr=3e-3, batch=32):
    """``model`` trained with Adam on ``steps`` batches of ``batch`` images drawn at random from ``images``, its
    weights that require gradients only; returned in eval mode."""
    optimizer = torch.optim.Adam([w for w in model.parameters() if w.requires_grad], lr=lr)
    model.train()
    for _ in range(steps):
        i = torch.randint(len(images), (batch,))
        loss = F.cross_entropy(model(images[i]), labels[i])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def held_out_accuracy(train, seen, new, seed=0):
    """The share of the new images ``new = (images, labels)`` that the model ``train(*seen)`` returns gets right,
    trained on ``seen = (images, labels)``. Torch's own draws while it trains (the initialization, the batches)
    are seeded by ``seed``, apart from the caller's, and it trains on one thread (``helpers.runtime.threads``)."""
    with threads(1), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = train(*seen)
    with torch.no_grad():
        return (model.eval()(new[0]).argmax(-1) == new[1]).float().mean().item()


def without_positions(ViT):
    """The baseline of 9.6.5's experiment, Exercise 9.6.4's model: ``train(images, labels)``, which builds the
    section's ``ViT`` (the class is passed in, as the notebook defines it) with 4 x 4 patches, width 32, 4 heads, one
    block and 4 classes, sets its position embeddings to zero and freezes them, and trains the rest with ``fit``: 300
    steps of Adam at 3e-3 on random batches of 32 images. Without positions its tokens are a set of patches: it can
    find the bar's orientation, not the square's quadrant. The model is built inside ``train``, so that its
    initialization draws from the generator that ``held_out_accuracy`` seeds."""
    def train(images, labels):
        model = ViT(image=16, P=4, d=32, heads=4, layers=1, classes=4)
        model.pos.requires_grad_(False).zero_()
        return fit(model, images, labels, steps=300, lr=3e-3, batch=32)
    train.__name__ = train.__qualname__ = "without_positions"
    return train


# 9.6.5: a ViT that finds the square --------------------------------------------------------------------------

TRAIN, HELD_OUT, NEEDED = 2048, 1000, 0.9     # images to train on, new images to measure on, the accuracy to reach


def _logits(model, images, case, name, what):
    """The model's logits for ``images``, ``(len(images), 4)``, or Wrong saying why not."""
    try:
        with torch.no_grad():
            out = model(images)
    except Exception as error:  # noqa: BLE001 (the reader's model: told as the error it raised)
        raise Wrong(f"{case}: the model {name} returned raised {type(error).__name__} on {what} "
                    f"{tuple(images.shape)}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}") from None
    if not isinstance(out, torch.Tensor) or out.shape != (len(images), 4) or not out.is_floating_point():
        got = f"shape {tuple(out.shape)}, {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise Wrong(f"{case}: the model {name} returned should map {what} {tuple(images.shape)} to logits "
                    f"({len(images)}, 4), one per quadrant, got {got}.")
    return out.float()


_TRAIN = ("the exercise asks you to train a model (a ViT, or any network) on the training images, its weights learned "
          "from them, not to write a detector by hand.")


def _accuracy(logits, labels):
    return (logits.argmax(-1) == labels).float().mean().item()


@exercise("9.6.5", f"Your model, trained on {TRAIN:,} images, finds the square's quadrant in at least {NEEDED:.0%} of "
                   f"{HELD_OUT:,} new ones.", time_limit=60)
def _(answer):
    with threads(1):                  # a small model trains fastest on one thread, the same on any machine
        _quadrants(answer)


def _quadrants(answer):
    r = fresh()
    g = generator()
    case = f"{TRAIN:,} training images, {HELD_OUT:,} new ones"
    images, labels = quadrant_images(TRAIN, g)
    new, new_labels = quadrant_images(HELD_OUT, g)
    with torch.random.fork_rng(devices=[]):     # the reader's draws (initialization, batches), seeded by the check
        torch.manual_seed(r.integer(0, 2 ** 31 - 1))
        model = call(answer, images, labels, case=case, watch=Unwatched())
    name = getattr(answer, "__name__", "your function")
    if not isinstance(model, nn.Module):
        raise Wrong(f"{case}: {name} should return the trained model (an nn.Module), got {type(model).__name__}.")
    model.eval()
    logits = _logits(model, new, case, name, "new images")
    accuracy = _accuracy(logits, new_labels)
    if accuracy >= NEEDED:
        # Right often enough: unless each image's answer depends on the rest of its batch.
        alone(lambda x: _logits(model, x, case, name, "one new image alone"), (new,), logits, case, "new image")
        # ... or it was written by hand, not trained. What a trained model does lives in its parameters: with the
        # entries of each shuffled it is noise of the same size, near chance, where a detector written by hand,
        # with no parameter or with a scale that is the same in every entry, does as well as before.
        weights = parameters_of(model, new[:8])
        if not weights:
            raise Wrong(f"{case}: the model {name} returned has no parameters its logits depend on: {_TRAIN}")
        with shuffled(weights, torch.Generator().manual_seed(r.integer(0, 2 ** 31 - 1))):
            try:
                still = _accuracy(_logits(model, new, case, name, "new images"), new_labels)
            except Wrong:                                # it no longer runs: its parameters were what it used
                still = 0.0
        if still >= NEEDED:
            raise Wrong(f"{case}: the model {name} returned is still right on {still:.0%} of the new images with the "
                        f"entries of each of its parameters shuffled: what it does is written in its code, but {_TRAIN}")
        return
    told = f"{case}: the model is right on {accuracy:.0%} of the new images, where {NEEDED:.0%} is needed."
    # Rolling an image by 8 pixels moves the square to another quadrant and only reorders its patches (of 1, 2, 4 or 8
    # pixels): a model whose logits change from image to image but not under any roll cannot know where a patch is.
    rolled = [_logits(model, new.roll(shift, dims=(2, 3)), case, name, "new images") for shift in ((8, 0), (0, 8), (8, 8))]
    scale = 1e-4 * (1 + logits.abs().max().item())
    varies = (logits - logits[:1]).abs().max().item() > scale
    if varies and all((x - logits).abs().max().item() <= scale for x in rolled):
        raise Wrong(f"{told} It gives the same logits when the square moves to another quadrant and the patches only "
                    "change places: your model does not know where a patch is (are its position embeddings missing, "
                    "or zero and never trained?).")
    seen = _accuracy(_logits(model, images[:HELD_OUT], case, name, "training images"), labels[:HELD_OUT])
    # Well below chance (25%), the model has learned something, but the wrong answers (a students' review: labels
    # shifted by one in training gave 0%, which the message called chance).
    if seen < 0.1:
        raise Wrong(f"{told} It is right on only {seen:.0%} of its own training images, far below chance (25%): it "
                    "learned a labelling, but not the one given. Are the labels it trains on the ones given, in the "
                    "same order as the images?")
    if seen < 0.4:
        raise Wrong(f"{told} It is at chance on its own training images too ({seen:.0%}): it has not learned. Does "
                    "the training take optimizer steps on the loss's gradients, with the right labels, and enough "
                    "of them?")
    if seen >= accuracy + 0.2:
        raise Wrong(f"{told} It is right on {seen:.0%} of its training images: it learned them by heart rather "
                    "than the task.")
    raise Wrong(f"{told} It has learned part of the task ({seen:.0%} of its training images): train it longer, or "
                "with a larger learning rate.")
