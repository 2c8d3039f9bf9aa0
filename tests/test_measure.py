import subprocess
import sys
import time

import pytest
import torch
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from helpers import measure
from helpers.efficient import naive_attention, tiled_attention
from helpers.measure import benchmark, growth_exponent, peak_memory, register_sdpa_flops, seconds


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


def test_seconds_is_the_shortest_of_the_repeats():
    inner = []

    def nap():
        start = time.perf_counter()
        time.sleep([0.03, 0.01, 0.02][len(inner)])
        inner.append(time.perf_counter() - start)

    best = seconds(nap, repeats=3)
    assert len(inner) == 3 and min(inner) <= best < min(inner) + 0.005
    with pytest.raises(ValueError, match="repeats must be a positive int, got 0"):
        seconds(lambda: None, repeats=0)


def test_benchmark_measures_every_method_at_every_length():
    r = benchmark({"naive": naive_attention, "tiled": lambda q, k, v: tiled_attention(q, k, v, 8)}, [16, 32], d=8, repeats=1)
    assert list(r) == ["naive", "tiled"] and r["naive"]["T"] == r["tiled"]["T"] == [16, 32]
    assert all(len(r[n]["seconds"]) == len(r[n]["bytes"]) == 2 for n in r)
    assert r["naive"]["bytes"][1] >= 32 * 32 * 4                  # at least the float32 score matrix
    with pytest.raises(ValueError, match="every one of lengths must be a positive int, got 0"):
        benchmark({"naive": naive_attention}, [0])
    with pytest.raises(ValueError, match="method"):
        benchmark({}, [16])


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
