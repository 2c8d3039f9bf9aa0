"""The appendices' exercises: 9.A.1 the Jacobian at a temperature, 9.A.2 the gradient of a learned ALiBi
slope.

Each checker accepts the notebook's reference solution and rejects the usual mistakes, each with its own
hint (exercises_common.py says how). The appendices' layout is tested here: each starter is followed by its
solution cell (tagged ``solution``, run by ``%%solution``, holding only the reference function and its check),
and every later cell that uses an exercise's function runs what ``solved(...)`` returns, so that the student
edition (solutions deleted) runs clean.
"""

import re

import jupytext
import pytest
import torch
from exercises_common import (
    NOTEBOOKS,
    compile_cell,
    exercise_cells,
    fails_on_every_seed,
    hidden,
    section_tests,
    slope,
)

from helpers.exercises import EXERCISES, verdict

# Wrong answers and right ones unlike the reference ---------------------------------------------------------------

def _temperature(s, tau, factor=True, times=False, at_one=False, diagonal_only=False):
    p = torch.softmax(s if at_one else s / tau, 0)
    J = torch.diag(p) if diagonal_only else torch.diag(p) - torch.outer(p, p)
    return J * tau if times else (J / tau if factor else J)


def _temperature_autograd(s, tau):
    """Autograd itself, in float32: right in value, but the exercise asks for the derivation."""
    return torch.autograd.functional.jacobian(lambda z: torch.softmax(z / tau, 0), s.float())


def _temperature_func(s, tau):
    """torch.func's Jacobian: autograd again, by another door."""
    return torch.func.jacrev(lambda z: torch.softmax(z / tau, 0))(s)


def _temperature_forward(s, tau):
    """Forward-mode differentiation, column by column: autograd too."""
    return torch.func.jacfwd(lambda z: torch.softmax(z / tau, 0))(s)


def _temperature_rows(s, tau):
    """Correct, another way: each row from the derivative of p_i = exp(s_i / tau) / Z, in float32."""
    s = s.float()
    e = torch.exp((s - s.max()) / tau)
    Z = e.sum()
    rows = [(e[i] / Z) * ((torch.arange(len(s)) == i).float() - e / Z) / tau for i in range(len(s))]
    return torch.stack(rows)


def _temperature_einsum(s, tau):
    """Correct, another way: the derivative of p_i = exp(s_i / tau) / Z written with einsum."""
    p = torch.softmax(s / tau, 0)
    eye = torch.eye(len(s), dtype=s.dtype)
    return torch.einsum("i,ij->ij", p, eye - p[None, :]) / tau


def _slope_autograd(q, k, v, m, d_out):
    """Autograd on the forward pass, with the slope as a tensor: right in value, but not derived."""
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


def _slope_centred(q, k, v, m, d_out):
    """Correct, another way: D_i as the row sum of P * dP, and each row's distances shifted by their mean under P
    (the invariance the exercise asks to show)."""
    T = q.shape[-2]
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).to(q.dtype)
    S = (q @ k.T / q.shape[-1] ** 0.5 - m * dist).masked_fill(dist < 0, float("-inf"))
    P = torch.softmax(S, -1)
    dP = d_out @ v.T
    dS = P * (dP - (P * dP).sum(-1, keepdim=True))
    shifted = (dist - (P * dist.clamp(min=0)).sum(-1, keepdim=True)).masked_fill(dist < 0, 0.0)
    return float(-(dS * shifted).sum())


APPENDIX = NOTEBOOKS["9.A"]
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
        exec(compile_cell(source, "9.A"), namespace)
    finally:
        torch.set_default_dtype(torch.float32)             # the appendix's setup cell switches to float64
    assert len(checked) == 1
    return checked[0]


def _temperature_float32(s, tau):
    """Right, in float32 with the largest score taken off: within the saturated case's tolerance (a students' review
    found a float32 answer rejected on 2 draws in 20 when that case's tolerance was float64's)."""
    p = torch.softmax(s.float() / tau, 0)
    return (torch.diag(p) - torch.outer(p, p)) / tau


