"""Section 9.3's exercises: 9.3.1 how much content overrides ALiBi's penalty, 9.3.2 ALiBi beyond its
trained length, 9.3.3 stretching RoPE's context.

Each checker accepts the notebook's reference solution and rejects the usual mistakes, each with its own
hint (exercises_common.py says how; the shared layout is tested in test_exercises_layout.py).
"""

import math

import pytest
import torch
from exercises_common import (
    advantage,
    each_wrong_answer_is_rejected_with_its_own_message,
    fails_on_every_seed,
    harvester,
    ids,
    new_exercises_accept_correct_answers_written_differently,
    new_exercises_reject_each_wrong_answer_with_its_hint_on_fresh_cases,
    reference_solution_passes,
    rope,
    solutions,
    starters,
    students_right_answers_pass_and_wrong_ones_get_their_message,
    untouched_starter_is_not_attempted,
    wrong_answers_fail_on_every_fresh_draw,
)

from helpers.exercises import s9_3, verdict

# Wrong answers and right ones unlike the reference ---------------------------------------------------------------

def _far(m, T, w, at_least=False, normalized=True, sign=-1):
    delta = torch.arange(T, dtype=torch.float64)
    weight = torch.exp(sign * m * delta)
    far = weight[delta >= w if at_least else delta > w].sum()
    return (far / weight.sum() if normalized else far).item()


def _rope_complex(x, scale=1.0):
    T, d = x.shape[-2:]
    angle = (torch.arange(T, dtype=torch.float64) / scale)[:, None] * 10000.0 ** (-torch.arange(0, d, 2) / d)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous()) * torch.polar(
        torch.ones_like(angle), angle)
    return torch.view_as_real(z).flatten(-2).to(x.dtype)


def _far_closed_form(m, T, w):
    r = math.exp(-m)
    return (r ** (w + 1) - r ** T) / (1 - r ** T)


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


# Wrong answers: for each exercise, (the mistake, a piece of the hint that must name it).
WRONG = {
    "9.3.2": [
        (lambda m, T, w: _far(m, T, w, at_least=True), "distance w itself is inside"),
        (lambda m, T, w: _far(m, T, w, normalized=False), "Normalize"),
        (lambda m, T, w: _far(m, T, w, sign=1), "the weight falls with distance"),
    ],
    "9.3.3": [
        (lambda x, scale=1.0: rope(x, scale, sign=-1), "rotate the wrong way"),
        (lambda x, scale=1.0: rope(x, scale, stretch=False), "not multiply"),
        (lambda x, scale=1.0: rope(x, 1.0), "The scale is ignored"),
        (lambda x, scale=1.0: rope(x, scale, halves=True), "not j and j + d/2"),
    ],
}


# Students at the exercises (REVIEW.md, brief 2): wrong attempts not in WRONG, and right answers unlike the
# reference. Each attempt is (answer, a piece of the message it must get); None marks a right answer.
STUDENTS = {
    "9.3.2": [
        (_far_closed_form, None),                                                                    # geometric series
        (lambda m, T, w: torch.softmax(-m * torch.arange(T, dtype=torch.float32), 0)[w + 1:].sum().item(), None),
        (lambda m, T, w: sum(math.exp(-m * t) for t in range(w + 1, T)) / sum(math.exp(-m * t) for t in range(T)), None),
        (lambda m, T, w: torch.softmax(-m * torch.arange(1, T + 1, dtype=torch.float64), 0)[w:].sum().item(),
         "distance w itself is inside"),
        (lambda m, T, w: torch.softmax(-m * torch.arange(T, dtype=torch.float64), 0)[w + 1:].sum(), None),  # a 0-d tensor
        (lambda m, T, w: 1 - torch.softmax(-m * torch.arange(T, dtype=torch.float64), 0)[:w].sum().item(),
         "distance w itself is inside"),
    ],
    "9.3.3": [
        (_rope_complex, None),                                                                       # complex rotation
        (lambda x, scale=1.0: _rope_complex(x.float(), scale), None),                               # float32
        (lambda x, scale=1.0: _rope_complex(x, scale)[..., :], None),
        (lambda x, scale=1.0: _rope_complex(x, 1 / scale), "not multiply"),
        (lambda x, scale=1.0: _rope_complex(x, scale).mT.contiguous().view(x.shape), "Row t, pair"),
        (lambda x, scale=1.0: _rope_complex(x, scale).detach().numpy(), "should be a torch.Tensor"),
    ],
}


