"""The adding-problem race of section 9.4: a transformer block, a GRU and a vanilla RNN trained on
the same data, each in its own single-threaded process so that the three run side by side.

One thread per process makes each model's run bit-for-bit reproducible on a given machine, whatever
thread count the notebook itself uses.
"""

import ctypes
import ctypes.util
import math
import multiprocessing as mp
import os
import pickle
import queue as queues
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from helpers.checks import finite_float, flag, non_negative_int, positive_float, positive_int
from helpers.data import adding_problem_batch
from helpers.models import AddingTransformer, RecurrentRegressor
from helpers.progress import Bar
from helpers.train import train_and_evaluate

# The transformer's learned position embeddings fix its sequence length (the recurrent models take any):
# Result.model() rebuilds it without a setup, so a race with the transformer runs at this length.
TRANSFORMER_LENGTH = 100
MODELS = {
    "transformer": lambda: AddingTransformer(features=2, length=TRANSFORMER_LENGTH, d=64, heads=4),
    "GRU": lambda: RecurrentRegressor("gru", features=2, hidden=64),
    "RNN": lambda: RecurrentRegressor("rnn", features=2, hidden=64),
}

# Submitted in this order, the longest first, so that with fewer processes than models the short ones
# fill in behind it (a training step single-threaded: about 34, 17 and 10 ms here, measured 2026-12).
SLOWEST_FIRST = ("GRU", "transformer", "RNN")


@dataclass
class Setup:
    """The race's setup, shared by every model: data, optimizer, budget and evaluation."""

    length: int = 100          # sequence length, even (a marker per half); the transformer's is TRANSFORMER_LENGTH
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
        for name in ("length", "batch", "steps", "test_size", "every"):
            positive_int(getattr(self, name), name)
        if self.length % 2:
            raise ValueError(f"length must be even (one marker in each half), got {self.length}")
        for name in ("seed", "data_seed", "test_seed"):
            if non_negative_int(getattr(self, name), name) >= 2**64:       # what torch.manual_seed takes
                raise ValueError(f"{name} must be below 2**64, got {getattr(self, name)}")
        positive_float(self.lr, "lr")
        if self.clip is not None:
            positive_float(self.clip, "clip")


@dataclass
class Result:
    """One model's run: parameter count, test MSE at ``steps``, and the trained weights.

    For the transformer, ``readout`` holds, at each of ``steps``, the readout token's attention on the
    first test sequence, per head: arrays ``(heads, length)`` (section 9.4's control turns through them).
    """

    name: str
    params: int
    steps: list = field(default_factory=list)
    test_mse: list = field(default_factory=list)
    state: dict = field(default_factory=dict)
    readout: list = field(default_factory=list)

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
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be a helpers.race.Setup, got {type(setup).__name__}")
    return adding_problem_batch(setup.test_size, setup.length, torch.Generator().manual_seed(setup.test_seed))


def _setup(setup, names):
    """``setup`` (None: ``Setup()``) for the models ``names``, or ValueError before anything trains."""
    setup = Setup() if setup is None else setup
    if not isinstance(setup, Setup):
        raise ValueError(f"setup must be a helpers.race.Setup, got {type(setup).__name__}")
    if "transformer" in names and setup.length != TRANSFORMER_LENGTH:
        raise ValueError(f"the transformer is built for sequences of length {TRANSFORMER_LENGTH}"
                         f" (TRANSFORMER_LENGTH), got setup.length = {setup.length}: race the others alone")
    return setup


