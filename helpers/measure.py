"""Measuring attention (section 9.5): wall-clock time, peak memory, operation counts, and how they grow.

On the CPU the peak memory comes from the PyTorch profiler's memory events. The public profiler API
aggregates them per operator and loses their order, so ``_memory_events`` reads the raw event list
through an undocumented attribute; that one use is isolated there, with what it relies on.
"""

import contextlib
import functools
import gc
import math
import numbers
import os
import sys
import time

import numpy as np
import torch

from helpers import runtime
from helpers.checks import positive_float, positive_int


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _quiet_stderr():
    """Send file descriptor 2 to /dev/null for a moment (C++ logging does not go through sys.stderr)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _memory_events(prof):
    """``(start_ns, nbytes)`` of every allocation (positive) and free (negative) that ``prof`` recorded.

    Undocumented: ``prof.profiler.kineto_results`` is the raw trace behind the public
    ``key_averages()``; its ``events()`` carry, for the operator named ``"[memory]"``, the signed size
    (``nbytes()``) and the time (``start_ns()``). The public API sums sizes per operator, which loses
    the time order a running peak needs. Checked against torch 2.13 by tests/test_measure.py; if a
    release renames any of these, that test fails here rather than a figure going quietly wrong.
    """
    events = [(e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    return sorted(events, key=lambda e: e[0])            # stable: simultaneous events keep their order


# CPU measurements in progress, outermost first: each gathers the memory events of its own time span.
# One profiler runs at a time; a nested call stops it, hands its events to every enclosing measurement,
# runs its own, and restarts one for the enclosing measurements when it is done.
_open_events = []
_running = [None]


def _start_profiler():
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_stderr():                                # the profiler logs its start and stop on fd 2
        prof.start()
    _running[0] = prof


def _stop_profiler():
    prof, _running[0] = _running[0], None
    with _quiet_stderr():
        prof.stop()
    events = _memory_events(prof)
    for gathered in _open_events:                        # an inner call's allocations are the outer's too
        gathered.extend(events)



def peak_memory(fn, device=None, threads=None):
    """Bytes allocated by ``fn()`` at its peak, above what was allocated when it started (measured).

    On CUDA this is ``torch.cuda.max_memory_allocated``. On the CPU it is measured with the PyTorch
    profiler (``profile_memory=True``): every allocation and free is an event with its size, and the
    running sum of the events, in time order, peaks at the answer. The result of ``fn`` is freed
    inside the measurement, so it counts towards the peak. Calls may nest (``fn`` may call
    ``peak_memory`` itself): each returns the peak of its own span, the outer one including the inner's.

    ``threads``: run ``fn`` with torch's CPU kernels on that many threads (None: as the caller has them).
    It matters: a kernel may keep a buffer per thread. PyTorch's fused CPU attention kernel keeps about
    0.59 MB per thread for one head of width 64 at 4,096 tokens, so on 32 threads it needed 20 MB
    there, more than a tiled loop's 6 MB, and on one thread 1.7 MB.
    """
    device = torch.device("cpu" if device is None else device)
    if device.type == "cuda":
        with runtime.threads(threads):
            return _cuda_peak(fn, device)
    if device.type != "cpu":
        raise ValueError(f"peak_memory measures the CPU or CUDA, not {device.type}")
    with runtime.threads(threads):
        return _cpu_peak(fn)


def _cpu_peak(fn):
    if _running[0] is not None:
        _stop_profiler()                                 # an enclosing measurement's profiler
    _open_events.append([])
    try:
        _start_profiler()
        try:
            out = fn()
            del out
        finally:
            _stop_profiler()
    finally:
        events = _open_events.pop()
        if _open_events:
            _start_profiler()                            # the enclosing measurement goes on
    now = peak = 0
    for _, nbytes in events:
        now += nbytes                                    # positive: allocated, negative: freed
        peak = max(peak, now)
    return peak


_cuda_peaks = []      # for each CUDA measurement in progress, the highest allocation its nested calls saw


def _cuda_peak(fn, device):
    _sync(device)
    if _cuda_peaks:                                      # keep the enclosing call's peak before resetting it
        _cuda_peaks[-1] = max(_cuda_peaks[-1], torch.cuda.max_memory_allocated(device))
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    _cuda_peaks.append(0)
    try:
        out = fn()
        _sync(device)
        del out
    finally:
        highest = max(_cuda_peaks.pop(), torch.cuda.max_memory_allocated(device))
        if _cuda_peaks:
            _cuda_peaks[-1] = max(_cuda_peaks[-1], highest)
    return highest - base


def _cuda_warm_up(device, dtype):
    """One small matrix product on ``device``, synchronized: the first product on a CUDA device allocates
    cuBLAS's workspace, which stays allocated, so without it the first measurement would count it."""
    a = torch.ones(8, 8, device=device, dtype=dtype)
    torch.mm(a, a)
    _sync(device)


