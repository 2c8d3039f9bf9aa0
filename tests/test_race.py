import pytest
import torch

from helpers.race import MODELS, Result, Setup, lanes, race, run_one
from helpers.race import test_set as held_out
from helpers.train import train_and_evaluate

SMALL = Setup(steps=4, every=2, test_size=8, batch=4)


def test_lanes_put_the_slowest_alone():
    assert lanes(["transformer", "GRU", "RNN"], 2) == [["GRU"], ["transformer", "RNN"]]
    assert sorted(map(len, lanes(list(MODELS), 8))) == [1, 1, 1]
    with pytest.raises(ValueError):
        lanes(["GRU"], 0)


def test_setup_rejects_bad_values():
    with pytest.raises(ValueError, match="steps"):
        Setup(steps=0)
    with pytest.raises(ValueError, match="lr"):
        Setup(lr=0)


def test_run_one_is_reproducible_and_records_evaluations():
    a, b = run_one("RNN", SMALL), run_one("RNN", SMALL)
    assert a.steps == [0, 2, 4] and a.test_mse == b.test_mse
    assert a.params == 4_417
    x, _ = held_out(SMALL)
    assert torch.equal(a.model()(x), b.model()(x))


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
    with pytest.raises(ValueError):
        train_and_evaluate(model, None, None, steps=0, evaluate=None)
