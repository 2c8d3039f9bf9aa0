import gc
import math
import subprocess
import sys
import time

import pytest
import torch
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from helpers import measure
from helpers.efficient import naive_attention, tiled_attention
from helpers.measure import (
    attention_inputs,
    count_flops,
    growth_exponent,
    matmul_reference,
    peak_memories,
    peak_memory,
    register_sdpa_flops,
    timings,
)


def test_peak_memory_sees_a_temporary():
    def f():
        big = torch.ones(1_000_000)                         # 4 MB, freed before f returns
        return big.sum()

    assert 4_000_000 <= peak_memory(f) < 4_100_000


def test_peak_memory_grows_quadratically_for_naive_and_linearly_for_tiled():
    def measure(fn, T):
        q, k, v = torch.randn(3, 1, T, 16).unbind(0)
        return peak_memory(lambda: fn(q, k, v))

    Ts = [256, 512, 1024]
    naive = [measure(naive_attention, T) for T in Ts]
    tiled = [measure(lambda q, k, v: tiled_attention(q, k, v, 64), T) for T in Ts]
    assert growth_exponent(Ts, naive) == pytest.approx(2, abs=0.15)
    assert growth_exponent(Ts, tiled) == pytest.approx(1, abs=0.15)


def test_peak_memory_rejects_other_devices():
    with pytest.raises(ValueError, match="CPU or CUDA"):
        peak_memory(lambda: None, "meta")


def test_peak_memories_measures_every_method_at_every_length():
    r = peak_memories({"naive": naive_attention, "tiled": lambda q, k, v: tiled_attention(q, k, v, 8)}, [16, 32], d=8)
    assert list(r) == ["naive", "tiled"] and all(len(r[n]) == 2 for n in r)
    assert r["naive"][1] >= 32 * 32 * 4                           # at least the float32 score matrix
    with pytest.raises(ValueError, match="every one of lengths must be a positive int, got 0"):
        peak_memories({"naive": naive_attention}, [0])
    with pytest.raises(ValueError, match="method"):
        peak_memories({}, [16])


def test_peak_memory_nests():
    """Issue 23: called inside itself, the outer call returned 0 B. Each call measures its own span."""
    def inner():
        x = torch.ones(1_000_000)                                 # 4 MB
        return x.sum()

    seen = []

    def outer():
        y = torch.ones(500_000)                                   # 2 MB, alive while the inner call runs
        seen.append(peak_memory(inner))
        return y.sum()

    total = peak_memory(outer)
    assert 4_000_000 <= seen[0] < 4_100_000
    assert 6_000_000 <= total < 6_200_000
    assert 4_000_000 <= peak_memory(inner) < 4_100_000           # and nothing is left running afterwards


def test_timings_measure_judge_and_report():
    methods = {"naive": naive_attention, "sdpa": F.scaled_dot_product_attention}
    t = timings(methods, [64, 256], attention_inputs(d=16), reference=matmul_reference(16), rounds=3, block=0.001,
                attempts=1)
    assert t.names == ["naive", "sdpa", "reference: (T x 16) @ (16 x T)"] and t.sizes == [64, 256]
    assert t.flops["naive"] == t.flops["sdpa"] == [4 * T * T * 16 for T in (64, 256)]     # counted, SDPA included
    assert t.flops[t.reference] == [2 * T * T * 16 for T in (64, 256)]
    assert all(len(m.raw_times) == 3 and m.median > 0 for ms in t.measurements.values() for m in ms)
    report = str(t)
    assert report.splitlines()[0] == "time per call: median of 3 interleaved rounds on 1 thread, ms (IQR / median)"
    assert report.splitlines()[-1].startswith("verdict: ")
    assert report.splitlines()[-1].startswith("verdict: passed") == (t.broken() == [])
    with pytest.raises(ValueError, match="rounds must be at least 3"):
        timings(methods, [64], attention_inputs(16), rounds=2)
    with pytest.raises(ValueError, match="grows names no method"):
        timings(methods, [64], attention_inputs(16), grows=["nope"])
    with pytest.raises(ValueError, match="method"):
        timings({}, [64], attention_inputs(16))


def test_timings_measure_again_when_the_verdict_fails_and_say_so():
    """A method whose time shrinks with the size fails the verdict every time: the protocol measures
    again, up to its bound, and the report says that it still failed."""
    made = []

    def inputs(size, generator, device):
        made.append(size)
        return (0.004 / size,)

    t = timings({"shrinking": time.sleep}, [1, 2], inputs, rounds=3, block=0.0001, attempts=2, spread=10.0)
    assert t.attempt == 2 and t.broken() == ["shrinking: time does not grow with T"]
    assert str(t).splitlines()[-1].startswith("verdict: FAILED after 2 measurements: shrinking: time does not grow with T")
    assert made == [1, 2]                                         # the inputs are made once, outside the timing


