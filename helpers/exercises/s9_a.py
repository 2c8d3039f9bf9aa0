"""The appendices' checkers, in exercise order: 9.A.1 the Jacobian at a temperature, 9.A.2 the gradient of a
learned ALiBi slope.

Both exercises ask for a derivation, so their checks refuse an answer that lets autograd compute the derivative
(``torch.autograd.grad``, which ``torch.autograd.functional.jacobian`` and ``torch.func`` call, ``backward``, or the
dual numbers of forward-mode differentiation), and
their hints name the mistake without giving the derivative's formula."""

import torch

from helpers.exercises.judge import Watch, Wrong, call, compare, compare_number, exercise, generator, pick

_AUTOGRAD = (torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward, torch._make_dual)
_BY_HAND = ("lets autograd compute the derivative: the exercise asks for your derivation, so compute the result "
            "from it with ordinary tensor operations (the check compares it with autograd).")


def _autograd(func, args, kwargs):
    return func in _AUTOGRAD


# 9.A.1: the Jacobian of a softmax with a temperature --------------------------------------------------------

@exercise("9.A.1", "Your Jacobian equals autograd's for every temperature and length tried.")
def _(answer):
    g = generator()
    for k in range(1, 5):
        # Cases 1-3: s / tau of unit scale. Case 4, on every check: the experiment's regime, scores spread like its
        # queries at tau = 1/100, where s / tau reaches hundreds and exp overflows without the largest score taken off.
        n, tau = (pick(g, (2, 5, 9)), pick(g, (0.1, 0.5, 2.0, 7.0))) if k < 4 else (pick(g, (9, 100)), 0.01)
        case = f"case {k} of 4 ({n} scores, temperature {tau:g})"
        s = (tau if k < 4 else 3.0) * torch.randn(n, generator=g, dtype=torch.float64)
        if k == 4:
            # Its largest score at least 1 above every other and at least 8.5: s / tau >= 850, so exp(s / tau)
            # overflows float64 (past 709), not only float32, on every draw. (At 1 above the largest |s| alone,
            # s / tau ranged over 600 to 900, and an unshifted exp in float64 passed one draw in four.)
            s[0] = max(s.abs().max().item() + 1, 8.5)
        want = torch.autograd.functional.jacobian(lambda z, tau=tau: torch.softmax(z / tau, 0), s)
        p, p1 = torch.softmax(s / tau, 0), torch.softmax(s, 0)
        got = call(answer, s, tau, case=case, watch=Watch(_autograd, _BY_HAND))
        if isinstance(got, torch.Tensor) and got.is_floating_point() and not got.isfinite().all():
            raise Wrong(f"{case}: your Jacobian has {'NaN' if got.isnan().any() else 'infinite'} entries: s / tau "
                        f"reaches {(s / tau).abs().max():.0f} here, and exp of that overflows. Subtract the largest "
                        "score before exp, as softmax does.")
        # Case 4's entries reach 1 / (4 tau) = 25, and an exponent of hundreds magnifies float32's rounding of s:
        # a right float32 answer is off by up to about 5e-4 of an entry there.
        compare(got, want, case, what="Jacobian", atol=1e-6 if k < 4 else 1e-4, rtol=1e-4 if k < 4 else 2e-3, mistakes=[
            (torch.diag(p) - torch.outer(p, p), "This is the Jacobian with respect to s / tau, not s: the chain rule "
                                                "through the division by tau is missing."),
            ((torch.diag(p) - torch.outer(p, p)) * tau, "The chain rule's factor is upside down: dividing the scores by "
                                                        "tau scales their derivative the other way."),
            ((torch.diag(p1) - torch.outer(p1, p1)) / tau, "Your probabilities are those at temperature 1: the Jacobian "
                                                          "needs the probabilities at this temperature."),
            (-(torch.diag(p) - torch.outer(p, p)) / tau, "The signs are flipped: raising a score raises its own "
                                                          "probability, so the diagonal is positive."),
            (torch.diag(p) / tau, "Only the diagonal is right: the entries off the diagonal are missing (raising one "
                                  "score takes weight from the others)."),
        ], hint="Start from Appendix A's Jacobian: at which scores is it taken here, and what does the chain rule add?")


# 9.A.2: the gradient of a learned ALiBi slope, from the backward pass of Appendix C -------------------------

def _slope_forward(q, k, v, m):
    T = q.shape[-2]
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).to(q.dtype)
    s = q @ k.mT / q.shape[-1] ** 0.5 - m * dist
    s = s.masked_fill(dist < 0, float("-inf"))
    return torch.softmax(s, -1) @ v


