"""Checkers for the chapter's exercises: ``check("9.3.1", my_alibi_bias)``.

A checker runs the reader's answer on a few cases and prints one line: correct, or which case failed,
expected against got (shape, index, largest error) and a hint. The hint comes from the usual mistakes:
each checker computes what each mistake would give and, when the answer matches one, names it. A starter
left as it is (a function whose body is ``...``, or ``raise NotImplementedError``) is reported as not
attempted yet, so a notebook runs top to bottom.

Nothing printed on success depends on the machine: results are compared within tolerances and the
messages hold no computed floats. ``verdict`` returns ``(ok, message)`` for the tests.
"""

import math
from dataclasses import dataclass

import torch


class Wrong(Exception):
    """The answer failed a case; the message says which, and how."""


class NotAttempted(Exception):
    """The starter is still as it was."""


@dataclass
class Exercise:
    run: callable      # run(answer) raises Wrong or NotAttempted, or returns when every case passed
    done: str          # what a correct answer has shown, said without computed numbers


EXERCISES = {}


def exercise(number, done):
    def register(run):
        EXERCISES[number] = Exercise(run, done)
        return run
    return register


def verdict(number, answer):
    """``(ok, message)``: the line ``check`` prints. ``ok`` is None when the starter is untouched."""
    if number not in EXERCISES:
        raise KeyError(f"no exercise {number!r}; there are {', '.join(EXERCISES)}")
    name = getattr(answer, "__name__", "your answer")
    try:
        if answer is None or answer is Ellipsis:
            raise NotAttempted
        EXERCISES[number].run(answer)
    except NotAttempted:
        return None, f"Exercise {number}: not attempted yet. Complete {name} above and run the cell again."
    except Wrong as wrong:
        return False, f"Exercise {number}: not yet. {wrong}"
    except Exception as error:      # the reader's code raised: say what, not a traceback from in here
        return False, f"Exercise {number}: not yet. {name} raised {type(error).__name__}: {error}"
    return True, f"Exercise {number}: correct. {EXERCISES[number].done}"


def check(number, answer):
    """Run exercise ``number``'s checker on ``answer`` and print its verdict."""
    print(verdict(number, answer)[1])


# Comparing -----------------------------------------------------------------------------------------

def call(f, *args, **kwargs):
    """The answer's result; an untouched starter (``...`` or NotImplementedError) is not attempted."""
    try:
        out = f(*args, **kwargs)
    except NotImplementedError:
        raise NotAttempted from None
    if out is None or out is Ellipsis:
        raise NotAttempted
    return out


def _num(x):
    return "True" if x is True else "False" if x is False else f"{x:.4g}"


def close(got, want, atol=1e-5, rtol=1e-4):
    got = torch.as_tensor(got)
    if got.shape != want.shape:
        return False
    if want.dtype == torch.bool or not want.is_floating_point():
        return torch.equal(got, want)
    return torch.allclose(got.to(want.dtype), want, atol=atol, rtol=rtol, equal_nan=True)


def compare(got, want, case, mistakes=(), hint="", what="output", atol=1e-5, rtol=1e-4):
    """Raise ``Wrong`` unless tensor ``got`` equals ``want`` (within tolerances for floats).

    ``mistakes`` is a sequence of ``(result of the mistake, hint)``: the first whose result ``got``
    matches gives the hint; otherwise ``hint``.
    """
    def fail(detail):
        for result, why in mistakes:
            if close(got, result, atol, rtol):
                raise Wrong(f"{case}: {detail}. {why}")
        raise Wrong(f"{case}: {detail}. {hint}".rstrip())

    if not isinstance(got, torch.Tensor):
        raise Wrong(f"{case}: the {what} should be a tensor, got {type(got).__name__}")
    if got.shape != want.shape:
        fail(f"the {what} should have shape {tuple(want.shape)}, got {tuple(got.shape)}")
    if (want.dtype == torch.bool) != (got.dtype == torch.bool):
        raise Wrong(f"{case}: the {what} should be {'boolean' if want.dtype == torch.bool else 'numbers'}, got {got.dtype}")
    if close(got, want, atol, rtol):
        return
    if want.dtype == torch.bool or not want.is_floating_point():
        wrong = got != want
        index = tuple(wrong.nonzero()[0].tolist())
        fail(f"{int(wrong.sum())} of {want.numel()} entries differ, the first at index {index}: "
             f"expected {_num(want[index].item())}, got {_num(got[index].item())}")
    g = got.to(want.dtype)
    error = (g - want).abs().nan_to_num(float("inf"))
    index = tuple(int(i) for i in torch.unravel_index(error.argmax(), want.shape))
    fail(f"largest error {_num(error[index].item())} at index {index}: "
         f"expected {_num(want[index].item())}, got {_num(g[index].item())}")


