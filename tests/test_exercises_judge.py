"""The checking machinery of the exercises (helpers/exercises/judge.py): what every check guarantees, tried on
whichever exercise shows it best. Each section's checkers are tested in its own file (test_exercises_9_1.py ...).

Issue 19 ("checkers a student cannot fool, and that never fail a right answer"), issue 23 and issue 32: every
defect the issues list, and the class it belongs to, as a test."""

import contextlib
import io
import math
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import jupytext
import pytest
import torch
from exercises_common import (
    NOTEBOOKS,
    ROOT,
    advantage,
    answers,
    compile_cell,
    connect,
    exercise_cells,
    fails_on_every_seed,
    harvester,
    reach,
    rope,
    slope,
)

from helpers import exercises
from helpers.exercises import check, verdict


def context(memory, params, layers, heads, kv_heads, d_head, batch, bytes_per, window):
    """9.5.2's answer: the longest context whose cache fits beside the weights (no limit when a window's fits)."""
    tokens = max(memory - params * bytes_per, 0) // (2 * layers * kv_heads * d_head * batch * bytes_per)
    return math.inf if window is not None and tokens >= window else tokens


def test_a_starter_that_raises_not_implemented_is_not_attempted():
    def starter(Q, K, V):
        raise NotImplementedError
    ok, message = verdict("9.1.1", starter)
    assert ok is None and "not attempted yet" in message


def test_an_answer_that_raises_says_what():
    ok, message = verdict("9.1.1", lambda Q, K, V: Q @ V)
    assert ok is False and "raised RuntimeError" in message


def test_hidden_cases_are_drawn_afresh_at_each_check():
    seen = []

    def spy(r, rho):
        seen.append((r, rho))
        return math.sqrt(rho / r)
    verdict("9.1.2", spy)
    first = list(seen)
    seen.clear()
    verdict("9.1.2", spy)
    assert first[:4] == seen[:4], "the shown cases are the same at every check"
    assert set(first[4:]).isdisjoint(seen[4:]) and len(first) > 4, "the hidden ones are new"


@pytest.mark.parametrize("number, parse", [
    ("9.1.2", float), ("9.3.2", float), ("9.4.3", float),
    ("9.5.2", lambda s: math.inf if s == "inf" else int(s.replace(",", ""))),
])
def test_a_table_harvested_from_the_messages_never_passes(number, parse):
    answer, learn = harvester(parse)
    for _ in range(8):
        ok, message = verdict(number, answer)
        assert ok is False, f"{number}: a lookup table passed after harvesting the messages"
        learn(message)


def test_a_float32_answer_passes_and_a_wrong_one_is_shown_with_digits_that_differ():
    """Issue 19: 9.4.2 rejected a float32 answer at rtol 1e-6, with "expected 0.8175, got 0.8175"."""
    def z_loss_grad(z, w):
        z = z.float()
        return 2 * w * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, -1) / z.shape[0]
    assert answers(verdict, "9.4.2", z_loss_grad) == [(True, answers(verdict, "9.4.2", z_loss_grad, 1)[0][1])] * 3

    def nearly(z, w):
        return (1 + 3e-4) * 2 * w * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, -1) / z.shape[0]
    ok, message = verdict("9.4.2", nearly)
    expected, got = re.search(r"expected (\S+), got (\S+?)\.", message).groups()
    assert ok is False and expected != got, message


def test_a_result_that_fits_two_mistakes_gets_both_hints():
    with pytest.raises(exercises.Wrong, match="fits more than one mistake: first. Or: second"):
        exercises.compare_number(3.0, 6.0, "case 1", mistakes=[(3.0, "first."), (3.0, "second.")])


@pytest.mark.parametrize("number, answer, argument", [
    ("9.1.1", lambda Q, K, V: (lambda Q: (torch.softmax(Q @ K.mT, -1) @ V, torch.softmax(Q @ K.mT, -1)))(
        Q.div_(Q.shape[-1] ** 0.5)), "Q"),
    ("9.3.3", lambda x, scale=1.0: x.copy_(rope(x, scale)), "x"),
    ("9.4.2", lambda z, w: (lambda z: 2 * w * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, -1) / z.shape[0])(
        z.sub_(z.amax(-1, keepdim=True))), "z"),
])
def test_an_answer_that_modifies_its_input_is_told_so(number, answer, argument):
    """Issue 19: the expected result of 9.1.1 was computed after the answer ran, from the modified Q."""
    ok, message = verdict(number, answer)
    assert ok is False and f"changed its input {argument} in place" in message, message


