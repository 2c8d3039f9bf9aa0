"""helpers.tables: the matrices 9.2 prints, rounded to 2 decimals, and the values round-off could print either way."""

import pytest
import torch

from helpers.tables import near_a_rounding_edge, show


def test_show_aligns_rows_and_columns_and_never_prints_minus_zero(capsys):
    show("t", torch.tensor([[0.254, -0.001], [1.0, 12.3449]]), ["a", "b"], ["x0", "x1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "t"
    assert lines[1] == " " * 8 + "     x0" + "     x1"
    assert lines[2] == "a       " + "   0.25" + "   0.00"          # -0.001 rounds to 0.00, not -0.00
    assert lines[3] == "b       " + "   1.00" + "  12.34"


def test_show_takes_float32_and_tensors_that_require_grad(capsys):
    w = torch.tensor([[0.5, 0.25]], requires_grad=True)
    show("w", w * 1, ["q"], ["k0", "k1"])
    assert capsys.readouterr().out.splitlines()[-1] == "q       " + "   0.50" + "   0.25"


@pytest.mark.parametrize("value", [0.125, -0.125, 1e-9, -1e-9, 2.005])
def test_show_refuses_a_value_that_round_off_could_print_either_way(value, capsys):
    with pytest.raises(ValueError, match="rounding edge"):
        show("t", torch.tensor([[0.3, value]], dtype=torch.float64), ["a"], ["x", "y"])
    assert capsys.readouterr().out == ""                          # nothing half printed


def test_near_a_rounding_edge_finds_halfway_points_and_tiny_numbers_and_skips_the_rest():
    table = torch.tensor([0.125, 0.3, 0.0, 1e-8, float("nan"), float("-inf"), 0.1250001], dtype=torch.float64)
    assert near_a_rounding_edge(table) == [0.125, 1e-8, 0.1250001]
    assert near_a_rounding_edge(table, within=1e-9) == [0.125]           # 1e-8 is now farther than within
    assert near_a_rounding_edge() == []
    assert near_a_rounding_edge(torch.tensor([0.3]), torch.tensor([[0.135, 2.0]], dtype=torch.float64)) == [0.135]


@pytest.mark.parametrize("values, rows, cols, match", [
    ([[0.1]], ["a"], ["x"], "values must be a torch.Tensor"),
    (torch.zeros(2), ["a", "b"], ["x"], "values must be a matrix"),
    (torch.zeros(2, 3), ["a"], ["x", "y", "z"], "1 row labels and 3 column labels for a matrix of shape"),
    (torch.zeros(2, 3), ["a", "b"], ["x", "y"], "2 row labels and 2 column labels"),
])
def test_show_names_what_is_wrong_with_its_arguments(values, rows, cols, match):
    with pytest.raises(ValueError, match=match):
        show("t", values, rows, cols)


@pytest.mark.parametrize("within", [0, -1e-6, "1e-6", float("nan")])
def test_near_a_rounding_edge_refuses_a_width_that_is_not_a_positive_number(within):
    with pytest.raises(ValueError, match="within"):
        near_a_rounding_edge(torch.tensor([0.3]), within=within)