# The exercises added later: each wrong answer is tried on several fresh checks, and RIGHT holds right answers
# written differently from the reference.
NEW_WRONG = {
    "9.3.1": [
        (lambda m, T, delta: advantage(m, T, delta, others=False), "other T - 1 keys compete"),
        (lambda m, T, delta: advantage(m, T, delta, penalty=False), "own bias"),
        (lambda m, T, delta: advantage(m, T, delta, as_string=True), "should be a number"),
        (lambda m, T, delta: torch.tensor([advantage(m, T, delta)]), "got a tensor of shape (1,)"),
    ],
}


RIGHT = {
    "9.3.1": [_advantage_bisection, _advantage_closed],
}


# The tests every section runs (exercises_common.py) ---------------------------------------------------------------

@pytest.mark.parametrize("case", solutions("9.3"), ids=ids)
def test_reference_solution_passes(case, monkeypatch):
    reference_solution_passes(case, monkeypatch)


@pytest.mark.parametrize("case", starters("9.3"), ids=ids)
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


@pytest.mark.parametrize("number", sorted(NEW_WRONG))
def test_new_exercises_reject_each_wrong_answer_with_its_hint_on_fresh_cases(number):
    new_exercises_reject_each_wrong_answer_with_its_hint_on_fresh_cases(number, NEW_WRONG[number])


@pytest.mark.parametrize("number", sorted(RIGHT))
def test_new_exercises_accept_correct_answers_written_differently(number):
    new_exercises_accept_correct_answers_written_differently(number, RIGHT[number])


# This section's own tests -----------------------------------------------------------------------------------------

def test_9_3_1_shows_what_its_message_claims_and_hides_fresh_cases():
    """Review 9.3 (B3): the message says "steep and shallow heads, short and long sequences", so every check
    shows the steepest and the shallowest head and T = 16 and 4,096; the hidden cases after them are new each
    time, and a table harvested from the messages never passes."""
    seen = []

    def spy(m, T, delta):
        seen.append((m, T, delta))
        return s9_3._advantage(m, T, delta)
    runs = []
    for _ in range(2):
        seen.clear()
        ok, message = verdict("9.3.1", spy)
        assert ok, message
        runs.append(list(seen))
    first, second = runs
    assert first[:4] == second[:4] and len(first) > 4, "the shown cases are the same at every check"
    assert {0.5, 2.0 ** -8} <= {m for m, _, _ in first[:4]} and {16, 4096} <= {T for _, T, _ in first[:4]}
    assert set(first[4:]).isdisjoint(second[4:]), "the hidden ones are new"
    answer, learn = harvester(float)
    for _ in range(8):
        ok, message = verdict("9.3.1", answer)
        assert ok is False, "9.3.1: a lookup table passed after harvesting the messages"
        learn(message)


def test_9_3_2_the_float32_complement_is_accepted():
    def far_weight(m, T, w):                              # right, but cancels in float32
        p = torch.softmax(-m * torch.arange(T, dtype=torch.float32), 0)
        return 1 - p[:w + 1].sum().item()
    assert all(verdict("9.3.2", far_weight)[0] for _ in range(20))


# Issue 32: verdicts that depended on the draw -----------------------------------------------------------------------

def test_9_3_3_an_answer_that_fails_on_float32_inputs_fails_every_check():
    """The hidden cases drew float32 or float64 for x, so a rotation built in float64 and applied with @, which
    raises on a float32 x, passed one check in eight (6 in 30)."""
    def rope_matrix(x, scale=1.0):
        T, d = x.shape[-2:]
        omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        angle = (torch.arange(T, dtype=torch.float64) / scale)[:, None] * omega
        R = torch.zeros(T, d, d, dtype=torch.float64)
        j = torch.arange(d // 2)
        R[:, 2 * j, 2 * j], R[:, 2 * j + 1, 2 * j] = angle.cos(), -angle.sin()
        R[:, 2 * j, 2 * j + 1], R[:, 2 * j + 1, 2 * j + 1] = angle.sin(), angle.cos()
        return (x[..., None, :] @ R)[..., 0, :]
    fails_on_every_seed("9.3.3", rope_matrix, "float32, scale")
    assert verdict("9.3.3", lambda x, scale=1.0: rope_matrix(x.double(), scale))[0]     # the same, x made float64
