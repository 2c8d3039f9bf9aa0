"""Section 9.4's exercises: 9.4.1 the residual stream, block by block, 9.4.2 what the z-loss does to the
logits, 9.4.3 label smoothing.

Each checker accepts the notebook's reference solution and rejects the usual mistakes, each with its own
hint (exercises_common.py says how; the shared layout is tested in test_exercises_layout.py).
"""

import pytest
import torch
from exercises_common import (
    each_wrong_answer_is_rejected_with_its_own_message,
    ids,
    new_exercises_accept_correct_answers_written_differently,
    new_exercises_reject_each_wrong_answer_with_its_hint_on_fresh_cases,
    reference_solution_passes,
    solutions,
    starters,
    students_right_answers_pass_and_wrong_ones_get_their_message,
    untouched_starter_is_not_attempted,
    wrong_answers_fail_on_every_fresh_draw,
)

from helpers.exercises import verdict

# Wrong answers and right ones unlike the reference ---------------------------------------------------------------

def _smoothed(z, t, eps, others=False, target_one=False, probs=False):
    V = z.shape[-1]
    one_hot = torch.nn.functional.one_hot(t, V).double()
    if others:
        smooth = (1 - eps) * one_hot + eps / (V - 1) * (1 - one_hot)
    else:
        smooth = (1 if target_one else 1 - eps) * one_hot + eps / V
    log_p = torch.softmax(z, -1) if probs else torch.log_softmax(z, -1)
    return -(smooth * log_p).sum(-1).mean()


def _rms(blocks, x, inputs=False, norm=False, std=False, normalized=False, as_list=False, in_place=False):
    out = [x.pow(2).mean().sqrt()] if inputs else []
    for block in blocks:
        if in_place:
            x += block(x) - x
        else:
            x = block(x)
        z = block.norm1(x) if normalized else x
        out.append(z.norm() if norm else z.std() if std else z.pow(2).mean().sqrt())
    return [v.item() for v in out] if as_list else torch.stack(out)


def _rms_float64(blocks, x):
    """Correct, another way: in double precision, from the stream's squared norm."""
    blocks = __import__("copy").deepcopy(blocks).double()
    x, out = x.double(), []
    for block in blocks:
        x = block(x)
        out.append((x.square().sum() / x.numel()).sqrt())
    return torch.stack(out).float()


# Wrong answers: for each exercise, (the mistake, a piece of the hint that must name it).
WRONG = {
    "9.4.2": [
        (lambda z, w: w * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, -1) / z.shape[0], "factor 2"),
        (lambda z, w: 2 * w * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, -1), "divide by N"),
        (lambda z, w: 2 * w * torch.logsumexp(z, -1, keepdim=True) / z.numel() + 0 * z, "not 1 / V"),
        (lambda z, w: 2 * w * z * torch.softmax(z, -1) / z.shape[0], "not the logits themselves"),
    ],
    "9.4.3": [
        (lambda z, t, eps: _smoothed(z, t, eps, others=True), "not over the other V - 1"),
        (lambda z, t, eps: _smoothed(z, t, eps, target_one=True), "not 1"),
        (lambda z, t, eps: -_smoothed(z, t, eps), "A loss is positive"),
        (lambda z, t, eps: _smoothed(z, t, eps, probs=True), "log_softmax"),
        (lambda z, t, eps: _smoothed(z, t, eps) * z.shape[0], "a mean, not a sum"),
    ],
}


