"""A small training loop with a progress bar on stderr (kept out of nbval's compared output)."""

import sys

import torch
from tqdm import tqdm


def _step(model, opt, loss, clip):
    """One optimizer step on ``loss``, with the gradient norm clipped at ``clip``; returns the loss."""
    opt.zero_grad()
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss.item()


def train(model, batch_fn, loss_fn, steps, lr=1e-3, clip=1.0, desc="training"):
    """Train ``model`` with Adam and gradient clipping; return the list of training losses.

    ``batch_fn(step)`` returns the inputs of ``loss_fn(model, batch) -> scalar loss``.
    """
    if steps < 1:
        raise ValueError(f"steps must be positive, got {steps}")
    if lr <= 0 or (clip is not None and clip <= 0):
        raise ValueError(f"lr and clip must be positive, got lr={lr}, clip={clip}")
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for step in tqdm(range(steps), desc=desc, file=sys.stderr, mininterval=1.0, leave=False):
        losses.append(_step(model, opt, loss_fn(model, batch_fn(step)), clip))
    model.eval()
    return losses


def train_and_evaluate(model, batch_fn, loss_fn, steps, evaluate, every=25, lr=1e-3, clip=1.0, on_step=None):
    """Train ``model`` with Adam and gradient clipping, evaluating it every ``every`` steps.

    ``batch_fn(step)`` gives the inputs of ``loss_fn(model, batch) -> scalar loss``;
    ``evaluate(model) -> float`` is called (under ``torch.no_grad`` and in eval mode) before the
    first step and after every ``every``-th step, and always after the last. ``on_step(step)`` is
    called after each step (for progress reporting). Returns ``(eval_steps, eval_values)``.
    """
    if steps < 1 or every < 1:
        raise ValueError(f"steps and every must be positive, got steps={steps}, every={every}")
    if lr <= 0 or (clip is not None and clip <= 0):
        raise ValueError(f"lr and clip must be positive, got lr={lr}, clip={clip}")
    opt = torch.optim.Adam(model.parameters(), lr=lr)

    def record(step):
        model.eval()
        with torch.no_grad():
            history[0].append(step)
            history[1].append(float(evaluate(model)))
        model.train()

    history = ([], [])
    model.train()
    record(0)
    for step in range(1, steps + 1):
        _step(model, opt, loss_fn(model, batch_fn(step)), clip)
        if step % every == 0 or step == steps:
            record(step)
        if on_step is not None:
            on_step(step)
    model.eval()
    return history
