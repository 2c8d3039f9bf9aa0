"""Section 9.5's exercises: 9.5.1 merging two tiles' online-softmax states, 9.5.2 the key-value cache,
9.5.3 how many layers until every token has heard from every other.

Each checker accepts the notebook's reference solution and rejects the usual mistakes, each with its own
hint (exercises_common.py says how; the shared layout is tested in test_exercises_layout.py).
"""

import math

import pytest
import torch
from exercises_common import (
    connect,
    each_wrong_answer_is_rejected_with_its_own_message,
    ids,
    new_exercises_accept_correct_answers_written_differently,
    new_exercises_reject_each_wrong_answer_with_its_hint_on_fresh_cases,
    reference_solution_passes,
    solutions,
    starters,
    students_right_answers_pass_and_wrong_ones_get_their_message,
    untouched_starter_is_not_attempted,
    wrong_answers_fail_on_every_fresh_draw,
)

from helpers.exercises import verdict

# Wrong answers and right ones unlike the reference ---------------------------------------------------------------

def _merge(a, b, rescale=True, upside_down=False, add_maxima=False):
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = m_a + m_b if add_maxima else torch.maximum(m_a, m_b)
    r_a, r_b = (torch.exp(m - m_a), torch.exp(m - m_b)) if upside_down else (torch.exp(m_a - m), torch.exp(m_b - m))
    if not rescale:
        r_a = r_b = 1.0
    return m, l_a * r_a + l_b * r_b, acc_a * r_a + acc_b * r_b


def _merge_all_empty_only(a, b):
    """Wrong: handles a batch in which every query saw no key, and gives NaN when only some did (a student's)."""
    if torch.isinf(a[0]).all() and torch.isinf(b[0]).all():
        return a
    return _merge(a, b)


def _kv_loop(layers, heads, kv_heads, d_head, T, batch=1, bytes_per=2):
    total = 0
    for _ in range(layers):
        for _ in ("keys", "values"):
            total += kv_heads * d_head * T * batch * bytes_per
    return total


