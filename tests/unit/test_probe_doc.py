"""The shared shape checker of probe answers (``brctl.analysis.probe_doc``)."""

from __future__ import annotations

from typing import Any

import pytest

from brctl.analysis.probe_doc import FINITE, REAL, SCALAR, MapOf, Required, malformed


@pytest.mark.parametrize(("value", "got"), [
    (float("nan"), "nan"), (float("inf"), "inf"), (10 ** 400, "a number too large for a float"),
    (True, "bool"), ("1", "str"), (None, "NoneType")])
def test_finite_refuses_what_arithmetic_and_format_cannot_take(value: Any, got: str) -> None:
    assert malformed({"x": value}, {"x": FINITE}) == f"document.x: expected a finite number, got {got}"


def test_real_takes_nan_and_infinities_but_not_an_int_past_a_float() -> None:
    assert malformed([float("nan"), float("-inf"), 2, 2.5], [REAL]) is None
    assert malformed([10 ** 400], [REAL]) == "document[0]: expected a number, got a number too large for a float"
    assert malformed([False], [REAL]) is not None


def test_required_keys_and_node_chosen_keys() -> None:
    shape = {"procs": [{"pid": Required(int)}], "logs": MapOf([str])}
    assert malformed({"procs": [{"pid": 1}], "logs": {"/a": ["x"]}}, shape) is None
    assert malformed({"procs": [{}]}, shape) == "document.procs[0].pid: missing"
    key = "/" + "x" * 100
    assert malformed({"logs": {key: [1]}}, shape) == \
        f"document.logs[{key[:60] + '...'!r}][0]: expected a string, got int"


def test_a_scalar_leaf_refuses_nested_garbage_and_nan() -> None:
    assert malformed({"a": "x", "b": 1, "c": None, "d": True}, MapOf(SCALAR)) is None
    assert malformed({"a": [1]}, MapOf(SCALAR)) is not None
    assert malformed({"a": float("nan")}, MapOf(SCALAR)) is not None
