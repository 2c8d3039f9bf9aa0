"""What the exercises' tests share: the notebooks' exercise cells, and the tests every section runs on its own tables.

Each section's test file (``test_exercises_9_1.py`` ... ``test_exercises_9_a.py``) lists its exercises' wrong
answers (``WRONG``, ``NEW_WRONG`` for the exercises added later), students' attempts (``STUDENTS``) and right
answers unlike the reference (``RIGHT``), and runs the tests below on them; ``make check NB=notebooks/x.md`` runs
only that section's file. The reference solutions are the notebooks' own hidden solution cells, executed after
the notebook's setup cell. The checking machinery's own tests are in ``test_exercises_judge.py``, the layout every
section shares in ``test_exercises_layout.py``."""

import linecache
import math
import re
from pathlib import Path

import jupytext
import pytest
import torch

from helpers import exercises
from helpers.exercises import verdict

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("9.1", "9.2", "9.3", "9.4", "9.5", "9.6")
NOTEBOOKS = {s: next((ROOT / "notebooks").glob(f"{s}-*.md")) for s in (*SECTIONS, "9.A")}
HEADING = re.compile(r"^### Exercise (\d+\.\d+\.\d+): \S", re.M)
CHECK = re.compile(r'^check\("(\d+\.[\dA-Z]+\.\d+)", (\w+)\)$', re.M)
REPEATS = 6                  # checks of each answer to the exercises added later: each draws its cases afresh
# An open exercise (each section's fifth) trains or runs a model on every class of case at each check, so a few
# checks of each answer are enough; six took up to a minute per exercise.
OPEN_REPEATS = 2
OPEN = {f"{s}.5" for s in SECTIONS}


class OverTheBatch(torch.nn.Module):
    """A trained model whose forward takes the softmax over the batch, dim 0: each answer depends on the rest of
    the batch, and its argmax barely moves. The open exercises (9.2.5, 9.3.5, 9.6.5) must refuse it."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *inputs):
        return self.model(*inputs).softmax(0)


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
    namespace, default = {}, torch.get_default_dtype()
    # The setup cell: the first code cell the site shows (the one before it installs helpers outside a checkout).
    exec(setup_cell(nb).source, namespace)
    namespace["check"] = record
    exec(compile_cell(cell.source, f"{section}-{checked_cell_index(nb, cell)}"), namespace)
    torch.set_default_dtype(default)             # 9.A's setup cell sets float64: keep it from the other tests
    assert len(checked) == 1, "a cell checks one exercise"
    return checked[0]


def setup_cell(nb):
    return next(c for c in nb.cells if c.cell_type == "code" and "remove-cell" not in c.metadata.get("tags", []))


def checked_cell_index(nb, cell):
    return next(i for i, c in enumerate(nb.cells) if c is cell or c.source == cell.source)


def compile_cell(source, name):
    """``source`` compiled as IPython compiles a cell: with a file name whose lines ``inspect`` can read. A
    solution cell's ``%%solution`` line (which runs it apart from the reader's names) becomes a blank line."""
    if source.startswith("%%solution\n"):
        source = "\n" + source.split("\n", 1)[1]
    filename = f"<cell {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    return compile(source, filename, "exec")


def solutions(section):
    return [(section, number, name, cell) for number, name, cell in checked_cells(section) if hidden(cell)]


def starters(section):
    return [(section, number, name, cell) for number, name, cell in checked_cells(section) if not hidden(cell)]


def ids(case):
    return case[1]


def answers(verdict_of, number, answer, runs=3):
    """The verdicts of ``runs`` checks of ``answer``: each draws its hidden cases afresh."""
    return [verdict_of(number, answer) for _ in range(runs)]


def harvester(parse):
    """An answer that learns from the checker's messages: it answers every input it was told about."""
    table, calls = {}, []

    def key(args):
        return tuple(round(a, 12) if isinstance(a, float) else
                     tuple(a.flatten().tolist()) if isinstance(a, torch.Tensor) else a for a in args)

    def answer(*args):
        calls.append(key(args))
        return table.get(key(args), 0)

    def learn(message):
        k = int(re.search(r"case (\d+) of", message)[1])
        table[calls[k - 1]] = parse(re.search(r"expected (\S+?),? got", message)[1])
        calls.clear()
    return answer, learn


# The tests each section runs on its own tables (its test file names them test_...) ---------------------------

def reference_solution_passes(case, monkeypatch):
    section, number, name, cell = case
    checked, answer = run_cell(section, cell, monkeypatch)
    assert checked == number
    ok, message = verdict(number, answer)
    assert ok, message
    assert message.startswith(f"Exercise {number}: correct.")


def untouched_starter_is_not_attempted(case, monkeypatch):
    section, number, name, cell = case
    checked, answer = run_cell(section, cell, monkeypatch)
    assert checked == number
    assert "...  # your code here" in cell.source
    ok, message = verdict(number, answer)
    assert ok is None and message == f"Exercise {number}: not attempted yet. Complete {name} above and run the cell again."


def each_wrong_answer_is_rejected_with_its_own_message(number, wrong):
    messages = []
    for answer, hint in wrong:
        ok, message = verdict(number, answer)
        assert ok is False, f"{number} accepted a wrong answer meant to be caught as {hint!r}"
        assert hint in message, f"{number}: expected the hint {hint!r}, got: {message}"
        messages.append(message)
    assert len(wrong) >= 2
    assert len(set(messages)) == len(messages), messages


def students_right_answers_pass_and_wrong_ones_get_their_message(number, attempts):
    right = [a for a, expected in attempts if expected is None]
    assert len(right) >= 2, f"{number}: at least two right answers unlike the reference"
    for answer, expected in attempts:
        for ok, message in answers(verdict, number, answer):
            if expected is None:
                assert ok, f"{number} refused a right answer: {message}"
            else:
                assert ok is False and expected in message, f"{number}: expected {expected!r} in: {message}"


def wrong_answers_fail_on_every_fresh_draw(number, wrong):
    for answer, hint in wrong:
        for ok, message in answers(verdict, number, answer, runs=4):
            assert ok is False and hint in message, f"{number}: expected {hint!r} in: {message}"


# The exercises added later (9.1.3, 9.2.2, 9.3.1, 9.4.1, 9.5.3, 9.A.*) draw every case afresh at every check, so each
# wrong answer is tried several times, and each time it must be rejected with its own hint; correct answers written
# differently from the reference must pass every time.

def new_exercises_reject_each_wrong_answer_with_its_hint_on_fresh_cases(number, wrong, repeats=None):
    messages, repeats = set(), repeats or (OPEN_REPEATS if number in OPEN else REPEATS)
    for answer, hint in wrong:
        for _ in range(repeats):
            ok, message = verdict(number, answer)
            assert ok is False, f"{number} accepted a wrong answer meant to be caught as {hint!r}"
            assert hint in message, f"{number}: expected the hint {hint!r}, got: {message}"
        messages.add(hint)
    assert len(wrong) >= 2 and len(messages) >= 2


def new_exercises_accept_correct_answers_written_differently(number, right, repeats=None):
    assert len(right) >= 2
    repeats = repeats or (OPEN_REPEATS if number in OPEN else REPEATS)
    for answer in right:
        for _ in range(repeats):
            ok, message = verdict(number, answer)
            assert ok, f"{number} rejected a correct answer ({answer.__name__}): {message}"


def fails_on_every_seed(number, answer, expected, seeds=range(25)):
    """A wrong answer whose verdict once depended on the draw: it fails on every seed, with ``expected`` in the message."""
    for seed in seeds:
        ok, message = verdict(number, answer, seed=seed)
        assert ok is False and expected in message, (seed, message)


# Answers that the tests of more than one file use ------------------------------------------------------------------

