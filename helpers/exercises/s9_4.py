"""Section 9.4's checkers, in exercise order: 9.4.1 the residual stream, block by block, 9.4.2 what the z-loss
does to the logits, 9.4.3 label smoothing."""

import numbers

import torch
import torch.nn.functional as F

from helpers.exercises.judge import (
    Watch,
    Wrong,
    call,
    cases,
    compare,
    compare_number,
    exercise,
    fresh,
    generator,
    pick,
    uses_keyword,
)

# 9.4.1: the residual stream's size, block by block ----------------------------------------------------------

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
    g = generator()
    for k in range(1, 4):
        L, d, B, T = pick(g, (2, 3, 5)), pick(g, (8, 16)), pick(g, (2, 3)), pick(g, (4, 6))
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


# 9.4.2: what the z-loss does to the logits ------------------------------------------------------------------

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


# 9.4.3: label smoothing -------------------------------------------------------------------------------------

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
        got = call(answer, z, t, eps, case=case, watch=Watch(_label_smoothing, _SMOOTHING))
        compare_number(got, want.sum(-1).mean().item(), case, what="loss", rtol=1e-5, mistakes=mistakes,
                       hint="Targets (1 - eps) for the true class plus eps / V for every class; "
                            "loss -sum(target * log_softmax(z)).")