def test_not_attempted_only_for_the_untouched_starter():
    """Issue 19: printing, `pass` and an unfinished helper were all told "not attempted yet"."""
    def my_attention(Q, K, V):
        """Q (..., m, d_k), K (..., n, d_k), V (..., n, d_v) -> outputs (..., m, d_v), weights (..., m, n)."""
        ...  # your code here
    assert verdict("9.1.1", my_attention)[0] is None

    def printing(Q, K, V):
        w = torch.softmax(Q @ K.mT / Q.shape[-1] ** 0.5, -1)
        print(w @ V, w)
    ok, message = verdict("9.1.1", printing)
    assert ok is False and "returned None: it printed its result instead of returning it" in message, message

    def forgot_return(Q, K, V):
        w = torch.softmax(Q @ K.mT / Q.shape[-1] ** 0.5, -1)
        w @ V, w
    ok, message = verdict("9.1.1", forgot_return)
    assert ok is False and "returned None: is a return statement missing?" in message, message

    def passing(Q, K, V):
        pass
    ok, message = verdict("9.1.1", passing)
    assert ok is False and "body is only `pass`" in message, message

    def my_softmax(s):
        raise NotImplementedError

    def unfinished(Q, K, V):
        w = my_softmax(Q @ K.mT / Q.shape[-1] ** 0.5)
        return w @ V, w
    ok, message = verdict("9.1.1", unfinished)
    assert ok is False and "raised NotImplementedError (in my_softmax" in message and "my_softmax is not finished" in message, \
        message


def test_the_untouched_starter_in_a_notebook_cell_is_not_attempted_and_pass_is_not():
    """The starter as the notebook compiles it (source readable, as in IPython), and the same cell with `pass`."""
    nb = jupytext.read(NOTEBOOKS["9.1"])
    cell = next(c for c in exercise_cells(nb) if c.cell_type == "code" and "def my_attention" in c.source)
    for source, expected in ((cell.source, None), (cell.source.replace("...  # your code here", "pass"), False)):
        namespace = {"check": lambda number, answer: None}
        exec(compile_cell(source, f"starter-{expected}"), namespace)
        assert verdict("9.1.1", namespace["my_attention"])[0] is expected


def test_dtype_is_checked():
    """Issue 19: torch.equal ignores dtype, so a float index passed 9.6.2."""
    def relative_index(w):
        y, x = torch.arange(w * w) // w, torch.arange(w * w) % w
        return ((y[:, None] - y[None, :] + w - 1) * (2 * w - 1) + (x[:, None] - x[None, :] + w - 1)).float()
    ok, message = verdict("9.6.2", relative_index)
    assert ok is False and "should be torch.long (or int32) integers, got torch.float32" in message, message

    def int_mask(lengths, T):
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        return ((j > i) | (j >= lengths[:, None, None])).long()
    ok, message = verdict("9.2.1", int_mask)
    assert ok is False and "should be boolean" in message, message

    def half(z, w):
        return (2 * w * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, -1) / z.shape[0]).half()
    ok, message = verdict("9.4.2", half)
    assert ok is False and "float32 or float64" in message, message


@pytest.mark.parametrize("number, answer", [
    ("9.1.2", lambda r, rho: str(math.sqrt(rho / r))),
    ("9.1.2", lambda r, rho: True),
    ("9.5.2", lambda *args: f"{context(*args)}"),
    ("9.4.3", lambda z, t, eps: [1.0]),
])
def test_numbers_are_numbers(number, answer):
    """Issue 19: strings passed as numbers in 9.1.2 and 9.5.2; a bool is not a number either."""
    ok, message = verdict(number, answer)
    assert ok is False and re.search(r"should be (a number|an integer)", message), message


def test_huge_numbers_are_told_apart_from_raising():
    """Issue 23: an answer returning 10**400 was blamed for raising OverflowError."""
    ok, message = verdict("9.1.2", lambda r, rho: 10 ** 400)
    assert ok is False and "should be a finite float, got an integer of 401 digits" in message and "raised" not in message
    ok, message = verdict("9.5.2", lambda *args: 10 ** 400)
    assert ok is False and "got an integer of 401 digits" in message and "raised" not in message, message
    ok, message = verdict("9.3.2", lambda m, T, w: float("nan"))
    assert ok is False and "should be a finite number" in message, message


