"""The checking machinery of the chapter's exercises; each section's checkers are in its own module (``s9_1`` ...).

A checker runs the reader's answer on a few cases and prints one line: correct, or which case failed,
expected against got (shape, index, largest error) and a hint. The hint comes from the usual mistakes:
each checker computes what each mistake would give and, when the answer matches one, names it (when a
result matches several, every matching hint is given).

What a check guarantees
-----------------------
- **Cases a message cannot leak.** Every check draws its numbers afresh from ``fresh()``, seeded from
  ``os.urandom``: the first cases have fixed shapes and parameters (told in each case's label), the
  hidden ones after them random shapes and parameters too, so neither hard-coding a shown case nor a
  table of answers harvested from "expected X" messages passes.
- **A verdict the draw cannot change.** Every kind of case that tells a wrong answer from a right one is
  there at every check (a batch with two leading dimensions, padding in every sequence, a float32 input),
  so a wrong answer fails every check, not one in three; a hidden case may draw its sizes, never its kind.
- **Inputs the answer cannot spoil.** ``call`` hands the answer copies of its arguments and keeps the
  originals, from which the expected result is computed; afterwards it compares the copies with the
  originals, and an answer that changed one in place (``Q /= ...``, or a model's parameters) is told
  which argument it changed.
- **Types and dtypes.** A tensor must be a ``torch.Tensor`` of the right kind: a boolean mask must be
  ``torch.bool``, an index an integer dtype (``torch.equal`` ignores dtype, so this is checked on its
  own), real values ``float32`` or ``float64``. A number must be a real number (an ``int``, a
  ``float``, a ``Fraction`` or ``Decimal``, a NumPy scalar or a 0-dimensional tensor): never a string, a
  bool, a tensor of shape (1,), or an int too large to be a float.
- **No half precision where it cannot pass.** Every number is compared at 0.1% or tighter, and tensors
  at 0.01%: float16 keeps about 3 significant digits and bfloat16 about 2, so a right formula computed
  in them fails at random. A float16 or bfloat16 result is refused by its dtype, whatever its value, and
  so is any float result computed through half-precision tensors (``.item()`` or ``.double()`` hides the
  dtype, so the answer's torch calls are watched: ``Watch``), with a message naming the dtype rather than
  a hint about the formula. An integer or boolean result is judged exactly, whatever the answer made.
- **Tolerances a float32 answer meets.** Floats are compared within ``rtol * (|want| + 0.1 max|want|)``
  with ``rtol`` at least 1e-4 (an answer computed in float32, even one returned as float64, is
  correct); a failing entry is shown with as many digits as it takes for expected and got to differ,
  and the error. An expected entry that is not finite (``-inf`` for a query that saw no key, NaN) must be
  matched exactly: the same infinity, NaN where NaN is expected. What an exercise asks to be exact (a
  mask, an index, the zero weight of a hidden position) is compared exactly.
- **A time limit.** Each check stops after ``time_limit`` seconds (20 by default; ``signal.setitimer``
  in the main thread, where a notebook kernel runs ``check``, or a watcher thread elsewhere) and says
  which case the answer was running. The stop is an exception, so an answer that catches every exception in
  a loop that never ends (a bare ``except:``, which also catches Jupyter's interrupt) cannot be stopped from
  Python: restart the kernel. An answer that calls ``check`` itself is refused, not checked again inside
  its own check (which would recurse, each check restarting the clock).
- **"Not attempted" only for the untouched starter**: a function whose body is only ``...`` (the
  starter's ``...  # your code here``) or only ``raise NotImplementedError``, read from its source (or,
  without source, its byte code). Anything else is run: an answer that returns None is told so ("did
  you print instead of return?"), a body of only ``pass`` is told so, and an exception raised anywhere
  in the answer's code, NotImplementedError from an unfinished helper included, is reported with the
  case it failed on and where it was raised. An error torch raises (a NotImplementedError among them) is
  reported as itself, its type and first line, never as an unfinished function.
- **Answers that work on 2-D inputs only** (``K.T``, ``.t()`` or ``torch.mm`` on a batch) are told so, with
  what to use instead, rather than shown torch's error or its deprecation warning.

Writing a checker
-----------------
In the section's module (``s9_N.py``, in exercise order), imported by the package so that it registers::

    @exercise("9.N.k", "what a correct answer has shown, without computed numbers", time_limit=10)
    def _(answer):
        r = fresh()                                    # this check's hidden cases
        for case, (n, d) in cases([(3, 4), (5, 8)], [(r.integer(1, 9), r.choice([2, 6]))],
                                  lambda n, d: f"n = {n}, d = {d}"):
            x = r.randn(n, d)                          # float64, drawn afresh
            want = ...                                 # computed before the answer runs
            compare(call(answer, x, case=case), want, case, mistakes=[(wrong_result, "hint")], hint="...")

``call(answer, *args, case=None, watch=None, **kwargs)`` runs the answer (``case``, keyword-only, names the case
in a message when the answer raises or runs out of time: pass it always; ``watch=Watch()`` refuses a number
computed through float16 or bfloat16 tensors, and is passed by every checker that compares a float number).
``compare`` (tensors), ``compare_number`` (numbers) and ``pair`` (a tuple of results) raise ``Wrong``;
``NotAttempted`` marks a starter. ``on_batches(run, *args, case=..., name=...)`` runs ``run`` (a call and its
comparisons) and, where it fails on a batch but passes on the batch's first matrix, says the answer works on 2-D
inputs only. ``generator()`` and ``pick`` draw from a torch generator seeded by ``fresh()``; ``as_number`` and
``as_integer`` read what the answer returned. ``randn(*shape, g=generator)`` and the ``atol``/``rtol`` arguments of
``compare`` still work as before (an ``rtol`` below 1e-4 is raised to it, the float32 floor). A shortcut
an exercise forbids is caught by ``uses_keyword(answer, "label_smoothing")`` (the answer's source) and by
``call(answer, ..., watch=Watch(refuse, why))`` (every torch call the answer makes, however the function was
imported and its arguments passed); ``inside(f, g)`` is such a ``refuse``, for a helper the answer may not use: it
flags every torch call made while ``f`` or ``g`` runs, under whatever name the answer called it. An open exercise,
whose answer is a trained model, runs a few examples alone through ``alone`` and compares them with their rows in
the batch, so that a model whose answers depend on the rest of the batch is told so. The checks of 9.4.5 and 9.6.5
also shuffle the entries of each tensor their model is computed from (``parameters_of``, ``shuffled``), so that a
model written by hand, whose work does not live in its parameters (it has none, or a scale the same in every entry),
is told that it was not trained.
An answer given as None or ``...`` (a value exercise's untouched starter) is not attempted, as before; an
exercise number that is not a string is a TypeError, an unknown one a ValueError.

Nothing printed on success depends on the machine: the messages of a correct answer hold no computed
floats. ``verdict(number, answer, seed=None, time_limit=None)`` returns ``(ok, message)`` for the tests
(``ok`` is None for an untouched starter); ``check`` prints the message.
"""

