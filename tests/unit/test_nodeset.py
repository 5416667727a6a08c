"""Node-set expansion and folding (ClusterShell/Slurm syntax, pdsh-lenient padding)."""

from __future__ import annotations

import random
import re

import pytest

from brctl.core.errors import InputError
from brctl.core.nodeset import expand, fold, select


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("gpu[001-003]", ["gpu001", "gpu002", "gpu003"]),
        ("a[1-3,7],b9", ["a1", "a2", "a3", "a7", "b9"]),
        ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
        ("10.0.1.[1-3]", ["10.0.1.1", "10.0.1.2", "10.0.1.3"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("n[98-101]", ["n98", "n99", "n100", "n101"]),
        ("single", ["single"]),
        ("a1, a2 ,a1", ["a1", "a2"]),
        ("x[3,1-2]", ["x3", "x1", "x2"]),
    ],
)
def test_expand(pattern: str, expected: list[str]) -> None:
    assert expand(pattern) == expected


def test_pdsh_lenient_padding_crosses_width() -> None:
    names = expand("n[01-128]")
    assert names[0] == "n01" and names[98] == "n99" and names[99] == "n100" and len(names) == 128


@pytest.mark.parametrize(
    ("pattern", "needle"),
    [
        ("gpu[1-", "unclosed"),
        ("gpu1-]", "unmatched"),
        ("gpu[[1-2]]", "nested"),
        ("gpu[5-1]", "backwards"),
        ("gpu[a-b]", "bad range item"),
        ("a,,b", "empty item"),
        ("", "empty"),
        ("gpu 1", "unexpected character"),
        ("n[1-99999999]", "larger than"),
    ],
)
def test_expand_errors_name_the_problem(pattern: str, needle: str) -> None:
    with pytest.raises(InputError) as err:
        expand(pattern)
    assert needle in err.value.message


@pytest.mark.parametrize(
    ("names", "folded"),
    [
        (["gpu001", "gpu002", "gpu003", "gpu005"], "gpu[001-003,005]"),
        (expand("gpu[001-128]"), "gpu[001-128]"),
        (expand("node[1-10]"), "node[1-10]"),
        (expand("n[01-128]"), "n[01-128]"),
        (expand("r[1-2]n[01-04]"), "r[1-2]n[01-04]"),
        (["b", "a", "a1"], "a,a1,b"),
        (["x7"], "x7"),
        (["10.0.0.1", "10.0.0.2"], "10.0.0.[1-2]"),
    ],
)
def test_fold(names: list[str], folded: str) -> None:
    assert fold(names) == folded


def test_fold_then_expand_round_trips_random_sets() -> None:
    rng = random.Random(7)
    for _ in range(300):
        width = rng.choice([0, 2, 3])
        names = {f"{rng.choice(['gpu', 'n', 'r1n'])}{str(rng.randrange(1, 300)).zfill(width)}"
                 for _ in range(rng.randrange(1, 40))}
        assert set(expand(fold(names))) == names


def test_select_include_exclude_keeps_inventory_order() -> None:
    available = expand("gpu[01-08]")
    assert select(available, "gpu[07,02-03]", None) == ["gpu02", "gpu03", "gpu07"]
    assert select(available, None, "gpu[02-07]") == ["gpu01", "gpu08"]
    with pytest.raises(InputError, match="not in the inventory: gpu09"):
        select(available, "gpu09", None)


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("gpu[1-8/2]", ["gpu1", "gpu3", "gpu5", "gpu7"]),
        ("gpu[01-16/5]", ["gpu01", "gpu06", "gpu11", "gpu16"]),
        ("gpu[1-8]!gpu[2-7]", ["gpu1", "gpu8"]),
        ("gpu[1-8]&gpu[6-12]", ["gpu6", "gpu7", "gpu8"]),
        ("gpu[1-4]^gpu[3-6]", ["gpu1", "gpu2", "gpu5", "gpu6"]),
        # Left to right, one precedence, as ClusterShell's nodeset.
        ("gpu[1-8]!gpu3&gpu[2-4]", ["gpu2", "gpu4"]),
        ("gpu[1-2],gpu9!gpu1", ["gpu2", "gpu9"]),
    ],
)
def test_steps_and_operators(pattern: str, expected: list[str]) -> None:
    assert expand(pattern) == expected


def test_groups_resolve_through_the_callers_function() -> None:
    groups = {"rack:r1": ["a1", "a2"], "job": ["a2", "a3"]}

    def resolve(name: str) -> list[str]:
        if name not in groups:
            raise InputError(f"group @{name} is unknown")
        return groups[name]

    assert expand("@rack:r1^@job", resolve) == ["a1", "a3"]
    assert expand("@job,a9", resolve) == ["a2", "a3", "a9"]
    with pytest.raises(InputError, match="@nope"):
        expand("@nope", resolve)
    with pytest.raises(InputError, match="needs an inventory"):
        expand("@job")


@pytest.mark.parametrize(("pattern", "needle"), [
    ("gpu[1-8/0]", "step below 1"), ("a!", "empty item"), ("&a", "empty item"),
    ("@bad name", "bad group name")])
def test_operator_and_step_errors(pattern: str, needle: str) -> None:
    with pytest.raises(InputError, match=re.escape(needle)):
        expand(pattern, lambda name: [])


def test_operators_agree_with_python_sets_on_random_sets() -> None:
    """Property: fold, chain operators left to right, expand: the set algebra holds."""
    rng = random.Random(11)
    ops = {"!": set.difference, "&": set.intersection, "^": set.symmetric_difference,
           ",": set.union}

    def one_item() -> set[str]:  # one prefix, one width: fold gives a single item
        prefix, width = rng.choice(["gpu", "n"]), rng.choice([0, 3])
        return {f"{prefix}{str(rng.randrange(1, 200)).zfill(width)}" for _ in range(rng.randrange(1, 30))}

    for _ in range(300):
        left = one_item() | one_item()
        pattern, expected = fold(left), left
        for _ in range(rng.randrange(1, 4)):
            op, right = rng.choice(list(ops)), one_item()
            pattern, expected = f"{pattern}{op}{fold(right)}", ops[op](expected, right)
        got = expand(pattern)
        assert set(got) == expected, pattern
        assert len(got) == len(set(got))


def test_steps_round_trip_through_fold() -> None:
    rng = random.Random(5)
    for _ in range(200):
        lo, step = rng.randrange(0, 50), rng.randrange(1, 9)
        hi = lo + rng.randrange(0, 100)
        names = expand(f"n[{lo}-{hi}/{step}]")
        assert names == [f"n{i}" for i in range(lo, hi + 1, step)]
        assert expand(fold(names)) == names


def test_select_refuses_unknown_names_in_exclude_too() -> None:
    available = expand("gpu[01-08]")
    with pytest.raises(InputError, match="-x 'gpu09': not in the inventory: gpu09"):
        select(available, None, "gpu09")
