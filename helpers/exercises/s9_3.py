"""Section 9.3's checkers, in exercise order: 9.3.1 how much content overrides ALiBi's penalty, 9.3.2 ALiBi
beyond its trained length, 9.3.3 stretching RoPE's context, 9.3.5 a model that needs positions (9.3.4 is
written)."""

import math

import torch
from torch import nn

from helpers.exercises.judge import (
    Watch,
    Wrong,
    _Raised,
    _raised,
    alone,
    call,
    cases,
    compare,
    compare_number,
    exercise,
    fresh,
    generator,
    on_batches,
)
from helpers.exercises.s9_2 import Training, learned, trained
from helpers.runtime import threads

# 9.3.1: the content advantage that overrides ALiBi's penalty ------------------------------------------------

def _finite(got, want, case, what, power):
    """Wrong, naming the overflow, where the answer returned infinity or NaN for a finite ``want``."""
    try:
        value = float(got.item() if isinstance(got, torch.Tensor) and got.numel() == 1 else got)
    except (TypeError, ValueError, OverflowError, RuntimeError):
        return                                                  # not a number: compare_number says so
    if not math.isfinite(value):
        raise Wrong(f"{case}: the {what} should be a finite number, expected {want:.5g}, got {value}: {power} overflows "
                    "or underflows here (a float64 ends near e^709 and e^-745, so e^1024 is inf and e^-1024 is 0; "
                    "inf / inf and 0 / 0 are NaN). Keep the exponents small: work with logarithms, or take out the "
                    "largest exponent before exponentiating.")


def _advantage(m, T, delta, others=True, penalty=True, itself=False):
    dist = torch.arange(T, dtype=torch.float64)
    rest = torch.logsumexp(-m * (dist if itself else dist[dist != delta]), 0).item() if others else 0.0
    return (m * delta if penalty else 0.0) + rest


@exercise("9.3.1", "Your advantage gives the far key exactly half of the last query's weight, for steep and shallow "
                   "heads, short and long sequences.")
def _(answer):
    r = fresh()
    # Shown: the steepest and the shallowest head of the section, short and long sequences, near and far keys
    # (the fourth the farthest key there is). The fifth is the steepest head's case in the cell after the exercise,
    # a key 2,048 back at T = 4,096: its penalty m delta = 1,024 is past e^709, about the largest float64, so an answer that
    # takes e^(m delta) overflows there (math.exp raises, torch.exp gives inf) at every check, not only when a hidden
    # case happens to reach so far. It needs the largest advantage of any case, about 1024.9 (the others need 17 at
    # most): a search for b over too small a range, such as a bisection between 0 and 50, fails it at every check too.
    # Hidden: any slope, length and key, as long as the key's penalty m delta stays below 490, so that no hidden case
    # needs more than 490 + ln(1 / (1 - e^-m)) <= 496.3 (m >= 2^-9).
    shown = [(2.0 ** -1, 16, 3), (2.0 ** -8, 4096, 3000), (2.0 ** -4, 1024, 64), (2.0 ** -6, 100, 99),
             (2.0 ** -1, 4096, 2048)]
    hidden = []
    for _ in range(3):
        m, T = r.log_uniform(2 ** -9, 1.0), r.integer(8, 5000)
        hidden.append((m, T, r.integer(1, min(T - 1, int(490 / m)))))
    # ... and one where the farthest key still counts (m T between 1 and 2, so e^(-m T) is at least e^-2): there a
    # sum over one key too many or too few, or over an endless sequence, is off by more than the tolerance (a
    # students' review: with every case's far keys negligible, T + 1 keys passed 20 checks in 20, and the shown
    # cases' answers looked up, with the endless sum elsewhere, 12 to 17).
    m = r.log_uniform(2 ** -4, 1.0)
    T = max(2, r.integer(math.ceil(1 / m), math.floor(2 / m)))
    hidden.append((m, T, r.integer(1, T - 1)))

    def describe(m, T, delta):
        slope = f"1/{1 / m:.0f}" if (1 / m).is_integer() else f"{m:.4g}"
        return f"slope {slope}, T = {T}, a key {delta} back"
    for case, (m, T, delta) in cases(shown, hidden, describe):
        want = _advantage(m, T, delta)
        got = call(answer, m, T, delta, case=case, watch=Watch())
        _finite(got, want, case, "advantage", "e to the power of the key's penalty")
        compare_number(got, want, case, what="advantage", mistakes=[
            (_advantage(m, T, delta, others=False), "Your advantage leaves out the other T - 1 keys: they take "
                                                     "weight too, and the key needs as much as all of them together."),
            (_advantage(m, T, delta, penalty=False), "Your advantage leaves out the key's own penalty: ALiBi's bias "
                                                     "counts against that key too."),
            (_advantage(m, T, delta, itself=True), "Your total of the other keys counts the key itself: leave it out."),
            (_advantage(m, T + 1, delta), "Your sum runs over T + 1 keys: the keys are 0 to T - 1 back, T of them."),
            (_advantage(m, T - 1, delta) if delta < T - 1 else None,
             "Your sum runs over T - 1 keys: the keys are 0 to T - 1 back, T of them."),
        ], hint="Test your b: add it to the one key's score, take the softmax over all T keys, and see whether "
                "that key gets one half.")