def run_one(name, setup=None, on_step=None):
    """Train model ``name`` (a key of ``MODELS``) under ``setup`` (None: ``Setup()``); return its ``Result``."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {list(MODELS)}")
    setup = _setup(setup, (name,))
    torch.manual_seed(setup.seed)
    model = MODELS[name]()
    data = torch.Generator().manual_seed(setup.data_seed)
    x_test, y_test = test_set(setup)
    readout, evaluated = [], []

    def evaluate(m):
        # The attention is read only, so the training run and its test MSE are the same with or without it.
        if isinstance(m, AddingTransformer):
            readout.append(m(x_test[:1], need_weights=True)[1][0, :, 1:].numpy().copy())
        value = F.mse_loss(m(x_test), y_test).item()
        if not math.isfinite(value):        # the lane has failed, even if its training loss is finite
            step = min(len(evaluated) * setup.every, setup.steps)      # evaluations: 0, every, ..., steps
            raise FloatingPointError(f"the test MSE of {name} is {value} at step {step}")
        evaluated.append(value)
        return value

    steps, mse = train_and_evaluate(
        model,
        batch_fn=lambda step: adding_problem_batch(setup.batch, setup.length, data),
        loss_fn=lambda m, batch: F.mse_loss(m(batch[0]), batch[1]),
        steps=setup.steps,
        evaluate=evaluate,
        every=setup.every,
        lr=setup.lr,
        clip=setup.clip,
        on_step=on_step,
    )
    params = sum(p.numel() for p in model.parameters())
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return Result(name, params, steps, mse, state, readout)


def usable_cores():
    """The cores this process may compute on: its CPU affinity, bounded by a container's CPU quota (a
    cgroup's ``cpu.max``, as Binder and Kubernetes set it), at least 1.

    ``os.cpu_count()`` counts the host's cores: under a quota of two cores on a host of 16 it says 16, and
    a race sized by it started three workers, each a process with its own copy of torch (about 0.3 GB).
    The environment's ``BOOK_CORES``, if set, replaces the count: ``make guarantees`` runs 9.4 as on a
    32-core machine (three workers, 29 threads beside them) on two cores.
    """
    env = os.environ.get("BOOK_CORES", "").strip()
    if env:
        return positive_int(int(env) if env.isdecimal() else env, "the environment's BOOK_CORES")
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    for quota_file, period_file in (("/sys/fs/cgroup/cpu.max", None),                       # cgroup v2
                                    ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us")):
        try:
            with open(quota_file) as f:
                fields = f.read().split()
            if period_file:
                with open(period_file) as f:
                    fields.append(f.read().strip())
            quota, period = fields[0], int(fields[1])
            if quota not in ("max", "-1") and int(quota) > 0 and period > 0:
                cores = min(cores, max(1, math.ceil(int(quota) / period)))
            break
        except (OSError, ValueError, IndexError):
            continue
    return max(1, cores)


def _trim():
    """Give the C heap's free memory back to the system (glibc's ``malloc_trim``; elsewhere nothing). A worker's
    training frees most of what each evaluation allocates, but glibc keeps it: about 45 MB of a worker's 280."""
    if _malloc_trim[0] is None:
        try:
            _malloc_trim[0] = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
        except (OSError, AttributeError, TypeError):
            _malloc_trim[0] = False
    if _malloc_trim[0]:
        _malloc_trim[0](0)


_malloc_trim = [None]


def _start_worker(channel):
    """Each worker process: one thread (reproducible runs), and a channel back to the race."""
    global _channel
    torch.set_num_threads(1)
    # Jupyter interrupts a kernel by signalling its whole process group, these workers included: an
    # interrupted cell must not end the race (the race's own cell, waiting, is what the reader stops).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _channel = channel
    channel.put(("worker", None, os.getpid()))


def _lane(run, name, setup, report_every):
    """One model's run in a worker, reporting its start (with the worker's id) and its progress."""
    _channel.put(("start", name, os.getpid()))

    def on_step(step):
        if step % report_every == 0:
            _channel.put(("progress", name, report_every))
            _trim()                          # memory only: what the run computes is the same

    try:
        return run(name, setup, on_step)
    except Exception as error:
        try:
            pickle.loads(pickle.dumps(error))
        except Exception:
            # The pool would send back the pickling error instead, or break unpickling it: send the text.
            raise RuntimeError(f"{type(error).__name__}: {error} (raised in the worker; it could not be"
                               " pickled to be sent back)") from None
        raise