import ast
import contextlib
import copy
import decimal
import dis
import functools
import inspect
import math
import numbers
import os
import random
import re
import signal
import sys
import textwrap
import threading
import time
import traceback
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

TIME_LIMIT = 20.0          # seconds per check, unless an exercise sets its own


class Wrong(Exception):
    """The answer failed a case; the message says which, and how."""


class NotAttempted(Exception):
    """The starter is still as it was."""


class _Raised(Exception):
    """The answer raised ``error`` on ``case`` (``flat``: the 2-D-only operation it used on a batch, if any)."""

    def __init__(self, case, error, flat=None):
        super().__init__(case, error)
        self.case, self.error, self.flat = case, error, flat


class _Nested(Exception):
    """``check`` was called from inside the answer that a check is running."""


class _TimeUp(BaseException):
    """The check ran out of time (a BaseException, so that an answer's ``except Exception`` cannot swallow it)."""


@dataclass
class Exercise:
    run: callable      # run(answer) raises Wrong or NotAttempted, or returns when every case passed
    done: str          # what a correct answer has shown, said without computed numbers
    time_limit: float = TIME_LIMIT


EXERCISES = {}


def exercise(number, done, time_limit=TIME_LIMIT):
    def register(run):
        EXERCISES[number] = Exercise(run, done, time_limit)
        return run
    return register


# The state of the check in progress ------------------------------------------------------------------

class Draw:
    """Random cases for one check: a torch generator and a Python ``random.Random`` from one seed."""

    def __init__(self, seed):
        self.torch = torch.Generator().manual_seed(seed)
        self.python = random.Random(seed)

    def randn(self, *shape, dtype=torch.float64):
        return torch.randn(*shape, generator=self.torch, dtype=torch.float64).to(dtype)

    def integer(self, low, high):
        """An int in ``low .. high``, both included."""
        return self.python.randint(low, high)

    def choice(self, options):
        return self.python.choice(list(options))

    def uniform(self, low, high):
        return self.python.uniform(low, high)

    def log_uniform(self, low, high):
        return math.exp(self.python.uniform(math.log(low), math.log(high)))


class _State(threading.local):
    draw = None        # the check's Draw
    case = None        # the case the answer is running
    calls = 0          # calls of the answer so far in this check
    in_answer = False  # whether the answer (not the checker) is running
    half = None        # the half-precision dtype the answer's last call computed with, if any (for the messages)
    flat = None        # the 2-D-only operation the answer's last call used on a batch, if any (for the messages)
    checking = False   # whether a check is running in this thread (so that one called by the answer is refused)
    nested = False     # whether the answer called check (noted, in case it caught the refusal)


_now = _State()   # the check in progress in this thread


def fresh():
    """This check's source of hidden cases, seeded afresh by each check (from ``os.urandom``)."""
    if _now.draw is None:
        _now.draw = Draw(int.from_bytes(os.urandom(8), "little"))
    return _now.draw


def cases(shown, hidden, describe):
    """``(label, parameters)`` for the fixed ``shown`` cases, then the ``hidden`` ones (drawn by ``fresh()``).

    ``describe(*parameters)`` says what a case is; the label reads "case 2 of 7 (...)", and "drawn at random"
    for a hidden case.
    """
    everything = [(p, False) for p in shown] + [(p, True) for p in hidden]
    for k, (p, drawn) in enumerate(everything, start=1):
        p = p if isinstance(p, tuple) else (p,)
        yield f"case {k} of {len(everything)} ({'drawn at random: ' if drawn else ''}{describe(*p)})", (
            p if len(p) > 1 else p[0])


# Running the answer ------------------------------------------------------------------------------------

def verdict(number, answer, seed=None, time_limit=None):
    """``(ok, message)``: the line ``check`` prints. ``ok`` is None when the starter is untouched."""
    if _now.checking:          # the answer itself called check: refuse it here, and the outer check says so
        _now.nested = True
        raise _Nested
    if not isinstance(number, str):
        raise TypeError(f'the exercise number must be a string such as "9.1.1", got {type(number).__name__} {number!r}')
    if number not in EXERCISES:
        raise ValueError(f"no exercise {number!r}; there are {', '.join(EXERCISES)}")
    exercise_ = EXERCISES[number]
    name = getattr(answer, "__name__", None) or "your answer"
    limit = exercise_.time_limit if time_limit is None else time_limit
    if isinstance(limit, bool) or not isinstance(limit, int | float) or not 0 < limit < 1e6:
        raise ValueError(f"time_limit must be a number of seconds between 0 and 1e6, got {limit!r}")
    saved = (_now.draw, _now.case, _now.calls, _now.in_answer)
    _now.draw = Draw(int.from_bytes(os.urandom(8), "little") if seed is None else seed)
    _now.case, _now.calls, _now.in_answer, _now.half, _now.flat = None, 0, False, None, None
    _now.checking, _now.nested = True, False
    try:
        if answer is None or answer is Ellipsis or (callable(answer) and _starter(answer) == "starter"):
            raise NotAttempted
        _within(limit, lambda: exercise_.run(answer))
    except NotAttempted:
        return None, f"Exercise {number}: not attempted yet. Complete {name} above and run the cell again."
    except Wrong as wrong:
        return False, f"Exercise {number}: not yet. {wrong}"
    except _Raised as raised:
        flat = f". It {_two_d(raised.flat)}" if raised.flat else ""
        return False, f"Exercise {number}: not yet. On {raised.case}, {name} {_raised(raised.error, name)}{flat}"
    except _TimeUp:
        where = f"On {_now.case}, {name}" if _now.in_answer and _now.case else f"{name}'s check"
        return False, (f"Exercise {number}: not yet. {where} did not finish within {limit:g} s, so the check stopped "
                       "it: is there a loop that never ends, or far more work than the small cases need?")
    except Exception as error:      # the checker could not use what the answer returned: say so, blame nothing
        where = f" on {_now.case}" if _now.case else ""
        return False, (f"Exercise {number}: not yet. The checker could not use what {name} returned{where} "
                       f"({type(error).__name__}: {_first_line(error)}).")
    finally:
        _now.draw, _now.case, _now.calls, _now.in_answer = saved
        _now.checking = False
    return True, f"Exercise {number}: correct. {exercise_.done}"


