"""Section 9.2's exercises: 9.2.1 padding and causal masks combined, 9.2.2 how far back a layer sees,
measured, 9.2.3 multi-query attention.

Each checker accepts the notebook's reference solution and rejects the usual mistakes, each with its own
hint (exercises_common.py says how; the shared layout is tested in test_exercises_layout.py).
"""

import re

import pytest
import torch
from exercises_common import (
    each_wrong_answer_is_rejected_with_its_own_message,
    fails_on_every_seed,
    ids,
    new_exercises_accept_correct_answers_written_differently,
    new_exercises_reject_each_wrong_answer_with_its_hint_on_fresh_cases,
    reach,
    reference_solution_passes,
    solutions,
    starters,
    students_right_answers_pass_and_wrong_ones_get_their_message,
    untouched_starter_is_not_attempted,
    wrong_answers_fail_on_every_fresh_draw,
)

from helpers.exercises import s9_2, verdict

# Wrong answers and right ones unlike the reference ---------------------------------------------------------------

def _mask(lengths, T, diagonal=1, keys=True, combine=torch.logical_or):
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    padded = (j if keys else i) >= lengths[:, None, None]
    return combine(j >= i + diagonal, padded)


def _mqa(x, W_q, W_k, W_v, H, causal=True, d_scale=False, split="BTHd", dim=-1):
    B, T, d = x.shape
    q = (x @ W_q).view(B, T, H, d // H).transpose(1, 2) if split == "BTHd" else (x @ W_q).view(B, H, T, d // H)
    s = q @ (x @ W_k)[:, None].mT / (d if d_scale else d // H) ** 0.5
    if causal:
        ones = torch.ones(T, T, dtype=torch.bool)
        s = s.masked_fill(ones.tril(-1) if causal == "transposed" else ones.triu(1), float("-inf"))
    return (torch.softmax(s, dim) @ (x @ W_v)[:, None]).transpose(1, 2).reshape(B, T, d)


def _mask_loops(lengths, T):
    mask = torch.zeros(len(lengths), T, T, dtype=torch.bool)
    for b, n in enumerate(lengths.tolist()):
        for i in range(T):
            for j in range(T):
                mask[b, i, j] = j > i or j >= n
    return mask


def _mqa_repeat(x, W_q, W_k, W_v, heads):
    """Multi-query attention as grouped-query attention with one group: repeat the key head, SDPA."""
    B, T, d = x.shape
    q = (x @ W_q).unflatten(-1, (heads, d // heads)).transpose(1, 2)
    k = (x @ W_k)[:, None].expand(B, heads, T, d // heads)
    v = (x @ W_v)[:, None].expand(B, heads, T, d // heads)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)


def _mqa_unscaled(x, W_q, W_k, W_v, heads):
    B, T, d = x.shape
    q = (x @ W_q).view(B, T, heads, d // heads).transpose(1, 2)
    s = (q @ (x @ W_k)[:, None].mT).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (s.softmax(-1) @ (x @ W_v)[:, None]).transpose(1, 2).reshape(B, T, d)


def _mqa_diagonal(x, W_q, W_k, W_v, heads):
    B, T, d = x.shape
    q = (x @ W_q).view(B, T, heads, d // heads).transpose(1, 2)
    s = (q @ (x @ W_k)[:, None].mT / (d // heads) ** 0.5).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(), float("-inf"))
    return (s.softmax(-1) @ (x @ W_v)[:, None]).transpose(1, 2).reshape(B, T, d)


def _mqa_einsum(x, W_q, W_k, W_v, heads):
    B, T, d = x.shape
    q = torch.einsum("btd,de->bte", x, W_q).reshape(B, T, heads, -1).float()
    k, v = (x @ W_k).float(), (x @ W_v).float()
    s = torch.einsum("bthe,bse->bhts", q, k) / q.shape[-1] ** 0.5
    s = s + torch.full((T, T), float("-inf"), dtype=s.dtype).triu(1)
    return torch.einsum("bhts,bse->bthe", s.softmax(-1), v).reshape(B, T, d)


def _reach_count(layer, T=64, d=4):
    """Wrong: the number of inputs the last output depends on, minus one (right only where they are contiguous)."""
    x = torch.randn(1, T, d, requires_grad=True)
    (grad,) = torch.autograd.grad(layer(x)[0, -1].sum(), x)
    return int((grad[0].abs().sum(-1) > 0).sum()) - 1


def _reach_jacobian(layer, T=64, d=4):
    """Correct, another way: the full Jacobian of the last output, and the farthest input with a nonzero entry."""
    J = torch.autograd.functional.jacobian(lambda x: layer(x)[0, -1], torch.randn(1, T, d))   # (d, 1, T, d)
    nonzero = J.abs().sum((0, 1, 3)) > 0
    return max(T - 1 - j for j in range(T) if nonzero[j])


def _reach_loop(layer, T=64, d=4):
    """Correct, another way: perturb one input at a time and see whether the last output moves."""
    x = torch.randn(1, T, d)
    with torch.no_grad():
        base = layer(x)[0, -1]
        for j in range(T):
            x2 = x.clone()
            x2[0, j] += 1.0
            if not torch.equal(layer(x2)[0, -1], base):
                return T - 1 - j
    return 0


def _perturb(layer, T=64, d=4, compare=torch.equal, channel=None):
    """Move one input at a time by 1 (every channel, or one) and see whether the last output moves."""
    x = torch.randn(1, T, d)
    with torch.no_grad():
        y = layer(x)[0, -1]
        for j in range(T):
            x2 = x.clone()
            x2[0, j, slice(None) if channel is None else channel] += 1.0
            if not compare(layer(x2)[0, -1], y):
                return T - 1 - j
    return 0


def _reach_threshold(layer, T=64, d=4, reduce="sum"):
    x = torch.randn(1, T, d, requires_grad=True)
    (g,) = torch.autograd.grad(layer(x)[0, -1].sum(), x)
    size = g[0].abs().sum(-1) if reduce == "sum" else g[0].abs().amax(-1)
    return T - 1 - int((size > 1e-4).nonzero()[0])


# Wrong answers: for each exercise, (the mistake, a piece of the hint that must name it).
WRONG = {
    "9.2.1": [
        (lambda lengths, T: ~_mask(lengths, T), "inverted"),
        (lambda lengths, T: _mask(lengths, T, diagonal=0), "diagonal is hidden"),
        (lambda lengths, T: _mask(lengths, T, keys=False), "hid padding queries"),
        (lambda lengths, T: _mask(lengths, T, combine=torch.logical_and), "Combine the masks with |"),
        (lambda lengths, T: _mask(lengths, T).float(), "should be boolean"),
        (lambda lengths, T: _mask(lengths, T)[:, :1], "should have shape"),
    ],
    "9.2.3": [
        (lambda x, W_q, W_k, W_v, H: _mqa(x, W_q, W_k, W_v, H, causal=False), "add the causal mask"),
        (lambda x, W_q, W_k, W_v, H: _mqa(x, W_q, W_k, W_v, H, d_scale=True), "1/sqrt(d_h)"),
        (lambda x, W_q, W_k, W_v, H: _mqa(x, W_q, W_k, W_v, H, split="BHTd"), "mixes tokens into heads"),
        (lambda x, W_q, W_k, W_v, H: _mqa(x, W_q, W_k, W_v, H, dim=-2), "runs over the keys"),
        (lambda x, W_q, W_k, W_v, H: _mqa(x, W_q, W_k, W_v, H, causal="transposed"), "mask is transposed"),
    ],
}


# Students at the exercises (REVIEW.md, brief 2): wrong attempts not in WRONG, and right answers unlike the
# reference. Each attempt is (answer, a piece of the message it must get); None marks a right answer.
STUDENTS = {
    "9.2.1": [
        (_mask_loops, None),
        (lambda lengths, T: torch.ones(T, T, dtype=torch.bool).triu(1) | (torch.arange(T) >= lengths[:, None])[:, None, :],
         None),
        (lambda lengths, T: torch.ones(T, T, dtype=torch.bool).triu(1) | (torch.arange(T)[None, None, :]
                                                                        > lengths[:, None, None]), "Off by one in the padding"),
        (lambda lengths, T: torch.ones(T, T, dtype=torch.bool).triu(1).expand(len(lengths), T, T).numpy(),
         "should be a torch.Tensor, got ndarray"),
        (lambda lengths, T: torch.ones(T, T, dtype=torch.bool).tril(-1) | (torch.arange(T) >= lengths[:, None])[:, None, :],
         "entries differ"),                                                                           # transposed causal
        (lambda lengths, T: torch.ones(5, 5, dtype=torch.bool).triu(1) | (torch.arange(5) >= lengths[:, None])[:, None, :],
         "case 2 of 6"),                                                                              # a global T = 5
        (lambda lengths, T: torch.ones(T, T, dtype=torch.bool).tril() | (torch.arange(T) >= lengths[:, None])[:, None, :],
         "The causal part is reversed"),                                                             # j <= i
    ],
    "9.2.3": [
        (_mqa_repeat, None),
        (_mqa_einsum, None),                                                                         # einsum, float32
        (lambda x, W_q, W_k, W_v, heads: _mqa_repeat(x, W_q, W_k, W_v, heads).transpose(-2, -1).reshape(x.shape),
         "Every head's queries"),
        (lambda x, W_q, W_k, W_v, heads: torch.nn.functional.scaled_dot_product_attention(
            x @ W_q, (x @ W_k).repeat(1, 1, heads), (x @ W_v).repeat(1, 1, heads), is_causal=True), "Every head's"),
        (_mqa_unscaled, "The scores are not scaled"),
        (_mqa_diagonal, "hides the diagonal too"),
    ],
}


# The exercises added later: each wrong answer is tried on several fresh checks, and RIGHT holds right answers
# written differently from the reference.
NEW_WRONG = {
    "9.2.2": [
        (lambda layer, T=64, d=4: reach(layer, T, d, index=True), "not that input's index"),
        (lambda layer, T=64, d=4: reach(layer, T, d, plus_one=True), "has reach 0"),
        (lambda layer, T=64, d=4: reach(layer, T, d, first_output=True), "Differentiate the last output alone"),
        (lambda layer, T=64, d=4: reach(layer, T, d, last=True), "not the latest such position"),
        (lambda layer, T=64, d=4: torch.tensor([reach(layer, T, d)]), "got a tensor of shape (1,)"),
        (lambda layer, T=64, d=4: reach(layer, T, d) + 0.5, "should be an integer"),
        (lambda layer, T=64, d=4: str(reach(layer, T, d)), "should be an integer"),
        (_reach_count, "counts the inputs"),
    ],
}


RIGHT = {
    "9.2.2": [_reach_jacobian, _reach_loop, lambda layer, T=64, d=4: float(reach(layer, T, d))],
}


# The tests every section runs (exercises_common.py) ---------------------------------------------------------------

@pytest.mark.parametrize("case", solutions("9.2"), ids=ids)
def test_reference_solution_passes(case, monkeypatch):
    reference_solution_passes(case, monkeypatch)


@pytest.mark.parametrize("case", starters("9.2"), ids=ids)
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

def test_9_2_3_shapes_beyond_one_head_width():
    """Issue 19: every case had head width 4, so an answer using the notebook's d_k = 4 passed."""
    d_k = 4                                                       # the notebook's global after 9.2 has run

    def multi_query(x, W_q, W_k, W_v, heads):
        B, T, d = x.shape
        q = (x @ W_q).view(B, T, heads, d_k).transpose(1, 2)
        s = q @ (x @ W_k)[:, None].mT / 2                         # sqrt(4), hard-coded
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return (torch.softmax(s, -1) @ (x @ W_v)[:, None]).transpose(1, 2).reshape(B, T, d)
    ok, message = verdict("9.2.3", multi_query)
    assert ok is False and "case 2 of" in message and "width 8" in message, message


def test_9_2_2_a_threshold_on_the_gradient_is_rejected():
    def reach(layer, T=64, d=4):                          # treats a gradient below 1e-4 as no dependence
        x = torch.randn(1, T, d, requires_grad=True)
        g, = torch.autograd.grad(layer(x)[0, -1].sum(), x)
        return T - 1 - int((g[0].abs().sum(-1) > 1e-4).nonzero()[0])
    assert not any(verdict("9.2.2", reach)[0] for _ in range(5))


def test_9_2_2_the_faint_case_tells_exact_tests_from_tolerant_ones_on_every_draw():
    """A perturbation test with torch.allclose passed 19 checks in 30: the faint tap moved the output by about
    allclose's own tolerance. Now its effect is always several float32 ulps and always far below that tolerance."""
    for seed in range(200):                                # the faint layer itself, on many draws
        g = torch.Generator().manual_seed(seed)
        T = (12, 16, 20, 24)[seed % 4]
        layer, want = s9_2._layer(g, 2, T, "faint")
        torch.manual_seed(seed)
        assert _perturb(layer, T, 2) == want and _perturb(layer, T, 2, channel=seed % 2) == want
        assert _perturb(layer, T, 2, compare=torch.allclose) < want
        assert _reach_threshold(layer, T, 2) < want and _reach_threshold(layer, T, 2, "max") < want
    right = [_perturb, lambda layer, T=64, d=4: _perturb(layer, T, d, channel=0), _reach_jacobian,
             lambda layer, T=64, d=4: reach(layer, T, d)]
    wrong = [lambda layer, T=64, d=4: _perturb(layer, T, d, compare=torch.allclose), _reach_threshold,
             lambda layer, T=64, d=4: _reach_threshold(layer, T, d, "max")]
    for seed in range(30):
        for answer in right:
            ok, message = verdict("9.2.2", answer, seed=seed)
            assert ok, message
        for answer in wrong:
            ok, message = verdict("9.2.2", answer, seed=seed)
            assert ok is False and "case 4 of 6" in message and "with no threshold or tolerance" in message, message


def test_9_2_2_a_zero_gets_the_hint_of_the_mistake_that_gives_it():
    """Every answer returning 0 was told to differentiate the last output, whatever its mistake."""
    def strongest(layer, T=64, d=4):
        x = torch.randn(1, T, d, requires_grad=True)
        (g,) = torch.autograd.grad(layer(x)[0, -1].sum(), x)
        return T - 1 - int(g[0].abs().sum(-1).argmax())
    attempts = [(lambda layer, T=64, d=4: reach(layer, T, d, last=True), "not the latest such position"),
                (_reach_threshold, "with no threshold or tolerance"),
                (strongest, "the largest gradient"),
                (lambda layer, T=64, d=4: reach(layer, T, d, first_output=True), "Differentiate the last output alone"),
                (lambda layer, T=64, d=4: reach(layer, T, d, all_outputs=True), "Differentiate the last output alone")]
    for answer, hint in attempts:
        for seed in range(12):
            ok, message = verdict("9.2.2", answer, seed=seed)
            # (The largest gradient of an attention layer depends on the input: named on the convolutions only.)
            assert ok is False and (hint in message or answer is strongest and not re.search("case [14] of", message)), \
                (hint, message)
            if "got 0." in message:
                assert "Differentiate the last output" not in message, message


# Issue 32: verdicts that depended on the draw -----------------------------------------------------------------------

def test_9_2_1_an_answer_that_takes_T_from_the_lengths_fails_every_check():
    """T matters only when every sequence is shorter than T; the shown cases each have a sequence of length T, and the
    hidden ones drew padding everywhere in some checks only, so an answer using lengths.max() for T passed 4 in 30."""
    def mask(lengths, T):
        T = int(lengths.max())
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        return (j > i) | (j >= lengths[:, None, None])
    fails_on_every_seed("9.2.1", mask, "the mask should have shape")