def _temperature_unshifted(s, tau):
    """Right in exact arithmetic, in float32 without the largest score taken off: exp(s / tau) overflows where the
    scores are spread like the experiment's queries at tau = 1/100 (it printed NaN there, and passed every check)."""
    e = torch.exp(s.float() / tau)
    p = e / e.sum()
    return ((torch.diag(p) - torch.outer(p, p)) / tau).double()


# The exercises added later: each wrong answer is tried on several fresh checks, and RIGHT holds right answers
# written differently from the reference.
NEW_WRONG = {
    "9.A.1": [
        (lambda s, tau: _temperature(s, tau, factor=False), "chain rule through the division by tau is missing"),
        (lambda s, tau: _temperature(s, tau, times=True), "upside down"),
        (lambda s, tau: _temperature(s, tau, at_one=True), "probabilities at this temperature"),
        (lambda s, tau: _temperature(s, tau, diagonal_only=True), "entries off the diagonal are missing"),
        (_temperature_autograd, "lets autograd compute the derivative"),
        (_temperature_func, "lets autograd compute the derivative"),
        (_temperature_forward, "lets autograd compute the derivative"),
        (_temperature_unshifted, "Subtract the largest score before exp"),           # a students' review: NaN at 1/100
        (lambda s, tau: -_temperature(s, tau), "the diagonal is positive"),
    ],
    "9.A.2": [
        (lambda q, k, v, m, d_out: slope(q, k, v, m, d_out, "plus"), "The sign is flipped"),
        (lambda q, k, v, m, d_out: slope(q, k, v, m, d_out, "no_D"), "lacks its row term"),
        (lambda q, k, v, m, d_out: slope(q, k, v, m, d_out, "dP"), "go back through the softmax first"),
        (lambda q, k, v, m, d_out: torch.tensor([slope(q, k, v, m, d_out)]), "got a tensor of shape (1,)"),
        (_slope_autograd, "lets autograd compute the derivative"),
        # sqrt(d) hard-coded as 2 (d = 4): right where d = 4, which every check meets once, wrong at d = 2 and 8
        (lambda q, k, v, m, d_out: slope(q * q.shape[-1] ** 0.5 / 2, k, v, m, d_out), "Follow Appendix C"),
    ],
}


def _temperature_unshifted64(s, tau):
    """Right in exact arithmetic, in float64 (the appendix's default dtype) without the largest score taken off: it
    overflowed on some draws of the saturated case and not on others (a students' review: 5 draws in 20 passed), and
    printed NaN in the experiment at tau = 1/100."""
    e = torch.exp(s / tau)
    p = e / e.sum()
    return (torch.diag(p) - torch.outer(p, p)) / tau


def _temperature_log_softmax(s, tau):
    """Right (a students' review): from log_softmax, exp and broadcasting."""
    p = torch.log_softmax(s / tau, -1).exp()
    return (p[:, None] * (torch.eye(s.numel(), dtype=s.dtype) - p[None, :])) / tau


def _temperature_python(s, tau):
    """Right (a students' review): Python loops over the entries, in float32."""
    p = torch.softmax(s.float() / tau, 0).tolist()
    n = len(p)
    return torch.tensor([[p[i] * ((i == j) - p[j]) / tau for j in range(n)] for i in range(n)], dtype=torch.float32)


def _slope_parts(q, k, v, m, d_out, scale_dim=None):
    T = q.shape[-2]
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).to(q.dtype)
    S = (q @ k.T / (q.shape[-1] if scale_dim is None else scale_dim) ** 0.5 - m * dist).masked_fill(dist < 0, float("-inf"))
    P = torch.softmax(S, -1)
    dP = d_out @ v.T
    return dist, P, dP, P * (dP - (P * dP).sum(-1, keepdim=True))


def _slope_values_width(q, k, v, m, d_out):
    """Wrong (a students' review): the scores scaled by sqrt(d_v), the values' width, not sqrt(d). It passed every
    check while v and d_out were drawn as wide as q."""
    dist, _, _, dS = _slope_parts(q, k, v, m, d_out, scale_dim=v.shape[-1])
    return -(dS * dist.clamp(min=0)).sum().item()


