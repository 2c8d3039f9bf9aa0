"""Measuring attention (section 9.5): wall-clock time, peak memory, and how either grows with length.

On the CPU the peak memory comes from the PyTorch profiler's memory events. The public profiler API
aggregates them per operator and loses their order, so ``_memory_events`` reads the raw event list
through an undocumented attribute; that one use is isolated there, with what it relies on.
"""

import contextlib
import functools
import math
import os
import sys
import time

import torch
from tqdm import tqdm

from helpers.checks import positive_int


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


def peak_memory(fn, device=None):
    """Bytes allocated by ``fn()`` at its peak, above what was allocated when it started (measured).

    On CUDA this is ``torch.cuda.max_memory_allocated``. On the CPU it is measured with the PyTorch
    profiler (``profile_memory=True``): every allocation and free is an event with its size, and the
    running sum of the events, in time order, peaks at the answer. The result of ``fn`` is freed
    inside the measurement, so it counts towards the peak.
    """
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        out = fn()
        _sync(device)
        del out
        return torch.cuda.max_memory_allocated(device) - base
    if device.type != "cpu":
        raise ValueError(f"peak_memory measures the CPU or CUDA, not {device.type}")
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_stderr():                                # the profiler logs its start and stop on fd 2
        prof.start()
    try:
        out = fn()
        del out
    finally:
        with _quiet_stderr():
            prof.stop()
    now = peak = 0
    for _, nbytes in _memory_events(prof):
        now += nbytes                                    # positive: allocated, negative: freed
        peak = max(peak, now)
    return peak


def seconds(fn, repeats=3, device=None):
    """The shortest wall-clock time of ``repeats`` calls of ``fn()``, in seconds (the least disturbed).

    Call ``fn`` once before to warm up; on CUDA the device is synchronized around each call.
    """
    repeats = positive_int(repeats, "repeats")
    device = torch.device(device or "cpu")
    best = math.inf
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def benchmark(methods, lengths, d=64, heads=1, repeats=2, device=None, dtype=torch.float32, seed=0):
    """Time and peak memory of attention methods against the sequence length.

    ``methods`` maps a name to ``f(q, k, v)`` with ``q, k, v (1, heads, T, d)``. Returns
    ``{name: {"T": [...], "seconds": [...], "bytes": [...]}}``; the memory run doubles as warm-up.
    """
    if not methods:
        raise ValueError("give at least one method")
    if not lengths:
        raise ValueError(f"lengths must be positive ints, got {lengths!r}")
    lengths = [positive_int(T, "every one of lengths") for T in lengths]
    d, heads, repeats = positive_int(d, "d"), positive_int(heads, "heads"), positive_int(repeats, "repeats")
    device = torch.device(device or "cpu")
    g = torch.Generator(device=device).manual_seed(seed)
    results = {name: {"T": [], "seconds": [], "bytes": []} for name in methods}
    steps = [(T, name) for T in lengths for name in methods]
    with torch.no_grad():
        for T, name in tqdm(steps, desc=f"benchmark ({device.type})", file=sys.stderr, leave=False):
            q, k, v = torch.randn(3, 1, heads, T, d, generator=g, device=device, dtype=dtype).unbind(0)
            call = functools.partial(methods[name], q, k, v)
            results[name]["T"].append(T)
            results[name]["bytes"].append(peak_memory(call, device))
            results[name]["seconds"].append(seconds(call, repeats, device))
    return results


def growth_exponent(x, y):
    """Least-squares slope of ``log y`` against ``log x``: ``y ~ x^slope``."""
    x, y = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
    if x.shape != y.shape or x.dim() != 1 or len(x) < 2:
        raise ValueError(f"need two 1-D series of equal length >= 2, got shapes {tuple(x.shape)} and {tuple(y.shape)}")
    if (x <= 0).any() or (y <= 0).any():
        raise ValueError("growth exponents need positive values")
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