# 9.3.2: ALiBi beyond its trained length ---------------------------------------------------------------------

@exercise("9.3.2", "Your far weights are right for steep and shallow heads, short and long sequences.")
def _(answer):
    r = fresh()
    hidden = []
    for _ in range(3):
        m, T = r.log_uniform(2 ** -10, 1.0), r.integer(2, 3000)
        # A far weight above about e^-6, so that 1 - (near weight) in float32, a right answer, keeps 4 digits.
        hidden.append((m, T, r.integer(0, max(0, min(T - 2, int(6 / m) - 1)))))
    # ... and one where the farthest key still counts (m T between 1 and 2): there an endless sequence's far weight,
    # e^(-m (w + 1)), is off by far more than the tolerance (a students' review: the shown cases' answers looked up,
    # with that formula elsewhere, passed 8 checks in 20).
    m = r.log_uniform(2 ** -4, 1.0)
    T = max(2, r.integer(math.ceil(1 / m), math.floor(2 / m)))
    hidden.append((m, T, r.integer(0, T - 2)))
    # The fifth shown case is the steepest head's in the cell after the exercise, beyond 1,023 at T = 4,096: e^(m t)
    # for a position t overflows there (e^2047.5), so an answer built on it gives NaN at every check, not only when a
    # hidden case reaches so far. Its far weight, about e^-512, is 0 in float32: the absolute tolerance there is
    # 1e-6, a few of float32's rounding steps near 1, so that 1 - (near weight) in float32, a right answer, passes.
    for case, (m, T, w) in cases([(0.5, 16, 4), (1 / 16, 1024, 64), (2 ** -8, 4096, 512), (0.25, 8, 0), (0.5, 4096, 1023)],
                                 hidden, lambda m, T, w: f"slope {m:.4g}, T = {T}, window {w}"):
        delta = torch.arange(T, dtype=torch.float64)                   # distances of the keys 0 .. T-1 back
        weight = torch.exp(-m * delta)
        want = float(weight[delta > w].sum() / weight.sum())
        mistakes = [
            (float(weight[delta >= w].sum() / weight.sum()), "Your sum counts the key exactly w back, which is "
                                                             "not more than w back."),
            (float(weight[delta > w].sum()), "Your weights are not normalized: over all T keys they should sum "
                                             "to one."),
            (math.exp(-m * (w + 1)), "Your far weight is that of an endless sequence: the keys stop T - 1 back, "
                                     "so normalize over those T keys only."),
            (float(torch.exp(m * delta)[delta > w].sum() / torch.exp(m * delta).sum()), "Your weights grow with "
                                                                                          "the distance: ALiBi's bias "
                                                                                          "is a penalty."),
        ]
        got = call(answer, m, T, w, case=case, watch=Watch())
        _finite(got, want, case, "far weight", "e to the power of a slope times a distance or a position")
        # A weight below zero is no weight, however small (a students' review: 1 minus the near weights, in float64,
        # gave -2.2e-16 for e^-512 and passed the absolute tolerance).
        try:
            negative = float(got) < 0
        except (TypeError, ValueError, RuntimeError):           # not one number: compare_number says what it is
            negative = False
        if negative:
            raise Wrong(f"{case}: expected {want:.4g}, got {float(got):.4g}: a weight is never negative. Subtracting "
                        "the near weights from 1 loses a far weight this small to rounding: sum the far keys' weights "
                        "themselves.")
        compare_number(got, want, case, atol=1e-6 if want < 1e-100 else 1e-12, mistakes=mistakes,
                       hint="Compare your weights with those of Figure 9.3.3's cell, which come from the bias alone.")


# 9.3.3: stretching RoPE's context ---------------------------------------------------------------------------

