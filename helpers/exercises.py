"""Checkers for the chapter's exercises: ``check("9.3.3", my_rope)``.

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
  so is a number computed through half-precision tensors (``.item()`` hides the dtype, so the answer's
  torch calls are watched: ``_Watch``), with a message naming the dtype rather than a hint about the
  formula.
- **Tolerances a float32 answer meets.** Floats are compared within ``rtol * (|want| + 0.1 max|want|)``
  with ``rtol`` at least 1e-4 (an answer computed in float32, even one returned as float64, is
  correct); a failing entry is shown with as many digits as it takes for expected and got to differ,
  and the error. An expected entry that is not finite (``-inf`` for a query that saw no key, NaN) must be
  matched exactly: the same infinity, NaN where NaN is expected.
- **A time limit.** Each check stops after ``time_limit`` seconds (20 by default; ``signal.setitimer``
  in the main thread, where a notebook kernel runs ``check``, or a watcher thread elsewhere) and says
  which case the answer was running. The stop is an exception, so an answer that catches every exception in
  a loop that never ends (a bare ``except:``, which also catches Jupyter's interrupt) cannot be stopped from
  Python: restart the kernel.
- **"Not attempted" only for the untouched starter**: a function whose body is only ``...`` (the
  starter's ``...  # your code here``) or only ``raise NotImplementedError``, read from its source (or,
  without source, its byte code). Anything else is run: an answer that returns None is told so ("did
  you print instead of return?"), a body of only ``pass`` is told so, and an exception raised anywhere
  in the answer's code, NotImplementedError from an unfinished helper included, is reported with the
  case it failed on and where it was raised.

Writing a checker
-----------------
::

    @exercise("9.N.k", "what a correct answer has shown, without computed numbers", time_limit=10)
    def _(answer):
        r = fresh()                                    # this check's hidden cases
        for case, (n, d) in cases([(3, 4), (5, 8)], [(r.integer(1, 9), r.choice([2, 6]))],
                                  lambda n, d: f"n = {n}, d = {d}"):
            x = r.randn(n, d)                          # float64, drawn afresh
            want = ...                                 # computed before the answer runs
            compare(call(answer, x, case=case), want, case, mistakes=[(wrong_result, "hint")], hint="...")

``call(answer, *args, case=None, watch=None, **kwargs)`` runs the answer (``case``, keyword-only, names the case
in a message when the answer raises or runs out of time: pass it always; ``watch=_Watch()`` refuses a number
computed through float16 or bfloat16 tensors, and is passed by every checker that compares a float number).
``compare`` (tensors), ``compare_number`` (numbers) and ``pair`` (a tuple of results) raise ``Wrong``;
``NotAttempted`` marks a starter. ``randn(*shape, g=generator)`` and the ``atol``/``rtol`` arguments of
``compare`` still work as before (an ``rtol`` below 1e-4 is raised to it, the float32 floor). A shortcut
an exercise forbids is caught by ``uses_keyword(answer, "label_smoothing")`` (the answer's source) and by
``call(answer, ..., watch=_Watch(refuse, why))`` (every torch call the answer makes, however the function was
imported and its arguments passed).
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
import inspect
import math
import numbers
import os
import random
import signal
import sys
import textwrap
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

TIME_LIMIT = 20.0          # seconds per check, unless an exercise sets its own


class Wrong(Exception):
    """The answer failed a case; the message says which, and how."""


class NotAttempted(Exception):
    """The starter is still as it was."""


class _Raised(Exception):
    """The answer raised ``error`` on ``case``."""

    def __init__(self, case, error):
        super().__init__(case, error)
        self.case, self.error = case, error


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


_now = _State()   # (the checkers below have their own _state)


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
    _now.case, _now.calls, _now.in_answer, _now.half = None, 0, False, None
    try:
        if answer is None or answer is Ellipsis or (callable(answer) and _starter(answer) == "starter"):
            raise NotAttempted
        _within(limit, lambda: exercise_.run(answer))
    except NotAttempted:
        return None, f"Exercise {number}: not attempted yet. Complete {name} above and run the cell again."
    except Wrong as wrong:
        return False, f"Exercise {number}: not yet. {wrong}"
    except _Raised as raised:
        return False, f"Exercise {number}: not yet. On {raised.case}, {name} {_raised(raised.error, name)}"
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
    return True, f"Exercise {number}: correct. {exercise_.done}"


def check(number, answer):
    """Run exercise ``number``'s checker on ``answer`` and print its verdict."""
    print(verdict(number, answer)[1])


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
        _now.draw, _now.calls = state
        try:
            outcome["value"] = run()
        except BaseException as error:  # noqa: BLE001 (handed back to the caller's thread)
            outcome["error"] = error
        outcome["case"], outcome["in_answer"] = _now.case, _now.in_answer
    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise _TimeUp
    _now.case, _now.in_answer = outcome.get("case"), outcome.get("in_answer", False)
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
    if isinstance(error, NotImplementedError):
        inner = frames[-1].name if frames else "a function it calls"
        return (f"raised NotImplementedError{where}: {inner + ' is' if inner != name else 'it is'} not finished. "
                "Complete it, or compute the result without it.")
    return f"raised {type(error).__name__}: {_first_line(error)}{where}"


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
    body of ``pass`` raises Wrong. ``watch``, a ``_Watch``, watches the answer's torch calls as it runs: a
    call it refuses, or (with ``watch.half_refused``) a float16 or bfloat16 tensor made along the way, raises
    Wrong, even when the answer caught the refusal and went on.
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
    # nothing, so that a failing comparison can name the precision instead of a formula (a right formula computed
    # in bfloat16 and returned as float32 is off by 1e-3), while a half tensor used for something else, such as
    # a dtype's size, changes nothing when the answer is right.
    watch = _Watch(half_refused=False) if watch is None else watch
    _now.case, _now.in_answer, _now.half = label, True, None
    try:
        with contextlib.redirect_stdout(tee), watch:
            out = f(*given, **given_kw)
    except _Forbidden as forbidden:
        raise Wrong(f"{label}: {name} {forbidden}") from None
    except Exception as error:
        if watch.refused:
            raise Wrong(f"{label}: {name} {watch.why}") from None
        raise _Raised(label, error) from error
    _now.in_answer = False          # (left True when time runs out in the answer, for verdict's message)
    _now.half = watch.half
    if watch.refused:
        raise Wrong(f"{label}: {name} {watch.why}")
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
        raise Wrong(f"{label}: {name} computed with {watch.half} tensors, which keep about {_HALF_DIGITS[watch.half]} "
                    "significant digits, too few for this check: compute in float32 or float64.")
    return out


# Half precision: about how many significant digits each keeps, said in the messages that refuse it.
_HALF_DIGITS = {torch.float16: 3, torch.bfloat16: 2}


class _Watch(TorchFunctionMode):
    """Watches the torch calls of the answer that runs inside it (``call(..., watch=...)``).

    It notes the dtype of the first float16 or bfloat16 tensor the answer makes (``half``; refused after the
    call when ``half_refused``), and refuses each call that ``refuse(func, args, kwargs)`` flags: it raises
    ``_Forbidden(why)`` and notes it (``refused``), so that an answer that catches the exception is still
    refused. Every route to a torch function passes here, whatever name the answer imported it under and
    however it passed the arguments: a Python function such as ``F.cross_entropy`` comes with its arguments
    as its signature names them (``label_smoothing`` among the keywords, even when given by position).
    """

    def __init__(self, refuse=None, why="", half_refused=True):
        super().__init__()
        self.refuse, self.why, self.half_refused = refuse, why, half_refused
        self.half, self.refused = None, False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.refuse is not None and self.refuse(func, args, kwargs):
            self.refused = True
            raise _Forbidden(self.why)
        out = func(*args, **kwargs)
        if self.half is None:
            for t in out if isinstance(out, tuple | list) else (out,):
                if isinstance(t, torch.Tensor) and t.dtype in _HALF_DIGITS:
                    self.half = t.dtype
                    break
        return out


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
    # No known mistake fits and the answer computed in half precision: that, not the formula, is the first suspect.
    if _now.half is not None and not hints:
        return Wrong(f"{case}: {detail}. Your function computed with {_now.half} tensors, which keep about "
                     f"{_HALF_DIGITS[_now.half]} significant digits, too few for this check: compute in float32 or "
                     "float64.")
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
        fail(f"the {what} should have shape {tuple(want.shape)}, got {tuple(got.shape)}")
    if want.dtype == torch.bool and got.dtype != torch.bool:
        raise Wrong(f"{case}: the {what} should be boolean (torch.bool, True where hidden), got {got.dtype}")
    if want.dtype != torch.bool and not want.is_floating_point():
        if got.dtype not in (torch.int64, torch.int32):
            raise Wrong(f"{case}: the {what} should be integers (torch.long), got {got.dtype}"
                        + (": a float tensor cannot index a table" if got.is_floating_point() else ""))
    if want.is_floating_point():
        if got.dtype not in (torch.float32, torch.float64):
            advice = {True: "compute in float32 or float64", False: "the result is real-valued: compute it in floating point"}
            raise Wrong(f"{case}: the {what} should hold floating-point numbers (float32 or float64), got {got.dtype}: "
                        + advice[got.is_floating_point()])
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