def test_the_failing_case_is_named_when_the_answer_raises():
    """Issue 19: K.T works on 2-D keys only, and the message did not say it failed on the batched case."""
    def my_attention(Q, K, V):
        w = torch.softmax(Q @ K.T / Q.shape[-1] ** 0.5, -1)
        return w @ V, w
    ok, message = verdict("9.1.1", my_attention)
    assert ok is False and message.startswith("Exercise 9.1.1: not yet. On case 3 of 7 (a batch of 2, 4 queries"), message
    assert "my_attention raised RuntimeError" in message and "(in my_attention, line" in message, message


def test_an_answer_that_never_returns_is_stopped_with_a_message():
    import time

    def forever(Q, K, V):
        while True:
            try:
                Q = Q + 0
            except Exception:                                       # a loop that swallows errors does not escape
                pass
    start = time.perf_counter()
    ok, message = verdict("9.1.1", forever, time_limit=1)
    assert time.perf_counter() - start < 3
    assert ok is False and "On case 1 of 7" in message and "did not finish within 1 s" in message, message


def test_the_time_limit_leaves_an_outer_timer_running():
    import signal
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *args: fired.append(True))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        assert verdict("9.1.2", lambda r, rho: math.sqrt(rho / r))[0]
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 20 < remaining <= 30 and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_the_time_limit_holds_outside_the_main_thread_too():
    import threading
    import time

    def slow(r, rho):
        for _ in range(60):
            time.sleep(0.05)
        return math.sqrt(rho / r)
    out = []
    worker = threading.Thread(target=lambda: out.append(verdict("9.1.2", slow, time_limit=0.5)))
    start = time.perf_counter()
    worker.start()
    worker.join(5)
    assert time.perf_counter() - start < 2.5
    assert out and out[0][0] is False and "did not finish within 0.5 s" in out[0][1], out


def test_check_takes_a_string_number():
    """Issue 23: check(["9.1.1"], f) failed with TypeError: unhashable type."""
    with pytest.raises(TypeError, match=r'the exercise number must be a string such as "9.1.1", got list \[\'9.1.1\'\]'):
        exercises.check(["9.1.1"], lambda Q, K, V: None)
    with pytest.raises(ValueError, match="no exercise '9.1.9'"):
        exercises.check("9.1.9", lambda Q, K, V: None)


def test_passing_the_result_instead_of_the_function_is_told_so():
    ok, message = verdict("9.6.2", torch.zeros(4, 4, dtype=torch.long))
    assert ok is False and "pass the function itself" in message, message


def test_new_exercises_draw_fresh_cases():
    """Two checks of the same wrong answer fail on different cases: nothing to learn from the messages."""
    first_wrong = {"9.2.2": lambda layer, T=64, d=4: reach(layer, T, d, index=True),   # each one's first in NEW_WRONG
                   "9.5.3": lambda pattern: connect(pattern, hops=True)}
    for number, answer in first_wrong.items():
        seen = {verdict(number, answer)[1] for _ in range(8)}
        assert len(seen) > 1, f"{number} showed the same case every time: {seen}"


