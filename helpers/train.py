"""A small training loop, with its progress shown as it runs (helpers.progress)."""

import math

import torch

from helpers import runtime
from helpers.checks import positive_float, positive_int
from helpers.progress import progress


def _check(steps, lr, clip):
    """The arguments both loops share: ``steps`` a positive int, ``lr`` and ``clip`` (or None) positive."""
    positive_int(steps, "steps")
    positive_float(lr, "lr")
    if clip is not None:
        positive_float(clip, "clip")          # NaN would clip every gradient to NaN



def _step(model, opt, loss, clip, step):
    """One optimizer step on ``loss``, with the gradient norm clipped at ``clip``; returns the loss.

    A NaN or infinite loss stops training before it reaches the weights.
    """
    value = loss.item()
    if not math.isfinite(value):
        raise FloatingPointError(f"the loss is {value} at step {step}; the weights are those before that step")
    opt.zero_grad()
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return value


def train(model, batch_fn, loss_fn, steps, lr=1e-3, clip=1.0, desc="training", threads=1):
    """Train ``model`` with Adam and gradient clipping; return the list of training losses.

    ``batch_fn(step)`` returns the inputs of ``loss_fn(model, batch) -> scalar loss``. The model is
    left in eval mode, also when a step fails; a non-finite loss raises ``FloatingPointError``.

    The steps run on ``threads`` torch threads (None: as many as are set), and the count set before
    is restored after, also when a step fails. One thread is the default: a run's losses and weights
    then do not depend on how many threads a machine would use, which changes the order of the sums.
    """
    _check(steps, lr, clip)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    with runtime.threads(threads):
        model.train()
        try:
            for step in progress(range(steps), desc=desc):
                losses.append(_step(model, opt, loss_fn(model, batch_fn(step)), clip, step))
        finally:
            model.eval()
    return losses


def train_and_evaluate(model, batch_fn, loss_fn, steps, evaluate, every=25, lr=1e-3, clip=1.0, on_step=None):
    """Train ``model`` with Adam and gradient clipping, evaluating it every ``every`` steps.

    ``batch_fn(step)`` gives the inputs of ``loss_fn(model, batch) -> scalar loss``;
    ``evaluate(model) -> float`` is called (under ``torch.no_grad`` and in eval mode) before the
    first step and after every ``every``-th step, and always after the last. ``on_step(step)`` is
    called after each step (for progress reporting). Returns ``(eval_steps, eval_values)``. The model
    is left in eval mode, also when a step fails; a non-finite loss raises ``FloatingPointError``.
    """
    _check(steps, lr, clip)
    positive_int(every, "every")
    opt = torch.optim.Adam(model.parameters(), lr=lr)

    def record(step):
        model.eval()
        with torch.no_grad():
            history[0].append(step)
            history[1].append(float(evaluate(model)))
        model.train()

    history = ([], [])
    model.train()
    try:
        record(0)
        for step in range(1, steps + 1):
            _step(model, opt, loss_fn(model, batch_fn(step)), clip, step)
            if step % every == 0 or step == steps:
                record(step)
            if on_step is not None:
                on_step(step)
    finally:
        model.eval()
    return history
