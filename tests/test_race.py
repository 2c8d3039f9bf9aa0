import concurrent.futures
import multiprocessing as mp
import os
import signal
import time

import pytest
import torch

from helpers import race as race_module
from helpers.race import MODELS, SLOWEST_FIRST, Result, Setup, race, run_one, start_race, usable_cores
from helpers.race import test_set as held_out
from helpers.train import train_and_evaluate

SMALL = Setup(steps=4, every=2, test_size=8, batch=4)


def test_every_model_has_a_place_in_the_submission_order():
    assert sorted(SLOWEST_FIRST) == sorted(MODELS)


def test_setup_rejects_bad_values():
    with pytest.raises(ValueError, match="steps"):
        Setup(steps=0)
    with pytest.raises(ValueError, match="lr must be a positive finite number, got 0"):
        Setup(lr=0)
    with pytest.raises(ValueError, match="clip must be a positive finite number, got nan"):
        Setup(clip=float("nan"))
    with pytest.raises(ValueError, match="batch must be a positive int, got 4.5"):
        Setup(batch=4.5)


def test_run_one_is_reproducible_and_records_evaluations():
    a, b = run_one("RNN", SMALL), run_one("RNN", SMALL)
    assert a.steps == [0, 2, 4] and a.test_mse == b.test_mse
    assert a.params == sum(p.numel() for p in MODELS["RNN"]().parameters())
    x, _ = held_out(SMALL)
    assert torch.equal(a.model()(x), b.model()(x))


def test_the_transformer_records_its_readout_attention_at_each_evaluation():
    t, rnn = run_one("transformer", SMALL), run_one("RNN", SMALL)
    assert len(t.readout) == len(t.steps) and rnn.readout == []
    x, _ = held_out(SMALL)
    for w in t.readout:
        assert w.shape == (4, SMALL.length)
        assert (w >= 0).all() and (w.sum(1) <= 1 + 1e-6).all()    # a share of one softmax: the readout's own weight is left out
    with torch.no_grad():                                      # the last one is the trained model's
        _, last = t.model()(x[:1], need_weights=True)
    assert torch.allclose(torch.as_tensor(t.readout[-1]), last[0, :, 1:])


def test_first_below():
    r = Result("GRU", 1, steps=[0, 25, 50], test_mse=[0.2, 0.05, 0.001])
    assert r.first_below(0.1) == 25 and r.first_below(0.001) is None


def test_race_in_processes_matches_the_race_in_this_process():
    here = race(("transformer", "RNN"), SMALL, workers=0, progress=False)
    there = race(("transformer", "RNN"), SMALL, workers=2, progress=False)
    assert list(there) == ["transformer", "RNN"]
    for name in here:
        assert here[name].steps == there[name].steps
        assert here[name].test_mse == pytest.approx(there[name].test_mse, rel=1e-5)


def hang(name, setup, on_step):
    """A lane that never finishes (module level: the workers import it by name)."""
    if name == "RNN":
        time.sleep(3600)
    return run_one(name, setup, on_step)


def fail(name, setup, on_step):
    raise ArithmeticError(f"no {name} today")


def die(name, setup, on_step):
    os._exit(3)


def test_watchdog_stops_a_hung_lane_and_names_it():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="no progress from RNN for 2 s"):
        race(("RNN",), SMALL, workers=1, progress=False, stall=2, run=hang)
    assert time.monotonic() - start < 60
    for _ in range(50):                                    # the hung worker was ended, not left asleep
        if not mp.active_children():
            break
        time.sleep(0.1)
    assert not mp.active_children()


def test_deadline_names_the_lanes_still_running():
    with pytest.raises(TimeoutError, match=r"RNN still running after the 1 s deadline"):
        race(("RNN",), SMALL, workers=1, progress=False, deadline=1, run=hang)


def test_a_failing_or_dying_lane_is_named():
    with pytest.raises(RuntimeError, match="training GRU failed: ArithmeticError") as failure:
        race(("GRU",), SMALL, workers=1, progress=False, run=fail)
    assert isinstance(failure.value.__cause__, ArithmeticError)
    with pytest.raises(RuntimeError, match="a worker died while training GRU"):
        race(("GRU",), SMALL, workers=1, progress=False, run=die)