def _slope_grad(q, k, v, m, d_out, variant=None, terms=False):
    """The slope's gradient by Appendix C's backward pass (``variant``: a known mistake); with ``terms``, the terms
    of its sum, one per score, unsummed."""
    T = q.shape[-2]
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).to(q.dtype)
    width = v.shape[-1] if variant == "d_v" else 1 if variant == "unscaled" else q.shape[-1]
    s = q @ k.mT / width ** 0.5 - m * (dist.clamp(min=0) if variant == "unmasked, distances clamped" else dist)
    if variant not in ("unmasked", "unmasked, distances clamped"):
        s = s.masked_fill(dist < 0, float("-inf"))
    p = torch.softmax(s, -1)
    dp = d_out @ v.mT
    ds = p * (dp - (p * dp).sum(-1, keepdim=True)) if variant != "no_D" else p * dp
    if variant == "plus":
        return (ds * dist.clamp(min=0)).sum()
    if variant == "dp":
        return -(dp * dist.clamp(min=0)).sum()
    each = -(ds * (dist if variant == "unmasked" else dist.clamp(min=0)))
    return each if terms else each.sum()


def _well_posed(q, k, v, m, d_out):
    """Whether the gradient is at least a tenth of the sum of its terms' sizes. On about one draw in eight its terms
    nearly cancel, and a correct answer in float32 (its error up to 1e-5 of that sum, measured over 3,000 draws)
    misses the 0.1% tolerance; such draws are drawn again."""
    terms = _slope_grad(q, k, v, m, d_out, terms=True)
    return terms.sum().abs() >= 0.1 * terms.abs().sum()


@exercise("9.A.2", "Your slope gradient equals autograd's in every case.")
def _(answer):
    g = generator()
    # Each check meets all three widths d, in a random order: a scale hard-coded to one width fails every check.
    widths = [(2, 4, 8)[i] for i in torch.randperm(3, generator=g).tolist()]
    for k, d in enumerate(widths, start=1):
        # The values, and so dO, are never as wide as the queries and keys (d_v odd, d even): a scale by sqrt(d_v)
        # instead of sqrt(d) fails every check.
        T, d_v, m = pick(g, (3, 6, 10)), pick(g, (3, 5, 7)), pick(g, (0.05, 0.25, 1.0))
        case = f"case {k} of 3 (T = {T}, d = {d}, d_v = {d_v}, slope {m:g})"
        while True:
            q, k_ = (torch.randn(T, d, generator=g, dtype=torch.float64) for _ in range(2))
            v, d_out = (torch.randn(T, d_v, generator=g, dtype=torch.float64) for _ in range(2))
            if _well_posed(q, k_, v, m, d_out):
                break
        slope = torch.tensor(m, dtype=torch.float64, requires_grad=True)
        (_slope_forward(q, k_, v, slope) * d_out).sum().backward()
        want = slope.grad.item()
        got = call(answer, q, k_, v, m, d_out, case=case, watch=Watch(_autograd, _BY_HAND))
        compare_number(got, want, case, what="gradient", mistakes=[
            (_slope_grad(q, k_, v, m, d_out, "plus").item(), "The sign is flipped: the scores fall as the slope m "
                                                             "grows, so each score's derivative in m is negative."),
            (_slope_grad(q, k_, v, m, d_out, "no_D").item(), "The softmax's backward lacks its row term (Appendix C's "
                                                             "D_i): without it the rows of dS do not sum to zero."),
            (_slope_grad(q, k_, v, m, d_out, "dp").item(), "This sums the gradient of the weights, dP: the slope "
                                                           "enters the scores S, so go back through the softmax first."),
            (_slope_grad(q, k_, v, m, d_out, "d_v").item(), "Your scores are scaled by the square root of the "
                                                            "values' width: the scale is sqrt(d), the width of the "
                                                            "queries and keys."),
            (_slope_grad(q, k_, v, m, d_out, "unscaled").item(), "Your scores are not scaled: the head's scores are "
                                                                 "the dot products over sqrt(d), before the bias."),
            *((_slope_grad(q, k_, v, m, d_out, unmasked).item(), "Your softmax also weighs the future keys (j > i): "
               "the head is causal, so hide them before the softmax; their weights, and so their terms, are 0.")
              for unmasked in ("unmasked", "unmasked, distances clamped")),
        ], hint="Follow Appendix C's backward pass from dO to the scores, then ask how each visible score changes with m.",
            mistake_rtol=1e-6)   # sqrt(d) hard-coded as 2 landed within 0.1% of the sqrt(d_v) mistake on 1 draw in 150