def _as_number(got, case, what):
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


def compare_number(got, want, case, mistakes=(), hint="", what="answer", exact=False, rtol=1e-3, atol=0.0):
    """Raise ``Wrong`` unless the number ``got`` equals ``want``: exactly (``exact``, an integer), or within
    ``rtol`` (0.1% by default) and ``atol``. A string, a bool or a tensor of more than one number is not a number."""
    g = _as_number(got, case, what)
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


# 9.1 -----------------------------------------------------------------------------------------------

def _sdpa(Q, K, V, scale, dim=-1):
    w = torch.softmax(Q @ K.transpose(-2, -1) * scale, dim=dim)
    return w @ V, w


@exercise("9.1.1", "Your weights sum to one over the keys and your outputs are softmax(QK^T / sqrt(d_k)) V, "
                   "with and without leading batch dimensions.")
def _(answer):
    r = fresh()

    def describe(m, n, d, d_v, lead):
        batch = f"a batch of {' x '.join(map(str, lead))}, " if lead else ""
        return f"{batch}{m} quer{'y' if m == 1 else 'ies'}, {n} keys, d_k = {d}, d_v = {d_v}"
    hidden = [(r.integer(2, 6), r.integer(2, 9), r.choice([8, 12, 20, 24, 48]), r.integer(1, 6),
               r.choice([(), (3,), (2, 2)])) for _ in range(3)]
    for case, (m, n, d, d_v, lead) in cases([(3, 5, 16, 2, ()), (1, 7, 64, 3, ()), (4, 6, 32, 5, (2,))], hidden, describe):
        Q, K, V = r.randn(*lead, m, d), r.randn(*lead, n, d), r.randn(*lead, n, d_v)
        want_out, want_w = _sdpa(Q, K, V, d ** -0.5)
        mistakes = [
            (_sdpa(Q, K, V, 1.0)[1], "Your weights are softmax(QK^T) without the scale: divide the scores by sqrt(d_k)."),
            (_sdpa(Q, K, V, 1 / d)[1], "You divided the scores by d_k: the scale is 1/sqrt(d_k)."),
            (_sdpa(Q, K, V, d_v ** -0.5)[1], "Scale by sqrt(d_k), the width of the queries and keys, not of the values."),
            (_sdpa(Q, K, V, d ** -0.5, dim=-2)[1],
             "Your weights sum to one over the queries: take the softmax over the keys (dim=-1)."),
            (want_w.transpose(-2, -1), "Your weights are transposed: row i should hold query i's weights over the keys."),
        ]
        out, w = pair(call(answer, Q, K, V, case=case), case, ("outputs", "weights"))
        if isinstance(out, torch.Tensor) and isinstance(w, torch.Tensor) and out.shape == want_w.shape \
                and w.shape == want_out.shape and want_w.shape != want_out.shape:
            raise Wrong(f"{case}: your first result has the weights' shape and the second the outputs': "
                        "return (outputs, weights), in that order.")
        compare(w, want_w, case, what="weights", mistakes=mistakes, hint="Scores are Q K^T / sqrt(d_k), one row per query.")
        compare(out, want_out, case, what="outputs", hint="Your weights are right: the outputs are weights @ V.")


def _kernel_weights(u, k, rho, h):
    """Nadaraya-Watson weights at the point rho u (u (d,) of norm 1) over keys k (n, d), Gaussian kernel of bandwidth h.

    exp(-|rho u - k_i|^2 / 2h^2), normalized: a softmax of its logarithm, since the kernel itself underflows to 0
    for every key once |rho u - k|^2 / 2h^2 passes about 745.
    """
    return torch.softmax(-((rho * u - k) ** 2).sum(-1) / (2 * h ** 2), dim=0)


@exercise("9.1.2", "Your bandwidth makes the Nadaraya-Watson weights equal to softmax(q . k) for every query norm "
                   "and key norm tried: h = sqrt(rho / r).")
def _(answer):
    r_ = fresh()
    hidden = [(r_.log_uniform(0.1, 100.0), r_.log_uniform(0.1, 100.0)) for _ in range(4)]
    for case, (r, rho) in cases([(9.0, 4.0), (0.25, 3.0), (100.0, 0.5), (2.0, 8.0)], hidden,
                                lambda r, rho: f"query norm r = {r:.4g}, key norm rho = {rho:.4g}"):
        h = call(answer, r, rho, case=case, watch=_Watch())
        compare_number(h, math.sqrt(rho / r), case, what="bandwidth", rtol=1e-5, mistakes=[
            (1 / math.sqrt(r), "The keys' norm matters too: the query point is rho u, and |rho u - k|^2 = 2 rho^2 - 2 rho u.k."),
            (rho / r, "That is h^2: take the square root."),
            (math.sqrt(r / rho), "Upside down: a longer query makes the weights sharper, so the bandwidth shrinks as r grows."),
            (rho / math.sqrt(r), "The term in u.k is rho u.k / h^2 (|k|^2 = rho^2 is the same for every key and cancels): "
                                 "h^2 = rho / r, not rho^2 / r."),
        ], hint="Expand |rho u - k|^2 / (2 h^2) and match the term in u.k with r u.k.")
        # What the message says: the kernel weights built with the answer's h are attention's weights, on keys
        # of norm rho in a few dimensions.
        n, d = r_.integer(10, 30), r_.choice([2, 3, 5, 8])
        u = r_.randn(d)
        u = u / u.norm()
        k = r_.randn(n, d)
        k = rho * k / k.norm(dim=1, keepdim=True)
        compare(_kernel_weights(u, k, rho, float(_as_number(h, case, "bandwidth"))), torch.softmax(k @ (r * u), 0),
                f"{case}, the Nadaraya-Watson weights at rho u with your h against softmax(q . k), over {n} keys in "
                f"{d} dimensions", what="Nadaraya-Watson weights",
                hint="With this h the kernel weights are not attention's: check h for this r and rho.")


# 9.2 -----------------------------------------------------------------------------------------------

def _masks(lengths, T):
    j = torch.arange(T)
    causal = j[None, :] > j[:, None]                                   # (T, T): key after query
    pad_keys = j[None, None, :] >= torch.as_tensor(lengths)[:, None, None]   # (B, 1, T)
    pad_queries = j[None, :, None] >= torch.as_tensor(lengths)[:, None, None]
    return causal, pad_keys, pad_queries


@exercise("9.2.1", "Your mask hides exactly the future and the padding keys, for every batch tried.")
def _(answer):
    r = fresh()
    hidden = []
    for _ in range(3):
        T = r.integer(1, 8)
        hidden.append(([r.integer(1, T) for _ in range(r.integer(1, 4))], T))
    for case, (lengths, T) in cases([([3, 5], 5), ([1, 4, 2], 4), ([6], 6)], hidden,
                                    lambda lengths, T: f"lengths {lengths}, T = {T}"):
        causal, pad_keys, pad_queries = _masks(lengths, T)
        want = causal | pad_keys
        off_by_one = torch.arange(T)[None, :] >= torch.arange(T)[:, None]
        pad_late = torch.arange(T)[None, None, :] > torch.as_tensor(lengths)[:, None, None]
        compare(call(answer, torch.tensor(lengths), T, case=case), want, case, what="mask", mistakes=[
            (~want, "True should mark what a query may NOT see (as nn.MultiheadAttention): your mask is inverted."),
            (off_by_one | pad_keys, "The diagonal is hidden: a query may attend to its own position "
                                    "(j > i is hidden, not j >= i)."),
            (causal | pad_queries, "You hid padding queries: pad the keys, j >= length, so the mask's last axis."),
            (causal & pad_keys.expand(-1, T, -1), "Combine the masks with |: a key is hidden if it is in the future OR padding."),
            (causal.expand(len(lengths), T, T), "The padding is missing: also hide keys j >= length."),
            (causal | pad_late, "Off by one in the padding: the real keys are 0 .. length - 1, so hide j >= length."),
            (~causal | pad_keys, "The causal part is reversed: hide the keys after the query (j > i), not those up to it."),
        ], hint="Hide key j from query i where j > i or j >= the sequence's length.")