def test_timings_time_their_rounds_with_the_garbage_collector_off_and_restore_it():
    """As timeit does: a collection inside a block would make its round an outlier. The collector is
    on again afterwards, and stays off for a caller who had turned it off."""
    seen = []

    def probe(x):
        seen.append(gc.isenabled())
        return x

    inputs = lambda size, generator, device: (size,)                  # noqa: E731
    timings({"probe": probe}, [1, 2], inputs, rounds=3, block=0.0001, attempts=1, grows=[])
    # the two calls counting FLOPs (once a size) are not timed; every timed call, blocked_autorange's (timeit's) too, is
    assert seen[:2] == [True, True] and len(seen) > 8 and not any(seen[2:]) and gc.isenabled()
    gc.disable()
    try:
        timings({"probe": probe}, [1], inputs, rounds=3, block=0.0001, attempts=1, grows=[])
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_environment_sets_how_many_measurements_by_default(monkeypatch):
    """make guarantees runs two notebooks at once and compares no timing: BOOK_TIMING_ATTEMPTS=1 measures once."""
    def shrinking(size, generator, device):
        return (0.004 / size,)

    for value, want in (("1", 1), (None, 3)):
        if value is None:
            monkeypatch.delenv("BOOK_TIMING_ATTEMPTS", raising=False)
        else:
            monkeypatch.setenv("BOOK_TIMING_ATTEMPTS", value)
        t = timings({"shrinking": time.sleep}, [1, 2], shrinking, rounds=3, block=0.0001, spread=10.0)
        assert t.attempt == want and str(t).splitlines()[-1].startswith(f"verdict: FAILED after {want} measurement")


def test_count_flops_counts_attention():
    q, k, v = torch.randn(3, 1, 2, 32, 8).unbind(0)
    assert count_flops(F.scaled_dot_product_attention, q, k, v) == 4 * 2 * 32 * 32 * 8
    assert count_flops(torch.matmul, torch.ones(3, 4), torch.ones(4, 5)) == 2 * 3 * 4 * 5


def test_memory_events_are_signed_sizes_in_time_order():
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        x = torch.ones(250_000)                                      # 1 MB, then freed
        del x
    events = measure._memory_events(prof)
    assert [t for t, _ in events] == sorted(t for t, _ in events)
    assert (1_000_000 in [b for _, b in events]) and (-1_000_000 in [b for _, b in events])


def test_growth_exponent():
    assert growth_exponent([1, 2, 4], [3, 12, 48]) == pytest.approx(2)
    with pytest.raises(ValueError, match="positive"):
        growth_exponent([1, 2], [0, 1])
    with pytest.raises(ValueError, match="equal length"):
        growth_exponent([1, 2, 3], [1, 2])


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_growth_exponent_refuses_what_is_not_finite(bad):
    """Issue 23: a NaN or an inf gave NaN, silently."""
    with pytest.raises(ValueError, match="finite values, got y"):
        growth_exponent([1, 2, 4], [1, bad, 3])
    with pytest.raises(ValueError, match="finite values, got x"):
        growth_exponent([1, bad, 4], [1, 2, 3])


def test_growth_exponent_of_a_constant_and_against_a_constant():
    """Issue 23: a constant x gave NaN (0 / 0); it has no slope, and is refused. A constant y does not
    grow: its exponent is exactly 0, not a rounding error away from it."""
    with pytest.raises(ValueError, match="two different x"):
        growth_exponent([2, 2, 2], [1, 2, 3])
    assert growth_exponent([1, 2, 4], [0.1, 0.1, 0.1]) == 0.0
    assert growth_exponent([3, 7, 11], [1 / 3] * 3) == 0.0