# Students at the exercises (REVIEW.md, brief 2): wrong attempts not in WRONG, and right answers unlike the
# reference. Each attempt is (answer, a piece of the message it must get); None marks a right answer.
STUDENTS = {
    "9.4.2": [
        (lambda z, w: (lambda z: torch.autograd.grad(w * torch.logsumexp(z, -1).pow(2).mean(), z)[0])(
            z.detach().requires_grad_()), None),                                                      # autograd
        (lambda z, w: (lambda e: 2 * w * e.sum(-1, keepdim=True).log() * e / e.sum(-1, keepdim=True) / len(z))(
            (z - z.amax(-1, keepdim=True)).exp()) + 2 * w * z.amax(-1, keepdim=True) * torch.softmax(z, -1) / len(z), None),
        (lambda z, w: 2 * w * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, 0) / z.shape[0],
         "d/dz_j of w mean_rows"),
        (lambda z, w: 2 * w * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, -1) / z.numel(), "d/dz_j"),
        (lambda z, w: (2 * w * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, -1) / z.shape[0]).tolist(),
         "should be a torch.Tensor, got list"),
    ],
    "9.4.3": [
        (lambda z, t, eps: torch.nn.functional.cross_entropy(
            z, (1 - eps) * torch.nn.functional.one_hot(t, z.shape[-1]).to(z.dtype) + eps / z.shape[-1]), None),  # soft targets
        (lambda z, t, eps: ((1 - eps) * torch.nn.functional.nll_loss(z.float().log_softmax(-1), t)
                            - eps * z.float().log_softmax(-1).mean(-1).mean()).item(), None),        # float32 decomposition
        (lambda z, t, eps: torch.nn.functional.cross_entropy(z, t), "eps"),                            # no smoothing
        (lambda z, t, eps: (-(1 - eps) * z.log_softmax(-1).gather(1, t[:, None]).squeeze(1)
                            - eps / z.shape[-1] * z.log_softmax(-1).sum(-1)).sum().item(), "a mean, not a sum"),
        (lambda z, t, eps: f"{torch.nn.functional.cross_entropy(z, t):.4f}", "should be a number, got str"),
    ],
}


# The exercises added later: each wrong answer is tried on several fresh checks, and RIGHT holds right answers
# written differently from the reference.
NEW_WRONG = {
    "9.4.1": [
        (lambda blocks, x: _rms(blocks, x, inputs=True), "leave out the input"),
        (lambda blocks, x: _rms(blocks, x, norm=True), "not the norm"),
        (lambda blocks, x: _rms(blocks, x, std=True), "does not subtract the mean"),
        (lambda blocks, x: _rms(blocks, x, normalized=True), "not its normalized copy"),
        (lambda blocks, x: _rms(blocks, x, as_list=True), "return a tensor"),
        (lambda blocks, x: _rms(blocks, x, in_place=True), "changed its input x"),
        (lambda blocks, x: _rms(blocks, x, inputs=True)[:-1], "not before it"),
    ],
}


RIGHT = {
    "9.4.1": [_rms_float64, lambda blocks, x: torch.tensor([v for v in _rms(blocks, x, as_list=True)])],
}


# The tests every section runs (exercises_common.py) ---------------------------------------------------------------

@pytest.mark.parametrize("case", solutions("9.4"), ids=ids)
def test_reference_solution_passes(case, monkeypatch):
    reference_solution_passes(case, monkeypatch)


@pytest.mark.parametrize("case", starters("9.4"), ids=ids)
def test_untouched_starter_is_not_attempted(case, monkeypatch):
    untouched_starter_is_not_attempted(case, monkeypatch)


@pytest.mark.parametrize("number", sorted(WRONG))
def test_each_wrong_answer_is_rejected_with_its_own_message(number):
    each_wrong_answer_is_rejected_with_its_own_message(number, WRONG[number])


@pytest.mark.parametrize("number", sorted(STUDENTS))
def test_students_right_answers_pass_and_wrong_ones_get_their_message(number):
    students_right_answers_pass_and_wrong_ones_get_their_message(number, STUDENTS[number])


@pytest.mark.parametrize("number", sorted(set(WRONG) & set(STUDENTS)))
def test_wrong_answers_fail_on_every_fresh_draw(number):
    wrong_answers_fail_on_every_fresh_draw(number, WRONG[number])


@pytest.mark.parametrize("number", sorted(NEW_WRONG))
def test_new_exercises_reject_each_wrong_answer_with_its_hint_on_fresh_cases(number):
    new_exercises_reject_each_wrong_answer_with_its_hint_on_fresh_cases(number, NEW_WRONG[number])