def _merge_logaddexp(a, b):
    """The normalizer through logaddexp; a query that saw no key (m = -inf) keeps the empty state."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = torch.maximum(m_a, m_b)
    seen = torch.isfinite(m)
    log_l = torch.logaddexp(m_a + l_a.log(), m_b + l_b.log())
    l_ = torch.where(seen, torch.exp(log_l - m), torch.zeros_like(m))
    safe = torch.where(seen, m, torch.zeros_like(m))
    return m, l_, acc_a * torch.exp(m_a - safe) + acc_b * torch.exp(m_b - safe)


def _merge_branches(a, b):
    """Rescale only the tile whose maximum is smaller (the other's factor is exactly 1)."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    a_first = m_a >= m_b
    m = torch.where(a_first, m_a, m_b)
    r = torch.exp(torch.where(a_first, m_b - m_a, m_a - m_b).nan_to_num(nan=0.0))   # -inf - -inf: nothing to rescale
    l_ = torch.where(a_first, l_a + l_b * r, l_a * r + l_b)
    return m, l_, torch.where(a_first, acc_a + acc_b * r, acc_a * r + acc_b)


def _connect_floyd(pattern):
    """Correct, another way: Floyd-Warshall's shortest paths in float64, the longest returned as a whole float."""
    T = pattern.shape[0]
    D = torch.where(pattern, 1.0, math.inf).double()
    for k in range(T):
        D = torch.minimum(D, D[:, k:k + 1] + D[k:k + 1, :])
    return D.max().item()


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


# Wrong answers: for each exercise, (the mistake, a piece of the hint that must name it).
WRONG = {
    "9.5.1": [
        (lambda a, b: _merge(a, b, rescale=False), "Rescale each tile's normalizer l"),
        (lambda a, b: _merge(a, b, upside_down=True), "upside down"),
        (lambda a, b: _merge(a, b, add_maxima=True), "not their sum"),
        (lambda a, b: _merge(a, b)[1:], "return a tuple (m, l, acc)"),
        (_merge_all_empty_only, "Where both tiles saw no key"),
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
        (lambda layers, heads, kv_heads, d_head, T, batch=1, bytes_per=2:
         torch.tensor([2, layers, kv_heads, d_head, T, batch, bytes_per], dtype=torch.float32).prod(),
         "rounded in floating point"),
        (lambda layers, heads, kv_heads, d_head, T, batch=1, bytes_per=2: 4 * layers * kv_heads * d_head * T * batch * bytes_per,
         "counts it twice"),
    ],
}


# Students at the exercises (REVIEW.md, brief 2): wrong attempts not in WRONG, and right answers unlike the
# reference. Each attempt is (answer, a piece of the message it must get); None marks a right answer.
STUDENTS = {
    "9.5.1": [
        (_merge_logaddexp, None),
        (_merge_branches, None),
        (lambda a, b: tuple(x.float() for x in _merge_logaddexp(a, b)), None),                       # float32
        (lambda a, b: (torch.maximum(a[0], b[0]), a[1] + b[1], a[2] + b[2]), "Rescale each tile's normalizer l"),
        (lambda a, b: {"m": torch.maximum(a[0], b[0])}, "return a tuple (m, l, acc)"),
        (lambda a, b: (torch.maximum(a[0], b[0]).squeeze(-1),) + _merge_logaddexp(a, b)[1:], "should have shape"),
    ],
    "9.5.2": [
        (_kv_loop, None),
        (lambda layers, heads, kv_heads, d_head, T, batch=1, bytes_per=2: math.prod(
            [2, layers, kv_heads, d_head, T, batch, bytes_per]), None),
        (lambda layers, heads, kv_heads, d_head, T, batch=1, bytes_per=2:
            float(2 * layers * kv_heads * d_head * T * batch * bytes_per), None),                      # a whole float
        (lambda layers, heads, kv_heads, d_head, T, batch=1, bytes_per=2: 2 * layers * kv_heads * d_head * T * batch * 2,
         "Use the argument bytes_per"),                                                                # bytes hard-coded
        (lambda layers, heads, kv_heads, d_head, T, batch=1, bytes_per=2: 2 * layers * kv_heads * d_head * T * batch
         * bytes_per * 8, "not bits"),
        (lambda layers, heads, kv_heads, d_head, T, batch=1, bytes_per=2: 2 * layers * kv_heads * d_head * T * batch
         * bytes_per / 2 ** 30, "expected"),                                                           # GiB, not bytes
    ],
}


# The exercises added later: each wrong answer is tried on several fresh checks, and RIGHT holds right answers
# written differently from the reference.
NEW_WRONG = {
    "9.5.3": [
        (lambda pattern: connect(pattern, hops=True), "start at 1"),
        (lambda pattern: connect(pattern, plus=1), "stop at the first number of layers"),
        (lambda pattern: connect(pattern, middle=True), "not only the middle token"),
        (lambda pattern: connect(pattern, first=True), "not only the first one"),
        (lambda pattern: connect(pattern, never=pattern.shape[0]), "return math.inf"),
        (lambda pattern: connect(pattern, never=-1), "return math.inf"),
    ],
}


RIGHT = {
    "9.5.3": [_connect_bfs, _connect_numpy, _connect_floyd],
}


# The tests every section runs (exercises_common.py) ---------------------------------------------------------------

@pytest.mark.parametrize("case", solutions("9.5"), ids=ids)
def test_reference_solution_passes(case, monkeypatch):
    reference_solution_passes(case, monkeypatch)


@pytest.mark.parametrize("case", starters("9.5"), ids=ids)
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

def test_an_in_place_merge_is_told_so():
    def merge(a, b):
        (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
        m = torch.maximum(m_a, m_b)
        r_a, r_b = torch.exp(m_a - m), torch.exp(m_b - m)
        acc_a *= r_a                                          # in place: the caller's state is changed
        return m, l_a * r_a + l_b * r_b, acc_a + acc_b * r_b
    ok, message = verdict("9.5.1", merge)
    assert ok is False and "changed its input a in place" in message, message


def test_9_5_2_hints_name_the_mistake_made():
    """Issue 19: case 1 had bytes_per = 2 and layers = kv_heads, so two mistakes got each other's hint."""
    def no_bytes(layers, heads, kv_heads, d_head, T, batch=1, bytes_per=2):
        return 2 * layers * kv_heads * d_head * T * batch

    def group_size(layers, heads, kv_heads, d_head, T, batch=1, bytes_per=2):
        return 2 * layers * (heads // kv_heads) * d_head * T * batch * bytes_per
    ok, message = verdict("9.5.2", no_bytes)
    assert "multiply by the bytes per number" in message and "Or:" not in message, message
    ok, message = verdict("9.5.2", group_size)
    assert "not the group size" in message and "Or:" not in message, message


def test_9_5_2_shown_cases_cover_multi_head_grouped_query_and_multi_query():
    """Review r3 of 9.5: no shown case had kv_heads == heads, so multi-head models were checked only when a
    hidden case drew one, though the success message names them."""
    kinds = {"multi-head": lambda heads, kv_heads: kv_heads == heads,
             "grouped-query": lambda heads, kv_heads: 1 < kv_heads < heads,
             "multi-query": lambda heads, kv_heads: kv_heads == 1}
    for name, kind in kinds.items():
        def wrong_for_this_kind(layers, heads, kv_heads, d_head, T, batch=1, bytes_per=2, kind=kind):
            right = 2 * layers * kv_heads * d_head * T * batch * bytes_per
            return right + 1 if kind(heads, kv_heads) else right
        for seed in range(4):
            ok, message = verdict("9.5.2", wrong_for_this_kind, seed=seed)
            assert ok is False and "drawn at random" not in message, (name, message)


def test_9_5_3_a_symmetrized_pattern_is_rejected():
    def layers(pattern):                                  # ignores direction: a causal pattern then connects
        p = pattern | pattern.T
        r = p.clone()
        for n in range(1, len(p) + 1):
            if r.all():
                return n
            r = (r.float() @ p.float()) > 0
        return math.inf
    assert not any(verdict("9.5.3", layers)[0] for _ in range(5))


def test_9_5_2_an_int32_product_is_told_so():
    """A reviewer's mistake that got a generic hint (it was part of test_new_hints_name_their_mistake, in 9.4's file)."""
    def int32(layers, heads, kv_heads, d_head, T, batch=1, bytes_per=2):
        return torch.tensor([2, layers, kv_heads, d_head, T, batch, bytes_per], dtype=torch.int32).prod(dtype=torch.int32)
    ok, message = verdict("9.5.2", int32)
    assert ok is False and "is what this product gives when computed in int32" in message, message