def test_flop_counter_lacks_the_cpu_attention_kernel_until_registered():
    """Why register_sdpa_flops exists: a fresh torch has no formula for the CPU flash kernel (when a
    release adds one, this fails, and the helper can go)."""
    code = ("import torch; from torch.utils import flop_counter; "
            "print(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu in flop_counter.flop_registry)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_register_sdpa_flops_counts_attention_on_the_cpu_forward_and_backward():
    register_sdpa_flops()
    assert register_sdpa_flops() == []                   # a second call adds nothing
    B, H, T, d = 2, 3, 16, 8
    q, k, v = torch.randn(3, B, H, T, d, requires_grad=True).unbind(0)
    with FlopCounterMode(display=False) as forward:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with FlopCounterMode(display=False) as backward:
        out.sum().backward()
    # Two products of T x T scores, 2BHT^2d each, the full matrix even under a causal mask; the backward
    # recomputes the scores and takes four more products.
    assert forward.get_total_flops() == 4 * B * H * T * T * d
    assert backward.get_total_flops() == 10 * B * H * T * T * d


# The review that passed bad input to the helpers.
FAST = dict(rounds=3, block=0.0005, attempts=1)


def test_peak_memories_and_timings_take_lengths_as_an_array_or_a_tensor():
    """np.array or tensor lengths raised 'the truth value of an array is ambiguous'."""
    import numpy as np

    methods = {"naive": naive_attention}
    for lengths in (np.array([16, 32]), torch.tensor([16, 32]), range(16, 33, 16)):
        assert [len(v) for v in peak_memories(methods, lengths, d=8).values()] == [2]
    assert timings(methods, np.array([8, 16]), attention_inputs(8), **FAST).sizes == [8, 16]
    for bad, message in ((16, "lengths must be a sequence of positive ints, got 16"),
                         (torch.tensor([16.0]), "every one of lengths must be a positive int, got 16.0"),
                         (np.array([], dtype=int), "lengths must be positive ints, got \\[\\]")):
        with pytest.raises(ValueError, match=message):
            peak_memories(methods, bad, d=8)


def test_timings_refuse_a_reference_that_counts_no_flops():
    def add_inputs(T, generator, device):
        return torch.randn(T, T, generator=generator), torch.randn(T, T, generator=generator)

    with pytest.raises(ValueError, match="the reference 'add' counts no FLOPs"):       # was ZeroDivisionError
        timings({"naive": naive_attention}, [8, 16], attention_inputs(8), reference=("add", torch.add, add_inputs), **FAST)


def test_timings_rate_without_a_reference_says_so():
    t = timings({"naive": naive_attention}, [8, 16], attention_inputs(8), **FAST)
    with pytest.raises(ValueError, match="measured without one"):                    # was KeyError: None
        t.rate("naive")


@pytest.mark.parametrize(("option", "message"), [({"block": 0}, "block must be a positive finite number"),
                                                 ({"spread": -1.0}, "spread must be a positive finite number"),
                                                 ({"margin": float("nan")}, "margin must be a finite number >= 0")])
def test_timings_check_their_options_before_measuring_anything(option, message):
    made = []

    def inputs(T, generator, device):
        made.append(T)
        return (torch.ones(T),)

    with pytest.raises(ValueError, match=message):
        timings({"sum": torch.sum}, [8], inputs, **{**FAST, **option})
    assert made == []                                              # the inputs were built and counted first


@pytest.mark.parametrize("value", ["two", "0", "-1", ""])
def test_timings_name_a_bad_attempts_variable(monkeypatch, value):
    monkeypatch.setenv("BOOK_TIMING_ATTEMPTS", value)
    with pytest.raises(ValueError, match=f"the environment's BOOK_TIMING_ATTEMPTS must be a positive int, got .*{value}"):
        timings({"naive": naive_attention}, [8], attention_inputs(8), rounds=3, block=0.0005)


def test_inputs_that_could_never_pass_or_would_mean_nothing_are_refused():
    """Bad input to the helpers: repeated or decreasing sizes failed the verdict on every run ('run the cell
    again'), a string for grows was read letter by letter, bools passed as numbers, float seeds failed deep
    inside torch."""
    methods = {"matmul": lambda q, k, v: q @ k.mT}
    inputs = measure.attention_inputs(d=4)
    for sizes in ([8, 8], [16, 8]):
        with pytest.raises(ValueError, match="sizes must increase"):
            measure.timings(methods, sizes, inputs)
    with pytest.raises(ValueError, match="grows must be a list of method names"):
        measure.timings(methods, [8, 16], inputs, grows="matmul")
    for seed in (1.5, True, -1, 2**70):
        with pytest.raises(ValueError, match="seed must be an int"):
            measure.timings(methods, [8, 16], inputs, seed=seed)
        with pytest.raises(ValueError, match="seed must be an int"):
            measure.peak_memories(methods, [8, 16], d=4, seed=seed)
    for x in ([True, 2], "12"):
        with pytest.raises(ValueError, match="growth_exponent takes two sequences"):
            measure.growth_exponent(x, [1, 2])