def test_race_rejects_duplicate_names_and_bad_limits():
    with pytest.raises(ValueError, match="names must be distinct"):
        race(("RNN", "RNN"), SMALL)
    with pytest.raises(ValueError, match="stall must be a positive finite number"):
        race(("RNN",), SMALL, stall=0)
    with pytest.raises(ValueError, match="workers must be a non-negative int"):
        race(("RNN",), SMALL, workers=-1)


def test_race_rejects_unknown_models():
    with pytest.raises(ValueError, match="names"):
        race(("LSTM",), SMALL)
    with pytest.raises(ValueError, match="unknown"):
        run_one("LSTM", SMALL)


def test_train_and_evaluate_schedule_and_arguments():
    model = torch.nn.Linear(2, 1)
    calls = []
    steps, values = train_and_evaluate(
        model, lambda s: torch.zeros(3, 2), lambda m, b: m(b).pow(2).mean(), steps=5,
        evaluate=lambda m: 1.0, every=2, on_step=calls.append)
    assert steps == [0, 2, 4, 5] and values == [1.0] * 4 and calls == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="steps must be a positive int, got 0"):
        train_and_evaluate(model, None, None, steps=0, evaluate=None)


# Issue 23: the race's errors name the one lane that failed, and a NaN test error fails its lane.
def nan_mse(name, setup, on_step):
    """A lane whose training loss stays finite but whose test MSE is NaN."""
    result = run_one(name, setup, on_step)
    result.test_mse[-1] = float("nan")
    return result


def nan_loss(name, setup, on_step):
    raise FloatingPointError("the loss is nan at step 3; the weights are those before that step")


def one_dies(name, setup, on_step):
    """RNN's worker dies while GRU's is still training."""
    if name == "RNN":
        time.sleep(2)
        os._exit(3)
    time.sleep(8)                                    # still training when RNN dies, 2 s in
    return run_one(name, setup, on_step)


class Unpicklable(Exception):
    def __init__(self, message, extra):                   # pickles, but cannot be rebuilt from its args
        super().__init__(message)
        self.extra = extra


def raise_unpicklable(name, setup, on_step):
    raise Unpicklable(f"no {name} today", extra=1)


def raise_with_a_lock(name, setup, on_step):
    import threading

    raise ValueError(f"no {name} today", threading.Lock())   # cannot be pickled at all


@pytest.mark.parametrize("workers", [0, 1])
def test_a_nan_test_mse_fails_its_lane(workers):
    with pytest.raises(RuntimeError, match="race: training RNN failed: its test MSE is nan at step 4"):
        race(("RNN",), SMALL, workers=workers, progress=False, run=nan_mse)


def test_run_one_refuses_a_nan_test_mse(monkeypatch):
    from helpers import race as module

    monkeypatch.setattr(module.F, "mse_loss", lambda a, b: torch.tensor(float("nan")) + 0 * a.sum())
    with pytest.raises(FloatingPointError, match="the test MSE of RNN is nan at step 0"):
        run_one("RNN", SMALL)                  # the training loss is NaN too, but evaluation comes first


def test_a_failing_lane_in_this_process_is_named():
    with pytest.raises(RuntimeError, match=r"race: training GRU failed: FloatingPointError\('the loss is nan") as failure:
        race(("GRU",), SMALL, workers=0, progress=False, run=nan_loss)
    assert isinstance(failure.value.__cause__, FloatingPointError)


def test_a_dying_worker_names_its_lane_only():
    with pytest.raises(RuntimeError, match=r"a worker died while training RNN \(exit code 3\)$"):
        race(("GRU", "RNN"), SMALL, workers=2, progress=False, run=one_dies)


@pytest.mark.parametrize("run", [raise_unpicklable, raise_with_a_lock])
def test_an_exception_that_does_not_pickle_keeps_its_message(run):
    with pytest.raises(RuntimeError, match="training RNN failed: .*no RNN today"):
        race(("RNN",), SMALL, workers=1, progress=False, run=run)