def test_an_infinite_expected_entry_is_matched_exactly():
    """9.5.1 accepted any m (7, +inf, -1e30) for a query that saw no key: -inf had an infinite tolerance."""
    inf, nan = float("inf"), float("nan")
    want = torch.tensor([[-inf], [1.0]], dtype=torch.float64)
    for got in (7.0, inf, -1e30, 0.0, nan):
        assert not exercises.close(torch.tensor([[got], [1.0]]), want), got
    assert exercises.close(torch.tensor([[-inf], [1.0]]), want)
    assert exercises.close(torch.tensor([nan, 2.0]), torch.tensor([nan, 2.0], dtype=torch.float64))
    assert not exercises.close(torch.tensor([nan, 2.0]), torch.tensor([inf, 2.0], dtype=torch.float64))
    assert not exercises.close(torch.tensor([inf, 2.0]), torch.tensor([1e300, 2.0], dtype=torch.float64))

    def merge_where(a, b, empty):                          # right, but a query that saw no key gets m = empty
        (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
        m = torch.maximum(m_a, m_b)
        shift = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        r_a, r_b = torch.exp(m_a - shift), torch.exp(m_b - shift)
        return torch.where(torch.isinf(m), torch.full_like(m, empty), m), l_a * r_a + l_b * r_b, acc_a * r_a + acc_b * r_b

    def clamped(a, b):                                     # -inf replaced by -1e30 to dodge the NaN
        (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
        m_a, m_b = m_a.clamp(min=-1e30), m_b.clamp(min=-1e30)
        m = torch.maximum(m_a, m_b)
        return m, l_a * torch.exp(m_a - m) + l_b * torch.exp(m_b - m), acc_a * torch.exp(m_a - m) + acc_b * torch.exp(m_b - m)
    for answer in (lambda a, b: merge_where(a, b, 7.0), lambda a, b: merge_where(a, b, float("inf")), clamped):
        ok, message = verdict("9.5.1", answer)
        assert ok is False and "saw no key" in message and "maximum m" in message and "keeps m = -inf" in message, message
    assert verdict("9.5.1", lambda a, b: merge_where(a, b, float("-inf")))[0]


def test_half_precision_numbers_are_refused_by_their_dtype():
    """9.1.2 gave a float16 bandwidth a hint about the derivation; 9.3.2 accepted a float16 softmax 39 times in 40
    (its .item() hides the dtype) and refused it the 40th with a hint about the formula."""
    import numpy as np
    answers = [
        ("9.1.2", lambda r, rho: torch.tensor(rho / r, dtype=torch.float16).sqrt(), "torch.float16"),
        ("9.1.2", lambda r, rho: np.float16(math.sqrt(rho / r)), "float16"),
        ("9.1.2", lambda r, rho: torch.tensor(rho / r, dtype=torch.bfloat16).sqrt().item(), "torch.bfloat16"),
        ("9.3.2", lambda m, T, w: torch.softmax(-m * torch.arange(T, dtype=torch.float16), 0)[w + 1:].sum().item(),
         "torch.float16"),
        ("9.3.1", lambda m, T, delta: advantage(m, T, delta) + 0 * torch.zeros((), dtype=torch.float16).item(),
         "torch.float16"),
        ("9.A.2", lambda q, k, v, m, d_out: slope(q.half().double(), k, v, m, d_out), "torch.float16"),
    ]
    for number, answer, dtype in answers:
        for seed in range(20):
            ok, message = verdict(number, answer, seed=seed)
            assert ok is False and dtype in message and "float32 or float64" in message, (number, message)


def test_any_real_number_is_a_number():
    """A Decimal bandwidth was refused as "should be a number, got Decimal"."""
    from decimal import Decimal
    from fractions import Fraction
    assert all(verdict("9.1.2", lambda r, rho: (Decimal(rho) / Decimal(r)).sqrt(), seed=seed)[0] for seed in range(3))
    assert verdict("9.1.2", lambda r, rho: Fraction(math.sqrt(rho / r)))[0]
    for kind in (Decimal, Fraction):
        assert verdict("9.5.2", lambda *args, kind=kind: c if (c := context(*args)) == math.inf else kind(c))[0]


@pytest.mark.parametrize("number, answer", [
    ("9.2.2", lambda layer, T=64, d=4: T - 1 - (torch.autograd.grad(layer(x := torch.randn(1, T, d, requires_grad=True))
                                                                    [0, -1].sum(), x)[0][0].abs().sum(-1) > 0).nonzero()[0]),
    ("9.3.1", lambda m, T, delta: torch.tensor([advantage(m, T, delta)])),
    ("9.A.2", lambda q, k, v, m, d_out: torch.tensor([slope(q, k, v, m, d_out)])),
    ("9.3.2", lambda m, T, w: torch.softmax(-m * torch.arange(T, dtype=torch.float64), 0)[w + 1:].sum(0, keepdim=True)),
    ("9.1.2", lambda r, rho: __import__("numpy").array([math.sqrt(rho / r)])),
])
def test_a_tensor_of_one_number_is_told_its_shape(number, answer):
    """9.2.2, 9.3.1 and 9.A.2 said "got Tensor" for a tensor of shape (1,), where 9.3.2 named its shape."""
    ok, message = verdict(number, answer)
    assert ok is False and "of shape (1,)" in message and "take its one entry with .item()" in message, message


@pytest.mark.parametrize("number, answer", [
    ("9.1.3", lambda model, source, offsets: 1 / 0),
    ("9.2.2", lambda layer, T=64, d=4: 1 / 0),
    ("9.4.1", lambda blocks, x: 1 / 0),
    ("9.5.3", lambda pattern: 1 / 0),
    ("9.A.1", lambda s, tau: 1 / 0),
    ("9.A.2", lambda q, k, v, m, d_out: 1 / 0),
])
def test_a_failure_names_the_case_in_every_checker(number, answer):
    """These six checkers called the answer without its case: "On call 1 (AttentionSeq2Seq, shape (8, 4), (1))"."""
    ok, message = verdict(number, answer)
    assert ok is False and re.search(r"On case 1 of \d+ \(", message) and "call 1" not in message, message


def test_a_formula_computed_in_half_precision_is_told_so_and_half_used_for_something_else_is_not():
    """A right formula computed in bfloat16 and returned as float32 fails on precision, and the message says so
    (not a hint about the formula); a right answer that makes a half tensor for another purpose passes."""
    def attention_bf16(Q, K, V):
        w = torch.softmax(Q.bfloat16() @ K.bfloat16().mT / Q.shape[-1] ** 0.5, -1)
        return (w @ V.bfloat16()).to(Q.dtype), w.to(Q.dtype)

    ok, message = verdict("9.1.1", attention_bf16)
    assert ok is False and "computed with torch.bfloat16 tensors" in message, message

    def longest(*args):
        assert torch.empty(0, dtype=torch.float16).element_size() == 2         # a half tensor, used for its size
        return context(*args)

    ok, message = verdict("9.5.2", longest)
    assert ok, message


def test_answers_written_with_torch_func_pass_under_the_checkers_watch():
    """Every answer runs under a TorchFunctionMode (the half-precision watch): torch.func's transforms, which a
    student may reach for, work under it. Where the exercise asks for a derivation (9.A.1, 9.4.2), an answer that
    lets torch.func differentiate is refused for that reason, not for a crash of the watch."""
    def attention(Q, K, V):
        def one(q, k, v):
            w = torch.softmax(q @ k.mT / q.shape[-1] ** 0.5, -1)
            return w @ v, w
        for _ in range(Q.dim() - 2):
            one = torch.func.vmap(one)
        return one(Q, K, V)

    ok, message = verdict("9.1.1", attention)
    assert ok, message

    def jacobian(s, tau):
        return torch.func.jacrev(lambda z: torch.softmax(z / tau, -1))(s)

    def z_loss_grad(z, w):
        return torch.func.grad(lambda x: w * torch.logsumexp(x, -1).pow(2).mean())(z)

    for number, answer in (("9.A.1", jacobian), ("9.4.2", z_loss_grad)):
        ok, message = verdict(number, answer)
        assert ok is False and "autograd" in message and "raised" not in message, message


# Issue 32: answers students wrote that the checkers told wrongly --------------------------------------------------

def test_an_answer_that_works_on_2_d_inputs_only_gets_the_hint():
    """K.T on a batch raised torch's RuntimeError (with its deprecation warning in the notebook), and an answer that
    swaps dims 0 and 1 or unpacks a 2-D shape was told an error or a wrong entry, not what the mistake is."""
    def dot_T(Q, K, V):                                      # .T reverses every dim of a batch
        w = torch.softmax(Q @ K.T / Q.shape[-1] ** 0.5, -1)
        return w @ V, w

    def swap_01(Q, K, V):                                    # right on a matrix, wrong on a batch, and no error
        w = torch.softmax(Q @ K.transpose(0, 1) / Q.shape[-1] ** 0.5, -1)
        return w @ V, w

    def two_d_shape(x, scale=1.0):                           # T, d = x.shape fails on a batch
        T, d = x.shape
        return rope(x, scale)

    def multi_query(x, W_q, W_k, W_v, heads):                # k.T on (B, 1, T, d_h)
        B, T, d = x.shape
        q = (x @ W_q).view(B, T, heads, d // heads).transpose(1, 2)
        s = q @ (x @ W_k)[:, None].T / (d // heads) ** 0.5
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return (torch.softmax(s, -1) @ (x @ W_v)[:, None]).transpose(1, 2).reshape(B, T, d)
    for number, answer, cause in (("9.1.1", dot_T, ".T on a 3-D tensor reverses all its dims"), ("9.1.1", swap_01, ""),
                                  ("9.3.3", two_d_shape, ""), ("9.2.3", multi_query, ".T on a 4-D tensor")):
        for seed in range(3):
            ok, message = verdict(number, answer, seed=seed)
            assert ok is False and "works on 2-D inputs only" in message and ".transpose(-2, -1) or .mT" in message, message
            assert cause in message, message
    # torch warns about .T on a batch once per process: in a fresh one, the check shows no warning.
    code = ("import torch\nfrom helpers.exercises import verdict\n"
            "def f(Q, K, V):\n    w = torch.softmax(Q @ K.T / Q.shape[-1] ** 0.5, -1)\n    return w @ V, w\n"
            "print(verdict('9.1.1', f)[1])\n")
    ran = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert "works on 2-D inputs only" in ran.stdout and "Warning" not in ran.stderr, ran.stderr


def test_an_error_torch_raises_is_reported_as_itself():
    """torch raises NotImplementedError for an operation it lacks (a sparse layout, a Module without forward):
    the checker said the answer "is not finished"."""
    def sparse(Q, K, V):                                     # raised from C: the last frame is the answer's own line
        w = torch.softmax(Q @ K.mT / Q.shape[-1] ** 0.5, -1)
        return w.to_sparse().cumsum(-1), w

    def no_forward(Q, K, V):                                 # raised in torch's Python code
        w = torch.softmax(torch.nn.Module()(Q) @ K.mT, -1)
        return w @ V, w
    for answer, error in ((sparse, "NotImplementedError: Could not run 'aten::cumsum'"),
                          (no_forward, 'NotImplementedError: Module [Module] is missing the required "forward" function')):
        ok, message = verdict("9.1.1", answer)
        assert ok is False and error in message and "not finished" not in message and "not attempted" not in message, \
            message

    def my_softmax(s):
        raise NotImplementedError("my_softmax: your code here")

    def unfinished(Q, K, V):                                 # the reader's own unfinished helper: still told so
        w = my_softmax(Q @ K.mT)
        return w @ V, w

    def starter(Q, K, V):
        raise NotImplementedError
    assert "my_softmax is not finished" in verdict("9.1.1", unfinished)[1]
    assert verdict("9.1.1", starter)[0] is None


def test_check_called_inside_the_answer_is_refused():
    """check("9.1.1", f) inside f checked f again inside its own check, and so on: each check restarted the clock,
    so the time limit never came, and every level printed."""
    import time

    def recursive(Q, K, V):
        check("9.1.1", recursive)
        w = torch.softmax(Q @ K.mT / Q.shape[-1] ** 0.5, -1)
        return w @ V, w

    def swallowed(Q, K, V):                                  # catches the refusal and goes on
        try:
            verdict("9.1.1", swallowed)
        except Exception:
            pass
        w = torch.softmax(Q @ K.mT / Q.shape[-1] ** 0.5, -1)
        return w @ V, w
    for answer in (recursive, swallowed):
        start = time.perf_counter()
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            ok, message = verdict("9.1.1", answer, time_limit=5)
        assert time.perf_counter() - start < 5
        assert ok is False and "case 1 of 7" in message and "calls check itself" in message, message
        assert printed.getvalue() == "", printed.getvalue()
    out = []                                                 # outside the main thread (a watcher thread times it)
    worker = threading.Thread(target=lambda: out.append(verdict("9.1.1", recursive, time_limit=5)))
    worker.start()
    worker.join(10)
    assert out and out[0][0] is False and "calls check itself" in out[0][1], out
    assert verdict("9.1.1", lambda Q, K, V: (torch.softmax(Q @ K.mT / Q.shape[-1] ** 0.5, -1) @ V,
                                             torch.softmax(Q @ K.mT / Q.shape[-1] ** 0.5, -1)))[0]   # and after it


def test_a_float_result_computed_in_half_precision_fails_every_check():
    """A tensor result was judged by its values only: an RMS squared and averaged in float16 and returned as float64
    passed 28 checks in 30 (the rounding averages out), a merge rescaled in float16 2 in 30."""
    def rms(blocks, x):
        out = []
        for block in blocks:
            x = block(x)
            out.append(x.half().pow(2).float().mean().sqrt())
        return torch.stack(out).double()

    def merge(a, b):
        (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
        m = torch.maximum(m_a, m_b)
        safe = torch.where(m.isinf(), torch.zeros_like(m), m)
        r_a, r_b = torch.exp((m_a - safe).half()).double(), torch.exp((m_b - safe).half()).double()
        return m, l_a * r_a + l_b * r_b, acc_a * r_a + acc_b * r_b
    for number, answer in (("9.4.1", rms), ("9.5.1", merge)):
        fails_on_every_seed(number, answer, "your function computed with torch.float16 tensors")


def test_solved_waits_for_that_very_function_to_pass(capsys):
    """An experiment after a check runs what ``solved(number, name)`` returns: that function once it has passed."""
    from helpers.exercises import check, solved
    from helpers.exercises.judge import SOLVED

    def relative_index(M):
        y, x = torch.arange(M * M) // M, torch.arange(M * M) % M
        dy, dx = y[:, None] - y[None, :], x[:, None] - x[None, :]
        return (dy + M - 1) * (2 * M - 1) + (dx + M - 1)

    def starter(M):
        ...  # your code here

    SOLVED.pop("9.6.2", None)
    assert not solved("9.6.2", relative_index)
    assert capsys.readouterr().out.startswith("Exercise 9.6.2: complete the function above first")
    check("9.6.2", starter)
    assert not solved("9.6.2", starter)
    check("9.6.2", relative_index)
    capsys.readouterr()
    assert solved("9.6.2", relative_index) and capsys.readouterr().out == ""

    def redefined(M):                      # a new function, not yet checked: the experiment waits again
        return relative_index(M)

    assert not solved("9.6.2", redefined)
    check("9.6.2", lambda M: relative_index(M).T.contiguous())    # a failing check forgets the pass
    assert not solved("9.6.2", relative_index)
    with pytest.raises(ValueError, match="no exercise"):
        solved("9.9.9", relative_index)
    with pytest.raises(ValueError, match="no exercise"):
        solved(9.1, relative_index)


def test_a_solution_cell_never_replaces_the_readers_function(capsys):
    """``%%solution`` runs the reference in a copy of the notebook's names: the reader's function stays, and
    ``solved`` hands the experiment the reference, saying so, until the reader's own function passes."""
    from helpers.exercises import check, run_solution, solved
    from helpers.exercises.judge import SOLVED

    starter_source = "def relative_index(M):\n    ...  # your code here\n"
    reference = ("import torch\n\n\ndef relative_index(M):\n"
                 "    y, x = torch.arange(M * M) // M, torch.arange(M * M) % M\n"
                 "    dy, dx = y[:, None] - y[None, :], x[:, None] - x[None, :]\n"
                 "    return (dy + M - 1) * (2 * M - 1) + (dx + M - 1)\n\n"
                 'check("9.6.2", relative_index)\n')
    names = {"check": check}
    exec(starter_source, names)
    theirs = names["relative_index"]
    SOLVED.pop("9.6.2", None)
    path = Path(tempfile.mkdtemp()) / "solution.py"      # a file, so that the checker can read the source
    path.write_text(reference)
    run_solution(compile(reference, str(path), "exec"), names)
    assert names["relative_index"] is theirs                       # the reader's function untouched
    assert capsys.readouterr().out.startswith("Exercise 9.6.2: the reference solution is correct. Its ")   # not "Your"
    pick = solved("9.6.2", theirs)
    assert pick is not None and pick is not theirs and pick(2).shape == (4, 4)
    assert capsys.readouterr().out.startswith("Exercise 9.6.2: run with the reference solution")
    assert solved("9.6.2", theirs, quiet=True) is pick and capsys.readouterr().out == ""
    check("9.6.2", theirs)                                         # the reader's starter: the reference is gone
    capsys.readouterr()
    assert solved("9.6.2", theirs) is None
    assert capsys.readouterr().out.startswith("Exercise 9.6.2: complete the function above first")


# Review of the checkers (students' findings): the tools the section checkers gained ----------------------------------

def test_inside_refuses_a_helper_however_it_is_reached_and_nothing_else():
    """``Watch(inside(f))`` refuses every torch call made while ``f`` runs: called by its name, under another, through
    its module or from a function of the answer's own; the same torch calls made outside ``f`` pass, and ``f`` called
    by the checker, outside the answer, is not watched."""
    from helpers import attention
    from helpers.exercises.judge import Watch, Wrong, call, inside

    watch = lambda: Watch(inside(attention.causal_mask), "uses causal_mask.", half_refused=False)
    mine = lambda T: attention.causal_mask(T)
    for answer in (attention.causal_mask, lambda T: attention.causal_mask(T) | False, mine, lambda T: mine(T)):
        with pytest.raises(Wrong, match="uses causal_mask"):
            call(answer, 4, case="case 1", watch=watch())
    assert torch.equal(call(lambda T: torch.ones(T, T, dtype=torch.bool).triu(1), 4, case="case 1", watch=watch()),
                       attention.causal_mask(4))


def test_alone_tells_a_model_whose_answers_depend_on_its_batch():
    """``alone`` runs a few examples as batches of one and compares them with their rows of the whole batch: a model
    that normalizes over the batch fails, with the hint; a model that treats each example apart passes, within the
    rounding of another order of summation."""
    from helpers.exercises.judge import Wrong, alone

    layer = torch.nn.Linear(6, 3)
    x = torch.randn(50, 6)
    with torch.no_grad():
        alone(lambda z: layer(z).detach(), (x,), layer(x).detach(), "the check", "example")
        for over_the_batch in (lambda z: layer(z).softmax(0), lambda z: layer(z) - layer(z).mean(0)):
            with pytest.raises(Wrong, match=r"example 0 run alone, a batch of one, differs .* over the batch dimension"):
                alone(over_the_batch, (x,), over_the_batch(x), "the check", "example")


def test_float_of_a_tensor_that_requires_grad_warns_nothing():
    """A students' review: a right 9.4.1 answer that took float() of the stream, which requires a gradient (the blocks'
    weights do), printed torch's warning, attributed to judge.py. The watch detaches a tensor before float() (its
    value is the same; a Python float carries no gradient anyway)."""
    import warnings

    def answer(blocks, x):
        values = []
        for block in blocks:
            x = block(x)
            values.append(float(torch.einsum("btd,btd->", x, x) / x.numel()) ** 0.5)
        return torch.tensor(values)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok, message = verdict("9.4.1", answer, seed=0)
    assert ok, message
    assert not [w for w in caught if "requires_grad=True to a scalar" in str(w.message)], [str(w.message) for w in caught]


def test_parameters_of_finds_a_models_weights_however_it_is_returned():
    """``parameters_of(model, *inputs)``: the tensors a model's outputs are computed from that training could set, found
    through the autograd graph of its output and through what it holds (a module's parameters, a function's closure,
    a function run under torch.no_grad, functools.partial); nothing for a function that holds none."""
    import functools

    from helpers.exercises.judge import parameters_of

    layer = torch.nn.Linear(3, 2)
    scale = torch.nn.Parameter(torch.tensor(2.0))
    x = torch.randn(4, 3)
    expected = {id(p) for p in layer.parameters()}

    def closure(z):
        return layer(z)
    for model in (layer, closure, torch.no_grad()(closure), functools.partial(lambda z, m: m(z), m=layer),
                  lambda z: layer(z).detach()):
        assert {id(t) for t in parameters_of(model, x)} == expected, model
    assert [id(t) for t in parameters_of(lambda z: z * scale, x)] == [id(scale)]
    assert parameters_of(lambda z: z.sum(-1) * 2, x) == []


def test_shuffled_permutes_each_tensor_and_restores_it():
    """``shuffled(tensors, generator)`` permutes the entries of each tensor in place, and puts them back afterwards,
    even when the body raises."""
    from helpers.exercises.judge import shuffled

    layer = torch.nn.Linear(8, 8)
    before = [p.detach().clone() for p in layer.parameters()]
    with shuffled(list(layer.parameters()), torch.Generator().manual_seed(0)):
        for p, b in zip(layer.parameters(), before, strict=True):
            assert not torch.equal(p, b) and torch.equal(p.detach().flatten().sort().values, b.flatten().sort().values)
    assert all(torch.equal(p, b) for p, b in zip(layer.parameters(), before, strict=True))
    with pytest.raises(ValueError), shuffled(list(layer.parameters()), torch.Generator().manual_seed(0)):
        raise ValueError("the body raised")
    assert all(torch.equal(p, b) for p, b in zip(layer.parameters(), before, strict=True))