def _stop(pids):
    """End the workers we started (by their ids): a hung one would never return its job."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def race(names=tuple(MODELS), setup=None, workers=None, progress=True, stall=120.0, deadline=None, run=run_one,
         stop=None, on_steps=None):
    """Train every model in ``names`` under the same ``setup``; return ``{name: Result}`` in that order.

    Each model is one job for a pool of ``workers`` single-threaded (spawned) processes (default: one
    per core this process may use, ``usable_cores()``, at most one per model), submitted longest first;
    ``workers=0`` trains them one after the other in this process. With ``progress`` a bar counts the
    steps of all models together (``helpers.progress.Bar``: in a notebook a display that ends on the quiet
    line "race (3 models x 1,500 steps): 4,500 steps", elsewhere tqdm on stderr); ``on_steps(n)``, if given,
    is called as each ``n`` more steps are done, in the thread that runs the race (``start_race`` counts them
    for ``result()``).

    A watchdog ends the workers and raises ``TimeoutError`` naming the model (the lane) when a started
    model reports no progress for ``stall`` seconds, or when the whole race passes ``deadline``
    seconds (None: no deadline). A model whose training raises (a NaN loss, say), whose test MSE is
    not finite, or whose worker dies, stops the race with a ``RuntimeError`` naming it, also with
    ``workers=0``. ``run(name, setup, on_step) -> Result`` is ``run_one`` unless a
    test replaces it (with a module-level function: the workers import it by name). ``stop``, a
    ``threading.Event``, ends the race when set: its workers are ended and ``RuntimeError`` is raised.
    """
    names, workers = _lanes(names, workers)
    setup = _setup(setup, names)
    if stop is not None and not callable(getattr(stop, "is_set", None)):
        raise ValueError(f"stop must be a threading.Event (or None), got {stop!r}")
    stall = positive_float(stall, "stall")
    deadline = None if deadline is None else positive_float(deadline, "deadline")
    flag(progress, "progress")
    if on_steps is not None and not callable(on_steps):
        raise ValueError(f"on_steps must be a function of the number of steps done (or None), got {on_steps!r}")
    bar = _Count(Bar(len(names) * setup.steps, desc=_desc(len(names), setup.steps), every=1.0, disable=not progress),
                 on_steps)
    finished = False
    try:
        if workers == 0:
            results = {}

            def on_step(step):
                if stop is not None and stop.is_set():
                    raise RuntimeError("race: stopped")
                bar.update(1)

            for name in names:
                try:
                    results[name] = run(name, setup, on_step)
                except Exception as error:
                    raise RuntimeError(f"race: training {name} failed: {error!r}") from error
                _finite(name, results[name])
            finished = True
            return results
        try:
            pickle.dumps(run)
        except Exception as error:
            raise ValueError(f"run must be a module-level function when workers > 0 (the workers import it by"
                             f" name), got {run!r}: {error}") from None
        results = _race_in_processes(names, setup, workers, bar, stall, deadline, run, stop)
        finished = True
        return results
    finally:
        bar.close(finished)


def _desc(models, steps):
    """The progress line's name: "race (3 models x 1,500 steps)", so that its total reads as what it adds up."""
    return f"race ({models} model{'s' if models != 1 else ''} x {steps:,} steps)"


class _Count:
    """The race's count of steps done: shown by ``bar``, and passed on to ``on_steps``."""

    def __init__(self, bar, on_steps=None):
        self.bar, self.on_steps = bar, on_steps

    def update(self, n):
        self.bar.update(n)
        if self.on_steps is not None:
            self.on_steps(n)

    def close(self, finished):
        self.bar.close(finished)


def _lanes(names, workers):
    """``(names as a tuple, worker processes the race uses: 0 means this process)``, or ValueError."""
    if isinstance(names, str):
        raise ValueError(f"names must be a sequence of model names such as ({names!r},), got the string {names!r}")
    names = tuple(names)
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise ValueError(f"names must be some of {list(MODELS)}, got {list(names)}")
    if len(set(names)) != len(names):
        raise ValueError(f"names must be distinct, got {list(names)}")
    workers = usable_cores() if workers is None else non_negative_int(workers, "workers")
    return names, min(workers, len(names))