def test_race_refuses_a_string_of_names_a_foreign_setup_and_a_non_bool_progress():
    with pytest.raises(ValueError, match="names must be a sequence of model names such as \\('GRU',\\)"):
        race("GRU", SMALL)                         # was read as the models 'G', 'R' and 'U'
    with pytest.raises(ValueError, match="setup must be a helpers.race.Setup, got dict"):
        race(("GRU",), {"steps": 4})               # an AttributeError before
    with pytest.raises(ValueError, match="progress must be True or False"):
        race(("GRU",), SMALL, progress="no")


def returns_none(name, setup, on_step):
    return None


def test_race_names_a_run_it_cannot_send_or_a_lane_that_returns_no_result():
    with pytest.raises(ValueError, match="run must be a module-level function when workers > 0"):
        race(("RNN",), SMALL, workers=1, progress=False, run=lambda n, s, o: run_one(n, s, o))
    with pytest.raises(RuntimeError, match="race: training RNN failed: run returned NoneType, not a Result"):
        race(("RNN",), SMALL, workers=0, progress=False, run=returns_none)     # an AttributeError before
    with pytest.raises(ValueError, match=r"seed must be below 2\*\*64"):
        Setup(seed=2**64)                          # "Overflow when unpacking long long" inside the lane before


def test_start_race_runs_the_race_in_the_background_and_returns_its_results():
    future = start_race(SMALL, names=("RNN",), workers=0)
    assert future.workers == 0                                  # it trains in this process
    results = future.result(timeout=120)
    assert list(results) == ["RNN"] and results["RNN"].steps[-1] == SMALL.steps
    failing = start_race(SMALL, names=("GRU",), workers=1, run=fail)
    assert failing.workers == 1
    with pytest.raises(RuntimeError, match="training GRU failed"):
        failing.result(timeout=120)
    both = start_race(SMALL, names=("GRU", "RNN"), run=fail)      # default: a worker per core, one per model at most
    assert both.workers == min(usable_cores(), 2)
    with pytest.raises(RuntimeError, match="failed"):
        both.result(timeout=120)
    lazy = start_race(SMALL, names=(n for n in ("RNN",)), workers=0)                  # a generator, read once
    assert lazy.workers == 0 and list(lazy.result(timeout=120)) == ["RNN"]
    for refused in ({"workers": -1}, {"workers": 2.0}, {"names": ("RNN", "RNN")}, {"names": "RNN"}, {"names": 3}):
        future = start_race(SMALL, **refused)
        assert future.workers == 0                     # what race refuses starts no worker
        with pytest.raises((ValueError, TypeError)):
            future.result(timeout=120)


def test_start_race_leaves_the_workers_their_cores_and_a_second_start_stops_the_first(monkeypatch):
    """9.4's reader ran the race's cell twice: the first race went on beside the second (four workers on two
    cores), and the thread count the notebook restored was the one the first race had lowered."""
    monkeypatch.setattr(race_module, "usable_cores", lambda: 3)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        first = start_race(Setup(steps=10_000, every=5_000, test_size=4, batch=4), names=("RNN", "GRU"), workers=2)
        assert torch.get_num_threads() == 1                 # 3 cores, 2 workers: one thread for this process
        with pytest.raises(concurrent.futures.TimeoutError):
            first.result(timeout=0.1)                       # a wait interrupted: the race goes on, still known
        assert torch.get_num_threads() == 1
        second = start_race(SMALL, names=("RNN",), workers=1)
        with pytest.raises(RuntimeError, match="race: stopped"):
            first.result(timeout=60)                        # its workers were ended, long before 10,000 steps
        assert torch.get_num_threads() == 2                 # 3 threads before either race, less second's worker
        assert list(second.result(timeout=120)) == ["RNN"]
        assert torch.get_num_threads() == 3                 # given back
        untouched = start_race(SMALL, names=("RNN",), workers=1, leave_cores=False)
        assert torch.get_num_threads() == 3 and list(untouched.result(timeout=120)) == ["RNN"]
    finally:
        torch.set_num_threads(threads)


def ignores_sigint(pid):
    """Whether process ``pid`` ignores SIGINT (Linux: the SigIgn mask in /proc)."""
    try:
        mask = next(line for line in open(f"/proc/{pid}/status") if line.startswith("SigIgn:"))
    except (OSError, StopIteration):
        return False
    return bool(int(mask.split()[1], 16) >> (signal.SIGINT - 1) & 1)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the signal mask from Linux's /proc")