@pytest.mark.parametrize("number", sorted(RIGHT))
def test_new_exercises_accept_correct_answers_written_differently(number):
    new_exercises_accept_correct_answers_written_differently(number, RIGHT[number])


# This section's own tests -----------------------------------------------------------------------------------------

def test_forbidden_label_smoothing_is_detected():
    """Issue 19: F.cross_entropy(..., label_smoothing=eps) passed 9.4.3, whose statement forbids it."""
    import torch.nn.functional as F
    from torch.nn.functional import cross_entropy as ce

    def functional(z, targets, eps):
        return F.cross_entropy(z, targets, label_smoothing=eps)

    def module(z, targets, eps):
        return torch.nn.CrossEntropyLoss(**{"label_smoothing": eps})(z, targets)   # hidden from a source scan

    def imported(z, targets, eps):
        return ce(z, targets, label_smoothing=eps)

    # Fresh review of the checkers: hidden from the source scan, these reached the function unseen.
    def positional(z, targets, eps):
        return F.cross_entropy(z, targets, None, None, -100, None, "mean", eps)

    def imported_unpacked(z, targets, eps):
        return ce(z, targets, **{"label_smoothing": eps})

    def module_positional(z, targets, eps):
        return torch.nn.CrossEntropyLoss(None, None, -100, None, "mean", eps)(z, targets)

    def builtin(z, targets, eps):
        return torch._C._nn.cross_entropy_loss(z, targets, None, 1, -100, eps)

    def swallowed(z, targets, eps):                      # catches the refusal and answers another way
        try:
            return ce(z, targets, **{"label_smoothing": eps})
        except Exception:
            return ce(z, targets)
    for answer in (functional, module, imported, positional, imported_unpacked, module_positional, builtin, swallowed):
        for seed in range(3):
            ok, message = verdict("9.4.3", answer, seed=seed)
            assert ok is False and "label_smoothing, which the exercise asks you to do without" in message, message

    def soft_targets(z, targets, eps):                   # allowed: F.cross_entropy without its label_smoothing
        q = (1 - eps) * F.one_hot(targets, z.shape[-1]).to(z.dtype) + eps / z.shape[-1]
        return ce(z, q, None, None, -100, None, "mean", 0.0)
    assert all(verdict("9.4.3", soft_targets, seed=seed)[0] for seed in range(5))


def test_9_4_3_half_precision_is_told_it_is_the_dtype():
    """A right formula in float16 or bfloat16 was told its formula was wrong."""
    def smoothed(z, t, eps, dtype):
        q = (1 - eps) * torch.nn.functional.one_hot(t, z.shape[-1]) + eps / z.shape[-1]
        return -(q.to(dtype) * torch.log_softmax(z.to(dtype), -1)).sum(-1).mean()
    for dtype in (torch.float16, torch.bfloat16):
        for answer in (lambda z, t, eps, dtype=dtype: smoothed(z, t, eps, dtype),
                       lambda z, t, eps, dtype=dtype: smoothed(z, t, eps, dtype).item()):
            for seed in range(4):
                ok, message = verdict("9.4.3", answer, seed=seed)
                assert ok is False and str(dtype) in message and "float32 or float64" in message, message
                assert "Targets" not in message, message


def test_new_hints_name_their_mistake():
    """Reviewers' mistakes that got a generic hint: RMS before each block, a flipped sign (and an int32 product: 9.5's
    file)."""
    for seed in range(6):
        ok, message = verdict("9.4.1", lambda blocks, x: _rms(blocks, x, inputs=True)[:-1], seed=seed)
        assert ok is False and "not before it" in message, message
        ok, message = verdict("9.4.2", lambda z, w: -2 * w * torch.logsumexp(z, -1, keepdim=True)
                              * torch.softmax(z, -1) / z.shape[0], seed=seed)
        assert ok is False and "The sign is flipped" in message, message