def _slope_from_output(q, k, v, m, d_out):
    """Right (a students' review): D from dO . O (Appendix C's identity), with einsum, in float32."""
    q, k, v, d_out = q.float(), k.float(), v.float(), d_out.float()
    T, d = q.shape
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).float()
    S = (torch.einsum("id,jd->ij", q, k) / d ** 0.5 - m * dist).masked_fill(dist < 0, float("-inf"))
    P = S.softmax(-1)
    D = torch.einsum("iv,iv->i", d_out, P @ v)[:, None]
    return float(-(P * (d_out @ v.T - D) * dist).nan_to_num(0.0).sum())


def _slope_covariance(q, k, v, m, d_out):
    """Right (a students' review): the gradient as a covariance of distance and dP under each row's weights."""
    dist, P, dP, _ = _slope_parts(q, k, v, m, d_out)
    dist = dist.clamp(min=0)
    E_dist, E_dP = (P * dist).sum(-1, keepdim=True), (P * dP).sum(-1, keepdim=True)
    return -(P * (dist - E_dist) * (dP - E_dP)).sum(-1).sum()


RIGHT = {
    "9.A.1": [_temperature_einsum, _temperature_rows, _temperature_float32, _temperature_log_softmax,
              _temperature_python],
    "9.A.2": [_slope_loops, _slope_centred, _slope_from_output, _slope_covariance],
}


# The tests every section runs (exercises_common.py) ---------------------------------------------------------------

globals().update(section_tests("9.A", new_wrong=NEW_WRONG, right=RIGHT))


# This section's own tests -----------------------------------------------------------------------------------------

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


# A students' review: verdicts that depended on the draw, and a mistake that no draw caught --------------------------

def test_9_a_1_an_unshifted_exp_in_float64_fails_every_check():
    """D2: exp(s / tau) without the largest score taken off, in float64, passed 5 draws in 20: the saturated case's
    s / tau reached 600 to 900, and float64's exp overflows past 709. Its largest score now puts s / tau at 800 or
    more on every draw."""
    fails_on_every_seed("9.A.1", _temperature_unshifted64, "Subtract the largest score before exp", seeds=range(25))


def test_9_a_2_scores_scaled_by_the_values_width_fail_every_check():
    """D1: the scores scaled by sqrt(d_v) passed every check, as v and d_out were drawn as wide as q and k. They are
    now drawn with another width on every check."""
    fails_on_every_seed("9.A.2", _slope_values_width, "the width of the queries and keys", seeds=range(25))


def _slope_unmasked(q, k, v, m, d_out, clamped=False):
    """Wrong (a students' review, issue 32): the softmax over every key, the future ones too (no causal mask),
    with the distances as they are or clamped at 0. It got only the generic hint."""
    T = q.shape[-2]
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).to(q.dtype)
    dist = dist.clamp(min=0) if clamped else dist
    P = torch.softmax(q @ k.T / q.shape[-1] ** 0.5 - m * dist, -1)
    dP = d_out @ v.T
    return -(P * (dP - (P * dP).sum(-1, keepdim=True)) * dist).sum().item()


def test_9_a_2_softmax_over_the_future_keys_is_told_so():
    for clamped in (False, True):
        fails_on_every_seed("9.A.2", lambda q, k, v, m, d_out, c=clamped: _slope_unmasked(q, k, v, m, d_out, c),
                            "also weighs the future keys", seeds=range(25))


def _slope_unscaled(q, k, v, m, d_out):
    """Wrong (a students' review, 2026-12-04): the scores without the 1 / sqrt(d). It got only the generic hint."""
    T = q.shape[-2]
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).to(q.dtype)
    P = torch.softmax((q @ k.T - m * dist).masked_fill(dist < 0, float("-inf")), -1)
    dP = d_out @ v.T
    return -(P * (dP - (P * dP).sum(-1, keepdim=True)) * dist.clamp(min=0)).sum().item()


def test_9_a_2_unscaled_scores_are_told_so():
    fails_on_every_seed("9.A.2", _slope_unscaled, "Your scores are not scaled", seeds=range(25))