class Racing:
    """A race running in the background (``start_race``). ``result()`` waits for it and returns what
    ``race`` returns (or raises what it raised); ``workers`` is how many worker processes it uses;
    ``total`` is its number of steps, all models together (None if the race refused its arguments), and
    ``steps_done`` how many of them its models have reported done."""

    def __init__(self, future, workers, threads, stop, total=None, desc="race"):
        self._future, self.workers, self.threads, self._stop = future, workers, threads, stop
        self.total, self.steps_done, self.desc = total, 0, desc

    def _count(self, n):                     # called in the race's thread as its models report
        self.steps_done += n

    def done(self):
        return self._future.done()

    def result(self, timeout=None, progress=True):
        """Wait for the race (``TimeoutError`` after ``timeout`` seconds), then give this process its threads back.

        With ``progress`` the wait shows how far the race is (``helpers.progress.Bar``: in a notebook a bar
        that ends on the quiet line "race (3 models x 1,500 steps): 4,500 steps", elsewhere tqdm on stderr). A
        wait that ends early (a timeout, an interrupt) leaves the race running, its cores left to it and itself
        known to ``start_race``, which stops it if started again; the bar then says how far the race had got."""
        flag(progress, "progress")
        if timeout is not None and finite_float(timeout, "timeout") < 0:
            raise ValueError(f"timeout must be >= 0 seconds (or None: no limit), got {timeout!r}")
        end = None if timeout is None else time.monotonic() + timeout
        bar = Bar(self.total or 1, desc=self.desc, disable=not progress or self.total is None)
        succeeded = False
        try:
            while not self._future.done():
                bar.set(min(self.steps_done, bar.total))
                left = 0.5 if end is None else min(0.5, end - time.monotonic())
                if left <= 0 and end is not None:
                    raise TimeoutError(f"race: still running after the {timeout:g} s this wait allowed; it goes on")
                wait_for([self._future], timeout=left, return_when=FIRST_COMPLETED)
            value = self._future.result()
            succeeded = True
            return value
        finally:
            bar.set(min(self.steps_done, bar.total))
            bar.close(succeeded)
            if self._future.done():
                self._give_back()

    def stop(self):
        """End the race and its workers (its ``result()`` then raises ``RuntimeError``)."""
        self._stop.set()
        self._give_back()

    def _give_back(self):
        if self in _RACING:                 # once: a race stopped by a newer one gave them back then
            _RACING.remove(self)
            torch.set_num_threads(self.threads)


_RACING = []        # races start_race began and nobody has collected: a newer one stops them


def start_race(setup=None, leave_cores=True, **kw):
    """Start ``race(setup=setup, progress=False, **kw)`` in a background thread; return a ``Racing``.

    The race's worker processes then train while the caller runs other code; ``.result()`` waits for
    the race, showing how far it is. The training runs are the same as in the foreground: each model
    trains on one thread in its own process. With ``leave_cores`` this process computes on the cores the
    workers leave it, with one thread at least, until ``.result()`` (more busy threads than cores slow
    every one of them); the thread count it had is given back then, or by ``.stop()``. A race started
    earlier by ``start_race`` and not yet collected (its cell run again, say) is stopped first, its
    workers ended.
    """
    for earlier in list(_RACING):
        earlier.stop()
    flag(leave_cores, "leave_cores")
    try:
        if "names" in kw and not isinstance(kw["names"], str):
            kw["names"] = tuple(kw["names"])          # read once: a generator would be empty for race
        names, workers = _lanes(kw.get("names", tuple(MODELS)), kw.get("workers"))
    except (TypeError, ValueError):                   # race refuses them too, and says so through the future
        names, workers = (), 0
    try:
        steps = _setup(setup, names).steps if names else None
    except (TypeError, ValueError):
        steps = None
    total = None if steps is None else len(names) * steps
    desc = "race" if steps is None else _desc(len(names), steps)
    stop = threading.Event()
    pool = ThreadPoolExecutor(1, thread_name_prefix="race")
    racing = Racing(None, workers, torch.get_num_threads(), stop, total, desc)
    racing._future = pool.submit(race, setup=setup, progress=False, stop=stop, on_steps=racing._count, **kw)
    pool.shutdown(wait=False)             # the thread ends with the race
    _RACING.append(racing)
    if leave_cores and workers:
        torch.set_num_threads(max(1, min(racing.threads, usable_cores() - workers)))
    return racing