def rope(x, scale=1.0, sign=1, stretch=True, halves=False):
    T, d = x.shape[-2:]
    t = torch.arange(T, dtype=x.dtype)
    angle = sign * (t / scale if stretch else t * scale)[:, None] * 10000.0 ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
    a, b = (x[..., : d // 2], x[..., d // 2:]) if halves else (x[..., 0::2], x[..., 1::2])
    ra, rb = a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()
    return torch.cat([ra, rb], -1) if halves else torch.stack([ra, rb], -1).flatten(-2)


def reach(layer, T=64, d=4, index=False, plus_one=False, first_output=False, all_outputs=False, last=False):
    x = torch.randn(1, T, d, requires_grad=True)
    y = layer(x)
    out = y[0, 0] if first_output else (y.sum() if all_outputs else y[0, -1])
    (grad,) = torch.autograd.grad(out.sum(), x)
    first = int((grad[0].abs().sum(-1) > 0).nonzero()[-1 if last else 0])
    return first if index else T - 1 - first + plus_one


def advantage(m, T, delta, others=True, penalty=True, start=0, as_string=False):
    dist = torch.arange(start, start + T, dtype=torch.float64)
    rest = torch.logsumexp(-m * dist[torch.arange(T) != delta], 0).item() if others else 0.0
    b = (m * (delta + start) if penalty else 0.0) + rest
    return str(b) if as_string else b


def connect(pattern, hops=False, plus=0, middle=False, never=math.inf, first=False):
    T = pattern.shape[0]
    reach = pattern.clone()
    for n in range(1, T + 1):
        if (reach[T // 2] if middle else reach[0] if first else reach).all():
            return n - 1 if hops else n + plus
        reach = (reach.double() @ pattern.double()) > 0
    return never


def slope(q, k, v, m, d_out, variant=None):
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


def section_tests(section, wrong=None, students=None, new_wrong=None, right=None, reference_elsewhere=()):
    """The tests every section runs on its own tables, for its test module to take in with ``globals().update``.
    ``reference_elsewhere``: exercises whose reference needs the main text's definitions (the section tests them).
    A table the section does not have gives no test, rather than one that pytest reports as skipped."""
    wrong, students, new_wrong, right = (table or {} for table in (wrong, students, new_wrong, right))

    @pytest.mark.parametrize("case", [c for c in solutions(section) if c[1] not in reference_elsewhere], ids=ids)
    def test_reference_solution_passes(case, monkeypatch):
        reference_solution_passes(case, monkeypatch)

    @pytest.mark.parametrize("case", starters(section), ids=ids)
    def test_untouched_starter_is_not_attempted(case, monkeypatch):
        untouched_starter_is_not_attempted(case, monkeypatch)

    @pytest.mark.parametrize("number", sorted(wrong))
    def test_each_wrong_answer_is_rejected_with_its_own_message(number):
        each_wrong_answer_is_rejected_with_its_own_message(number, wrong[number])

    @pytest.mark.parametrize("number", sorted(students))
    def test_students_right_answers_pass_and_wrong_ones_get_their_message(number):
        students_right_answers_pass_and_wrong_ones_get_their_message(number, students[number])

    @pytest.mark.parametrize("number", sorted(set(wrong) & set(students)))
    def test_wrong_answers_fail_on_every_fresh_draw(number):
        wrong_answers_fail_on_every_fresh_draw(number, wrong[number])

    @pytest.mark.parametrize("number", sorted(new_wrong))
    def test_new_exercises_reject_each_wrong_answer_with_its_hint_on_fresh_cases(number):
        new_exercises_reject_each_wrong_answer_with_its_hint_on_fresh_cases(number, new_wrong[number])

    @pytest.mark.parametrize("number", sorted(right))
    def test_new_exercises_accept_correct_answers_written_differently(number):
        new_exercises_accept_correct_answers_written_differently(number, right[number])

    return {name: test for name, test in locals().items()
            if name.startswith("test_") and test.pytestmark[0].args[1]}     # (argnames, argvalues): values given