def test_a_workers_interrupt_does_not_end_the_race():
    # Jupyter's interrupt signals the kernel's process group, the race's workers included.
    racing = start_race(Setup(steps=300, every=300, test_size=4, batch=4), names=("RNN",), workers=1)
    deadline = time.monotonic() + 60
    while not (ready := [c.pid for c in mp.active_children() if ignores_sigint(c.pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)                                     # until the worker's initializer has run
    assert ready
    for pid in ready:
        os.kill(pid, signal.SIGINT)
    assert racing.result(timeout=120)["RNN"].steps[-1] == 300


# The review that passed bad input to the helpers.
def test_the_transformers_length_is_checked_before_anything_trains(monkeypatch):
    """Setup(length=50) reached the transformer, built for 100, and failed deep inside: 'x must be (batch, 100, 2)'."""
    from helpers import race as module

    short = Setup(length=50, steps=2, every=1, test_size=4, batch=4)
    message = "the transformer is built for sequences of length 100 .*got setup.length = 50"
    monkeypatch.setattr(module, "ProcessPoolExecutor", None)          # no process may start
    with pytest.raises(ValueError, match=message):
        run_one("transformer", short)
    for workers in (0, 2):
        with pytest.raises(ValueError, match=message):
            race(("GRU", "transformer"), short, workers=workers, progress=False)
    with pytest.raises(ValueError, match=message):
        start_race(short, workers=2).result(timeout=60)
    assert race(("GRU",), short, workers=0, progress=False)["GRU"].steps == [0, 1, 2]    # the others take any length


def test_setup_refuses_an_odd_length():
    """Setup(length=7) was taken, and failed later inside a lane (one marker per half)."""
    with pytest.raises(ValueError, match="length must be even .*, got 7"):
        Setup(length=7)


def test_run_one_takes_no_setup_as_race_does(monkeypatch):
    """run_one("RNN", None) raised AttributeError; race takes None as Setup()."""
    from dataclasses import dataclass

    from helpers import race as module

    @dataclass
    class Small(Setup):                                               # Setup() itself trains 1,500 steps
        steps: int = SMALL.steps
        every: int = SMALL.every
        test_size: int = SMALL.test_size
        batch: int = SMALL.batch

    want = run_one("RNN", SMALL).test_mse
    monkeypatch.setattr(module, "Setup", Small)
    assert run_one("RNN", None).test_mse == want
    with pytest.raises(ValueError, match="setup must be a helpers.race.Setup, got dict"):
        run_one("RNN", {"steps": 2})


def test_a_setup_and_a_stop_of_the_wrong_kind_are_named():
    """Bad input to the helpers: test_set(dict) raised AttributeError, and race(stop=True) blamed the GRU's training."""
    from helpers.race import Setup, race, test_set
    with pytest.raises(ValueError, match="setup must be a helpers.race.Setup"):
        test_set({"test_size": 4})
    with pytest.raises(ValueError, match="stop must be a threading.Event"):
        race(("RNN",), Setup(steps=2, every=1, test_size=4, batch=2), workers=0, progress=False, stop=True)


@pytest.mark.parametrize(("files", "want"), [
    ({"/sys/fs/cgroup/cpu.max": "max 100000"}, 16),                       # no quota: the affinity
    ({"/sys/fs/cgroup/cpu.max": "200000 100000"}, 2),                     # Binder-like: 2 cores of 16
    ({"/sys/fs/cgroup/cpu.max": "150000 100000"}, 2),                     # 1.5 cores: 2 busy processes fit
    ({"/sys/fs/cgroup/cpu.max": "50000 100000"}, 1),
    ({"/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "300000", "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000"}, 3),   # v1
    ({"/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1", "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000"}, 16),
    ({}, 16),
])
def test_the_race_sizes_its_workers_by_the_cores_it_may_use(monkeypatch, files, want):
    """Issue 34: os.cpu_count() counts the host's cores; under a container's quota (Binder: 2 GiB, a core or
    two of a large host) a race sized by it started a worker per model, each with its own torch."""
    import io

    def fake_open(path, *args, **kwargs):
        if path in files:
            return io.StringIO(files[path])
        raise FileNotFoundError(path)

    monkeypatch.setattr(race_module, "open", fake_open, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert usable_cores() == want
    assert race_module._lanes(("GRU", "transformer", "RNN"), None)[1] == min(want, 3)


def test_book_cores_stands_for_the_machine_the_guarantees_simulate(monkeypatch):
    """make guarantees runs 9.4 as on a 32-core machine: three workers, and 29 threads for the notebook."""
    monkeypatch.setenv("BOOK_CORES", "32")
    assert usable_cores() == 32
    assert race_module._lanes(("GRU", "transformer", "RNN"), None)[1] == 3
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("BOOK_CORES", bad)
        with pytest.raises((ValueError, TypeError), match="BOOK_CORES"):
            usable_cores()


@pytest.fixture
def notebook(monkeypatch):
    """helpers.progress as in a notebook: each display's objects, in order, one list per display."""
    import IPython.display

    from helpers import progress as progress_module

    shown = []

    class Handle:
        def __init__(self, obj):
            self.objects = [obj]

        def update(self, obj):
            self.objects.append(obj)

    def display(obj, display_id=False):
        shown.append(Handle(obj))
        return shown[-1]

    monkeypatch.setattr(progress_module, "_in_notebook", lambda: True)
    monkeypatch.setattr(IPython.display, "display", display)
    return shown


def test_in_a_notebook_the_races_bar_is_a_display_that_ends_on_its_quiet_line(notebook, capsys):
    """Issue 31: race's tqdm bar went to stderr, a pink band under the cell in a notebook."""
    for workers in (0, 1):
        race(("RNN",), SMALL, workers=workers)
    quiet = "race (1 model x 4 steps): 4 steps"                         # its total, as what it adds up
    assert race_module._desc(3, 1500) == "race (3 models x 1,500 steps)"     # 9.4's race: 3 x 1,500, not "4,500"
    assert [repr(h.objects[0]) for h in notebook] == [repr(h.objects[-1]) for h in notebook] == [quiet] * 2
    assert capsys.readouterr() == ("", "")
    with pytest.raises(RuntimeError, match="training GRU failed"):
        race(("GRU",), SMALL, workers=0, run=fail)
    assert repr(notebook[-1].objects[-1]) == "race (1 model x 4 steps): step 0 of 4"    # a failed race: how far it got
    counted = []
    race(("RNN", "GRU"), SMALL, workers=2, progress=False, on_steps=counted.append)
    assert sum(counted) == 2 * SMALL.steps and len(notebook) == 3
    with pytest.raises(ValueError, match="on_steps"):
        race(("RNN",), SMALL, workers=0, on_steps=3)


def test_waiting_for_a_race_shows_how_far_it_is_and_ends_on_a_quiet_line(notebook, capsys):
    """Issue 31: 9.4's cell that waits for the race showed only [*] for about 30 s."""
    slow = Setup(steps=400, every=400, test_size=4, batch=4)
    racing = start_race(slow, names=("RNN",), workers=1)
    assert racing.total == 400
    with pytest.raises(concurrent.futures.TimeoutError):
        racing.result(timeout=0.2)                          # the wait stopped early: the line says how far
    assert repr(notebook[0].objects[-1]).startswith("race (1 model x 400 steps): step ")
    results = racing.result(timeout=120)
    assert list(results) == ["RNN"] and racing.steps_done == 400
    assert repr(notebook[1].objects[0]) == repr(notebook[1].objects[-1]) == "race (1 model x 400 steps): 400 steps"
    assert all(repr(s).startswith("race (1 model x 400 steps): step ") for s in notebook[1].objects[1:-1])
    racing.result(timeout=120)                              # collected again: the same line at once
    assert [repr(s) for s in notebook[2].objects] == ["race (1 model x 400 steps): 400 steps"] * 2
    quiet = start_race(SMALL, names=("RNN",), workers=0)
    quiet.result(timeout=120, progress=False)
    assert len(notebook) == 3 and capsys.readouterr().err == ""
    refused = start_race(SMALL, names="RNN")
    assert refused.total is None
    with pytest.raises(ValueError):
        refused.result(timeout=120)                         # and no bar for a race that never began
    assert len(notebook) == 3
    never = start_race(SMALL, names=("RNN",), workers=0)
    with pytest.raises(ValueError, match="timeout"):
        never.result(timeout=-1)
    never.result(timeout=120, progress=False)
