import numpy as np
import pytest
import torch

from helpers import checks


def test_positive_int_accepts_numpy_ints_and_refuses_bool_and_floats():
    assert checks.positive_int(np.int64(3), "T") == 3 and type(checks.positive_int(np.int64(3), "T")) is int
    for bad in (0, -1, True, 4.0, 4.5, "4", None):
        with pytest.raises(ValueError, match=r"^T must be a positive int, got "):
            checks.positive_int(bad, "T")


def test_non_negative_int_and_integer():
    assert checks.non_negative_int(0, "steps") == 0
    with pytest.raises(ValueError, match="steps must be a non-negative int, got -1"):
        checks.non_negative_int(-1, "steps")
    assert checks.integer(np.int32(-5), "offset") == -5
    with pytest.raises(ValueError, match="offset must be an int, got 1.0"):
        checks.integer(1.0, "offset")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), True, "1"])
def test_finite_and_positive_floats(bad):
    with pytest.raises(ValueError, match="lr must be a finite number"):
        checks.finite_float(bad, "lr")
    with pytest.raises(ValueError, match="lr must be a positive finite number"):
        checks.positive_float(bad, "lr")


def test_floats_convert_and_positive_refuses_zero():
    assert checks.finite_float(np.float32(0.5), "x") == 0.5 and checks.positive_float(2, "x") == 2.0
    with pytest.raises(ValueError, match="x must be a positive finite number, got 0"):
        checks.positive_float(0, "x")


def test_flag_refuses_truthy_strings():
    assert checks.flag(False, "is_causal") is False
    with pytest.raises(ValueError, match="is_causal must be True or False, got 'no'"):
        checks.flag("no", "is_causal")


def test_tensor_refuses_lists_and_too_few_dimensions():
    x = torch.zeros(2, 3)
    assert checks.tensor(x, "q", min_dim=2) is x
    with pytest.raises(ValueError, match="q must be a torch.Tensor, got list"):
        checks.tensor([[1.0]], "q")
    with pytest.raises(ValueError, match=r"q needs at least 2 dimensions, got shape \(3,\)"):
        checks.tensor(torch.zeros(3), "q", min_dim=2)


def test_integers_refuse_floats_and_bools():
    assert checks.integers([1, 2], "lengths").tolist() == [1, 2]
    assert checks.integers(np.array([3]), "lengths").dtype == torch.int64
    for bad in ([1.0, 2.0], torch.tensor([True])):
        with pytest.raises(ValueError, match="lengths must be integers"):
            checks.integers(bad, "lengths")


def test_one_of():
    assert checks.one_of("gru", "cell", ("gru", "rnn")) == "gru"
    with pytest.raises(ValueError, match=r"cell must be one of \['gru', 'rnn'\], got 'lstm'"):
        checks.one_of("lstm", "cell", ("gru", "rnn"))


def test_one_of_takes_a_string_as_one_choice_not_its_substrings():
    """Issue 23: checks.one_of("ru", ...) passed, because a string given as the choices was tested for a substring."""
    assert checks.one_of("gru", "cell", "gru") == "gru"
    for bad in ("ru", "", "g"):
        with pytest.raises(ValueError, match=r"cell must be one of \['gru'\]"):
            checks.one_of(bad, "cell", "gru")


def test_one_of_does_not_take_equal_values_of_another_type():
    """True == 1 and 1.0 == 1: a flag or a float is not the int choice it equals."""
    assert checks.one_of(2, "heads", (1, 2, 4)) == 2
    for bad in (True, 1.0, np.float64(2.0)):
        with pytest.raises(ValueError, match="heads must be one of"):
            checks.one_of(bad, "heads", (1, 2, 4))


def test_a_huge_int_is_not_a_finite_float():
    """Issue 23: checks.finite_float(10**400) raised OverflowError."""
    with pytest.raises(ValueError, match="x must be a finite number, got an integer of 401 digits, too large for a float"):
        checks.finite_float(10 ** 400, "x")
    with pytest.raises(ValueError, match="x must be a positive finite number, got an integer of 401 digits"):
        checks.positive_float(10 ** 400, "x")
    assert checks.finite_float(10 ** 300, "x") == 1e300


# The review that passed bad input to the helpers.
@pytest.mark.parametrize(("value", "shown"), [(None, "None"), ([2**70], r"\[1180591620717411303424\]"),
                                              ("23", "'23'"), ([[1], [2, 3]], r"\[\[1\], \[2, 3\]\]")])
def test_integers_name_what_torch_cannot_hold(value, shown):
    """None gave 'Could not infer dtype of NoneType', 2**70 'Overflow when unpacking long long', unnamed."""
    with pytest.raises(ValueError, match=f"lengths must be integers within int64 .*, got {shown}"):
        checks.integers(value, "lengths")


def test_integers_refuse_unsigned_values_beyond_int64():
    """A uint64 array holding 2**63 wrapped: t5_bucket gave it a bucket of the past."""
    from helpers.positions import t5_bucket

    with pytest.raises(ValueError, match="offsets must be integers within int64, got torch.uint64 values of 2"):
        t5_bucket(np.array([5, 2**63], dtype=np.uint64))
    assert checks.integers(np.array([5, 2**63 - 1], dtype=np.uint64), "x").tolist() == [5, 2**63 - 1]