SOLVED = {}      # exercise number -> the answer whose check last passed (what ``solved`` asks about)
REFERENCE = {}   # exercise number -> the reference solution its ``%%solution`` cell checked
_in_solution = False             # True while a ``%%solution`` cell runs: its check speaks of the reference


def check(number, answer):
    """Run exercise ``number``'s checker on ``answer`` and print its verdict."""
    ok, message = verdict(number, answer)
    if ok:
        SOLVED[number] = answer
        if _in_solution:              # not "Your ...": the reader's function was not run
            REFERENCE[number] = answer
            done = EXERCISES[number].done
            message = f"Exercise {number}: the reference solution is correct. " + re.sub(r"^Your ", "Its ", done)
    else:
        SOLVED.pop(number, None)
    print(message)


def run_solution(code, namespace):
    """Run a solution cell's compiled ``code`` in a copy of ``namespace`` (the ``%%solution`` cell magic).

    The reference function it defines lands in the copy, so it never replaces the student's function of the
    same name; the cell's check line registers it, and ``solved`` hands it to the experiments until the
    student's own function passes.
    """
    global _in_solution
    _in_solution = True
    try:
        exec(code, dict(namespace))  # noqa: S102 (the notebook's own cell)
    finally:
        _in_solution = False


def solved(number, answer, quiet=False):
    """The function an exercise's experiment runs, or None, saying what to do first.

    ``answer`` once its check of exercise ``number`` has passed (a function redefined since then is not used).
    Otherwise, where the book's solution cell has passed the check, its reference solution, saying so unless
    ``quiet``. Otherwise None, after saying to complete the function above. An experiment reads::

        pick = solved("9.6.2", relative_index)
        if pick:
            ...  # pick(...), never relative_index(...), which may still be the starter
    """
    if not isinstance(number, str) or number not in EXERCISES:
        raise ValueError(f'no exercise {number!r}; give its number as a string, such as "9.1.1"')
    name = getattr(answer, "__name__", None) or "the answer"
    passed = SOLVED.get(number)
    if passed is not None and passed is answer:
        return answer
    if passed is not None and passed is REFERENCE.get(number):
        if not quiet:
            print(f"Exercise {number}: run with the reference solution; to run it with your {name}, "
                  "complete it above and run its check.")
        return passed
    print(f"Exercise {number}: complete the function above first ({name} has not passed its check yet), "
          "then run this cell again.")
    return None


def _within(seconds, run):
    """``run()``, stopped with ``_TimeUp`` after ``seconds``."""
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        armed = [True]

        def alarm(signum, frame):
            if armed[0]:
                raise _TimeUp
        previous = signal.signal(signal.SIGALRM, alarm)
        start, outer, outer_interval = time.monotonic(), 0.0, 0.0
        try:
            # Armed inside the try, so that an alarm firing at once still disarms it in the finally. It repeats
            # every 0.25 s in case the answer swallows the first one (a bare ``except:``).
            outer, outer_interval = signal.setitimer(signal.ITIMER_REAL, seconds, 0.25)
            return run()
        finally:
            armed[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if outer:                            # someone else's timer (pytest-timeout, say) runs on as it was
                signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 1e-3), outer_interval)
    # Not the main thread: run in a watcher's thread and give up on it after ``seconds`` (it runs on, unseen).
    outcome = {}
    state = (_now.draw, _now.calls)

    def target():
        _now.draw, _now.calls, _now.checking, _now.nested = *state, True, False
        try:
            outcome["value"] = run()
        except BaseException as error:  # noqa: BLE001 (handed back to the caller's thread)
            outcome["error"] = error
        outcome["case"], outcome["in_answer"] = _now.case, _now.in_answer
        outcome["half"], outcome["flat"] = _now.half, _now.flat
    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise _TimeUp
    _now.case, _now.in_answer = outcome.get("case"), outcome.get("in_answer", False)
    _now.half, _now.flat = outcome.get("half"), outcome.get("flat")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _first_line(error, limit=300):
    text = str(error).strip().splitlines()
    text = text[0] if text else ""
    return text if len(text) <= limit else text[:limit] + " ..."


_LIBRARY = (str(Path(torch.__file__).parents[1]), str(Path(__file__).resolve().parent), str(Path(np.__file__).parents[1]))


def _raised(error, name):
    """'raised TypeError: ... (in f, line 3)': the exception and the last place in the reader's code."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith(_LIBRARY)]
    where = f" (in {frames[-1].name}, line {frames[-1].lineno})" if frames else ""
    # An unfinished function raises NotImplementedError itself; torch raises it too (an operation it lacks for a
    # dtype or a layout), and that is reported as the error it is.
    if isinstance(error, NotImplementedError) and _raised_here(error):
        inner = frames[-1].name if frames else "a function it calls"
        return (f"raised NotImplementedError{where}: {inner + ' is' if inner != name else 'it is'} not finished. "
                "Complete it, or compute the result without it.")
    return f"raised {type(error).__name__}: {_first_line(error)}{where}"


def _raised_here(error):
    """Whether ``error`` comes from a raise statement in the reader's code (its last frame's instruction is the raise:
    where torch raised it from C, that frame's instruction is the call)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or tb.tb_frame.f_code.co_filename.startswith(_LIBRARY):
        return False
    return any(i.offset == tb.tb_lasti and i.opname == "RAISE_VARARGS" for i in dis.get_instructions(tb.tb_frame.f_code))


def _starter(f):
    """'starter' when ``f``'s body is only ``...`` or ``raise NotImplementedError``, 'pass' when only ``pass``,
    'empty' when only a docstring, None otherwise."""
    code = getattr(f, "__code__", None)
    if code is None or code.co_name == "<lambda>":
        return None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(f)))
        node = tree.body[0]
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            node = None
    except (OSError, TypeError, SyntaxError, IndexError):
        node = None
    if node is not None:
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:]                                  # the docstring
        if not body:
            return "empty"
        if len(body) == 1:
            s = body[0]
            if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and s.value.value is Ellipsis:
                return "starter"
            if isinstance(s, ast.Raise) and s.exc is not None:
                exc = s.exc.func if isinstance(s.exc, ast.Call) else s.exc
                if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
                    return "starter"
            if isinstance(s, ast.Pass):
                return "pass"
        return None
    # No source (code built by exec without a file): the byte code of `...` (or pass) and of the raise.
    ops = [(i.opname, i.argval) for i in dis.get_instructions(code) if i.opname not in ("RESUME", "NOP", "CACHE")]
    if ops in ([("LOAD_CONST", None), ("RETURN_VALUE", None)], [("RETURN_CONST", None)]):
        return "starter"
    if ops and ops[0] == ("LOAD_GLOBAL", "NotImplementedError") and ops[-1][0] == "RAISE_VARARGS" and \
            code.co_names == ("NotImplementedError",):
        return "starter"
    return None