def _rope(x, scale=1.0, sign=1.0, start=0, halves=False, floor=False, base=10000.0):
    T, d = x.shape[-2:]
    omega = base ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
    t = torch.arange(start, start + T, dtype=x.dtype)
    t = torch.div(t, scale, rounding_mode="floor") if floor else t / scale
    angle = sign * t[:, None] * omega
    cos, sin = angle.cos(), angle.sin()
    a, b = (x[..., : d // 2], x[..., d // 2:]) if halves else (x[..., 0::2], x[..., 1::2])
    ra, rb = a * cos - b * sin, a * sin + b * cos
    return torch.cat([ra, rb], -1) if halves else torch.stack([ra, rb], -1).flatten(-2)


@exercise("9.3.3", "Your rotation matches RoPE at scale 1 and rotates by t / scale at larger scales, batched too.")
def _(answer):
    r = fresh()
    # A float32 x in every check (the first hidden case), so that an answer that fails on float32 inputs (a
    # rotation built in float64 and multiplied by x with @) fails every check, not one in eight.
    hidden = [((*r.choice([(), (2,), (2, 3)]), r.integer(1, 9), r.choice([2, 6, 10, 12])), r.choice([1.0, 1.5, 3.0, 8.0]),
               torch.float32 if k == 0 else r.choice([torch.float64, torch.float32])) for k in range(3)]
    shown = [((5, 4), 1.0, torch.float64), ((8, 8), 4.0, torch.float64), ((2, 3, 6, 4), 2.0, torch.float64),
             ((3, 6), 1.5, torch.float64)]
    name = getattr(answer, "__name__", "your function")
    right_at_one = False                    # whether a case at scale 1 has passed: then the hint points past it
    for case, (shape, scale, dtype) in cases(shown, hidden, lambda shape, scale, dtype:
                                             f"x of shape {shape}, {str(dtype)[6:]}, scale {scale:g}"):
        def run(x, case=case, scale=scale, right_at_one=right_at_one):
            x64 = x.double()
            want = _rope(x64, scale)
            mistakes = [
                (_rope(x64, scale, sign=-1.0),
                 "Your pairs rotate the wrong way, clockwise: compare with the section's rope at scale 1."),
                (_rope(x64, 1 / scale), "Your angles grow with the scale, as if the positions were multiplied by it: "
                                        "interpolation squeezes the positions into the trained range."),
                (_rope(x64, 1.0), "The scale is ignored: your result is the same at every scale."),
                (_rope(x64, scale, start=1), "Your positions start at 1: the first row is position 0, not rotated."),
                (_rope(x64, scale, halves=True), "Your pairs are coordinates j and j + d/2; the chapter's rope pairs "
                                                 "neighbours, 2j and 2j+1 (interleaved)."),
                (_rope(x64, scale, floor=True), "Your positions are rounded down to whole numbers (integer division): "
                                                "interpolation rotates position t as t / scale, fraction included."),
                (_rope(x64, 1.0, base=10000.0 * scale), "You stretched the base (10000 times the scale, NTK-aware "
                                                        "scaling), which slows each pair by its own factor: this "
                                                        "exercise divides every position by the scale instead."),
            ]
            hint = ("Your function is right at scale 1 but not here: at a larger scale, position t should be rotated "
                    "as position t / scale is at scale 1." if right_at_one and scale != 1 else
                    "At scale 1 your function should equal the section's rope: try that first.")
            compare(call(answer, x, scale, case=case), want, case, mistakes=mistakes, hint=hint)
        x = r.randn(*shape, dtype=dtype)
        try:
            on_batches(run, x, case=case, name=name)
        except _Raised as raised:
            # Right on one matrix of the batch, and it raised unpacking: x.shape read as two sizes (T, d = x.shape).
            if raised.flat and x.dim() > 2 and isinstance(raised.error, ValueError) \
                    and "values to unpack" in str(raised.error):
                raise Wrong(f"On {raised.case}, {name} {_raised(raised.error, name)}. It works on 2-D inputs only (it is "
                            "right on one matrix of this batch): x.shape holds the batch's sizes in front of T and d, "
                            "so it does not unpack into two names: use x.shape[-2:], the last two. (And on a batch, "
                            "swap the last two dims with .transpose(-2, -1) or .mT, and multiply with @.)") from None
            raise
        right_at_one = right_at_one or scale == 1


# 9.3.5: a model that needs positions ------------------------------------------------------------------------

VOCAB = 16                                  # tokens 0 .. 15
TRAIN, HELD_OUT, NEEDED = 4000, 2000, 0.9   # sequences to train on, new ones to measure on, the accuracy to reach


def order_task(n, T, g, a=1, b=2):
    """``n`` sequences ``(n, T)`` of tokens in ``0 .. VOCAB - 1``, each with one ``a``, one ``b`` and fillers (the other
    tokens), and the labels ``(n,)``: 1 where ``a`` comes before ``b``. The notebook's ``order_task`` is the same."""
    fillers = torch.tensor([v for v in range(VOCAB) if v not in (a, b)])
    tokens = fillers[torch.randint(len(fillers), (n, T), generator=g)]
    where = torch.rand(n, T, generator=g).argsort(dim=1)[:, :2]          # two distinct positions: a's and b's
    rows = torch.arange(n)
    tokens[rows, where[:, 0]] = a
    tokens[rows, where[:, 1]] = b
    return tokens, (where[:, 0] < where[:, 1]).long()


def _order_logits(model, tokens, case, name, what):
    """The model's logits for ``tokens``, ``(len(tokens), 2)``, or Wrong saying why not."""
    try:
        with torch.no_grad():
            out = model(tokens)
    except Exception as error:  # noqa: BLE001 (the reader's model: told as the error it raised)
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise Wrong(f"{case}: the model {name} returned raised {type(error).__name__} on {what} "
                    f"{tuple(tokens.shape)}: {first}") from None
    if not isinstance(out, torch.Tensor) or out.shape != (len(tokens), 2) or not out.is_floating_point():
        got = f"shape {tuple(out.shape)}, {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise Wrong(f"{case}: the model {name} returned should map {what} {tuple(tokens.shape)} to logits "
                    f"({len(tokens)}, 2), class 1 for \"A comes first\", got {got}.")
    return out.detach().double()


_TRAIN = ("The exercise asks for a model with an attention layer and a position encoding whose parameters are trained "
          "on the sequences, not for a rule written by hand.")


def _accuracy(logits, labels):
    return (logits.argmax(-1) == labels).double().mean().item()


def _trained(answer, tokens, labels, case, seed, training=None, **kwargs):
    """The model ``answer`` returns, trained with the reader's draws (initialization, batches) seeded by the check (on
    the one thread the whole check runs on)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = call(answer, tokens, labels, case=case,
                     watch=None if training is None else Watch(training, "", half_refused=False), **kwargs)
    if not isinstance(model, nn.Module):
        name = getattr(answer, "__name__", "your function")
        raise Wrong(f"{case}: {name} should return the trained model (an nn.Module), got {type(model).__name__}.")
    model.eval()
    return model


@exercise("9.3.5", f"Your model, trained on {TRAIN:,} sequences, tells which token comes first in at least "
                   f"{NEEDED:.0%} of {HELD_OUT:,} new ones, and without positions it cannot.", time_limit=60)
def _(answer):
    # The whole check on one thread, the models' training and evaluations: they are small and train fastest there,
    # and on a machine with fewer cores than threads (the hardware matrix's 32 threads on 2 cores, two notebooks at
    # once) the threads' waits, not the arithmetic, set the time (once, this check's verdict in the stored notebook
    # changed there).
    with threads(1):
        _order_check(answer)


def _order_check(answer):
    r = fresh()
    g = generator()
    # A and B are never the notebook's tokens 1 and 2, nor is T its 8: a rule written for the notebook's data fails.
    # Every check draws a length above 8 (with positions) and one below (without): a table of the notebook's 8
    # positions, or code that reads its eighth token, fails every check, not only the checks that drew the other side
    # (a students' review: a table of 8 rows passed when T was 6 or 7).
    a, b = r.python.sample(range(3, VOCAB), 2)
    T, T_blind = r.choice([9, 10]), r.choice([6, 7])
    case = f"{TRAIN:,} training sequences of {T} tokens, A = {a} and B = {b}, {HELD_OUT:,} new ones"
    tokens, labels = order_task(TRAIN, T, g, a, b)
    new, new_labels = order_task(HELD_OUT, T, g, a, b)

    def swap(x):                    # A and B change places: the other label
        return torch.where(x == a, b, torch.where(x == b, a, x))
    swapped = swap(new)
    name = getattr(answer, "__name__", "your function")

    def same(x, y):                 # the same logits, up to the rounding of a sum taken in another order
        return (x - y).abs().max().item() <= 1e-4 * (1 + y.abs().max().item())

    training = Training()
    model = _trained(answer, tokens, labels, case, r.integer(0, 2 ** 31 - 1), training)
    logits = _order_logits(model, new, case, name, "new sequences")
    accuracy = _accuracy(logits, new_labels)
    if accuracy < NEEDED:
        told = f"{case}: the model is right on {accuracy:.0%} of the new sequences, where {NEEDED:.0%} is needed."
        seen = _accuracy(_order_logits(model, tokens, case, name, "its training sequences"), labels)
        # Wrong on most new sequences and on most of its own training ones: trained the other way round (a model
        # trained on swapped labels for the tests' 100 steps stopped at 10% and 16% on some draws, 1 in 60, and was
        # told it was at chance, "(9%)"). A model at chance is near 50% on both.
        if accuracy <= 1 - NEEDED or max(accuracy, seen) < 0.4:
            raise Wrong(f"{told} It is wrong on {'nearly all' if accuracy <= 1 - NEEDED else 'most'} of them, so it "
                        "has learned the rule the other way round: class 1 is \"A comes first\" (are the labels, or "
                        "the two logits, swapped?).")
        if seen >= NEEDED:
            raise Wrong(f"{told} It is right on {seen:.0%} of its training sequences: it learned them by heart (or "
                        "reads their labels) rather than the rule.")
        if same(_order_logits(model, swapped, case, name, "new sequences"), logits):
            raise Wrong(f"{told} It gives the same logits when A and B change places, so it cannot tell which comes "
                        "first: your model does not see positions (is the encoding missing, or averaged away before "
                        "anything compares the tokens?).")
        if same(_order_logits(model, new.flip(1), case, name, "new sequences"), logits):
            raise Wrong(f"{told} It gives the same logits for a sequence and for that sequence reversed, which has the "
                        "other label: a symmetric position signal cannot tell a sequence from its reversal (the section's "
                        "ALiBi extended to later keys, -m|i - j|, without the causal mask is one; add the mask, or use "
                        "another encoding).")
        if seen < 0.6:
            raise Wrong(f"{told} It is at chance on its own training sequences too ({seen:.0%}): it has not learned. "
                        "Does the training take optimizer steps on the loss's gradients, with the right labels, and "
                        "enough of them?")
        raise Wrong(f"{told} It has learned part of the task ({seen:.0%} of its training sequences): train it longer, "
                    "or with a larger learning rate.")
    # Right often enough: unless each sequence's answer depends on the rest of its batch.
    alone(lambda x: _order_logits(model, x, case, name, "one new sequence alone"), (new,), logits, case, "new sequence")
    # ... and unless it was written by hand rather than trained: what a trained model does lives in parameters that its
    # training changed, and with their entries shuffled it is near chance.
    learned(model, (new[:8],), training,
            lambda: _accuracy(_order_logits(model, new, case, name, "new sequences"), new_labels), NEEDED, case, _TRAIN)
    # Without positions the same model must not tell the two orders apart.
    case = (f"{TRAIN:,} training sequences of {T_blind} tokens, A = {a} and B = {b}, {HELD_OUT:,} new ones, "
            "use_positions=False")
    tokens, labels = order_task(TRAIN, T_blind, g, a, b)
    new, new_labels = order_task(HELD_OUT, T_blind, g, a, b)
    swapped = swap(new)
    blind_training = Training()
    blind = _trained(answer, tokens, labels, case, r.integer(0, 2 ** 31 - 1), blind_training, use_positions=False)
    logits = _order_logits(blind, new, case, name, "new sequences")
    if not same(_order_logits(blind, new, case, name, "new sequences"), logits):
        raise Wrong(f"{case}: the model gives other logits each time it sees the same new sequences (random logits?): "
                    "without positions it should be the same model, trained, whose logits are the "
                    "same for a sequence and for that sequence with A and B swapped.")
    if not same(_order_logits(blind, swapped, case, name, "new sequences"), logits):
        raise Wrong(f"{case}: its logits change when A and B change places (it is right on "
                    f"{_accuracy(logits, new_labels):.0%} of the new sequences), so it still sees where they are: with "
                    "use_positions=False leave out every source of position, the encoding and any causal mask, or "
                    "reading one position's output: pool over positions.")
    # ... and it must be the same kind of model, trained (a students' review: a module of constant logits, or one
    # never trained, passed: neither tells the orders apart either).
    trained(blind, (new[:8],), blind_training, case, "With use_positions=False, build and train the same model, "
            "without any position information: its accuracy is then what the question after the exercise asks about.")
