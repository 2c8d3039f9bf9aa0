"""The appendices' checkers, in exercise order: 9.A.1 the Jacobian at a temperature, 9.A.2 the gradient of a
learned ALiBi slope."""

import torch

from helpers.exercises.judge import Watch, call, compare, compare_number, exercise, generator, pick

# 9.A.1: the Jacobian of a softmax with a temperature --------------------------------------------------------

@exercise("9.A.1", "Your Jacobian equals autograd's for every temperature and length tried: (diag(p) - p p^T) / tau "
                   "with p = softmax(s / tau).")
def _(answer):
    g = generator()
    for k in range(1, 4):
        n, tau = pick(g, (2, 5, 9)), pick(g, (0.1, 0.5, 2.0, 7.0))
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


# 9.A.2: the gradient of a learned ALiBi slope, from the backward pass of Appendix C -------------------------

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
    g = generator()
    for k in range(1, 4):
        T, d, m = pick(g, (3, 6, 10)), pick(g, (2, 4, 8)), pick(g, (0.05, 0.25, 1.0))
        case = f"case {k} of 3 (T = {T}, d = {d}, slope {m:g})"
        q, k_, v, d_out = (torch.randn(T, d, generator=g, dtype=torch.float64) for _ in range(4))
        slope = torch.tensor(m, dtype=torch.float64, requires_grad=True)
        (_slope_forward(q, k_, v, slope) * d_out).sum().backward()
        want = slope.grad.item()
        got = call(answer, q, k_, v, m, d_out, case=case, watch=Watch())
        compare_number(got, want, case, what="gradient", mistakes=[
            (_slope_grad(q, k_, v, m, d_out, "plus").item(), "The bias is -m (i - j): its derivative in m is -(i - j)."),
            (_slope_grad(q, k_, v, m, d_out, "no_D").item(), "dS_ij = P_ij (dP_ij - D_i): the row term "
                                                             "D_i = sum_k P_ik dP_ik is missing."),
            (_slope_grad(q, k_, v, m, d_out, "dp").item(), "Go through the softmax: the bias enters the scores S, so "
                                                           "use dS, not dP."),
        ], hint="dP = dO V^T, dS = P * (dP - rowsum(P * dP)), and dL/dm = sum_ij dS_ij * d S_ij / d m = "
                "-sum_ij dS_ij (i - j) over the visible pairs.")
