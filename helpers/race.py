"""The adding-problem race of section 9.4: a transformer block, a GRU and a vanilla RNN trained on
the same data, each in its own single-threaded process so that the three run side by side.

One thread per process makes each model's run bit-for-bit reproducible on a given machine, whatever
thread count the notebook itself uses.
"""

import multiprocessing as mp
import os
import queue as queues
import sys
import traceback
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F
from tqdm import tqdm

from helpers.data import adding_problem_batch
from helpers.models import AddingTransformer, RecurrentRegressor
from helpers.train import train_and_evaluate

MODELS = {
    "transformer": lambda: AddingTransformer(features=2, length=100, d=64, heads=4),
    "GRU": lambda: RecurrentRegressor("gru", features=2, hidden=64),
    "RNN": lambda: RecurrentRegressor("rnn", features=2, hidden=64),
}


# Relative cost of a training step, single-threaded (measured: about 31, 54 and 22 ms here). Used only
# to share the models out among fewer processes than models, the slowest alone.
COST = {"transformer": 31, "GRU": 54, "RNN": 22}


def lanes(names, workers):
    """Share ``names`` among ``workers`` processes, greedily by cost: a list of lists of names."""
    if workers < 1:
        raise ValueError(f"workers must be positive, got {workers}")
    groups = [[] for _ in range(min(workers, len(names)))]
    for name in sorted(names, key=lambda n: -COST.get(n, 1)):
        min(groups, key=lambda g: sum(COST.get(n, 1) for n in g)).append(name)
    return groups


@dataclass
class Setup:
    """The race's setup, shared by every model: data, optimizer, budget and evaluation."""

    length: int = 100          # sequence length
    batch: int = 64            # a fresh batch every step
    steps: int = 1500
    lr: float = 1e-3           # Adam
    clip: float = 1.0          # gradient-norm clipping
    test_size: int = 256       # fixed held-out sequences
    every: int = 25            # evaluate on them every `every` steps
    seed: int = 0              # model initialization
    data_seed: int = 1         # the training batches' own generator
    test_seed: int = 2         # the test set's generator

    def __post_init__(self):
        for name in ("batch", "steps", "test_size", "every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")


@dataclass
class Result:
    """One model's run: parameter count, test MSE at ``steps``, and the trained weights."""

    name: str
    params: int
    steps: list = field(default_factory=list)
    test_mse: list = field(default_factory=list)
    state: dict = field(default_factory=dict)

    def model(self):
        """The trained model, rebuilt from its weights (in eval mode)."""
        model = MODELS[self.name]()
        model.load_state_dict({k: torch.as_tensor(v) for k, v in self.state.items()})
        return model.eval()

    def first_below(self, level):
        """The first evaluated step at which the test MSE is below ``level``, or None."""
        return next((s for s, v in zip(self.steps, self.test_mse, strict=True) if v < level), None)


def test_set(setup):
    """The fixed held-out sequences: ``(x (test_size, length, 2), y (test_size,))``."""
    return adding_problem_batch(setup.test_size, setup.length, torch.Generator().manual_seed(setup.test_seed))


def run_one(name, setup, on_step=None):
    """Train model ``name`` (a key of ``MODELS``) under ``setup``; return its ``Result``."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {list(MODELS)}")
    torch.manual_seed(setup.seed)
    model = MODELS[name]()
    data = torch.Generator().manual_seed(setup.data_seed)
    x_test, y_test = test_set(setup)
    steps, mse = train_and_evaluate(
        model,
        batch_fn=lambda step: adding_problem_batch(setup.batch, setup.length, data),
        loss_fn=lambda m, batch: F.mse_loss(m(batch[0]), batch[1]),
        steps=setup.steps,
        evaluate=lambda m: F.mse_loss(m(x_test), y_test).item(),
        every=setup.every,
        lr=setup.lr,
        clip=setup.clip,
        on_step=on_step,
    )
    params = sum(p.numel() for p in model.parameters())
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return Result(name, params, steps, mse, state)


def _worker(names, setup, channel, report_every):
    torch.set_num_threads(1)
    for name in names:
        try:
            def on_step(step, name=name):
                if step % report_every == 0:
                    channel.put(("progress", name, report_every))

            channel.put(("done", name, run_one(name, setup, on_step)))
        except BaseException:
            channel.put(("error", name, traceback.format_exc()))
            return


def race(names=tuple(MODELS), setup=None, workers=None, progress=True):
    """Train every model in ``names`` under the same ``setup``; return ``{name: Result}``.

    The models are shared among ``workers`` single-threaded (spawned) processes (default: one per
    CPU core, at most one per model) that run side by side; ``workers=0`` trains them one after the
    other in this process. A tqdm bar on stderr counts the steps of all models together.
    """
    setup = setup or Setup()
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise ValueError(f"names must be some of {list(MODELS)}, got {list(names)}")
    workers = (os.cpu_count() or 1) if workers is None else workers
    bar = tqdm(total=len(names) * setup.steps, desc="race", file=sys.stderr, mininterval=5.0,
               leave=False, disable=not progress)
    results = {}
    if workers == 0:
        for name in names:
            results[name] = run_one(name, setup, on_step=lambda step: bar.update(1))
        bar.close()
        return results
    ctx = mp.get_context("spawn")           # fork after torch has started threads is unsafe
    channel = ctx.Queue()
    report_every = max(1, setup.steps // 100)
    procs = [ctx.Process(target=_worker, args=(group, setup, channel, report_every), daemon=True)
             for group in lanes(names, workers)]
    for p in procs:
        p.start()
    try:
        while len(results) < len(names):
            try:
                kind, name, payload = channel.get(timeout=5)
            except queues.Empty:
                if not any(p.is_alive() for p in procs):
                    raise RuntimeError("a race worker died without reporting") from None
                continue
            if kind == "progress":
                bar.update(payload)
            elif kind == "error":
                raise RuntimeError(f"training {name} failed:\n{payload}")
            else:
                results[name] = payload
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
        bar.close()
    return {n: results[n] for n in names}