class _Tee:
    """Passes writes on to ``stream`` and notes whether anything was written."""

    def __init__(self, stream):
        self.stream, self.wrote = stream, False

    def write(self, text):
        self.wrote = self.wrote or bool(text.strip())
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _copied(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, tuple | list):
        return type(x)(_copied(v) for v in x)
    if isinstance(x, dict):
        return {k: _copied(v) for k, v in x.items()}
    if isinstance(x, torch.nn.Module):
        return copy.deepcopy(x)
    return x


def _same(a, b):
    """Whether ``b`` still equals ``a`` (tensors bit for bit, NaN equal to NaN)."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.is_floating_point() or a.is_complex():
            return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))
        return torch.equal(a, b)
    if isinstance(a, tuple | list):
        return isinstance(b, tuple | list) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.nn.Module):
        if not isinstance(b, torch.nn.Module) or [(n, type(m)) for n, m in a.named_modules()] != \
                [(n, type(m)) for n, m in b.named_modules()]:
            return False
        sa, sb = a.state_dict(), b.state_dict()
        return sa.keys() == sb.keys() and all(_same(sa[k], sb[k]) for k in sa)
    return True


def _describe(x):
    if isinstance(x, torch.Tensor):
        return f"shape {tuple(x.shape)}"
    if isinstance(x, tuple | list):
        return "(" + ", ".join(_describe(v) for v in x) + ")"
    if isinstance(x, numbers.Number):
        return f"{x:g}" if isinstance(x, float) else str(x)
    return type(x).__name__


def _names(f, args, kwargs):
    """The parameter name of each positional argument, as far as ``f``'s signature tells."""
    try:
        bound = inspect.signature(f).bind_partial(*args, **kwargs)
        return {i: n for i, n in enumerate(bound.arguments) if i < len(args)}
    except (TypeError, ValueError):
        return {}


def call(f, *args, case=None, watch=None, **kwargs):
    """Run the answer ``f`` on copies of the arguments and return its result.

    An untouched starter raises NotAttempted. The answer's own exceptions come back as a message naming
    ``case`` (or, without it, the arguments' shapes). An argument changed in place, a None returned, or a
    body of ``pass`` raises Wrong. ``watch``, a ``Watch``, watches the answer's torch calls as it runs: a
    call it refuses, or (with ``watch.half_refused``) a float16 or bfloat16 tensor made along the way, raises
    Wrong, even when the answer caught the refusal and went on. So does an answer that calls ``check`` itself.
    """
    _now.calls += 1
    label = case or f"call {_now.calls} ({', '.join(_describe(a) for a in args)})"
    if not callable(f):
        raise Wrong(f"pass the function itself, check(\"9.N.k\", name), not its result: got {type(f).__name__}")
    kind = _starter(f)
    if kind == "starter":
        raise NotAttempted
    name = getattr(f, "__name__", "your function")
    if kind in ("pass", "empty"):
        raise Wrong(f"{name}'s body is only {'`pass`' if kind == 'pass' else 'its docstring'}, so it returns None: "
                    "write the computation and return its result.")
    given, given_kw = _copied(args), _copied(kwargs)
    tee = _Tee(sys.stdout)
    # Every call is watched for half precision: where the checker passes no watch of its own, one that refuses
    # nothing here, so that ``compare`` can refuse a float result computed in half precision (a right formula
    # computed in float16 and returned as float64 passes a 0.01% tolerance on some draws and not on others),
    # while a half tensor used for something else, such as a dtype's size, changes nothing in an integer result.
    # The watch also notes an operation that takes 2-D tensors only used on a batch, for the message.
    watch = Watch(half_refused=False) if watch is None else watch
    _now.case, _now.in_answer, _now.half, _now.flat = label, True, None, None
    try:
        # torch's deprecation warning for .T on a batch would reach the notebook's output: the message says it.
        with contextlib.redirect_stdout(tee), watch, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"The use of `x\.T` on tensors of dimension other than 2")
            out = f(*given, **given_kw)
    except _Forbidden as forbidden:
        raise Wrong(f"{label}: {name} {forbidden}") from None
    except _Nested:
        raise Wrong(f"{label}: {name} {_NESTED}") from None
    except Exception as error:
        if watch.refused:
            raise Wrong(f"{label}: {name} {watch.why}") from None
        if _now.nested:
            raise Wrong(f"{label}: {name} {_NESTED}") from None
        raise _Raised(label, error, watch.flat) from error
    _now.in_answer = False          # (left True when time runs out in the answer, for verdict's message)
    _now.half, _now.flat = watch.half, watch.flat
    if watch.refused:
        raise Wrong(f"{label}: {name} {watch.why}")
    if _now.nested:
        raise Wrong(f"{label}: {name} {_NESTED}")
    names = _names(f, args, kwargs)
    changed = [(names.get(i, f"number {i + 1}"), a) for i, (a, b) in enumerate(zip(args, given, strict=True))
               if not _same(a, b)] + [(key, kwargs[key]) for key in kwargs if not _same(kwargs[key], given_kw[key])]
    for argument, original in changed[:1]:
        if isinstance(original, torch.nn.Module):
            raise Wrong(f"{label}: {name} changed the model it was given as {argument} (its parameters, buffers or "
                        "submodules): use the model as it is, and leave it as you found it.")
        raise Wrong(f"{label}: {name} changed its input {argument} in place (an operation such as x /= ..., "
                    "x[...] = ... or x.add_(...)): a function should leave its inputs as they were, so compute on a "
                    "new tensor (x = x / ...).")
    if out is None:
        raise Wrong(f"{label}: {name} returned None" + (": it printed its result instead of returning it. Use return."
                                                          if tee.wrote else ": is a return statement missing?"))
    if out is Ellipsis:
        raise Wrong(f"{label}: {name} returned ... (Ellipsis): return the result itself.")
    if watch.half_refused and watch.half is not None:
        raise Wrong(f"{label}: {name} {_half(watch.half)}")
    return out


_NESTED = ("calls check itself, which would check it again inside its own check, without end: call check once, "
           "on its own line after the function, not inside it.")

# Half precision: about how many significant digits each keeps, said in the messages that refuse it.
_HALF_DIGITS = {torch.float16: 3, torch.bfloat16: 2}


def _half(dtype):
    return (f"computed with {dtype} tensors, which keep about {_HALF_DIGITS[dtype]} significant digits, too few for "
            "this check: compute in float32 or float64.")


