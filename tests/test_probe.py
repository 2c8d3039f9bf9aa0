"""The fresh bad-input probe after the merge (issue 23's follow-up): each case failed before its fix."""

import math
import signal

import pytest
import torch

from helpers.controls import control
from helpers.exercises import verdict
from helpers.measure import attention_inputs, peak_memory, timings
from helpers.models import AddingTransformer, Attention, LanguageModel, LogitAttention, train_lm


def good(Q, K, V):
    w = torch.softmax(Q @ K.transpose(-2, -1) / Q.shape[-1] ** 0.5, dim=-1)
    return w @ V, w


@pytest.mark.parametrize("limit", [0, -1, float("nan"), float("inf"), True, "5"])
def test_a_bad_time_limit_is_refused_not_blamed_on_the_answer(limit):
    with pytest.raises(ValueError, match="time_limit"):
        verdict("9.1.1", good, time_limit=limit)


def test_a_tiny_time_limit_leaves_no_timer_running():
    verdict("9.1.1", good, time_limit=1e-9)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.default_int_handler, None) or \
        not getattr(signal.getsignal(signal.SIGALRM), "__qualname__", "").startswith("_within")


@pytest.mark.parametrize("rule", [dict(block=float("nan")), dict(block=float("inf")), dict(spread=float("nan")),
                                  dict(margin=float("nan"))])
def test_timings_refuses_rules_that_hang_or_switch_a_check_off(rule):
    with pytest.raises(ValueError):
        timings({"sdpa": torch.nn.functional.scaled_dot_product_attention}, [8], attention_inputs(4, 1), rounds=1,
                attempts=1, **rule)


@pytest.mark.skipif(torch.cuda.is_available(), reason="device 0 is a real GPU here")
def test_peak_memory_on_device_0_is_not_the_cpu():
    with pytest.raises((RuntimeError, AssertionError)):
        peak_memory(lambda: torch.empty(1000), device=0)


@pytest.mark.parametrize("build", [lambda: Attention(8, 2, causal="no"), lambda: LogitAttention(8, 2, qk_norm="no"),
                                   lambda: AddingTransformer(d=8, heads=2)(torch.zeros(1, 100, 2), need_weights="no")])
def test_a_string_flag_is_refused(build):
    with pytest.raises(ValueError, match="must be True or False"):
        build()


def test_control_start_1_is_not_the_state_true():
    shown = control(lambda v: str(v), [True, 1, 2], "v", start=1)
    assert shown.start == 1


def test_train_lm_with_attention_that_records_weights_reports_no_logit():
    lm = LanguageModel(32, 32, 16, 2, 2)
    history = train_lm(lm, 1e-3, steps=2, warmup=1)
    assert all(logit is None and math.isfinite(loss) for loss, logit in history)


def test_attention_with_mixed_dtypes_keeps_the_widest_precision():
    from helpers.attention import attention

    q, k, v = torch.randn(3, 2, 5, 8, dtype=torch.float64).unbind(0)
    out, _ = attention(q.float(), k, v)
    want = torch.softmax(q.float().double() @ k.mT / 8 ** 0.5, -1) @ v
    assert out.dtype == torch.float64 and (out - want).abs().max() < 1e-12