def _seed(value):
    """``value``, a seed for a ``torch.Generator``: an int in 0 .. 2**63 - 1 (what ``manual_seed`` takes), or ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value < 2**63:
        raise ValueError(f"seed must be an int in 0 .. 2**63 - 1, got {value!r}")
    return int(value)


def _sizes(values, name, increasing=False):
    """``values``, a sequence of positive ints (a list, range, array or tensor), as a list of ``int``; with
    ``increasing``, each larger than the one before (a rule about growth needs sizes that grow)."""
    if hasattr(values, "tolist"):
        values = values.tolist()                          # an array or tensor: its truth value is ambiguous
    if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
        raise ValueError(f"{name} must be a sequence of positive ints, got {values!r:.60}")
    values = list(values)
    if not values:
        raise ValueError(f"{name} must be positive ints, got {values!r}")
    values = [positive_int(v, f"every one of {name}") for v in values]
    if increasing and any(b <= a for a, b in zip(values[:-1], values[1:], strict=True)):
        raise ValueError(f"{name} must increase, each larger than the one before (the verdict asks whether the time "
                         f"grows with them), got {values}")
    return values


def attention_inputs(d=64, heads=1, dtype=torch.float32):
    """``inputs(T, generator, device) -> (q, k, v)``, each ``(1, heads, T, d)``: what ``timings`` and
    ``peak_memories`` give attention methods."""
    d, heads = positive_int(d, "d"), positive_int(heads, "heads")

    def inputs(T, generator, device):
        return torch.randn(3, 1, heads, T, d, generator=generator, device=device, dtype=dtype).unbind(0)

    return inputs


def peak_memories(methods, lengths, d=64, heads=1, device=None, dtype=torch.float32, seed=0, threads=1):
    """Peak memory of attention methods against the sequence length (measured by ``peak_memory``).

    ``methods`` maps a name to ``f(q, k, v)`` with ``q, k, v (1, heads, T, d)``. Returns
    ``{name: [bytes at each length]}``. Every call runs with torch's CPU kernels on ``threads`` threads
    (default 1, as ``timings`` times them), so that what is measured is the method's memory, the same
    on any machine, and not the number of the machine's cores times a kernel's buffer per thread
    (``peak_memory``); None leaves the caller's thread count. It shows no progress: section 9.5's
    measurements take seconds, and a progress line left under its cell ("peak memory (cpu): 6 steps") told
    a reader nothing.
    """
    if not methods:
        raise ValueError("give at least one method")
    if threads is not None:
        threads = positive_int(threads, "threads")
    lengths = _sizes(lengths, "lengths")
    device = torch.device("cpu" if device is None else device)
    inputs = attention_inputs(d, heads, dtype)
    g = torch.Generator(device=device).manual_seed(_seed(seed))
    results = {name: [] for name in methods}
    with torch.no_grad():
        if device.type == "cuda":
            _cuda_warm_up(device, dtype)                 # cuBLAS's workspace, allocated before the first measurement
        for T in lengths:
            q, k, v = inputs(T, g, device)
            for name, f in methods.items():
                results[name].append(peak_memory(functools.partial(f, q, k, v), device, threads))
    return results


def growth_exponent(x, y):
    """Least-squares slope of ``log y`` against ``log x``: ``y ~ x^slope``."""
    for name, series in (("x", x), ("y", y)):
        if isinstance(series, str | bytes) or not hasattr(series, "__len__") or any(
                isinstance(v, bool | np.bool_) for v in (series.tolist() if hasattr(series, "tolist") else series)):
            raise ValueError(f"growth_exponent takes two sequences of positive numbers, got {name} = {series!r:.60}")
    x, y = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
    if x.shape != y.shape or x.dim() != 1 or len(x) < 2:
        raise ValueError(f"need two 1-D series of equal length >= 2, got shapes {tuple(x.shape)} and {tuple(y.shape)}")
    for name, series in (("x", x), ("y", y)):
        if not series.isfinite().all():
            raise ValueError(f"growth exponents need finite values, got {name} = {series.tolist()}")
    if (x <= 0).any() or (y <= 0).any():
        raise ValueError("growth exponents need positive values")
    if (x == x[0]).all():
        raise ValueError(f"growth exponents need at least two different x, got x = {x.tolist()}")
    if (y == y[0]).all():
        return 0.0                                       # exactly: a constant does not grow
    lx, ly = x.log(), y.log()
    lx = lx - lx.mean()
    return float((lx * (ly - ly.mean())).sum() / (lx * lx).sum())


def register_sdpa_flops():
    """Make ``FlopCounterMode`` count ``scaled_dot_product_attention`` on the CPU; return the ops it added.

    Why: the counter's table (``torch.utils.flop_counter.flop_registry``, torch 2.13) has formulas for
    the CUDA kernels of ``F.scaled_dot_product_attention`` (flash, memory-efficient, cuDNN) but none for
    the CPU flash kernel it dispatches to, ``aten._scaled_dot_product_flash_attention_for_cpu``, nor for
    its backward, so on the CPU a model's attention would count as zero operations. This registers the
    counter's own SDPA formulas for those two ops, which take the same arguments as the CUDA flash
    kernel's: they count the full ``T x T`` score matrix, as the kernel computes it, mask or not.
    Calling it again adds nothing; if a release of torch registers the ops itself, it adds nothing.
    """
    from torch.utils import flop_counter

    aten = torch.ops.aten
    formulas = {aten._scaled_dot_product_flash_attention_for_cpu: flop_counter.sdpa_flop,
                aten._scaled_dot_product_flash_attention_for_cpu_backward: flop_counter.sdpa_backward_flop}
    added = []
    for op, formula in formulas.items():
        if op not in flop_counter.flop_registry:
            flop_counter.register_flop_formula(op, get_raw=True)(formula)
            added.append(op)
    return added


# ---------------------------------------------------------------------------------------------------
# Timing: one protocol for every timing the book shows (issue 21).


def count_flops(fn, *args, **kwargs):
    """Floating-point operations of ``fn(*args, **kwargs)`` counted by ``FlopCounterMode`` (SDPA included).

    Counted, not assumed: the counter adds up its formula for every matrix product and attention call
    that runs (``register_sdpa_flops`` supplies the one for the CPU attention kernel).
    """
    from torch.utils.flop_counter import FlopCounterMode

    register_sdpa_flops()
    with FlopCounterMode(display=False) as counter:
        fn(*args, **kwargs)
    return counter.get_total_flops()


def matmul_reference(d=64, dtype=torch.float32):
    """The fair reference for attention of head width ``d``: ``(T x d) @ (d x T)``, the rank-``d`` product of
    the scores. Returns ``(name, fn, inputs)`` as ``timings`` takes it: ``inputs(T, generator, device)``."""
    d = positive_int(d, "d")

    def inputs(T, generator, device):
        return (torch.randn(T, d, generator=generator, device=device, dtype=dtype),
                torch.randn(d, T, generator=generator, device=device, dtype=dtype))

    return f"reference: (T x {d}) @ ({d} x T)", torch.matmul, inputs


# How a passing verdict begins: what the reader is assured of, then the rules kept (``Timings.verdict``).
SOUND = "the timings are sound: "


class Timings:
    """What ``timings`` measured: per method and size a ``torch.utils.benchmark.Measurement`` (its median
    and IQR), the counted FLOPs, and the verdict. ``str()`` is the whole report, the protocol's verdict
    included; ``table()`` is what a reader is shown, the times (and rates) alone, and the verdict goes in
    the check cell below it (section 9.5: ``print(t.verdict())`` inside ``helpers.verify``, and a failed
    check when ``broken()`` is not empty), where tests/test_timings.py reads it back beside the table.
    ``where``: the device, in words ("the CPU", or the GPU's name)."""

    def __init__(self, sizes, names, measurements, flops, reference, rules, attempt, attempts, size_name, grows,
                 where="the CPU"):
        self.sizes, self.names, self.measurements, self.flops = sizes, names, measurements, flops
        self.reference, self.rules, self.attempt, self.attempts, self.size_name = reference, rules, attempt, attempts, size_name
        self.grows, self.where = grows, where

    def median(self, name):
        """Median seconds per call of ``name`` at every size."""
        return [m.median for m in self.measurements[name]]

    def spread(self, name):
        """IQR / median of ``name`` at every size."""
        return [m.iqr / m.median for m in self.measurements[name]]

    def rate(self, name):
        """Counted FLOPs per second of ``name`` at every size, as a fraction of the reference's best rate
        (over all sizes, measured in the same rounds): the most this machine did on that shape."""
        if not self.reference:
            raise ValueError("a rate is a fraction of the reference's: these timings were measured without one")
        best = max(f / t for f, t in zip(self.flops[self.reference], self.median(self.reference), strict=True))
        return [f / t / best for f, t in zip(self.flops[name], self.median(name), strict=True)]

    def quartiles(self, name):
        """``(lower, upper)`` quartile of the seconds per call of ``name`` at every size (as the median is
        taken by ``Measurement``: linear interpolation between the sorted rounds)."""
        out = []
        for m in self.measurements[name]:
            times = torch.tensor(sorted(m.times), dtype=torch.float64)
            out.append((times.quantile(0.25).item(), times.quantile(0.75).item()))
        return out

    def growth_problems(self, name):
        """How the time of ``name`` fails to grow with the size, in words; empty when it grows.

        It grows when (1) the median rises at every step from one size to the next, (2) by more than
        the rounds scatter: the lower quartile at the larger size lies above the upper quartile at the
        smaller, and (3) by at least ``growth`` times from the first size to the last. Rule 3 is what
        refuses a flat series: rules 1 and 2 alone hold by chance for a time that does not depend on the
        size (rule 1 at each step half the time), rule 3 only if noise moves a median by half its value.
        """
        t, quartiles, growth = self.median(name), self.quartiles(name), self.rules["growth"]
        found, s = [], self.size_name
        if any(b <= a for a, b in zip(t, t[1:], strict=False)):
            found.append(f"{name}: time does not grow with {s}")
        else:
            for i, ((_, upper), (lower, _)) in enumerate(zip(quartiles, quartiles[1:], strict=False)):
                if lower <= upper:
                    found.append(f"{name}: time does not grow with {s} beyond its spread from {s} = "
                                 f"{self.sizes[i]:,} to {self.sizes[i + 1]:,} (its quartiles overlap)")
                    break
        if t[-1] < growth * t[0]:
            found.append(f"{name}: time grows less than {growth:g} times from {s} = {self.sizes[0]:,} to {self.sizes[-1]:,}")
        return found

    def disturbances(self):
        """The rules a disturbed measurement breaks (spread, and a rate above the reference's), in words."""
        margin, bound = self.rules["margin"], self.rules["spread"]
        found = []
        for name in self.names:
            if max(self.spread(name)) > bound:
                found.append(f"{name}: spread above {bound:.0%}")
            if self.reference and name != self.reference and max(self.rate(name)) > 1 + margin:
                found.append(f"{name}: FLOP rate above the reference's by more than {margin:.0%}")
        return found

    def broken(self):
        """The rules this measurement breaks, in words; empty when it passes."""
        judged = len(self.sizes) > 1
        growth = [p for name in self.names if judged and name in self.grows for p in self.growth_problems(name)]
        return growth + self.disturbances()

    def rules_text(self):
        """The rules a sound measurement keeps, in a reader's words (the same rules ``broken`` applies)."""
        which = "every method" if set(self.grows) == set(self.names) else ", ".join(self.grows)
        s, margin = self.size_name, self.rules["margin"]
        return ", ".join(
            ([f"time grows with {s} for {which} (at least {self.rules['growth']:g} times from the first {s} to the"
              " last, and at each step by more than the repeats scatter)"] if self.grows and len(self.sizes) > 1 else [])
            + ([f"no method's counted FLOPs per second beat the reference product's best by more than {margin:.0%}"]
               if self.reference else [])
            + [f"repeats agree within {self.rules['spread']:.0%} (IQR / median)"])    # (one size: no growth to judge)

    def verdict(self):
        """The protocol's verdict, one line. Passed: what the timings keep (``SOUND``, then the rules), without
        the attempt that passed (``attempt``). Failed: after how many measurements, which rules broke, and why
        (or whether) measuring again may help."""
        rules, broken = self.rules_text(), self.broken()
        if not broken:
            return f"{SOUND}{rules}"
        s = "" if self.attempt == 1 else "s"
        head = f"verdict: FAILED after {self.attempt} measurement{s}: {'; '.join(broken)} (rules: {rules})."
        if not any(self.growth_problems(name) for name in self.grows if len(self.sizes) > 1):
            return f"{head} Other work on the machine disturbs timings most: run the cell again when it is idle"
        return (f"{head} A time that did not grow, or grew less than the rules ask, is not measured again: a repeat"
                " could pass by chance what does not grow")

    def _rows(self):
        """The table's lines below its title: the medians with their spreads, then the rates (with a reference)."""
        width = max(len(n) for n in self.names) + 1
        head = f"{self.size_name:<{width}}" + "".join(f"{s:>16,}" for s in self.sizes)
        lines = [head]
        for name in self.names:
            cells = "".join(f"{t * 1e3:>9.3g} ({s:3.0%})" for t, s in zip(self.median(name), self.spread(name), strict=True))
            lines.append(f"{name:<{width}}{cells}")
        if self.reference:
            lines += ["", "counted FLOPs per second, as a fraction of the reference's best", head]
            lines += [f"{name:<{width}}" + "".join(f"{r:>16.0%}" for r in self.rate(name))
                      for name in self.names if name != self.reference]
        return lines

    def table(self):
        """What a reader is shown: the median time per call and its spread (and the rates), without the verdict."""
        title = f"time per call on {self.where}, ms: median of {self.rules['rounds']} rounds (IQR / median)"
        return "\n".join([title, *self._rows()])

    def __str__(self):
        title = f"time per call: median of {self.rules['rounds']} interleaved rounds on 1 thread, ms (IQR / median)"
        verdict = self.verdict()
        if not self.broken():                  # the whole report also says which measurement passed
            verdict += f" (measurement {self.attempt} of at most {self.attempts})"
        return "\n".join([title, *self._rows(), verdict])


def _block(fn, args, number, device):
    _sync(device)
    start = time.perf_counter()
    for _ in range(number):
        fn(*args)
    _sync(device)
    return time.perf_counter() - start


@contextlib.contextmanager
def _no_gc():
    """The garbage collector off, as ``timeit`` (and so ``blocked_autorange``) has it while timing: a
    collection falling inside one block made its round an outlier (here, before: the IQR above a quarter
    of the median in 7 of 8 measurements of section 9.5's table; with it off, 2 of 8)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def timings(methods, sizes, inputs, reference=None, rounds=5, block=0.005, margin=0.2, spread=0.25, growth=1.5,
            attempts=None, grows=None, device=None, seed=0, size_name="T"):
    """Time ``methods`` at every size with one protocol, and judge the measurement; returns ``Timings``.

    ``methods`` maps a name to ``f(*inputs(size, generator, device))``; ``reference`` is ``(name, fn,
    inputs)`` (``matmul_reference``), timed in the same loop at every size; ``grows`` names the methods
    whose time must grow with the size (default: all, and the reference). The protocol:

    - each call runs on one thread (``torch.utils.benchmark``'s default), so another process on the
      machine disturbs it less and a rate means the same on any core count;
    - ``Timer.blocked_autorange`` warms every call up and times it, which sizes its block: enough calls
      for ``block`` seconds, at least one (blocked_autorange's own blocks, up to ten times longer than it
      is asked for, made 9.5's timings cost twice as long);
    - then ``rounds`` rounds, each timing one block of every method and the reference at every size,
      in an order rotated from round to round, so a disturbance spreads over all of them instead of
      falling on one, with the garbage collector off as ``timeit`` has it; a ``Measurement`` of the rounds
      gives the median and the IQR;
    - with a reference, FLOPs are counted with ``FlopCounterMode`` (``count_flops``), once per method and
      size, for the rates (without one, ``flops`` is empty: nothing uses them);
    - the verdict: the time grows with the size for every method in ``grows`` (``Timings.growth_problems``:
      the median rises at every step, beyond the quartiles of the rounds, and by ``growth`` times at least
      from the first size to the last), no method's counted FLOPs per second exceed the reference's best
      (over the sizes) by more than ``margin`` (the reference is what this machine does on this shape:
      more is a broken measurement), and every IQR is at most ``spread`` of its median;
    - a measurement is repeated only when its time grew and it was disturbed, that is when only a spread or
      a rate broke its rule, up to ``attempts`` measurements in all; a passing verdict says what the
      timings keep (``Timings.attempt`` says which measurement passed), a failing one that the last
      failed and why. A measurement whose time did not grow is final: a repeat never gives a failed
      growth rule a second chance, so a series passes it only if every measurement taken grew (before,
      a repeat after a failed growth rule gave a time that does not depend on the size a new chance: it
      passed in 13 or 14 of 20 runs with three attempts, 5 to 10 with one). ``attempts`` defaults to 3,
      or to the environment's ``BOOK_TIMING_ATTEMPTS``: ``make guarantees`` sets 1, since it runs two
      notebooks at once, where a verdict means nothing and its timings are not compared
      (tests/test_chapter.py).

    On a GPU (``device`` CUDA), a call at small sizes costs its kernel launches and Python's dispatch,
    some microseconds each whatever the size: the time is flat there, and the growth rule refuses it,
    rightly, since nothing grows. Time a GPU from sizes where the work takes several launches' time:
    section 9.5 times one head of width 64 from T = 2,048 on a GPU (about 1 GFLOP a call for the
    attention methods, some tens of microseconds at the tens of TFLOP/s of a current GPU, and a
    T x T matrix of 16 MB or more to write), against T = 128 on the CPU. The reference's rate is no
    bound there either: a GPU's fused attention kernels may run float32 on its tensor cores, which a
    float32 matrix product does not use by default, so 9.5 times a GPU without a reference.
    """
    from torch.utils.benchmark import Measurement, TaskSpec, Timer, set_torch_threads

    if not methods:
        raise ValueError("give at least one method")
    sizes, seed = _sizes(sizes, "sizes", increasing=True), _seed(seed)
    if attempts is None:
        env = os.environ.get("BOOK_TIMING_ATTEMPTS", "3")
        attempts = positive_int(int(env) if env.strip().isdecimal() else env, "the environment's BOOK_TIMING_ATTEMPTS")
    rounds, attempts = positive_int(rounds, "rounds"), positive_int(attempts, "attempts")
    if rounds < 3:
        raise ValueError(f"rounds must be at least 3 for an IQR, got {rounds}")
    block, spread = positive_float(block, "block"), positive_float(spread, "spread")
    if positive_float(growth, "growth") <= 1:
        raise ValueError(f"growth must be above 1 (the time at the largest size over the time at the smallest), got {growth!r}")
    if not (isinstance(margin, int | float) and not isinstance(margin, bool) and 0 <= margin < float("inf")):
        raise ValueError(f"margin must be a finite number >= 0, got {margin!r}")
    device = torch.device("cpu" if device is None else device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"the {device.type.upper()}"
    calls = {name: (fn, inputs) for name, fn in methods.items()}
    if reference is not None:
        ref_name, ref_fn, ref_inputs = reference
        if ref_name in calls:
            raise ValueError(f"the reference's name {ref_name!r} is also a method's")
        calls[ref_name] = (ref_fn, ref_inputs)
    names = list(calls)
    if isinstance(grows, str):
        raise ValueError(f"grows must be a list of method names such as [{grows!r}], got the string {grows!r}")
    grows = names if grows is None else list(grows)
    if unknown := set(grows) - set(names):
        raise ValueError(f"grows names no method: {sorted(unknown)}")
    g = torch.Generator(device=device).manual_seed(seed)
    args = {(name, s): make(s, g, device) for s in sizes for name, (_, make) in calls.items()}
    flops = {}                                  # counted for the rates, which need a reference
    if reference is not None:
        with torch.no_grad():
            flops = {name: [count_flops(calls[name][0], *args[name, s]) for s in sizes] for name in names}
    if reference is not None and not any(flops[ref_name]):        # every rate would divide by its best, 0
        raise ValueError(f"the reference {ref_name!r} counts no FLOPs at any size (FlopCounterMode counts matrix"
                         " products and attention), so it has no FLOP rate to measure the methods' against")
    rules = {"margin": margin, "spread": spread, "rounds": rounds, "growth": growth}
    for attempt in range(1, attempts + 1):
        with torch.no_grad(), set_torch_threads(1):
            number = {}
            for key, a in args.items():                  # warm up and size every block
                timer = Timer("fn(*args)", globals={"fn": calls[key[0]][0], "args": a}, num_threads=1)
                # blocked_autorange grows its block by tens until the timer's overhead is 1e-4 of it, so its
                # blocks last up to ten times min_run_time (5 to 50 ms for 5 ms asked): it warms up, and the
                # rounds time blocks of ``block`` seconds, the calls it took at least one.
                warm = timer.blocked_autorange(min_run_time=block / 5)
                number[key] = max(1, math.ceil(block / warm.median))
            raw = {key: [] for key in args}
            keys = list(args)
            with _no_gc():
                for r in range(rounds):
                    order = keys[r % len(keys):] + keys[:r % len(keys)]
                    for key in order:
                        raw[key].append(_block(calls[key[0]][0], args[key], number[key], device))
        measurements = {name: [Measurement(number[name, s], raw[name, s],
                                           TaskSpec(stmt=name, setup="", num_threads=1, sub_label=f"{size_name}={s}"))
                               for s in sizes] for name in names}
        result = Timings(sizes, names, measurements, flops, reference and reference[0], rules, attempt, attempts,
                         size_name, grows, where)
        if not result.disturbances() or any(result.growth_problems(name) for name in grows if len(sizes) > 1):
            break                              # passed, or failed to grow: final either way (no second chance)
    return result