# Operations that take matrices only: used on a batch they raise, or (.T) reverse every dimension.
_T = torch.Tensor.T.__get__
_FLOAT = torch.Tensor.__float__


def _flat(func, args):
    """What gives away an answer that works on 2-D inputs only, when ``func`` is such an operation applied to a
    tensor of more dimensions; else None."""
    dims = max((a.dim() for a in args[:2] if isinstance(a, torch.Tensor)), default=0)
    if dims <= 2:
        return None
    if func == _T:
        return f".T on a {dims}-D tensor reverses all its dims"
    if func in (torch.t, torch.Tensor.t):
        return ".t() takes 2-D tensors only"
    if func in (torch.mm, torch.Tensor.mm):
        return "torch.mm takes 2-D tensors only"
    return None


def _two_d(cause=None):
    """The hint for an answer that works on 2-D inputs only, with what gave it away (``cause``) if known."""
    # No 2-D-only operation seen: a size or a dim counted from the front (Q.shape[1] is m on a batch, not d_k).
    front = "" if cause else "count sizes and dims from the end (Q.shape[-1], not Q.shape[1]; dim=-1), "
    return (f"works on 2-D inputs only{f' ({cause})' if cause else ''}: {front}use .transpose(-2, -1) or .mT to swap "
            "the last two dims of a batch, and @ (torch.matmul) to multiply batches of matrices.")


def on_batches(run, *args, case, name):
    """``run(*args)``, a call of the answer and the comparisons of its result; where it fails on a case with leading
    batch dimensions but passes on the case's first matrix (every tensor of ``args`` cut to its last two dims), the
    answer works on 2-D inputs only, and the message says so: after the error it raised, or instead of the entry it
    got wrong."""
    try:
        return run(*args)
    except (Wrong, _Raised) as failure:
        first = tuple(a.reshape(-1, *a.shape[-2:])[0] if isinstance(a, torch.Tensor) and a.dim() > 2 else a
                      for a in args)
        if all(a is b for a, b in zip(first, args, strict=True)):
            raise
        cause = failure.flat if isinstance(failure, _Raised) else _now.flat
        try:
            run(*first)
        except Exception:  # noqa: BLE001 (wrong on one matrix too: the failure on the batch is the one to show)
            raise failure from None
        # Right on one matrix, and on one batch dimension too where there were two or more: it takes 3-D inputs
        # only (torch.bmm, transpose(1, 2)), not "2-D only" (a students' review).
        one = tuple(a.reshape(-1, *a.shape[-3:])[0] if isinstance(a, torch.Tensor) and a.dim() > 3 else a
                    for a in args)
        if not all(a is b for a, b in zip(one, args, strict=True)):
            try:
                run(*one)
            except Exception:  # noqa: BLE001 (wrong on one batch dimension too: 2-D only, as below)
                pass
            else:
                raise Wrong(f"{case}: {name} is right on a batch with one leading dimension but not with "
                            f"{args[0].dim() - 2}: it works on 3-D inputs only (torch.bmm and transpose(1, 2) count "
                            "dims from the front): use @ (torch.matmul) and .transpose(-2, -1) or .mT, which work "
                            "with any number of leading dims.") from None
        if isinstance(failure, _Raised):          # told as the error it raised on the batch, with the hint
            failure.flat = cause or "it is right on one matrix of this batch"
            raise failure from None
        raise Wrong(f"{case}: {name} is right on one matrix of this batch but not on the batch: it "
                    f"{_two_d(cause)}") from None


class Watch(TorchFunctionMode):
    """Watches the torch calls of the answer that runs inside it (``call(..., watch=...)``).

    It notes the dtype of the first float16 or bfloat16 tensor the answer makes (``half``; refused after the
    call when ``half_refused``) and the first operation that takes matrices only that it uses on a batch
    (``flat``), and refuses each call that ``refuse(func, args, kwargs)`` flags: it raises ``_Forbidden(why)``
    and notes it (``refused``), so that an answer that catches the exception is still refused. Every route
    to a torch function passes here, whatever name the answer imported it under and however it passed the
    arguments: a Python function such as ``F.cross_entropy`` comes with its arguments as its signature names
    them (``label_smoothing`` among the keywords, even when given by position).
    """

    def __init__(self, refuse=None, why="", half_refused=True):
        super().__init__()
        self.refuse, self.why, self.half_refused = refuse, why, half_refused
        self.half, self.refused, self.flat = None, False, None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.flat is None:
            self.flat = _flat(func, args)
        if self.refuse is not None and self.refuse(func, args, kwargs):
            self.refused = True
            raise _Forbidden(self.why)
        if func is _FLOAT and args and isinstance(args[0], torch.Tensor) and args[0].requires_grad:
            # float() of a tensor that requires a gradient (a stream computed with a model's weights): the same value,
            # without torch's warning, which would name this line. A Python float carries no gradient anyway.
            args = (args[0].detach(), *args[1:])
        out = func(*args, **kwargs)
        if self.half is None:
            for t in out if isinstance(out, tuple | list) else (out,):
                if isinstance(t, torch.Tensor) and t.dtype in _HALF_DIGITS:
                    self.half = t.dtype
                    break
        return out


class Unwatched(contextlib.nullcontext):
    """In place of a ``Watch``, for an answer judged by what its result does, not by how it computes it (9.6.5's
    trained model, judged by its accuracy): its torch calls run unwatched, which makes its training about a third
    faster. It refuses nothing and notes nothing."""

    half = flat = None
    refused = half_refused = False
    why = ""


# Comparing -----------------------------------------------------------------------------------------

RTOL = 1e-4                # the least relative tolerance: what an answer computed in float32 meets


def _shown(want, got):
    """Expected and got, with as many digits as it takes to tell them apart."""
    if isinstance(want, bool) or isinstance(got, bool) or not (isinstance(want, float) or isinstance(got, float)):
        return str(want), str(got)
    for digits in range(4, 18):
        a, b = f"{want:.{digits}g}", f"{got:.{digits}g}"
        if a != b:
            return a, b
    return repr(want), repr(got)


def _num(x):
    return "True" if x is True else "False" if x is False else f"{x:.4g}"


def _tolerance(got, want, atol, rtol):
    """Per-entry tolerance: rtol (|want| + 0.1 max|want|) + atol, rtol at least RTOL, over the finite entries of
    ``want``; 0 where ``want`` is infinite or NaN, which must be matched exactly (an infinite tolerance there
    would let any number, or the other infinity, pass for -inf)."""
    rtol = max(rtol or 0.0, RTOL)
    w = want.to(torch.float64)
    finite = w.isfinite()
    size = w.abs().where(finite, torch.zeros_like(w))
    scale = size.max() if w.numel() else torch.tensor(0.0, dtype=torch.float64)
    return torch.where(finite, rtol * (size + 0.1 * scale) + (atol or 0.0), torch.zeros_like(w))


