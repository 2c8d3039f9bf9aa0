"""A small training loop with a progress bar on stderr (kept out of nbval's compared output)."""

import sys

import torch
from tqdm import tqdm


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
        loss = loss_fn(model, batch_fn(step))
        opt.zero_grad()
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses
