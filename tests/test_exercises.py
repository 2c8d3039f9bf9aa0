"""The exercises: every checker accepts the notebook's reference solution and rejects plausible wrong
answers, each with its own message; every section ends with 4 to 6 exercises laid out the same way.

The reference solutions are the notebooks' own hidden solution cells, executed here after the notebook's
setup cell; the wrong answers are the usual mistakes, written out below.
"""

import math
import re
from pathlib import Path

import jupytext
import nbformat
import pytest
import torch

from helpers import exercises
from helpers.exercises import EXERCISES, verdict

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("9.1", "9.2", "9.3", "9.4", "9.5", "9.6")
NOTEBOOKS = {s: next((ROOT / "notebooks").glob(f"{s}-*.md")) for s in SECTIONS}
HEADING = re.compile(r"^### Exercise (\d+\.\d+\.\d+): \S", re.M)
CHECK = re.compile(r'^check\("(\d+\.\d+\.\d+)", (\w+)\)$', re.M)


def exercise_cells(nb):
    """The cells after the notebook's "## Exercises" heading."""
    start = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and re.search("^## Exercises$", c.source, re.M))
    return nb.cells[start:]


def hidden(cell):
    return cell.metadata.get("jupyter", {}).get("source_hidden") is True and "hide-input" in cell.metadata.get("tags", [])


def checked_cells(section):
    """(number, name, cell) for each code cell ending in a check call, in order."""
    nb = jupytext.read(NOTEBOOKS[section])
    return [(*CHECK.search(c.source).groups(), c) for c in exercise_cells(nb)
            if c.cell_type == "code" and CHECK.search(c.source)]


def run_cell(section, cell, monkeypatch):
    """Execute the notebook's setup cell and then ``cell``; return what it passed to ``check``."""
    nb = jupytext.read(NOTEBOOKS[section])
    checked = []
    record = lambda number, answer: checked.append((number, answer))
    monkeypatch.setattr(exercises, "check", record)       # for a cell that imports check itself
    namespace = {}
    # The setup cell: the first code cell the site shows (the one before it installs helpers outside a checkout).
    exec(next(c for c in nb.cells if c.cell_type == "code" and "remove-cell" not in c.metadata.get("tags", [])).source,
         namespace)
    namespace["check"] = record
    exec(cell.source, namespace)
    assert len(checked) == 1, "a cell checks one exercise"
    return checked[0]


def solutions():
    return [(s, number, name, cell) for s in SECTIONS for number, name, cell in checked_cells(s) if hidden(cell)]


def starters():
    return [(s, number, name, cell) for s in SECTIONS for number, name, cell in checked_cells(s) if not hidden(cell)]


def ids(case):
    return case[1]


# Wrong answers: for each exercise, (the mistake, a piece of the hint that must name it).

def _sdpa(Q, K, V, scale, dim=-1):
    w = torch.softmax(Q @ K.transpose(-2, -1) * scale, dim=dim)
    return w @ V, w


def _scale_samples(d, g, reduce):
    q, k = torch.randn(2000, d, generator=g), torch.randn(2000, d, generator=g)
    return reduce((q * k).sum(-1))


def _mask(lengths, T, diagonal=1, keys=True, combine=torch.logical_or):
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    padded = (j if keys else i) >= lengths[:, None, None]
    return combine(j >= i + diagonal, padded)


def _masked(q, k, v, mask, fill=float("-inf"), after=False, dim=-1):
    s = q @ k.mT / q.shape[-1] ** 0.5
    w = torch.softmax(s, dim).masked_fill(mask, 0.0) if after else torch.softmax(s.masked_fill(mask, fill), dim)
    return w @ v, w