def close(got, want, atol=None, rtol=None):
    """Whether ``got`` equals ``want``: exactly for booleans and integers, within the tolerance for floats."""
    if not isinstance(got, torch.Tensor):
        try:
            got = torch.as_tensor(got)
        except (TypeError, ValueError, RuntimeError):
            return False
    if got.shape != want.shape:
        return False
    if want.dtype == torch.bool:
        return got.dtype == torch.bool and bool(torch.equal(got, want))
    if not want.is_floating_point():
        return got.dtype in (torch.int64, torch.int32) and bool(torch.equal(got.to(want.dtype), want))
    if not got.is_floating_point():
        return False
    g, w = got.detach().to(torch.float64), want.to(torch.float64)
    nan = w.isnan()
    if not torch.equal(g.isnan(), nan):                     # NaN where NaN is expected, and only there
        return False
    # Finite entries within the tolerance; an infinite one (tolerance 0) only by the same infinity, g == w.
    within = ((g - w).abs() <= _tolerance(got, want, atol, rtol)) | (g == w)
    return bool(within.logical_or(nan).all())


def _matching(got, mistakes, same):
    """The hints of every mistake whose result ``got`` matches, once each."""
    hints = []
    for result, why in mistakes:
        try:
            hit = same(got, result)
        except Exception:  # noqa: BLE001 (a mistake that cannot be compared does not match)
            hit = False
        if hit and why not in hints:
            hints.append(why)
    return hints


def _hinted(case, detail, hints, hint):
    # No known mistake fits and the answer computed in half precision, or used a 2-D-only operation on a batch:
    # that, not the formula, is the first suspect.
    if _now.half is not None and not hints:
        return Wrong(f"{case}: {detail}. Your function {_half(_now.half)}")
    if _now.flat is not None and not hints:
        return Wrong(f"{case}: {detail}. Your function {_two_d(_now.flat)}")
    if len(hints) == 1:
        return Wrong(f"{case}: {detail}. {hints[0]}")
    if hints:
        return Wrong(f"{case}: {detail}. This result fits more than one mistake: "
                     + " Or: ".join(hints))
    return Wrong(f"{case}: {detail}. {hint}".rstrip())


def compare(got, want, case, mistakes=(), hint="", what="output", atol=None, rtol=None):
    """Raise ``Wrong`` unless tensor ``got`` equals ``want``: the same shape, the same kind of dtype (boolean,
    integer, or float32/float64), and the same entries (within the tolerance for floats).

    ``mistakes`` is a sequence of ``(result of the mistake, hint)``: the hints of those whose result ``got``
    matches are given; otherwise ``hint``.
    """
    def fail(detail):
        raise _hinted(case, detail, _matching(got, mistakes, lambda g, r: close(g, r, atol, rtol)), hint)

    if type(got) not in (torch.Tensor, torch.nn.Parameter):
        kind = type(got).__name__
        raise Wrong(f"{case}: the {what} should be a torch.Tensor, got {kind}"
                    + (": build it with torch operations, or torch.tensor(...)" if kind in ("list", "ndarray", "tuple") else ""))
    got = got.detach()
    if got.shape != want.shape:
        if want.dim() >= 3 and got.dim() == want.dim() and got.shape[1:] == want.shape[1:]:
            # Right but for the batch: one sequence computed (x[0]), or a batch reduced (a students' review: the hint
            # about the exercise's own mistakes blamed something else).
            hint = (f"Your {what} has {got.shape[0]} along its first dimension, where {want.shape[0]} are expected, "
                    "and the rest of its shape is right: was only the first element of a batch used, or the batch "
                    "reduced? Compute it for every element.")
        fail(f"the {what} should have shape {tuple(want.shape)}, got {tuple(got.shape)}")
    if want.dtype == torch.bool and got.dtype != torch.bool:
        raise Wrong(f"{case}: the {what} should be boolean (torch.bool, True where hidden), got {got.dtype}")
    if want.dtype != torch.bool and not want.is_floating_point():
        if got.dtype not in (torch.int64, torch.int32):
            raise Wrong(f"{case}: the {what} should be torch.long (or int32) integers, got {got.dtype}"
                        + (": a float tensor cannot index a table" if got.is_floating_point() else
                           ": too narrow for every index" if got.dtype in (torch.int16, torch.int8, torch.uint8) else ""))
    if want.is_floating_point():
        if got.dtype not in (torch.float32, torch.float64):
            advice = {True: "compute in float32 or float64", False: "the result is real-valued: compute it in floating point"}
            raise Wrong(f"{case}: the {what} should hold floating-point numbers (float32 or float64), got {got.dtype}: "
                        + advice[got.is_floating_point()])
        if _now.half is not None:        # right or wrong by the draw: refused whatever its values
            raise Wrong(f"{case}: your function {_half(_now.half)}")
    if close(got, want, atol, rtol):
        return
    if want.dtype == torch.bool or not want.is_floating_point():
        wrong = got.to(want.dtype) != want
        index = tuple(wrong.nonzero()[0].tolist())
        fail(f"the {what}: {int(wrong.sum())} of {want.numel()} entries differ, the first at index {index}: "
             f"expected {_num(want[index].item())}, got {_num(got[index].item())}")
    g, w = got.to(torch.float64), want.to(torch.float64)
    odd = ((g != w) & ~(g.isnan() & w.isnan())) & ~(g.isfinite() & w.isfinite())
    if odd.any():                       # an infinity or NaN where it should not be, or missing where it should
        index = tuple(odd.nonzero()[0].tolist())
        fail(f"the {what}: {int(odd.sum())} of {want.numel()} entries differ where one of them is not finite, the "
             f"first at index {index}: expected {_num(w[index].item())}, got {_num(g[index].item())}")
    tol = _tolerance(got, want, atol, rtol)
    error = (g - w).abs()
    ratio = (error / tol.clamp_min(1e-300)).nan_to_num(float("inf"), float("inf"))
    ratio[(w.isnan() & g.isnan()) | (g == w)] = 0
    index = tuple(int(i) for i in torch.unravel_index(ratio.argmax(), want.shape))
    expected, obtained = _shown(w[index].item(), g[index].item())
    fail(f"the {what}: {int((ratio > 1).sum())} of {want.numel()} entries differ, the largest error "
         f"{error[index].item():.2g} at index {index}: expected {expected}, got {obtained}")


