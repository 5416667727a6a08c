"""The daemon's log-tail reader takes hostile answers: entries out of shape are left out."""

from __future__ import annotations

from typing import Any

import pytest

from brctl.operations.daemon.hooks import joined_tails


def test_tails_are_joined_oldest_file_first() -> None:
    doc = {"files": [{"tail": "new", "mtime": 20}, {"tail": "old", "mtime": 10.5}]}
    assert joined_tails(doc) == "old\nnew"


@pytest.mark.parametrize("bad", [
    {"tail": "x", "mtime": 10 ** 400},       # an int no float holds: float() raised OverflowError
    {"tail": "x", "mtime": float("nan")},
    {"tail": "x", "mtime": "10"},
    {"tail": "x", "mtime": True},
    {"tail": 5, "mtime": 1},
    "not a file",
])
def test_an_entry_out_of_shape_is_left_out_never_raised(bad: Any) -> None:
    doc = {"files": [{"tail": "good", "mtime": 1}, bad]}
    assert joined_tails(doc) == "good"


@pytest.mark.parametrize("doc", [None, {}, {"files": 7}, {"files": "x"}])
def test_no_files_is_no_text(doc: Any) -> None:
    assert joined_tails(doc) == ""
