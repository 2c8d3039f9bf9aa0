"""Section 9.3's checkers, in exercise order: 9.3.1 how much content overrides ALiBi's penalty, 9.3.2 ALiBi
beyond its trained length, 9.3.3 stretching RoPE's context."""

import torch

from helpers.exercises.judge import Watch, call, cases, compare, compare_number, exercise, fresh, on_batches

# 9.3.1: the content advantage that overrides ALiBi's penalty ------------------------------------------------

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
        got = call(answer, m, T, delta, case=case, watch=Watch())
        compare_number(got, want, case, what="advantage", mistakes=[
            (_advantage(m, T, delta, others=False), "The other T - 1 keys compete: half the weight means "
                                                     "exp(b - m delta) equals the sum of their weights."),
            (_advantage(m, T, delta, penalty=False), "The key's own bias, -m delta, counts against it too."),
        ], hint="Weights softmax over keys at distances 0 .. T - 1 with scores -m delta', plus b for the one key "
                "delta back: solve for the b that gives it one half.")


# 9.3.2: ALiBi beyond its trained length ---------------------------------------------------------------------

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
        compare_number(call(answer, m, T, w, case=case, watch=Watch()), want, case, atol=1e-12, mistakes=mistakes,
                       hint="With equal content scores the weights are softmax(-m delta) over delta = 0 .. T - 1.")


# 9.3.3: stretching RoPE's context ---------------------------------------------------------------------------

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
    # A float32 x in every check (the first hidden case), so that an answer that fails on float32 inputs (a
    # rotation built in float64 and multiplied by x with @) fails every check, not one in eight.
    hidden = [((*r.choice([(), (2,), (2, 3)]), r.integer(1, 9), r.choice([2, 6, 10, 12])), r.choice([1.0, 1.5, 3.0, 8.0]),
               torch.float32 if k == 0 else r.choice([torch.float64, torch.float32])) for k in range(3)]
    shown = [((5, 4), 1.0, torch.float64), ((8, 8), 4.0, torch.float64), ((2, 3, 6, 4), 2.0, torch.float64),
             ((3, 6), 1.5, torch.float64)]
    name = getattr(answer, "__name__", "your function")
    for case, (shape, scale, dtype) in cases(shown, hidden, lambda shape, scale, dtype:
                                             f"x of shape {shape}, {str(dtype)[6:]}, scale {scale:g}"):
        def run(x, case=case, scale=scale):
            x64 = x.double()
            want = _rope(x64, scale)
            mistakes = [
                (_rope(x64, scale, sign=-1.0),
                 "Your pairs rotate the wrong way: (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos)."),
                (_rope(x64, 1 / scale), "To stretch the context divide the positions by the scale, t / scale, not multiply."),
                (_rope(x64, 1.0), "The scale is ignored: rotate position t by (t / scale) omega_j."),
                (_rope(x64, scale, start=1), "Positions start at 0: the first row is not rotated."),
                (_rope(x64, scale, halves=True), "Pair coordinates 2j and 2j+1 (interleaved), as the chapter's rope does, "
                                                 "not j and j + d/2."),
            ]
            compare(call(answer, x, scale, case=case), want, case, mistakes=mistakes,
                    hint="Row t, pair (2j, 2j+1), rotates by the angle (t / scale) * 10000^(-2j/d).")
        on_batches(run, r.randn(*shape, dtype=dtype), case=case, name=name)