def _kind(got):
    """What ``got`` is, for a message: 'a tensor of shape (1,)', 'float 7.0', 'str '7''."""
    if isinstance(got, torch.Tensor):
        return f"a tensor of shape {tuple(got.shape)}" if got.dim() else f"a 0-d {got.dtype} tensor"
    if isinstance(got, np.ndarray):
        return f"a NumPy array of shape {got.shape}" if got.ndim else f"a 0-d NumPy {got.dtype} array"
    return type(got).__name__ + (f" {got!r}" if isinstance(got, float | str | bool | np.floating) else "")


def _one(got, case, what, one):
    """``got`` unwrapped from a 0-d tensor or array (checked for a real, full-precision dtype), or Wrong saying that
    a tensor or array of another shape is not ``one`` (a number, an integer)."""
    if isinstance(got, torch.Tensor | np.ndarray) and got.ndim != 0:
        size = got.numel() if isinstance(got, torch.Tensor) else got.size
        raise Wrong(f"{case}: the {what} should be {one}, got {_kind(got)}"
                    + (": take its one entry with .item()" if size == 1 else ""))
    if isinstance(got, torch.Tensor):
        if got.dtype == torch.bool or got.is_complex():
            raise Wrong(f"{case}: the {what} should be a real number, got a {got.dtype} tensor")
        if got.dtype in _HALF_DIGITS:
            raise Wrong(f"{case}: the {what} is a {got.dtype} number, which keeps about {_HALF_DIGITS[got.dtype]} "
                        "significant digits, too few for this check: compute in float32 or float64.")
        return got.item()
    if isinstance(got, np.ndarray):
        got = got[()]                                          # a 0-d array: its NumPy scalar
    if isinstance(got, np.float16):
        raise Wrong(f"{case}: the {what} is a NumPy float16 number, which keeps about 3 significant digits, too few "
                    "for this check: compute in float32 or float64.")
    return got


def as_number(got, case, what):
    """``got`` as an int or a float, or ``Wrong`` saying why it is not a number: any real number (int, float,
    Fraction, Decimal, NumPy scalar, 0-d tensor), but not a bool, a string, a tensor of another shape, or a
    float16 or bfloat16 number (too few digits for any check here)."""
    if isinstance(got, bool | np.bool_):
        raise Wrong(f"{case}: the {what} should be a number, got a bool ({got})")
    got = _one(got, case, what, "one number")
    if isinstance(got, bool | np.bool_):
        raise Wrong(f"{case}: the {what} should be a number, got a bool ({got})")
    if isinstance(got, np.generic) and got.dtype.kind in "iuf":
        return got.item()
    if isinstance(got, numbers.Rational) and got.denominator == 1:
        return int(got)
    if isinstance(got, numbers.Real | decimal.Decimal):
        if isinstance(got, decimal.Decimal) and got.is_finite() and got == got.to_integral_value():
            return int(got)
        try:
            return float(got)
        except (TypeError, ValueError, OverflowError):
            pass
    raise Wrong(f"{case}: the {what} should be a number, got {_kind(got)}"
                + (": return the number itself, not text" if isinstance(got, str) else ""))


def _big(x):
    return f"an integer of {len(str(abs(x)))} digits" if isinstance(x, int) and abs(x) >= 10 ** 18 else None


def compare_number(got, want, case, mistakes=(), hint="", what="answer", exact=False, rtol=1e-3, atol=0.0,
                   mistake_rtol=None):
    """Raise ``Wrong`` unless the number ``got`` equals ``want``: exactly (``exact``, an integer), or within
    ``rtol`` (0.1% by default) and ``atol``. A string, a bool or a tensor of more than one number is not a number.
    ``mistake_rtol``, if given, is how close to a known mistake's value an answer must be for its hint (else ``rtol``):
    a tighter one keeps another mistake that lands within ``rtol`` of it on some draw from being told the wrong hint."""
    g = as_number(got, case, what)
    if exact:
        if isinstance(g, float):
            if not math.isfinite(g) or not g.is_integer():
                raise Wrong(f"{case}: the {what} should be a whole number, expected {want:,}, got {g!r}")
            g = int(g)

        def same(a, b):
            return a == b

        def shown(x):
            return _big(x) or f"{x:,}"
        expected, obtained = shown(want), shown(g)
    else:
        if isinstance(g, int):
            try:
                g = float(g)
            except OverflowError:
                raise Wrong(f"{case}: the {what} should be a finite float, got {_big(g)}, too large for one") from None
        if not math.isfinite(g):
            raise Wrong(f"{case}: the {what} should be a finite number, expected {_num(want)}, got {g}")

        def same(a, b):
            return math.isclose(a, b, rel_tol=rtol, abs_tol=atol)
        expected, obtained = _shown(float(want), g)
    if same(g, want):
        return
    if mistake_rtol is not None:        # a known mistake named only when the answer is that mistake, not near it
        def same(a, b):
            return math.isclose(a, b, rel_tol=mistake_rtol, abs_tol=atol)
    hints = _matching(g, mistakes, same)
    raise _hinted(case, f"expected {expected}, got {obtained}", hints, hint)


def pair(out, case, names):
    if not (isinstance(out, tuple | list) and len(out) == len(names)):
        got = f"got {type(out).__name__}" if not isinstance(out, tuple | list) else f"got {len(out)} items"
        raise Wrong(f"{case}: return a tuple ({', '.join(names)}), {got}")
    return out


def randn(*shape, g):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


class _Forbidden(Exception):
    pass


