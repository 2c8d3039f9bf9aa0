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


def _mask(lengths, T, diagonal=1, keys=True, combine=torch.logical_or):
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    padded = (j if keys else i) >= lengths[:, None, None]
    return combine(j >= i + diagonal, padded)


def _mqa(x, W_q, W_k, W_v, H, causal=True, d_scale=False, split="BTHd"):
    B, T, d = x.shape
    q = (x @ W_q).view(B, T, H, d // H).transpose(1, 2) if split == "BTHd" else (x @ W_q).view(B, H, T, d // H)
    s = q @ (x @ W_k)[:, None].mT / (d if d_scale else d // H) ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(s, -1) @ (x @ W_v)[:, None]).transpose(1, 2).reshape(B, T, d)


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
    "9.2.1": [
        (lambda lengths, T: ~_mask(lengths, T), "inverted"),
        (lambda lengths, T: _mask(lengths, T, diagonal=0), "diagonal is hidden"),
        (lambda lengths, T: _mask(lengths, T, keys=False), "hid padding queries"),
        (lambda lengths, T: _mask(lengths, T, combine=torch.logical_and), "Combine the masks with |"),
        (lambda lengths, T: _mask(lengths, T).float(), "should be boolean"),
        (lambda lengths, T: _mask(lengths, T)[:, :1], "should have shape"),
    ],
    "9.2.3": [
        (lambda x, W_q, W_k, W_v, H: _mqa(x, W_q, W_k, W_v, H, causal=False), "add the causal mask"),
        (lambda x, W_q, W_k, W_v, H: _mqa(x, W_q, W_k, W_v, H, d_scale=True), "1/sqrt(d_h)"),
        (lambda x, W_q, W_k, W_v, H: _mqa(x, W_q, W_k, W_v, H, split="BHTd"), "mixes tokens into heads"),
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


# New experiment exercises (9.1.3, 9.2.2, 9.3.1, 9.4.1, 9.5.3, 9.A.*) ------------------------------------
# Their checkers draw fresh cases at every check, so each wrong answer is tried several times, and each
# time it must be rejected with its own hint; correct answers written differently from the reference must
# pass every time.

REPEATS = 6


def _decode(model, source, offsets, sign=1, copied=True, renormalize=True, context=True, wrap=False, modify=False):
    n = source.shape[1]
    if modify:
        model.out.weight.data.mul_(2.0)
    h, _ = model.encoder(model.embed(source))
    s = torch.tanh(model.init(h.mean(1)))
    prev = torch.full_like(source[:, 0], model.vocab)
    logits, weights = [], []
    for t in range(n):
        c, a = model.attention(s, h)
        a = a.clone()
        for o in offsets:
            i = (n - 1 - t if copied else t) + sign * o
            if 0 <= i < n or (wrap and -n <= i < 0):
                a[:, i] = 0.0
        if renormalize:
            a = a / a.sum(-1, keepdim=True)
        if context:
            c = (a[:, :, None] * h).sum(1)
        s = model.cell(torch.cat([model.embed(prev), c], -1), s)
        logit = model.out(torch.cat([s, c], -1))
        logits.append(logit)
        weights.append(a)
        prev = logit.argmax(-1)
    return torch.stack(logits, 1), torch.stack(weights, 1)


def _decode_masked_scores(model, source, offsets):
    """Correct, another way: a wrapper that sets the hidden positions' weights by a -inf mask on log-weights."""
    n = source.shape[1]
    h, _ = model.encoder(model.embed(source))
    s = torch.tanh(model.init(h.mean(1)))
    prev = torch.full((source.shape[0],), model.vocab, dtype=torch.long)
    out_l, out_w = [], []
    for t in range(n):
        _, a = model.attention(s, h)
        hide = torch.tensor([any(i == n - 1 - t + o for o in offsets) for i in range(n)])
        a = torch.softmax(a.log().masked_fill(hide, float("-inf")), -1)     # renormalized, as a softmax
        c = torch.einsum("bn,bnd->bd", a, h)
        s = model.cell(torch.cat([model.embed(prev), c], -1), s)
        logit = model.out(torch.cat([s, c], -1))
        out_l.append(logit)
        out_w.append(a)
        prev = logit.argmax(-1)
    return torch.stack(out_l, 1), torch.stack(out_w, 1)


def _reach(layer, T=64, d=4, index=False, plus_one=False, first_output=False, all_outputs=False):
    x = torch.randn(1, T, d, requires_grad=True)
    y = layer(x)
    out = y[0, 0] if first_output else (y.sum() if all_outputs else y[0, -1])
    (grad,) = torch.autograd.grad(out.sum(), x)
    first = int((grad[0].abs().sum(-1) > 0).nonzero()[0]) if not first_output else 0
    r = T - 1 - first
    if first_output:
        r = 0
    return first if index else r + plus_one


def _reach_jacobian(layer, T=64, d=4):
    """Correct, another way: the full Jacobian of the last output, and the farthest input with a nonzero entry."""
    J = torch.autograd.functional.jacobian(lambda x: layer(x)[0, -1], torch.randn(1, T, d))   # (d, 1, T, d)
    nonzero = J.abs().sum((0, 1, 3)) > 0
    return max(T - 1 - j for j in range(T) if nonzero[j])


def _reach_loop(layer, T=64, d=4):
    """Correct, another way: perturb one input at a time and see whether the last output moves."""
    x = torch.randn(1, T, d)
    with torch.no_grad():
        base = layer(x)[0, -1]
        for j in range(T):
            x2 = x.clone()
            x2[0, j] += 1.0
            if not torch.equal(layer(x2)[0, -1], base):
                return T - 1 - j
    return 0


def _advantage_answer(m, T, delta, others=True, penalty=True, start=0, as_string=False):
    dist = torch.arange(start, start + T, dtype=torch.float64)
    rest = torch.logsumexp(-m * dist[torch.arange(T) != delta], 0).item() if others else 0.0
    b = (m * (delta + start) if penalty else 0.0) + rest
    return str(b) if as_string else b


def _advantage_bisection(m, T, delta):
    """Correct, another way: bisection on the weight measured with a float32 softmax."""
    dist = torch.arange(T, dtype=torch.float32)
    lo, hi = 0.0, m * T + 50.0
    for _ in range(60):
        b = (lo + hi) / 2
        scores = -m * dist
        scores[delta] += b
        lo, hi = (b, hi) if torch.softmax(scores, 0)[delta] < 0.5 else (lo, b)
    return (lo + hi) / 2


def _advantage_closed(m, T, delta):
    """Correct, another way: the geometric series summed in closed form, in NumPy floats."""
    import numpy as np
    total = (1 - np.exp(-m * T)) / (1 - np.exp(-m))
    return float(m * delta + np.log(total - np.exp(-m * delta)))


def _rms(blocks, x, inputs=False, norm=False, std=False, normalized=False, as_list=False, in_place=False):
    out = [x.pow(2).mean().sqrt()] if inputs else []
    for block in blocks:
        if in_place:
            x += block(x) - x
        else:
            x = block(x)
        z = block.norm1(x) if normalized else x
        out.append(z.norm() if norm else z.std() if std else z.pow(2).mean().sqrt())
    return [v.item() for v in out] if as_list else torch.stack(out)


def _rms_float64(blocks, x):
    """Correct, another way: in double precision, from the stream's squared norm."""
    blocks = __import__("copy").deepcopy(blocks).double()
    x, out = x.double(), []
    for block in blocks:
        x = block(x)
        out.append((x.square().sum() / x.numel()).sqrt())
    return torch.stack(out).float()


def _connect(pattern, hops=False, plus=0, middle=False, never=math.inf):
    T = pattern.shape[0]
    reach = pattern.clone()
    for n in range(1, T + 1):
        if (reach[T // 2] if middle else reach).all():
            return n - 1 if hops else n + plus
        reach = (reach.double() @ pattern.double()) > 0
    return never


def _connect_bfs(pattern):
    """Correct, another way: the graph's diameter by breadth-first search from every key."""
    T = pattern.shape[0]
    worst = 0
    for j in range(T):
        dist = {j: 0}                                                       # hops from key j
        frontier = [j]
        while frontier:
            nxt = []
            for a in frontier:
                for i in pattern[:, a].nonzero().flatten().tolist():      # queries that see key a
                    if i not in dist:
                        dist[i] = dist[a] + 1
                        nxt.append(i)
            frontier = nxt
        if len(dist) < T:
            return math.inf
        worst = max(worst, max(dist.values()))
    return max(worst, 1)                                                    # one layer at least


def _connect_numpy(pattern):
    """Correct, another way: matrix powers in NumPy, returning a NumPy integer."""
    import numpy as np
    p = pattern.numpy().astype(np.int64)
    reach = p.copy()
    for n in range(1, p.shape[0] + 1):
        if reach.all():
            return np.int64(n)
        reach = np.minimum(reach @ p, 1)
    return math.inf


def _temperature(s, tau, factor=True, times=False, at_one=False, diagonal_only=False):
    p = torch.softmax(s if at_one else s / tau, 0)
    J = torch.diag(p) if diagonal_only else torch.diag(p) - torch.outer(p, p)
    return J * tau if times else (J / tau if factor else J)


def _temperature_autograd(s, tau):
    """Correct, another way: autograd itself, in float32."""
    return torch.autograd.functional.jacobian(lambda z: torch.softmax(z / tau, 0), s.float())


def _temperature_einsum(s, tau):
    """Correct, another way: the derivative of p_i = exp(s_i / tau) / Z written with einsum."""
    p = torch.softmax(s / tau, 0)
    eye = torch.eye(len(s), dtype=s.dtype)
    return torch.einsum("i,ij->ij", p, eye - p[None, :]) / tau


def _slope(q, k, v, m, d_out, variant=None):
    T = q.shape[-2]
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).to(q.dtype)
    S = (q @ k.T / q.shape[-1] ** 0.5 - m * dist).masked_fill(dist < 0, float("-inf"))
    P = torch.softmax(S, -1)
    dP = d_out @ v.T
    dS = P * dP if variant == "no_D" else P * (dP - (P * dP).sum(-1, keepdim=True))
    if variant == "dP":
        dS = dP
    g = (dS * dist.clamp(min=0)).sum()
    return g.item() if variant == "plus" else -g.item()


def _slope_autograd(q, k, v, m, d_out):
    """Correct, another way: autograd on the forward pass, with the slope as a tensor."""
    m = torch.tensor(float(m), dtype=q.dtype, requires_grad=True)
    T = q.shape[-2]
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).to(q.dtype)
    S = (q @ k.T / q.shape[-1] ** 0.5 - m * dist).masked_fill(dist < 0, float("-inf"))
    ((torch.softmax(S, -1) @ v) * d_out).sum().backward()
    return m.grad


def _slope_loops(q, k, v, m, d_out):
    """Correct, another way: one query at a time, in float32."""
    q, k, v, d_out = q.float(), k.float(), v.float(), d_out.float()
    total = 0.0
    for i in range(q.shape[0]):
        dist = torch.arange(i, -1, -1, dtype=torch.float32)                # i - j for j = 0 .. i
        p = torch.softmax(q[i] @ k[: i + 1].T / q.shape[1] ** 0.5 - m * dist, 0)
        dp = v[: i + 1] @ d_out[i]
        ds = p * (dp - p @ dp)
        total += float(-(ds * dist).sum())
    return total


NEW_WRONG = {
    "9.1.3": [
        (lambda model, source, offsets: _decode(model, source, offsets, sign=-1), "not n - 1 - t - 1"),
        (lambda model, source, offsets: _decode(model, source, offsets, copied=False), "not position t"),
        (lambda model, source, offsets: _decode(model, source, offsets, renormalize=False), "sum to one again"),
        (lambda model, source, offsets: _decode(model, source, offsets, wrap=True), "wraps around"),
        (lambda model, source, offsets: _decode(model, source, offsets, context=False), "the context still comes"),
        (lambda model, source, offsets: _decode(model, source, offsets, modify=True), "changed the model"),
    ],
    "9.2.2": [
        (lambda layer, T=64, d=4: _reach(layer, T, d, index=True), "not that input's index"),
        (lambda layer, T=64, d=4: _reach(layer, T, d, plus_one=True), "has reach 0"),
        (lambda layer, T=64, d=4: _reach(layer, T, d, first_output=True), "position T - 1"),
        (lambda layer, T=64, d=4: _reach(layer, T, d, all_outputs=True), "Differentiate the last output alone"),
        (lambda layer, T=64, d=4: float(_reach(layer, T, d)), "should be an integer"),
        (lambda layer, T=64, d=4: str(_reach(layer, T, d)), "should be an integer"),
    ],
    "9.3.1": [
        (lambda m, T, delta: _advantage_answer(m, T, delta, others=False), "other T - 1 keys compete"),
        (lambda m, T, delta: _advantage_answer(m, T, delta, penalty=False), "own bias"),
        (lambda m, T, delta: _advantage_answer(m, T, delta, as_string=True), "should be a number"),
    ],
    "9.4.1": [
        (lambda blocks, x: _rms(blocks, x, inputs=True), "leave out the input"),
        (lambda blocks, x: _rms(blocks, x, norm=True), "not the norm"),
        (lambda blocks, x: _rms(blocks, x, std=True), "does not subtract the mean"),
        (lambda blocks, x: _rms(blocks, x, normalized=True), "not its normalized copy"),
        (lambda blocks, x: _rms(blocks, x, as_list=True), "return a tensor"),
        (lambda blocks, x: _rms(blocks, x, in_place=True), "changed its input x"),
    ],
    "9.5.3": [
        (lambda pattern: _connect(pattern, hops=True), "start at 1"),
        (lambda pattern: _connect(pattern, plus=1), "stop at the first number of layers"),
        (lambda pattern: _connect(pattern, middle=True), "not only the middle token"),
        (lambda pattern: _connect(pattern, never=pattern.shape[0]), "return math.inf"),
        (lambda pattern: _connect(pattern, never=-1), "return math.inf"),
    ],
    "9.A.1": [
        (lambda s, tau: _temperature(s, tau, factor=False), "a factor 1 / tau"),
        (lambda s, tau: _temperature(s, tau, times=True), "not tau"),
        (lambda s, tau: _temperature(s, tau, at_one=True), "probabilities at this temperature"),
        (lambda s, tau: _temperature(s, tau, diagonal_only=True), "off-diagonal terms"),
    ],
    "9.A.2": [
        (lambda q, k, v, m, d_out: _slope(q, k, v, m, d_out, "plus"), "its derivative in m is -(i - j)"),
        (lambda q, k, v, m, d_out: _slope(q, k, v, m, d_out, "no_D"), "row term"),
        (lambda q, k, v, m, d_out: _slope(q, k, v, m, d_out, "dP"), "use dS, not dP"),
    ],
}
WRONG.update({n: w for n, w in NEW_WRONG.items() if not n.startswith("9.A")})

RIGHT = {
    "9.1.3": [_decode_masked_scores, lambda model, source, offsets: _decode(model, source, offsets)],
    "9.2.2": [_reach_jacobian, _reach_loop],
    "9.3.1": [_advantage_bisection, _advantage_closed],
    "9.4.1": [_rms_float64, lambda blocks, x: torch.tensor([v for v in _rms(blocks, x, as_list=True)])],
    "9.5.3": [_connect_bfs, _connect_numpy],
    "9.A.1": [_temperature_autograd, _temperature_einsum],
    "9.A.2": [_slope_autograd, _slope_loops],
}


@pytest.mark.parametrize("number", sorted(NEW_WRONG))
def test_new_exercises_reject_each_wrong_answer_with_its_hint_on_fresh_cases(number):
    messages = set()
    for answer, hint in NEW_WRONG[number]:
        for _ in range(REPEATS):
            ok, message = verdict(number, answer)
            assert ok is False, f"{number} accepted a wrong answer meant to be caught as {hint!r}"
            assert hint in message, f"{number}: expected the hint {hint!r}, got: {message}"
        messages.add(hint)
    assert len(NEW_WRONG[number]) >= 2 and len(messages) >= 2


@pytest.mark.parametrize("number", sorted(RIGHT))
def test_new_exercises_accept_correct_answers_written_differently(number):
    assert len(RIGHT[number]) >= 2
    for answer in RIGHT[number]:
        for _ in range(REPEATS):
            ok, message = verdict(number, answer)
            assert ok, f"{number} rejected a correct answer ({answer.__name__}): {message}"


def test_new_exercises_draw_fresh_cases():
    """Two checks of the same wrong answer fail on different cases: nothing to learn from the messages."""
    for number, (answer, _) in ((n, NEW_WRONG[n][0]) for n in ("9.2.2", "9.3.1", "9.5.3")):
        seen = {verdict(number, answer)[1] for _ in range(8)}
        assert len(seen) > 1, f"{number} showed the same case every time: {seen}"


APPENDIX = ROOT / "notebooks" / "9.A-appendices.md"
HEADING_A = re.compile(r"^### Exercise (9\.A\.\d+): \S", re.M)
CHECK_A = re.compile(r'^check\("(9\.A\.\d+)", (\w+)\)$', re.M)


def _appendix_cells():
    nb = jupytext.read(APPENDIX)
    return [(*CHECK_A.search(c.source).groups(), c) for c in exercise_cells(nb)
            if c.cell_type == "code" and CHECK_A.search(c.source)]


def _run_appendix_cell(cell):
    nb = jupytext.read(APPENDIX)
    checked = []
    namespace = {}
    exec(next(c for c in nb.cells if c.cell_type == "code" and "remove-cell" not in c.metadata.get("tags", [])).source,
         namespace)
    try:
        namespace["check"] = lambda number, answer: checked.append((number, answer))
        source = cell.source.replace("from helpers.exercises import check\n", "")
        exec(source, namespace)
    finally:
        torch.set_default_dtype(torch.float32)             # the appendix's setup cell switches to float64
    assert len(checked) == 1
    return checked[0]


@pytest.mark.parametrize("case", _appendix_cells(), ids=lambda case: case[0])
def test_appendix_exercises_solution_passes_and_starter_is_not_attempted(case):
    number, name, cell = case
    checked, answer = _run_appendix_cell(cell)
    assert checked == number
    ok, message = verdict(number, answer)
    if hidden(cell):
        assert ok, message
    else:
        assert ok is None and "...  # your code here" in cell.source, message


def test_appendix_has_two_or_three_exercises_laid_out_as_the_sections():
    nb = jupytext.read(APPENDIX)
    cells = exercise_cells(nb)
    numbers = HEADING_A.findall("\n".join(c.source for c in cells if c.cell_type == "markdown"))
    assert numbers == [f"9.A.{k}" for k in range(1, len(numbers) + 1)] and 2 <= len(numbers) <= 3, numbers
    pairs = [(number, hidden(cell)) for number, _, cell in _appendix_cells()]
    assert pairs[0::2] == [(n, False) for n, _ in pairs[0::2]] and pairs[1::2] == [(n, True) for n, _ in pairs[0::2]]
    assert {n for n in EXERCISES if n.startswith("9.A.")} == {n for n, _ in pairs}