def _mqa(x, Wq, Wk, Wv, heads, causal=True, split=True, scale=None, merge=True, dim=-1):
    B, T, d = x.shape
    q = (x @ Wq).view(B, T, heads, d // heads).transpose(1, 2) if split else (x @ Wq).view(B, heads, T, d // heads)
    k, v = (x @ Wk)[:, None], (x @ Wv)[:, None]                        # (B, 1, T, d_h): one head, shared
    s = q @ k.mT * (scale or (d // heads) ** -0.5)
    if causal:
        ones = torch.ones(T, T, dtype=torch.bool)
        hide = {"diagonal": torch.triu(ones, 0), "transposed": torch.tril(ones, -1)}.get(causal, torch.triu(ones, 1))
        s = s.masked_fill(hide, float("-inf"))
    y = torch.softmax(s, dim) @ v                                      # (B, H, T, d_h)
    return y.transpose(1, 2).reshape(B, T, d) if merge else y.reshape(B, T, d)


@exercise("9.2.3", "Your multi-query attention equals multi-head attention whose heads all use the same key and value "
                   "weights, causally, for every shape tried.")
def _(answer):
    r = fresh()
    hidden = []
    for _ in range(2):
        H = r.integer(1, 4)
        hidden.append((r.integer(1, 3), r.integer(1, 7), H * r.choice([2, 3, 5, 6, 8]), H))
    # Head widths 4, 8, 6 and 5: an answer that reads a notebook's d_k or hard-codes one fails.
    for case, (B, T, d, H) in cases([(2, 5, 8, 2), (1, 6, 16, 2), (2, 4, 18, 3), (1, 3, 5, 1)], hidden,
                                    lambda B, T, d, H: f"B = {B}, T = {T}, d = {d}, {H} head{'s' * (H > 1)} of width {d // H}"):
        x, Wq, Wk, Wv = r.randn(B, T, d), r.randn(d, d), r.randn(d, d // H), r.randn(d, d // H)
        # Multi-head attention with every head's key and value weights equal to the shared ones.
        Wk_all, Wv_all = Wk.repeat(1, H), Wv.repeat(1, H)
        q, kk, v = ((x @ W).view(B, T, H, d // H).transpose(1, 2) for W in (Wq, Wk_all, Wv_all))
        s = (q @ kk.mT / (d // H) ** 0.5).masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        want = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, d)
        mistakes = [
            (_mqa(x, Wq, Wk, Wv, H, causal=False), "Later tokens leak into earlier ones: add the causal mask."),
            (_mqa(x, Wq, Wk, Wv, H, scale=d ** -0.5), "Scale by 1/sqrt(d_h), the width of one head, not 1/sqrt(d)."),
            (_mqa(x, Wq, Wk, Wv, H, scale=1.0), "The scores are not scaled: divide them by sqrt(d_h), the width of one head."),
            (_mqa(x, Wq, Wk, Wv, H, causal="diagonal"), "The mask hides the diagonal too, so the first token sees nothing (NaN): "
                                                 "hide only the keys after the query, triu(..., diagonal=1)."),
            (_mqa(x, Wq, Wk, Wv, H, split=False), "Split the queries into heads with view(B, T, H, d_h).transpose(1, 2), "
                                                  "not view(B, H, T, d_h): that mixes tokens into heads."),
            (_mqa(x, Wq, Wk, Wv, H, merge=False), "Put the heads back with transpose(1, 2) before the reshape to (B, T, d)."),
            (_mqa(x, Wq, Wk, Wv, H, dim=-2), "The softmax runs over the keys, the last axis (dim=-1): each query's "
                                             "weights sum to one, not each key's."),
            (_mqa(x, Wq, Wk, Wv, H, causal="transposed"), "The mask is transposed: it hides the keys before each query. "
                                                          "Hide those after it, j > i: triu(..., diagonal=1)."),
        ]
        compare(call(answer, x, Wq, Wk, Wv, H, case=case), want, case, mistakes=mistakes,
                hint="Every head's queries attend to the same keys x Wk and values x Wv; d_h = d / heads.")


# 9.3 -----------------------------------------------------------------------------------------------

@exercise("9.3.2", "Your far weights are right for steep and shallow heads, short and long sequences.")
def _(answer):
    r = fresh()
    hidden = []
    for _ in range(3):
        m, T = r.log_uniform(2 ** -10, 1.0), r.integer(2, 3000)
        # A far weight above about e^-6, so that 1 - (near weight) in float32, a right answer, keeps 4 digits.
        hidden.append((m, T, r.integer(0, max(0, min(T - 2, int(6 / m) - 1)))))
    for case, (m, T, w) in cases([(0.5, 16, 4), (1 / 16, 1024, 64), (2 ** -8, 4096, 512), (0.25, 8, 0)], hidden,
                                 lambda m, T, w: f"slope {m:.4g}, T = {T}, window {w}"):
        delta = torch.arange(T, dtype=torch.float64)                   # distances of the keys 0 .. T-1 back
        weight = torch.exp(-m * delta)
        want = float(weight[delta > w].sum() / weight.sum())
        mistakes = [
            (float(weight[delta >= w].sum() / weight.sum()), "More than w back means distances w + 1 .. T - 1: "
                                                             "distance w itself is inside the window."),
            (float(weight[delta > w].sum()), "Normalize: divide by the sum of exp(-m delta) over all T keys."),
            (float(torch.exp(m * delta)[delta > w].sum() / torch.exp(m * delta).sum()), "The bias is -m delta: "
                                                                                          "the weight falls with distance."),
        ]
        compare_number(call(answer, m, T, w, case=case, watch=_Watch()), want, case, atol=1e-12, mistakes=mistakes,
                       hint="With equal content scores the weights are softmax(-m delta) over delta = 0 .. T - 1.")


def _rope(x, scale=1.0, sign=1.0, start=0, halves=False):
    T, d = x.shape[-2:]
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
    angle = sign * (torch.arange(start, start + T, dtype=x.dtype) / scale)[:, None] * omega
    cos, sin = angle.cos(), angle.sin()
    a, b = (x[..., : d // 2], x[..., d // 2:]) if halves else (x[..., 0::2], x[..., 1::2])
    ra, rb = a * cos - b * sin, a * sin + b * cos
    return torch.cat([ra, rb], -1) if halves else torch.stack([ra, rb], -1).flatten(-2)


@exercise("9.3.3", "Your rotation matches RoPE at scale 1 and rotates by t / scale at larger scales, batched too.")
def _(answer):
    r = fresh()
    hidden = [((*r.choice([(), (2,), (2, 3)]), r.integer(1, 9), r.choice([2, 6, 10, 12])), r.choice([1.0, 1.5, 3.0, 8.0]),
               r.choice([torch.float64, torch.float32])) for _ in range(3)]
    shown = [((5, 4), 1.0, torch.float64), ((8, 8), 4.0, torch.float64), ((2, 3, 6, 4), 2.0, torch.float64),
             ((3, 6), 1.5, torch.float64)]
    for case, (shape, scale, dtype) in cases(shown, hidden, lambda shape, scale, dtype:
                                             f"x of shape {shape}, {str(dtype)[6:]}, scale {scale:g}"):
        x = r.randn(*shape, dtype=dtype)
        x64 = x.double()
        want = _rope(x64, scale)
        mistakes = [
            (_rope(x64, scale, sign=-1.0), "Your pairs rotate the wrong way: (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos)."),
            (_rope(x64, 1 / scale), "To stretch the context divide the positions by the scale, t / scale, not multiply."),
            (_rope(x64, 1.0), "The scale is ignored: rotate position t by (t / scale) omega_j."),
            (_rope(x64, scale, start=1), "Positions start at 0: the first row is not rotated."),
            (_rope(x64, scale, halves=True), "Pair coordinates 2j and 2j+1 (interleaved), as the chapter's rope does, "
                                             "not j and j + d/2."),
        ]
        compare(call(answer, x, scale, case=case), want, case, mistakes=mistakes,
                hint="Row t, pair (2j, 2j+1), rotates by the angle (t / scale) * 10000^(-2j/d).")


# 9.4 -----------------------------------------------------------------------------------------------

@exercise("9.4.2", "Your gradient matches autograd's: 2 w log Z softmax(z) / N, which pulls every logit down "
                   "in proportion to its probability while log Z is positive.")
def _(answer):
    r = fresh()
    hidden = [(r.integer(1, 8), r.integer(2, 60), r.uniform(-10.0, 25.0), r.log_uniform(1e-4, 2.0)) for _ in range(2)]
    for case, (N, V, shift, w) in cases([(4, 10, 5.0, 1e-4), (3, 7, -3.0, 0.01), (6, 50, 20.0, 1.0)], hidden,
                                        lambda N, V, shift, w: f"{N} row{'s' * (N > 1)} of {V} logits around {shift:.3g}, "
                                                               f"weight {w:.3g}"):
        z = r.randn(N, V) + shift
        log_z = torch.logsumexp(z, -1, keepdim=True)
        p = torch.softmax(z, -1)
        want = 2 * w * log_z * p / N
        mistakes = [
            (w * log_z * p / N, "The derivative of (log Z)^2 is 2 log Z times that of log Z: the factor 2 is missing."),
            (2 * w * log_z * p, "The loss is a mean over the N rows: divide by N."),
            (2 * w * log_z / V / N + 0 * p, "d log Z / dz_j is softmax(z)_j, not 1 / V."),
            (2 * log_z * p / N, "Multiply by the weight w."),
            (2 * w * z * p / N, "Use log Z = logsumexp(z) over the row, not the logits themselves."),
            (-want, "The sign is flipped: the gradient of w (log Z)^2 is +2 w log Z softmax(z) / N, and yours is its "
                    "negative."),
        ]
        compare(call(answer, z, w, case=case), want, case, what="gradient", mistakes=mistakes,
                hint="d/dz_j of w mean_rows (log Z)^2 is 2 w log Z softmax(z)_j / N.")


_SMOOTHING = ("uses label_smoothing, which the exercise asks you to do without (in F.cross_entropy or "
              "nn.CrossEntropyLoss, however it is passed): build the smoothed targets yourself (F.cross_entropy with "
              "the targets as probabilities is fine).")


def _label_smoothing(func, args, kwargs):
    """Whether a torch call is a cross-entropy with label smoothing, passed by keyword or by position."""
    if func is F.cross_entropy or func is _CROSS_ENTROPY:
        position = 7                   # (input, target, weight, size_average, ignore_index, reduce, reduction, eps)
    elif func is torch._C._nn.cross_entropy_loss:
        position = 5                   # (input, target, weight, reduction, ignore_index, label_smoothing)
    else:
        return False
    value = kwargs.get("label_smoothing", args[position] if len(args) > position else 0.0)
    try:
        return float(value) != 0.0
    except (TypeError, ValueError, RuntimeError):
        return True


_CROSS_ENTROPY = F.cross_entropy


@exercise("9.4.3", "Your loss matches cross-entropy against the smoothed targets (1 - eps) one-hot + eps / V.")
def _(answer):
    r = fresh()
    if uses_keyword(answer, "label_smoothing"):
        raise Wrong(f"{getattr(answer, '__name__', 'your answer')} {_SMOOTHING}")
    hidden = [(r.integer(2, 9), r.integer(2, 12), r.uniform(0.05, 0.4)) for _ in range(2)]
    for case, (N, V, eps) in cases([(5, 4, 0.1), (8, 10, 0.2), (3, 3, 0.0)], hidden,
                                   lambda N, V, eps: f"{N} rows, {V} classes, eps = {eps:.3g}"):
        z = r.randn(N, V) * 2
        t = torch.randint(V, (N,), generator=r.torch)
        log_p = torch.log_softmax(z, -1)
        one_hot = F.one_hot(t, V).double()
        want = -((1 - eps) * one_hot + eps / V) * log_p
        others = -((1 - eps) * one_hot + eps / (V - 1) * (1 - one_hot)) * log_p
        no_shrink = -(one_hot + eps / V) * log_p
        not_target = -((1 - eps) * one_hot + eps / V * (1 - one_hot)) * log_p
        mistakes = [
            (others.sum(-1).mean().item(), "Spread eps over all V classes, the target included (eps / V each), "
                                           "as the original transformer and F.cross_entropy do, not over the other V - 1."),
            (no_shrink.sum(-1).mean().item(), "The target keeps 1 - eps (plus its share eps / V), not 1."),
            (not_target.sum(-1).mean().item(), "The true class gets its share eps / V too: its target is 1 - eps + eps / V."),
            (-(want.sum(-1)).mean().item(), "A loss is positive: the cross-entropy is -sum(target * log p)."),
            (want.sum().item(), "Average over the rows, as F.cross_entropy does: a mean, not a sum."),
            ((-((1 - eps) * one_hot + eps / V) * torch.softmax(z, -1)).sum(-1).mean().item(),
             "Use log-probabilities (log_softmax), not probabilities."),
        ]
        got = call(answer, z, t, eps, case=case, watch=_Watch(_label_smoothing, _SMOOTHING))
        compare_number(got, want.sum(-1).mean().item(), case, what="loss", rtol=1e-5, mistakes=mistakes,
                       hint="Targets (1 - eps) for the true class plus eps / V for every class; "
                            "loss -sum(target * log_softmax(z)).")


# 9.5 -----------------------------------------------------------------------------------------------

def _state(s, v):
    """A tile's (m, l, acc) for scores s (queries, keys); a query whose scores are all -inf gets (-inf, 0, 0)."""
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - torch.where(m.isinf(), torch.zeros_like(m), m))
    return m, e.sum(-1, keepdim=True), e @ v


@exercise("9.5.1", "Your merged state is the one a single pass over both tiles gives, and acc / l is exact attention.")
def _(answer):
    r = fresh()
    hidden = [(r.integer(1, 5), r.integer(1, 6), r.integer(1, 6), r.integer(1, 4), r.choice([-40.0, -5.0, 0.0, 5.0, 40.0]))
              for _ in range(2)]

    def describe(m_q, n_a, n_b, d_v, offset):
        shifted = f", tile b's scores shifted by {offset:+g}" if offset else ""
        return f"{m_q} quer{'y' if m_q == 1 else 'ies'}, tiles of {n_a} and {n_b} keys, d_v = {d_v}{shifted}"
    for case, (m_q, n_a, n_b, d_v, offset) in cases([(3, 4, 5, 2, 0.0), (2, 3, 3, 2, 30.0), (4, 6, 2, 3, -30.0)], hidden,
                                                    describe):
        s_a, s_b = r.randn(m_q, n_a) * 3, r.randn(m_q, n_b) * 3 + offset
        v_a, v_b = r.randn(n_a, d_v), r.randn(n_b, d_v)
        a, b = _state(s_a, v_a), _state(s_b, v_b)
        m, total, acc = _state(torch.cat([s_a, s_b], -1), torch.cat([v_a, v_b]))
        got = pair(call(answer, a, b, case=case), case, ("m", "l", "acc"))
        compare(got[0], m, case, what="maximum m", hint="The merged maximum is max(m_a, m_b), elementwise.", mistakes=[
            (a[0] + b[0], "The merged maximum is max(m_a, m_b), not their sum."),
        ])
        for what, got_x, want, x_a, x_b in (("normalizer l", got[1], total, a[1], b[1]), ("sum acc", got[2], acc, a[2], b[2])):
            compare(got_x, want, case, what=what, mistakes=[
                (x_a + x_b, f"Rescale each tile's {what} to the new maximum: multiply by exp(m_tile - m) before adding."),
                (x_a * torch.exp(m - a[0]) + x_b * torch.exp(m - b[0]),
                 "The rescaling factor is exp(m_tile - m), at most 1: yours is upside down."),
            ], hint=f"{what} = {what.split()[-1]}_a exp(m_a - m) + {what.split()[-1]}_b exp(m_b - m).")
    # Queries that saw no key in a tile (a fully masked row, as tiled_attention meets): m = -inf, l = 0, acc = 0 for
    # that tile. Mixed in one batch, as they come: an answer that special-cases a batch of them all fails here.
    case = ("the last case (4 queries: the first saw keys in tile a only, the second in neither tile, the third in "
            "both, the fourth in tile b only; a tile with no key has m = -inf, l = 0, acc = 0)")
    s_a, s_b = r.randn(4, 3) * 3, r.randn(4, 2) * 3
    s_a[[1, 3]], s_b[[0, 1]] = float("-inf"), float("-inf")
    v_a, v_b = r.randn(3, 3), r.randn(2, 3)
    a, b = _state(s_a, v_a), _state(s_b, v_b)
    want = _state(torch.cat([s_a, s_b], -1), torch.cat([v_a, v_b]))
    got = pair(call(answer, a, b, case=case), case, ("m", "l", "acc"))
    compare(got[0], want[0], case, what="maximum m", hint="A query that saw no key keeps m = -inf, the maximum of "
                                                           "nothing, in the merged state too: change only the shift.")
    for what, got_x, want_x in zip(("normalizer l", "sum acc"), got[1:], want[1:], strict=True):
        compare(got_x, want_x, case, what=what, hint="Where both tiles saw no key, exp(m_a - m) is "
                                                     "exp(-inf - (-inf)) = NaN: where m is -inf, shift by 0 instead "
                                                     "(torch.where), as tiled_attention does.")


@exercise("9.5.2", "Your cache sizes are exact for multi-head, grouped-query and multi-query models.")
def _(answer):
    r = fresh()
    hidden = []
    for _ in range(3):
        kv_heads = r.choice([1, 2, 4, 8])
        hidden.append((r.integer(1, 80), kv_heads * r.integer(1, 8), kv_heads, r.choice([32, 64, 80, 96, 128, 256]),
                       r.integer(1, 100_000), r.integer(1, 16), r.choice([1, 2, 4])))
    # The first case tells apart every mistake below but a forgotten bytes_per (1 byte per number): no two of its
    # factors are equal and none is 2; the second tells that one apart (4 bytes, no factor 4 elsewhere). The shown
    # cases cover every kind the message names, whatever the hidden ones draw: grouped-query (cases 1 to 3),
    # multi-query (case 4) and multi-head (case 5, GPT-2 medium's shape: kv_heads = heads). Case 6's product,
    # 2^5 x 283,497,165, has an odd factor above 2^24: float32 cannot hold it, so a product rounded there fails.
    shown = [(28, 40, 8, 128, 4096, 3, 1), (32, 32, 8, 128, 8192, 2, 4), (2, 8, 2, 16, 64, 1, 4), (24, 16, 1, 64, 1000, 3, 2),
             (24, 16, 16, 64, 1024, 3, 4), (27, 9, 3, 80, 99_999, 7, 1)]

    def describe(layers, heads, kv_heads, d_head, T, batch, nbytes):
        return (f"{layers} layers, {heads} query heads, {kv_heads} key-value head{'s' * (kv_heads > 1)} of width {d_head}, "
                f"{T:,} tokens, batch {batch}, {nbytes} byte{'s' * (nbytes > 1)} per number")
    for case, (layers, heads, kv_heads, d_head, T, batch, nbytes) in cases(shown, hidden, describe):
        want = 2 * layers * kv_heads * d_head * T * batch * nbytes
        mistakes = [
            (want // kv_heads * heads, "Only the key-value heads are cached: use kv_heads, not the query heads."),
            (want // kv_heads * (heads // kv_heads), "Use kv_heads, the number of key-value heads, not the group size "
                                                     "heads / kv_heads."),
            (want // 2, "Both keys and values are cached: a factor 2."),
            (want // layers, "Every layer has its own cache: multiply by the number of layers."),
            (want // batch, "Each sequence in the batch has its own cache: multiply by the batch size."),
            (want // nbytes, "Count bytes: multiply by the bytes per number."),
            (want // nbytes * 2, "Use the argument bytes_per: not every cache holds 2-byte numbers."),
            (want * 8, "Count bytes, not bits: bytes_per is already in bytes."),
            (want // d_head, "Each head caches a vector of d_head numbers per token: multiply by d_head."),
            (want * 2, "Keys and values make one factor 2: yours counts it twice."),
        ]
        wrapped = (want + 2 ** 31) % 2 ** 32 - 2 ** 31              # the product computed in int32, wrapped around
        if wrapped != want:
            mistakes.append((wrapped, f"{wrapped:,} is what this product gives when computed in int32 (a torch.int32 or "
                                      f"NumPy int32 tensor), which wraps around past {2 ** 31 - 1:,}: compute it in "
                                      "Python ints or int64."))
        got = call(answer, layers, heads, kv_heads, d_head, T, batch, nbytes, case=case)
        value = _as_number(got, case, "number of bytes")
        if isinstance(value, float) and value != want and math.isclose(value, want, rel_tol=1e-6):
            raise Wrong(f"{case}: expected {want:,}, got {value:,.0f}, off by {abs(value - want):,.0f}: the product was "
                        "rounded in floating point (float32 keeps 24 bits, exact only up to 16,777,216). Compute it in "
                        "Python ints or int64.")
        compare_number(got, want, case, exact=True,
                       what="number of bytes", mistakes=mistakes,
                       hint="2 (keys and values) x layers x kv_heads x d_head x T x batch x bytes per number.")


# 9.6 -----------------------------------------------------------------------------------------------

@exercise("9.6.1", "Your tokens match the linear map of flattened patches, in the same raster order.")
def _(answer):
    r = fresh()
    hidden = []
    for _ in range(2):
        P = r.integer(1, 4)
        hidden.append((r.integer(1, 3), P * r.integer(1, 4), P * r.integer(1, 4), P, r.integer(1, 6)))
    for case, (C, H, W, P, d) in cases([(3, 8, 8, 4, 5), (1, 6, 9, 3, 4), (2, 4, 8, 2, 6)], hidden,
                                       lambda C, H, W, P, d: f"image {(C, H, W)}, patches {P} x {P}, d = {d}"):
        img, W_lin, b = r.randn(C, H, W), r.randn(d, C * P * P), r.randn(d)
        grid = img.unfold(1, P, P).unfold(2, P, P)                     # (C, H/P, W/P, P, P)
        flat = grid.permute(1, 2, 0, 3, 4).reshape(-1, C * P * P)       # raster order, each patch as (C, P, P)
        want = flat @ W_lin.T + b
        channels_last = grid.permute(1, 2, 3, 4, 0).reshape(-1, C * P * P) @ W_lin.T + b
        columns = grid.permute(2, 1, 0, 3, 4).reshape(-1, C * P * P) @ W_lin.T + b
        compare(call(answer, img, W_lin, b, P, case=case), want, case, what="tokens", mistakes=[
            (want.T, "Return one row per patch, (number of patches, d): transpose the (d, patches) output."),
            (channels_last, "Reshape the weight to (d, C, P, P): a patch flattens channel first, as in the helpers' patches."),
            (columns, "The patches go in raster order, row by row: flatten the (H/P, W/P) grid, do not transpose it."),
            (want - b, "Add the bias."),
        ], hint="F.conv2d(img[None], W_lin.view(d, C, P, P), b, stride=P), then flatten the grid into rows.")


@exercise("9.6.2", "Your index gives each relative offset its own entry of the table, and pairs of tokens with equal "
                   "offsets the same entry.")
def _(answer):
    r = fresh()
    # The first hidden window is never a shown one nor M = 1 (whose index, [[0]], a table's fallback of zeros
    # gets right), so that a table of the shown cases fails on every check; the second is any M up to 9.
    for case, M in cases([2, 3, 7], [r.choice([4, 5, 6, 8, 9]), r.integer(1, 9)], lambda M: f"window {M} x {M}"):
        y, x = torch.div(torch.arange(M * M), M, rounding_mode="floor"), torch.arange(M * M) % M
        dy, dx = y[:, None] - y[None, :], x[:, None] - x[None, :]          # query minus key
        want = (dy + M - 1) * (2 * M - 1) + (dx + M - 1)
        compare(call(answer, M, case=case), want, case, what="index", mistakes=[
            (dy * (2 * M - 1) + dx, "Shift the offsets by M - 1 so that they start at 0: an index cannot be negative."),
            ((dy + M - 1) * M + (dx + M - 1), "Each row offset has 2M - 1 column offsets: multiply by 2M - 1, not M, "
                                                "or different offsets share an entry."),
            (want.T, "Offsets are the query's position minus the key's: yours are the key's minus the query's."),
            ((dx + M - 1) * (2 * M - 1) + (dy + M - 1), "Rows first: the index is (dy + M - 1)(2M - 1) + (dx + M - 1)."),
        ], hint="index[a, b] = (dy + M - 1)(2M - 1) + (dx + M - 1), dy and dx query minus key.")


@exercise("9.6.3", "Your resized table keeps the class token and interpolates the grid of patch positions.")
def _(answer):
    r = fresh()
    hidden = []
    for _ in range(2):
        n = r.integer(1, 6)
        hidden.append((n, n + r.integer(1, 6), r.integer(1, 6)))
    for case, (n, n_new, d) in cases([(2, 3, 4), (4, 6, 3), (14, 24, 8)], hidden,
                                     lambda n, n_new, d: f"{n} x {n} grid to {n_new} x {n_new}, d = {d}"):
        pos = r.randn(1 + n * n, d)

        def resize(grid, n_new=n_new):                                    # (d, n, n) -> (n_new^2, d)
            grid = F.interpolate(grid[None], size=(n_new, n_new), mode="bilinear", align_corners=False)[0]
            return grid.flatten(1).T

        grid = pos[1:].reshape(n, n, d).permute(2, 0, 1)                  # (d, n, n)
        want = torch.cat([pos[:1], resize(grid)])
        compare(call(answer, pos, n_new, case=case), want, case, what="table", mistakes=[
            (torch.cat([pos[:1], resize(pos[1:].reshape(d, n, n))]),
             "Reshape to (n, n, d) and then move d first: reshape(d, n, n) mixes positions and features."),
            (torch.cat([pos[:1], resize(grid.transpose(1, 2))]),
             "The grid is transposed: the first spatial axis is the row, in raster order."),
            (resize(grid), "Keep the class token: row 0 of the table, unchanged, before the grid."),
            (resize(pos[:n * n].reshape(n, n, d).permute(2, 0, 1)),
             "Row 0 is the class token, not a patch: interpolate rows 1 .. n^2 only."),
        ], hint="Row 0 is the class token, kept as it is; rows 1.. are an n x n grid in raster order, interpolated "
                "bilinearly (align_corners=False) to n_new x n_new.")


# New experiment exercises (9.1.3, 9.2.2, 9.3.1, 9.4.1, 9.5.3, 9.A.*) ---------------------------------
# Each check draws fresh cases (from ``fresh()``: a new seed every time, or verdict's ``seed``), computes what
# it expects before the answer runs, hands the answer copies through ``call`` (which names the case and tells
# an answer that changed its input so), and checks the type of what comes back.

def _fresh():
    """A torch generator for this check's cases, seeded from ``fresh()``: afresh at each check, so that no case
    can be learned from a message, and reproducible under ``verdict(..., seed=...)``."""
    return torch.Generator().manual_seed(fresh().integer(0, 2 ** 31 - 1))


def _pick(g, options):
    return options[int(torch.randint(len(options), (1,), generator=g))]


def _integer(got, case, what, inf_ok=False):
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
    if isinstance(value, float | np.floating) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    raise Wrong(f"{case}: the {what} should be an integer{' or math.inf' if inf_ok else ''}, got {_kind(got)}")


# 9.1.3: decoding the reversal model with some source positions hidden ----------------------------------

def _decode_hiding(model, source, offsets, relative=1, copied=True, renormalize=True, context=True, wrap=False,
                   teacher=False, tanh=True, start=False):
    """Greedy decoding with source positions n - 1 - t + o, o in offsets, hidden at output step t (``teacher``:
    the mistake of feeding the true reversed digit instead of the model's own prediction; ``start``: of feeding
    the start symbol at every step)."""
    n = source.shape[1]
    with torch.no_grad():
        h, _ = model.encoder(model.embed(source))
        s = torch.tanh(model.init(h.mean(1))) if tanh else model.init(h.mean(1))
        prev = torch.full_like(source[:, 0], model.vocab)
        logits, weights = [], []
        for t in range(n):
            c, a = model.attention(s, h)
            hide = torch.zeros(n, dtype=torch.bool)
            for o in offsets:
                i = (n - 1 - t if copied else t) + relative * o
                if 0 <= i < n or (wrap and -n <= i < 0):
                    hide[i] = True
            a = a.masked_fill(hide, 0.0)
            if renormalize:
                a = a / a.sum(-1, keepdim=True)
            if context:
                c = (a[:, :, None] * h).sum(1)
            s = model.cell(torch.cat([model.embed(prev), c], -1), s)
            logit = model.out(torch.cat([s, c], -1))
            logits.append(logit)
            weights.append(a)
            prev = source[:, n - 1 - t] if teacher else prev if start else logit.argmax(-1)
    return torch.stack(logits, 1), torch.stack(weights, 1)


_OWN_PREDICTION = ("Feed the model's own previous prediction, the argmax of its last logits, as AttentionSeq2Seq.forward "
                   "does without a target: the true digit source[:, n - 1 - t] is teacher forcing.")


@exercise("9.1.3", "With the positions you hid, your decoder's weights and logits are those of the model's own "
                   "decoding loop with the hidden weights removed and the rest renormalized, also where an offset "
                   "points before the start of the string.")
def _(answer):
    from helpers.models import AdditiveAttention, AttentionSeq2Seq
    g = _fresh()
    # One case hides the copied position or its neighbours, one reaches past the start of the string (-1).
    offset_sets = (([0], [1], [0, 1]), ([-1, 0], [-1, 2]), ([0], [1], [-1, 0], [0, 1], [-1, 2]))
    for k in range(1, 4):
        n, d, B = _pick(g, (4, 5, 6, 7)), _pick(g, (8, 12, 16)), _pick(g, (3, 5, 8))
        offsets = list(_pick(g, offset_sets[k - 1]))
        case = f"case {k} of 3 (strings of {n} digits, width {d}, offsets {offsets})"
        with torch.random.fork_rng():
            torch.manual_seed(int(torch.randint(2**31, (1,), generator=g)))
            model = AttentionSeq2Seq(10, d, AdditiveAttention(d, d, d)).eval()
            with torch.no_grad():
                model.out.weight.mul_(8.0)          # clear winners: greedy decoding does not hinge on rounding
                # An initial state tanh(init(mean h)) well inside tanh's bend, so that forgetting the tanh moves the
                # first weights by many times the tolerance, not by about as much (3e-5 against 1e-5 at scale 1).
                model.init.weight.mul_(8.0)
        source = torch.randint(10, (B, n), generator=g)
        want_logits, want_w = _decode_hiding(model, source, offsets)
        teacher_logits, teacher_w = _decode_hiding(model, source, offsets, teacher=True)
        # (call hands the answer a copy of the model and of the source, and tells an answer that changed them so.)
        got = pair(call(answer, model, source, offsets, case=case), case, ("logits", "weights"))
        start_w = _decode_hiding(model, source, offsets, start=True)[1]
        compare(got[1], want_w, case, what="weights", atol=1e-5, rtol=1e-4, mistakes=[
            (teacher_w, _OWN_PREDICTION),
            (start_w, "Every step is fed the start symbol: after each step, feed the model's own prediction, "
                      "prev = the argmax of its logits, as AttentionSeq2Seq.forward does."),
            (_decode_hiding(model, source, offsets, tanh=False)[1],
             "The decoder starts from s = tanh(init(mean of h)), as AttentionSeq2Seq.forward does: the tanh is missing."),
            (_decode_hiding(model, source, offsets, relative=-1)[1],
             "Offset +1 is the position after the one being copied: n - 1 - t + 1, not n - 1 - t - 1."),
            (_decode_hiding(model, source, offsets, copied=False)[1],
             "At output step t the decoder copies source position n - 1 - t, not position t."),
            (_decode_hiding(model, source, offsets, renormalize=False)[1],
             "The weights left should sum to one again: divide by their sum (or set the hidden scores to -inf)."),
            (_decode_hiding(model, source, offsets, wrap=True)[1],
             "A position outside 0 .. n - 1 does not exist: skip it (a negative index wraps around to the end)."),
            (_decode_hiding(model, source, offsets, context=False)[1],
             "Your first step's weights are right, but the context still comes from the old ones: "
             "c = sum_i a_i h_i with the new a."),
        ], hint="At step t hide positions n - 1 - t + o for each offset o, then renormalize the other weights.")
        compare(got[0], want_logits, case, what="logits", atol=1e-4, rtol=1e-4, mistakes=[
            (teacher_logits, _OWN_PREDICTION),
            (_decode_hiding(model, source, offsets, context=False)[0],
             "Your weights are right, but the context still comes from the old ones: c = sum_i a_i h_i with the new a."),
        ], hint="Your weights are right: feed the context sum_i a_i h_i and your own previous prediction, as "
                "AttentionSeq2Seq.forward does.")


# 9.2.2: how far back a layer sees, measured with gradients ----------------------------------------------

class _Conv(torch.nn.Module):
    def __init__(self, d, k, dilation):
        super().__init__()
        self.pad, self.conv = (k - 1) * dilation, torch.nn.Conv1d(d, d, k, dilation=dilation)

    def forward(self, x):
        return self.conv(F.pad(x.transpose(1, 2), (self.pad, 0))).transpose(1, 2)


class _Window(torch.nn.Module):
    """Causal attention that sees the w most recent positions (w = None: all of them)."""
    def __init__(self, d, w):
        super().__init__()
        self.mha, self.w = torch.nn.MultiheadAttention(d, 1, batch_first=True), w

    def forward(self, x):
        i, j = torch.arange(x.shape[1])[:, None], torch.arange(x.shape[1])[None, :]
        hidden = (j > i) | ((i - j >= self.w) if self.w else torch.zeros_like(j > i))
        return self.mha(x, x, x, attn_mask=hidden, need_weights=False)[0]


def _layer(g, d, T, kind):
    """A hidden layer (or stack) of the given kind, its sizes drawn from g, and how far back its last output sees."""
    if kind == "conv":
        k, dilation = _pick(g, (2, 3, 4, 5)), _pick(g, (1, 2, 3))
        conv = _Conv(d, k, dilation)
        with torch.no_grad():
            conv.conv.weight[..., -1] *= 0.1        # a weak tap at the output's own position: its largest gradient is
        return torch.nn.Sequential(conv), max(j * dilation for j in range(k) if j * dilation < T)   # farther back
    if kind == "window":
        w = _pick(g, (2, 3, 5, 8))
        return torch.nn.Sequential(_Window(d, w)), min(w - 1, T - 1)
    if kind == "stack":
        w, k = _pick(g, (2, 3, 4)), _pick(g, (2, 3))
        return torch.nn.Sequential(_Window(d, w), _Conv(d, k, 1), _Window(d, w)), min(2 * (w - 1) + k - 1, T - 1)
    if kind == "attention":
        return torch.nn.Sequential(_Window(d, None)), T - 1
    if kind == "faint":
        # Four taps, at distances 3 dil (every weight FAINT: the reach), 2 dil (0.1), dil (0.3: the largest gradient)
        # and 0 (drawn, times 0.1), and a bias of 12: for d = 2 and a random normal input each output is 12 +- about
        # 0.5, never outside [8, 16), where a float32 ulp is 2^-20 = 9.5e-7. Moving the farthest input by 1, in one
        # channel or in both, moves every output by 4e-6 or 8e-6, 4 to 8 ulps: an exact comparison always sees it,
        # and so does a gradient test (the gradient there is 8e-6, not 0), while torch.allclose's default tolerance,
        # 1e-8 + 1e-5 |y| >= 8e-5, is 10 times larger and never does; a gradient threshold of 1e-4 misses it too
        # (summed over both channels the gradient is 1.6e-5), but sees the tap 2 dil back.
        # Dilated (2 or 3) in every run: the inputs it depends on are not contiguous, so counting them is not the reach.
        dilation = _pick(g, (2, 3))
        conv = _Conv(d, 4, dilation)
        with torch.no_grad():
            weight = conv.conv.weight                               # (d, d, 4): tap 0 is the farthest input
            weight[..., 3] *= 0.1
            weight[..., 2], weight[..., 1], weight[..., 0] = 0.3, 0.1, _FAINT
            conv.conv.bias.fill_(12.0)
        return torch.nn.Sequential(conv), 3 * dilation
    return torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.Tanh()), 0


_FAINT = 4e-6                   # the faint tap's weights (see _layer)


@exercise("9.2.2", "Your measurement finds how far back the last output sees for a convolution, one whose farthest "
                   "input has a faint weight, windowed and full causal attention, a stack of them, and a layer that "
                   "sees only its own position.")
def _(answer):
    g = _fresh()
    # One case of each kind, every check, so that the message holds for each run. Cases 1-4 see back 1 .. T - 2
    # positions, case 5 all T - 1 and case 6 none: the first failing case then tells each mistake apart.
    # Case 4 is a convolution whose farthest input has a tiny weight: dependence, not strength, counts.
    kinds = ("conv", "window", "stack", "faint", "attention", "pointwise")
    for k, kind in enumerate(kinds, 1):
        T, d = _pick(g, (12, 16, 20, 24)), _pick(g, (2, 4))
        d = 2 if kind == "faint" else d             # (the faint case's margins, in _layer, are worked out for d = 2)
        with torch.random.fork_rng():
            torch.manual_seed(int(torch.randint(2**31, (1,), generator=g)))
            layer, want = _layer(g, d, T, kind)
        # What each mistake gives on this layer, from the gradient at a random input of our own: the last input that
        # matters is the output's own (T - 1) for every layer here; a convolution's gradient is the same for every
        # input, so its largest one and those above a threshold are the answer's too.
        x = torch.randn(1, T, d, generator=g, requires_grad=True)
        with torch.enable_grad():
            (grad,) = torch.autograd.grad(layer(x)[0, -1].sum(), x)
        size = grad[0].abs().sum(-1)                                       # (T,)
        mistakes = [
            (T - 1 - want, "Return the distance back, T - 1 minus the earliest input that matters, not that input's index."),
            (want + 1, "Count distances: a layer whose last output sees only its own input has reach 0."),
            (T - 1, "Differentiate the last output alone: an earlier output, or the sum of all outputs, sees other "
                    "inputs."),
            (T - 1 - int((size > 0).nonzero()[-1]), "That is the distance to the nearest input the last output depends "
                                                      "on, its own: the reach is to the farthest, the earliest position "
                                                      "whose gradient is not exactly zero (not the latest such position, "
                                                      "nor the one with the largest gradient)."),
        ]
        if kind in ("conv", "faint"):
            mistakes += [
                (int((size > 0).sum()) - 1, "That counts the inputs the last output depends on, minus one: a dilated "
                                            "convolution skips the inputs between its taps, so the reach is the distance "
                                            "to the farthest of them, T - 1 minus its position."),
                (T - 1 - int(size.argmax()), "That is the input with the largest gradient: the reach counts any "
                                             "dependence, however weak, so take the earliest position whose gradient "
                                             "is not exactly zero."),
                (T - 1 - int((size > 1e-4).nonzero()[0]), "A small effect is still a dependence: this layer's farthest "
                                                            "input has a tiny weight, so count every gradient (or change "
                                                            "of the output) that is not exactly zero, with no threshold or "
                                                            "tolerance such as torch.allclose's."),
            ]
        case = f"case {k} of {len(kinds)} (a hidden layer, T = {T}, d = {d})"
        got = _integer(call(answer, layer, T, d, case=case), case, "reach")
        compare_number(got, want, case, exact=True, what="reach", mistakes=mistakes,
                       hint="x (1, T, d) with requires_grad; differentiate layer(x)[0, -1].sum(); the reach is T - 1 "
                            "minus the first position whose gradient is not exactly zero.")


# 9.3.1: the content advantage that overrides ALiBi's penalty ---------------------------------------------

def _advantage(m, T, delta, others=True, penalty=True):
    dist = torch.arange(T, dtype=torch.float64)
    rest = torch.logsumexp(-m * dist[dist != delta], 0).item() if others else 0.0
    return (m * delta if penalty else 0.0) + rest


@exercise("9.3.1", "Your advantage gives the far key exactly half of the last query's weight, for steep and shallow "
                   "heads, short and long sequences.")
def _(answer):
    r = fresh()
    # Shown: the steepest and the shallowest head of the section, short and long sequences, near and far keys
    # (the last one the farthest key there is), none of them a case the solution prints. Hidden: any slope,
    # length and key.
    shown = [(2.0 ** -1, 16, 3), (2.0 ** -8, 4096, 3000), (2.0 ** -4, 1024, 64), (2.0 ** -6, 100, 99)]
    hidden = []
    for _ in range(3):
        T = r.integer(8, 5000)
        hidden.append((r.log_uniform(2 ** -9, 1.0), T, r.integer(1, T - 1)))

    def describe(m, T, delta):
        slope = f"1/{1 / m:.0f}" if (1 / m).is_integer() else f"{m:.4g}"
        return f"slope {slope}, T = {T}, a key {delta} back"
    for case, (m, T, delta) in cases(shown, hidden, describe):
        want = _advantage(m, T, delta)
        got = call(answer, m, T, delta, case=case, watch=_Watch())
        compare_number(got, want, case, what="advantage", mistakes=[
            (_advantage(m, T, delta, others=False), "The other T - 1 keys compete: half the weight means "
                                                     "exp(b - m delta) equals the sum of their weights."),
            (_advantage(m, T, delta, penalty=False), "The key's own bias, -m delta, counts against it too."),
        ], hint="Weights softmax over keys at distances 0 .. T - 1 with scores -m delta', plus b for the one key "
                "delta back: solve for the b that gives it one half.")


# 9.4.1: the residual stream's size, block by block --------------------------------------------------------

def _stream(blocks, x, inputs=False, reduce="rms", normalized=False):
    out = [x] if inputs else []
    with torch.no_grad():
        for block in blocks:
            x = block(x)
            out.append(block.norm1(x) if normalized else x)
    if reduce == "rms":
        return torch.stack([z.pow(2).mean().sqrt() for z in out])
    if reduce == "norm":
        return torch.stack([z.norm() for z in out])
    return torch.stack([z.std() for z in out])


@exercise("9.4.1", "Your measurement is the RMS of the residual stream after each block, for stacks of every depth "
                   "tried.")
def _(answer):
    from helpers.models import PreNormBlock
    g = _fresh()
    for k in range(1, 4):
        L, d, B, T = _pick(g, (2, 3, 5)), _pick(g, (8, 16)), _pick(g, (2, 3)), _pick(g, (4, 6))
        case = f"case {k} of 3 ({L} pre-norm blocks of width {d}, x of shape {(B, T, d)})"
        with torch.random.fork_rng():
            torch.manual_seed(int(torch.randint(2**31, (1,), generator=g)))
            blocks = torch.nn.Sequential(*[PreNormBlock(d, torch.nn.Linear(d, d)) for _ in range(L)])
            with torch.no_grad():
                for p in blocks.parameters():
                    p.mul_(2.0)                             # a stream that visibly grows
        x = 3 * torch.randn(B, T, d, generator=g) + 1      # a mean away from zero, so RMS and std differ
        want = _stream(blocks, x)
        got = call(answer, blocks, x, case=case)
        if isinstance(got, list | tuple) and all(isinstance(v, numbers.Real | torch.Tensor) for v in got):
            raise Wrong(f"{case}: return a tensor of {L} numbers (torch.stack or torch.tensor), got a {type(got).__name__}")
        compare(got, want, case, what="RMS after each block", atol=1e-5, rtol=1e-4, mistakes=[
            (_stream(blocks, x, inputs=True), "One value per block, after it: leave out the input."),
            (_stream(blocks, x, inputs=True)[:-1], "Measure after each block, not before it: the first value is the "
                                                   "RMS of block 1's output, the last that of the final block's."),
            (_stream(blocks, x, reduce="norm"), "The RMS is the square root of the mean of the squares, not the norm."),
            (_stream(blocks, x, reduce="std"), "The RMS does not subtract the mean: sqrt(mean(x ** 2))."),
            (_stream(blocks, x, normalized=True), "Measure the stream itself, x after each block, not its normalized copy."),
        ], hint="x = block(x) for each block; after each, sqrt(mean(x ** 2)) over all entries.")


# 9.5.3: how many layers a sparse pattern needs to connect every pair --------------------------------------

def _diameter(pattern, hops=False, middle=False, first=False):
    T = pattern.shape[0]
    p = pattern.to(torch.float64)
    reach = p.clone()
    for n in range(1, T + 1):
        done = (reach[T // 2] > 0).all() if middle else (reach[0] > 0).all() if first else (reach > 0).all()
        if done:
            return n - 1 if hops else n
        reach = ((reach @ p) > 0).to(torch.float64)
    return math.inf


def _pattern(g, T, kinds=("window", "strided", "global", "random", "causal", "blocks"), r=None):
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    kind = _pick(g, kinds)
    r = r or _pick(g, (1, 2, 3))
    window = (i - j).abs() <= r
    if kind == "strided":
        return window | ((i - j) % _pick(g, (3, 4, 5)) == 0)
    if kind == "global":
        n = _pick(g, (1, 2))
        return window | (i < n) | (j < n)
    if kind == "random":
        return (torch.rand(T, T, generator=g) < 0.08) | (i == j)
    if kind == "causal":
        return window & (j <= i)                            # never reaches the future: never all connected
    if kind == "blocks":
        return (i // 4 == j // 4)                           # separate blocks: never connected
    return window


@exercise("9.5.3", "Your count is the fewest layers after which every query has received information from every "
                   "key, and math.inf for patterns that never connect them.")
def _(answer):
    g = _fresh()
    kinds = []
    for k in range(1, 7):
        T = _pick(g, (9, 12, 16, 20))
        # Case 1, a window of one neighbour on either side, tells the mistakes apart: T - 1 layers connect every
        # pair, T - 2 hops, T / 2 layers the middle token alone.
        pattern = _pattern(g, T, ("window",), r=1) if k == 1 else _pattern(g, T)
        if k == 2:                      # the first query sees every key at once, the others only their neighbours:
            pattern = _pattern(g, T, ("window",)) | (torch.arange(T)[:, None] == 0)   # counting it alone is too few
        if k == 6:                      # a directed pattern that never connects: symmetrizing it would connect it
            i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
            pattern = ((i - j).abs() <= 1) & (j <= i)
        want = _diameter(pattern)
        kinds.append(want)
        case = f"case {k} of 6 (a hidden {T} x {T} pattern)"
        got = _integer(call(answer, pattern, case=case), case, "number of layers", inf_ok=True)
        if want == math.inf or got == math.inf:
            if got != want:
                raise Wrong(f"{case}: expected {want}, got {got}. " + (
                    "Some key never reaches some query, however many layers: return math.inf." if want == math.inf else
                    "This pattern does connect every pair: keep adding layers until it does (at most T)."))
            continue
        compare_number(got, want, case, exact=True, what="number of layers", mistakes=[
            (_diameter(pattern, hops=True), "Count layers, not extra hops: one layer already connects what the pattern "
                                            "allows, so start at 1."),
            (want + 1, "Off by one: stop at the first number of layers after which everything is connected."),
            (_diameter(pattern, middle=True), "Every query must receive every key, not only the middle token."),
            (_diameter(pattern, first=True), "Every query must receive every key, not only the first one."),
        ], hint="Information from key j reaches query i after n layers where the boolean power pattern^n is True; "
                "find the smallest n at which it is True everywhere.")


# 9.A.1: the Jacobian of a softmax with a temperature ------------------------------------------------------

@exercise("9.A.1", "Your Jacobian equals autograd's for every temperature and length tried: (diag(p) - p p^T) / tau "
                   "with p = softmax(s / tau).")
def _(answer):
    g = _fresh()
    for k in range(1, 4):
        n, tau = _pick(g, (2, 5, 9)), _pick(g, (0.1, 0.5, 2.0, 7.0))
        case = f"case {k} of 3 ({n} scores, temperature {tau:g})"
        s = tau * torch.randn(n, generator=g, dtype=torch.float64)     # s / tau of unit scale: no saturated entries
        want = torch.autograd.functional.jacobian(lambda z, tau=tau: torch.softmax(z / tau, 0), s)
        p, p1 = torch.softmax(s / tau, 0), torch.softmax(s, 0)
        got = call(answer, s, tau, case=case)
        compare(got, want, case, what="Jacobian", atol=1e-6, rtol=1e-4, mistakes=[
            (torch.diag(p) - torch.outer(p, p), "The chain rule through s / tau gives a factor 1 / tau."),
            ((torch.diag(p) - torch.outer(p, p)) * tau, "The factor is 1 / tau, not tau."),
            ((torch.diag(p1) - torch.outer(p1, p1)) / tau, "Use p = softmax(s / tau), the probabilities at this temperature."),
            (torch.diag(p) / tau, "The off-diagonal terms -p_i p_j / tau are missing."),
        ], hint="J_ij = (p_i delta_ij - p_i p_j) / tau with p = softmax(s / tau).")


# 9.A.2: the gradient of a learned ALiBi slope, from the backward pass of Appendix C -----------------------

def _slope_forward(q, k, v, m):
    T = q.shape[-2]
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).to(q.dtype)
    s = q @ k.mT / q.shape[-1] ** 0.5 - m * dist
    s = s.masked_fill(dist < 0, float("-inf"))
    return torch.softmax(s, -1) @ v


def _slope_grad(q, k, v, m, d_out, variant=None):
    T = q.shape[-2]
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).to(q.dtype)
    s = (q @ k.mT / q.shape[-1] ** 0.5 - m * dist).masked_fill(dist < 0, float("-inf"))
    p = torch.softmax(s, -1)
    dp = d_out @ v.mT
    ds = p * (dp - (p * dp).sum(-1, keepdim=True)) if variant != "no_D" else p * dp
    if variant == "plus":
        return (ds * dist.clamp(min=0)).sum()
    if variant == "dp":
        return -(dp * dist.clamp(min=0)).sum()
    return -(ds * dist.clamp(min=0)).sum()


@exercise("9.A.2", "Your slope gradient equals autograd's in every case. Derived, it is dL/dm = -sum_ij dS_ij (i - j), "
                   "with dS from the softmax backward of Appendix C.")
def _(answer):
    g = _fresh()
    for k in range(1, 4):
        T, d, m = _pick(g, (3, 6, 10)), _pick(g, (2, 4, 8)), _pick(g, (0.05, 0.25, 1.0))
        case = f"case {k} of 3 (T = {T}, d = {d}, slope {m:g})"
        q, k_, v, d_out = (torch.randn(T, d, generator=g, dtype=torch.float64) for _ in range(4))
        slope = torch.tensor(m, dtype=torch.float64, requires_grad=True)
        (_slope_forward(q, k_, v, slope) * d_out).sum().backward()
        want = slope.grad.item()
        got = call(answer, q, k_, v, m, d_out, case=case, watch=_Watch())
        compare_number(got, want, case, what="gradient", mistakes=[
            (_slope_grad(q, k_, v, m, d_out, "plus").item(), "The bias is -m (i - j): its derivative in m is -(i - j)."),
            (_slope_grad(q, k_, v, m, d_out, "no_D").item(), "dS_ij = P_ij (dP_ij - D_i): the row term "
                                                             "D_i = sum_k P_ik dP_ik is missing."),
            (_slope_grad(q, k_, v, m, d_out, "dp").item(), "Go through the softmax: the bias enters the scores S, so "
                                                           "use dS, not dP."),
        ], hint="dP = dO V^T, dS = P * (dP - rowsum(P * dP)), and dL/dm = sum_ij dS_ij * d S_ij / d m = "
                "-sum_ij dS_ij (i - j) over the visible pairs.")