def _mqa(x, W_q, W_k, W_v, H, causal=True, d_scale=False, split="BTHd"):
    B, T, d = x.shape
    q = (x @ W_q).view(B, T, H, d // H).transpose(1, 2) if split == "BTHd" else (x @ W_q).view(B, H, T, d // H)
    s = q @ (x @ W_k)[:, None].mT / (d if d_scale else d // H) ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(s, -1) @ (x @ W_v)[:, None]).transpose(1, 2).reshape(B, T, d)


def _alibi(T, slopes, sign=-1, absolute=True):
    offset = torch.arange(T, dtype=slopes.dtype)[:, None] - torch.arange(T, dtype=slopes.dtype)[None, :]
    return sign * slopes[:, None, None] * (offset.abs() if absolute else offset)


def _far(m, T, w, at_least=False, normalized=True, sign=-1):
    delta = torch.arange(T, dtype=torch.float64)
    weight = torch.exp(sign * m * delta)
    far = weight[delta >= w if at_least else delta > w].sum()
    return (far / weight.sum() if normalized else far).item()


def _rope(x, scale=1.0, sign=1, stretch=True, halves=False):
    T, d = x.shape[-2:]
    t = torch.arange(T, dtype=x.dtype)
    angle = sign * (t / scale if stretch else t * scale)[:, None] * 10000.0 ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
    a, b = (x[..., : d // 2], x[..., d // 2:]) if halves else (x[..., 0::2], x[..., 1::2])
    ra, rb = a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()
    return torch.cat([ra, rb], -1) if halves else torch.stack([ra, rb], -1).flatten(-2)


def _smoothed(z, t, eps, others=False, target_one=False, probs=False):
    V = z.shape[-1]
    one_hot = torch.nn.functional.one_hot(t, V).double()
    if others:
        smooth = (1 - eps) * one_hot + eps / (V - 1) * (1 - one_hot)
    else:
        smooth = (1 if target_one else 1 - eps) * one_hot + eps / V
    log_p = torch.softmax(z, -1) if probs else torch.log_softmax(z, -1)
    return -(smooth * log_p).sum(-1).mean()


def _merge(a, b, rescale=True, upside_down=False, add_maxima=False):
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = m_a + m_b if add_maxima else torch.maximum(m_a, m_b)
    r_a, r_b = (torch.exp(m - m_a), torch.exp(m - m_b)) if upside_down else (torch.exp(m_a - m), torch.exp(m_b - m))
    if not rescale:
        r_a = r_b = 1.0
    return m, l_a * r_a + l_b * r_b, acc_a * r_a + acc_b * r_b


def _window(T, w, slack=0, causal=True):
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return ((j > i) | (i - j >= w + slack)) if causal else (i - j).abs() >= w


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


WRONG = {
    "9.1.1": [
        (lambda Q, K, V: _sdpa(Q, K, V, 1.0), "without the scale"),
        (lambda Q, K, V: _sdpa(Q, K, V, 1 / Q.shape[-1]), "divided the scores by d_k"),
        (lambda Q, K, V: _sdpa(Q, K, V, Q.shape[-1] ** -0.5, dim=-2), "sum to one over the queries"),
        (lambda Q, K, V: (_sdpa(Q, K, V, Q.shape[-1] ** -0.5)[0], _sdpa(Q, K, V, Q.shape[-1] ** -0.5)[1].mT), "transposed"),
        (lambda Q, K, V: (V[..., :1, :], _sdpa(Q, K, V, Q.shape[-1] ** -0.5)[1]), "outputs are weights @ V"),
        (lambda Q, K, V: _sdpa(Q, K, V, Q.shape[-1] ** -0.5)[1], "return a tuple"),
    ],
    "9.1.2": [
        (lambda r, rho: 1 / math.sqrt(r), "keys' norm matters"),
        (lambda r, rho: rho / r, "take the square root"),
        (lambda r, rho: math.sqrt(r / rho), "Upside down"),
    ],
    "9.1.3": [
        (lambda d, g: _scale_samples(d, g, lambda s: 1 / s.var()), "1 / variance"),
        (lambda d, g: _scale_samples(d, g, lambda s: s.std()), "Upside down"),
        (lambda d, g: 1 / (torch.randn(2000, generator=g) * torch.randn(2000, generator=g)).std(), "does not change with d"),
    ],
    "9.2.1": [
        (lambda lengths, T: ~_mask(lengths, T), "inverted"),
        (lambda lengths, T: _mask(lengths, T, diagonal=0), "diagonal is hidden"),
        (lambda lengths, T: _mask(lengths, T, keys=False), "hid padding queries"),
        (lambda lengths, T: _mask(lengths, T, combine=torch.logical_and), "Combine the masks with |"),
        (lambda lengths, T: _mask(lengths, T).float(), "should be boolean"),
        (lambda lengths, T: _mask(lengths, T)[:, :1], "should have shape"),
    ],
    "9.2.2": [
        (lambda q, k, v, mask: _masked(q, k, v, mask, after=True), "before the softmax"),
        (lambda q, k, v, mask: _masked(q, k, v, mask, fill=0.0), "fill them with -inf"),
        (lambda q, k, v, mask: _masked(q, k, v, ~mask), "hid the visible keys"),
        (lambda q, k, v, mask: _masked(q, k, v, mask, dim=-2), "not the queries"),
        (lambda q, k, v, mask: _masked(q, k, v, torch.zeros_like(mask)), "mask is not applied"),
    ],
    "9.2.3": [
        (lambda x, W_q, W_k, W_v, H: _mqa(x, W_q, W_k, W_v, H, causal=False), "add the causal mask"),
        (lambda x, W_q, W_k, W_v, H: _mqa(x, W_q, W_k, W_v, H, d_scale=True), "1/sqrt(d_h)"),
        (lambda x, W_q, W_k, W_v, H: _mqa(x, W_q, W_k, W_v, H, split="BHTd"), "mixes tokens into heads"),
    ],
    "9.3.1": [
        (lambda T, slopes: _alibi(T, slopes, sign=1), "penalizes distance"),
        (lambda T, slopes: _alibi(T, slopes, absolute=False), "rewards keys after the query"),
        (lambda T, slopes: _alibi(T, slopes) / T, "Do not normalize by the length"),
    ],
    "9.3.2": [
        (lambda m, T, w: _far(m, T, w, at_least=True), "distance w itself is inside"),
        (lambda m, T, w: _far(m, T, w, normalized=False), "Normalize"),
        (lambda m, T, w: _far(m, T, w, sign=1), "the weight falls with distance"),
    ],
    "9.3.3": [
        (lambda x, scale=1.0: _rope(x, scale, sign=-1), "rotate the wrong way"),
        (lambda x, scale=1.0: _rope(x, scale, stretch=False), "not multiply"),
        (lambda x, scale=1.0: _rope(x, 1.0), "The scale is ignored"),
        (lambda x, scale=1.0: _rope(x, scale, halves=True), "not j and j + d/2"),
    ],
    "9.4.1": [
        (lambda x, attn, mlp, norm1, norm2: (lambda h: h + mlp(norm2(h)))(x + attn(norm1(x))), "pre-normalization"),
        (lambda x, attn, mlp, norm1, norm2: (lambda h: h + norm2(mlp(h)))(x + norm1(attn(x))), "not around the sublayer"),
        (lambda x, attn, mlp, norm1, norm2: norm2(mlp(norm1(attn(x)))), "residual connections are missing"),
        (lambda x, attn, mlp, norm1, norm2: (lambda h: norm1(h + mlp(h)))(norm2(x + attn(x))), "swapped"),
    ],
    "9.4.2": [
        (lambda z, w: w * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, -1) / z.shape[0], "factor 2"),
        (lambda z, w: 2 * w * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, -1), "divide by N"),
        (lambda z, w: 2 * w * torch.logsumexp(z, -1, keepdim=True) / z.numel() + 0 * z, "not 1 / V"),
        (lambda z, w: 2 * w * z * torch.softmax(z, -1) / z.shape[0], "not the logits themselves"),
    ],
    "9.4.3": [
        (lambda z, t, eps: _smoothed(z, t, eps, others=True), "not over the other V - 1"),
        (lambda z, t, eps: _smoothed(z, t, eps, target_one=True), "not 1"),
        (lambda z, t, eps: -_smoothed(z, t, eps), "A loss is positive"),
        (lambda z, t, eps: _smoothed(z, t, eps, probs=True), "log_softmax"),
        (lambda z, t, eps: _smoothed(z, t, eps) * z.shape[0], "a mean, not a sum"),
    ],
    "9.5.1": [
        (lambda a, b: _merge(a, b, rescale=False), "Rescale each tile's normalizer l"),
        (lambda a, b: _merge(a, b, upside_down=True), "upside down"),
        (lambda a, b: _merge(a, b, add_maxima=True), "not their sum"),
        (lambda a, b: _merge(a, b)[1:], "return a tuple (m, l, acc)"),
    ],
    "9.5.2": [
        (lambda layers, heads, kv_heads, d_head, T, batch=1, bytes_per=2: 2 * layers * heads * d_head * T * batch * bytes_per,
         "use kv_heads"),
        (lambda layers, heads, kv_heads, d_head, T, batch=1, bytes_per=2: layers * kv_heads * d_head * T * batch * bytes_per,
         "a factor 2"),
        (lambda layers, heads, kv_heads, d_head, T, batch=1, bytes_per=2: 2 * kv_heads * d_head * T * batch * bytes_per,
         "number of layers"),
        (lambda layers, heads, kv_heads, d_head, T, batch=1, bytes_per=2: 2 * layers * kv_heads * d_head * T * bytes_per,
         "batch size"),
    ],
    "9.5.3": [
        (lambda T, w: _window(T, w, slack=1), "so hide i - j >= w"),
        (lambda T, w: _window(T, w, slack=-1), "Off by one the other way"),
        (lambda T, w: _window(T, w, causal=False), "Hide the future as well"),
        (lambda T, w: ~_window(T, w), "inverted"),
    ],
    "9.6.1": [
        (lambda img, W, b, P: _patch_embed(img, W, b, P, channels_last=True), "channel first"),
        (lambda img, W, b, P: _patch_embed(img, W, b, P, transposed=True), "do not transpose it"),
        (lambda img, W, b, P: _patch_embed(img, W, b, P, bias=False), "Add the bias"),
        (lambda img, W, b, P: _patch_embed(img, W, b, P).T, "one row per patch"),
    ],
    "9.6.2": [
        (lambda w: _relative(w, shift=False), "cannot be negative"),
        (lambda w: _relative(w, stride=w), "multiply by 2w - 1, not w"),
        (lambda w: _relative(w, key_minus_query=True), "the key's minus the query's"),
    ],
    "9.6.3": [
        (lambda pos, n_new: _resize(pos, n_new, channels_first_reshape=True), "mixes positions and features"),
        (lambda pos, n_new: _resize(pos, n_new, transpose=True), "The grid is transposed"),
        (lambda pos, n_new: _resize(pos, n_new, keep_cls=False), "Keep the class token"),
    ],
}


@pytest.mark.parametrize("case", solutions(), ids=ids)
def test_reference_solution_passes(case, monkeypatch):
    section, number, name, cell = case
    checked, answer = run_cell(section, cell, monkeypatch)
    assert checked == number
    ok, message = verdict(number, answer)
    assert ok, message
    assert message.startswith(f"Exercise {number}: correct.")


@pytest.mark.parametrize("case", starters(), ids=ids)
def test_untouched_starter_is_not_attempted(case, monkeypatch):
    section, number, name, cell = case
    checked, answer = run_cell(section, cell, monkeypatch)
    assert checked == number
    assert "...  # your code here" in cell.source
    ok, message = verdict(number, answer)
    assert ok is None and message == f"Exercise {number}: not attempted yet. Complete {name} above and run the cell again."


@pytest.mark.parametrize("number", sorted(WRONG))
def test_each_wrong_answer_is_rejected_with_its_own_message(number):
    messages = []
    for answer, hint in WRONG[number]:
        ok, message = verdict(number, answer)
        assert ok is False, f"{number} accepted a wrong answer meant to be caught as {hint!r}"
        assert hint in message, f"{number}: expected the hint {hint!r}, got: {message}"
        messages.append(message)
    assert len(WRONG[number]) >= 2
    assert len(set(messages)) == len(messages), messages


def test_every_checker_has_wrong_answers_and_a_notebook():
    in_notebooks = {number for s in SECTIONS for number, _, _ in checked_cells(s)}
    registered = {n for n in EXERCISES if n.rsplit(".", 1)[0] in SECTIONS}
    assert registered == in_notebooks
    assert registered <= set(WRONG), f"checkers without wrong answers: {sorted(registered - set(WRONG))}"


def test_a_starter_that_raises_not_implemented_is_not_attempted():
    def starter(Q, K, V):
        raise NotImplementedError
    ok, message = verdict("9.1.1", starter)
    assert ok is None and "not attempted yet" in message


def test_an_answer_that_raises_says_what():
    ok, message = verdict("9.1.1", lambda Q, K, V: Q @ V)
    assert ok is False and "raised RuntimeError" in message


@pytest.mark.parametrize("section", SECTIONS)
def test_section_ends_with_four_to_six_exercises(section):
    """Numbered headings in order, at least three checked, each checked one followed by its hidden solution."""
    nb = jupytext.read(NOTEBOOKS[section])
    cells = exercise_cells(nb)
    numbers = HEADING.findall("\n".join(c.source for c in cells if c.cell_type == "markdown"))
    assert numbers == [f"{section}.{k}" for k in range(1, len(numbers) + 1)], numbers
    assert 4 <= len(numbers) <= 6, numbers
    checked = checked_cells(section)
    assert len({n for n, _, _ in checked}) >= 3
    pairs = [(number, hidden(cell)) for number, _, cell in checked]
    assert pairs[0::2] == [(n, False) for n, _ in pairs[0::2]] and pairs[1::2] == [(n, True) for n, _ in pairs[0::2]]
    # A written answer sits in a <details> block, closed until clicked.
    for c in cells:
        if c.cell_type == "markdown" and "Solution" in c.source:
            assert "<details>\n<summary>Solution</summary>\n" in c.source and c.source.rstrip().endswith("</details>")


@pytest.mark.parametrize("section", SECTIONS)
def test_stored_outputs_show_starters_untouched_and_solutions_passing(section):
    stored = nbformat.read(NOTEBOOKS[section].with_suffix(".ipynb"), as_version=4)
    for cell in exercise_cells(stored):
        found = cell.cell_type == "code" and CHECK.search(cell.source)
        if not found:
            continue
        text = "".join(o.get("text", "") for o in cell.outputs)
        verdict_ = "correct." if hidden(cell) else "not attempted yet."
        assert text.startswith(f"Exercise {found[1]}: {verdict_}"), text