def compare_number(got, want, case, mistakes=(), hint="", what="answer", exact=False):
    """Raise ``Wrong`` unless the number ``got`` equals ``want`` (exactly, or within 0.1%)."""
    try:
        g = float(got)
    except (TypeError, ValueError):
        raise Wrong(f"{case}: the {what} should be a number, got {type(got).__name__}") from None
    same = (lambda a, b: a == b) if exact else (lambda a, b: math.isclose(a, b, rel_tol=1e-3))
    if same(g, want):
        return
    shown = (lambda x: f"{x:,.0f}") if exact else _num
    detail = f"expected {shown(want)}, got {shown(g)}"
    for result, why in mistakes:
        if same(g, result):
            raise Wrong(f"{case}: {detail}. {why}")
    raise Wrong(f"{case}: {detail}. {hint}".rstrip())


def pair(out, case, names):
    if not (isinstance(out, tuple | list) and len(out) == len(names)):
        raise Wrong(f"{case}: return a tuple ({', '.join(names)})")
    return out


def randn(*shape, g):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


# 9.1 -----------------------------------------------------------------------------------------------

def _sdpa(Q, K, V, scale, dim=-1):
    w = torch.softmax(Q @ K.transpose(-2, -1) * scale, dim=dim)
    return w @ V, w


@exercise("9.1.1", "Your weights sum to one over the keys and your outputs are softmax(QK^T / sqrt(d_k)) V, "
                   "with and without leading batch dimensions.")
def _(answer):
    g = torch.Generator().manual_seed(11)
    for case, (m, n, d, d_v, lead) in {
        "case 1 of 3 (3 queries, 5 keys, d_k = 16)": (3, 5, 16, 2, ()),
        "case 2 of 3 (1 query, 7 keys, d_k = 64)": (1, 7, 64, 3, ()),
        "case 3 of 3 (a batch of 2, 4 queries, 6 keys, d_k = 32)": (4, 6, 32, 5, (2,)),
    }.items():
        Q, K, V = randn(*lead, m, d, g=g), randn(*lead, n, d, g=g), randn(*lead, n, d_v, g=g)
        out, w = pair(call(answer, Q, K, V), case, ("outputs", "weights"))
        want_out, want_w = _sdpa(Q, K, V, d ** -0.5)
        compare(w, want_w, case, what="weights", mistakes=[
            (_sdpa(Q, K, V, 1.0)[1], "Your weights are softmax(QK^T) without the scale: divide the scores by sqrt(d_k)."),
            (_sdpa(Q, K, V, 1 / d)[1], "You divided the scores by d_k: the scale is 1/sqrt(d_k)."),
            (_sdpa(Q, K, V, d ** -0.5, dim=-2)[1],
             "Your weights sum to one over the queries: take the softmax over the keys (dim=-1)."),
            (want_w.transpose(-2, -1), "Your weights are transposed: row i should hold query i's weights over the keys."),
        ], hint="Scores are Q K^T / sqrt(d_k), one row per query.")
        compare(out, want_out, case, what="outputs", hint="Your weights are right: the outputs are weights @ V.")


@exercise("9.1.2", "Your bandwidth makes the Nadaraya-Watson weights equal to softmax(q . k) for every query norm "
                   "and key norm tried: h = sqrt(rho / r).")
def _(answer):
    for k, (r, rho) in enumerate([(10.0, 1.0), (4.0, 2.0), (100.0, 0.5), (0.25, 3.0)], start=1):
        case = f"case {k} of 4 (query norm r = {r:g}, key norm rho = {rho:g})"
        compare_number(call(answer, r, rho), math.sqrt(rho / r), case, what="bandwidth", mistakes=[
            (1 / math.sqrt(r), "The keys' norm matters too: the query point is rho u, and |rho u - k|^2 = 2 rho^2 - 2 rho u.k."),
            (rho / r, "That is h^2: take the square root."),
            (math.sqrt(r / rho), "Upside down: a longer query makes the weights sharper, so the bandwidth shrinks as r grows."),
        ], hint="Expand |rho u - k|^2 / (2 h^2) and match the term in u.k with r u.k.")


@exercise("9.1.3", "At every width tried your scale is within 10% of 1/sqrt(d): the scale that keeps the scores "
                   "at unit variance falls as d^(-1/2).")
def _(answer):
    widths = (4, 16, 64, 256, 1024)
    for k, d in enumerate(widths, start=1):
        case = f"case {k} of {len(widths)} (d = {d})"
        got = call(answer, d, torch.Generator().manual_seed(d))
        try:
            got = float(got)
        except (TypeError, ValueError):
            raise Wrong(f"{case}: return one number, the scale, got {type(got).__name__}") from None
        want = d ** -0.5
        if abs(got - want) <= 0.1 * want:
            continue
        detail = f"expected about {want:.4g}, got {got:.4g}"
        for result, why in [(1 / d, "That is 1 / variance: the scale divides by the scores' standard deviation."),
                            (d ** 0.5, "Upside down: return 1 / (standard deviation of the scores)."),
                            (1.0, "Your scale does not change with d: compute the scores q . k = sum over the d coordinates.")]:
            if abs(got - result) <= 0.1 * result:
                raise Wrong(f"{case}: {detail}. {why}")
        raise Wrong(f"{case}: {detail}. Draw a few thousand pairs q, k ~ N(0, I_d) and return 1 / std(q . k).")