def _race_in_processes(names, setup, workers, bar, stall, deadline, run, stop=None):
    ctx = mp.get_context("spawn")           # fork after torch has started threads is unsafe
    channel = ctx.Queue()
    report_every = max(1, setup.steps // 100)
    pool = ProcessPoolExecutor(min(workers, len(names)), mp_context=ctx, initializer=_start_worker, initargs=(channel,))
    jobs = {name: pool.submit(_lane, run, name, setup, report_every)
            for name in sorted(names, key=lambda n: SLOWEST_FIRST.index(n) if n in SLOWEST_FIRST else len(SLOWEST_FIRST))}
    pids, heard, lanes, processes = set(), {}, {}, {}   # worker ids; when each model last reported; its worker
    began = last = time.monotonic()
    finished = False

    def read(message):
        kind, name, payload = message
        if kind in ("worker", "start"):
            pids.add(payload)
        if kind == "start":
            lanes[name] = payload
        if name is not None:
            heard[name] = time.monotonic()
        if kind == "progress":
            bar.update(payload)

    try:
        while not all(job.done() for job in jobs.values()):
            try:
                read(channel.get(timeout=0.5))
                last = time.monotonic()
            except queues.Empty:
                pass
            processes.update(getattr(pool, "_processes", None) or {})    # to read a dead worker's exit code
            _raise_failures(jobs, channel, read, lanes, processes)
            now = time.monotonic()
            running = [n for n, job in jobs.items() if not job.done()]
            silent = [n for n in running if n in heard and now - heard[n] > stall]
            if not silent and now - last > stall:
                silent = running                 # nothing at all for too long: the workers never started
            if silent:
                raise TimeoutError(f"race: no progress from {', '.join(silent)} for {stall:g} s; its worker was stopped")
            if stop is not None and stop.is_set():
                raise RuntimeError("race: stopped (a newer race was started, or stop() was called); its workers were ended")
            if deadline is not None and now - began > deadline:
                raise TimeoutError(f"race: {', '.join(running)} still running after the {deadline:g} s deadline; stopped")
        _raise_failures(jobs, channel, read, lanes, processes)
        results = {name: _finite(name, jobs[name].result()) for name in names}
        finished = True
        return results
    finally:
        if not finished:
            # Workers that never reported (stuck starting) are ended too: Python 3.11's executor has no
            # public way to end its workers (terminate_workers() comes in 3.14), so read its pid table.
            _stop(pids | set(getattr(pool, "_processes", None) or ()))
        pool.shutdown(wait=finished, cancel_futures=True)
        channel.close()
        channel.cancel_join_thread()


def _finite(name, result):
    """``result``, unless it is not a ``Result`` or its test MSE is not finite somewhere: then the lane failed."""
    if not isinstance(result, Result):
        raise RuntimeError(f"race: training {name} failed: run returned {type(result).__name__}, not a Result")
    bad = [(s, v) for s, v in zip(result.steps, result.test_mse, strict=True) if not math.isfinite(v)]
    if bad:
        raise RuntimeError(f"race: training {name} failed: its test MSE is {bad[0][1]} at step {bad[0][0]}")
    return result


def _raise_failures(jobs, channel, read, lanes, processes):
    """Raise for the first model whose job failed, naming it (or, if a worker died, the model it ran)."""
    for name, job in jobs.items():
        error = job.exception() if job.done() else None
        if isinstance(error, BrokenProcessPool):
            raise RuntimeError(f"race: {_who_died(jobs, channel, read, lanes, processes)}") from error
        if error is not None:
            raise RuntimeError(f"race: training {name} failed: {error!r}") from error


def _who_died(jobs, channel, read, lanes, processes):
    """Which lane's worker died. When one worker dies the pool fails every job still running and ends
    the other workers with SIGTERM, so the lane whose worker ended otherwise is the one that died."""
    while True:                                          # the lanes' last "start" messages
        try:
            read(channel.get_nowait())
        except (queues.Empty, OSError, ValueError):
            break
    broken = [n for n, job in jobs.items() if job.done() and isinstance(job.exception(), BrokenProcessPool)]
    ended = {}
    for name in broken:
        process = processes.get(lanes.get(name))
        if process is not None:
            process.join(5)
            ended[name] = process.exitcode
    dead = {n: code for n, code in ended.items() if code is not None and code != -signal.SIGTERM}
    if not dead and len(broken) == 1:
        dead = {broken[0]: ended.get(broken[0])}     # its start message may have died with it
    if not dead:
        return f"a worker died while training one of {', '.join(broken)}"
    how = {n: "" if code is None else f" (killed by signal {-code})" if code < 0 else f" (exit code {code})"
           for n, code in dead.items()}
    return f"{'a worker' if len(dead) == 1 else 'workers'} died while training " + ", ".join(n + how[n] for n in dead)