def uses_keyword(f, keyword):
    """Whether ``f``'s source passes ``keyword=`` to some call with a value other than a literal 0."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(f)))
    except (OSError, TypeError, SyntaxError):
        return False
    return any(isinstance(n, ast.keyword) and n.arg == keyword and not (isinstance(n.value, ast.Constant) and n.value.value == 0)
               for n in ast.walk(tree))


def alone(run, inputs, outputs, case, what, rows=(0, 1, 2)):
    """Wrong unless each example of ``rows`` run alone gives its row of ``outputs``, the model's outputs for the whole
    batch ``inputs`` (a tuple of tensors, the batch first in each): ``run(*inputs)`` gives the outputs of a batch, or
    raises Wrong. Within ``1e-4 (1 + max |row|)``: the same model on a batch of one and on a batch of many rounds its
    sums in another order. A softmax or a normalization over the batch dimension is what this finds: each example's
    answer then depends on the others, and an accuracy measured on a batch can pass with it."""
    for i in rows:
        got = run(*(x[i:i + 1] for x in inputs))
        want = outputs[i:i + 1]
        if not (isinstance(got, torch.Tensor) and got.shape == want.shape and
                (got.double() - want.double()).abs().max().item() <= 1e-4 * (1 + want.abs().max().item())):
            raise Wrong(f"{case}: the output for {what} {i} run alone, a batch of one, differs from its row in the "
                        "batch: each example's output must not depend on the others in its batch (a softmax or a "
                        "normalization over the batch dimension?).")


def inside(*functions):
    """A ``Watch`` refusal: whether a torch call is made while one of ``functions`` runs (its frame is on the stack),
    so that an answer that calls a forbidden helper is caught however it reached it (imported under another name,
    through its module, or from a function of its own)."""
    codes = {inspect.unwrap(f).__code__ for f in functions}

    def refuse(func, args, kwargs):
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code in codes:
                return True
            frame = frame.f_back
        return False
    return refuse


def _graph_leaves(out):
    """The leaf tensors of ``out``'s autograd graph: those it was computed from that require a gradient."""
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        return []
    if out.grad_fn is None:
        return [out]
    leaves, seen, stack = [], set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)               # an AccumulateGrad node: a leaf
        if isinstance(variable, torch.Tensor):
            leaves.append(variable)
        stack.extend(following for following, _ in node.next_functions)
    return leaves


def _held(obj, found, seen, depth=0):
    """Adds to ``found`` the tensors ``obj`` holds that training could set: a module's parameters, and tensors that
    require a gradient, reached through functions (their closures, the globals they name, ``__wrapped__``), bound
    methods, ``functools.partial``, containers and the attributes of other objects, a few levels deep."""
    if depth > 6 or id(obj) in seen or isinstance(obj, str | bytes | numbers.Number | type | types.ModuleType):
        return
    seen.add(id(obj))
    if isinstance(obj, torch.nn.Module):
        found.extend(obj.parameters())
        return
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() and obj.requires_grad:
            found.append(obj)
        return
    held = []
    if isinstance(obj, types.FunctionType):
        for cell in obj.__closure__ or ():
            try:
                held.append(cell.cell_contents)
            except ValueError:                             # a cell not yet filled
                pass
        codes, names = [obj.__code__], set()
        while codes:                                       # the names it and its nested functions read as globals
            code = codes.pop()
            names.update(code.co_names)
            codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        held += [obj.__globals__[n] for n in sorted(names) if n in obj.__globals__]
        held.append(getattr(obj, "__wrapped__", None))
    elif isinstance(obj, types.MethodType):
        held += [obj.__self__, obj.__func__]
    elif isinstance(obj, functools.partial):
        held += [obj.func, *obj.args, *obj.keywords.values()]
    elif isinstance(obj, dict):
        held += list(obj.values())
    elif isinstance(obj, list | tuple | set | frozenset):
        held += list(obj)
    else:                                                  # any other object: its attributes
        attributes = getattr(obj, "__dict__", None)
        if isinstance(attributes, dict):
            held += list(attributes.values())
    for item in held:
        if item is not None:
            _held(item, found, seen, depth + 1)


def parameters_of(model, *inputs):
    """The distinct floating-point tensors that ``model``'s outputs are computed from and that training could have set:
    the leaves of the autograd graph of ``model(*inputs)`` run with gradients on, and the parameters (or tensors that
    require a gradient) that it holds, as a module or a function (so that a trained model returned inside a function
    run under ``torch.no_grad`` is found too). An open exercise shuffles them (``shuffled``) to ask whether what its
    model does comes from them, or from code that would do it without any training."""
    found = []
    try:
        with torch.enable_grad():
            found += _graph_leaves(model(*inputs))
    except Exception:  # noqa: BLE001 (the model ran on these inputs before: this only asks what it was computed from)
        pass
    _held(model, found, set())
    unique = {}
    for t in found:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            unique.setdefault(id(t), t)
    return list(unique.values())


@contextlib.contextmanager
def shuffled(tensors, generator):
    """Each of ``tensors`` with its entries in a random order (drawn from ``generator``), in place, for the body of the
    ``with``; put back afterwards, even when the body raises. A trained model's weights shuffled so are noise of the
    same size: what it learned is gone, while a model whose work is written in its code, with a scale or a bias that
    is the same in every entry, does just as well."""
    saved = []
    try:
        with torch.no_grad():
            for t in tensors:
                original = t.detach().clone()
                order = torch.randperm(t.numel(), generator=generator)
                try:
                    t.copy_(original.flatten()[order].reshape(t.shape))
                except RuntimeError:      # a tensor that cannot be written in place (an inference tensor): left as is
                    continue
                saved.append((t, original))
        yield
    finally:
        with torch.no_grad():
            for t, original in reversed(saved):
                t.copy_(original)


# Cases drawn with a torch generator (a model's weights, a layer), and counts read from what the answer returned -----

def generator():
    """A torch generator for this check's cases, seeded from ``fresh()``: afresh at each check, so that no case
    can be learned from a message, and reproducible under ``verdict(..., seed=...)``."""
    return torch.Generator().manual_seed(fresh().integer(0, 2 ** 31 - 1))


def pick(g, options):
    return options[int(torch.randint(len(options), (1,), generator=g))]


def as_integer(got, case, what, inf_ok=False):
    """``got`` as an int: Python or NumPy integers and 0-d integer tensors, and a whole float (a count computed in
    floating point, such as ``D.max().item()``, is right; 9.5.2's ``compare_number(exact=True)`` takes one too);
    never a bool, a fractional float or a string, nor a tensor of shape (1,) (with ``inf_ok``, also infinity:
    math.inf, as ``min`` of nothing)."""
    if isinstance(got, bool | np.bool_):
        raise Wrong(f"{case}: the {what} should be an integer, got a bool ({got})")
    value = _one(got, case, what, "one integer" + (" or math.inf" if inf_ok else ""))
    if inf_ok and isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_) and value == math.inf:
        return math.inf
    if isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_):
        return int(value)
    if isinstance(value, numbers.Real | decimal.Decimal) and not isinstance(value, bool | np.bool_):
        # Any real number whose value is whole: a float, a NumPy float, a Fraction or a Decimal
        if value == math.inf and inf_ok:
            return math.inf
        if math.isfinite(value) and value == int(value):
            return int(value)
        shown = _kind(got) if isinstance(got, float | np.floating) else f"{_kind(got)} {value}"   # not twice
        raise Wrong(f"{case}: the {what} should be an integer{' or math.inf' if inf_ok else ''}, got {shown}")
    raise Wrong(f"{case}: the {what} should be an integer{' or math.inf' if inf_ok else ''}, got {_kind(got)}")
