"""The health document's TypedDicts and its checked shape (``DOCUMENT``) say the same thing:
the same keys at every level, every one optional, so ``parse``'s cast stays a proof."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args, get_type_hints, is_typeddict

import pytest

from brctl.analysis.health import doc as health_doc
from brctl.analysis.health.doc import DOCUMENT, HealthDocument, parse
from brctl.analysis.probe_doc import MapOf, Required
from tests.unit.test_health_analysis import doc


def _typeddicts(hint: Any) -> Iterator[Any]:
    """The TypedDicts inside a type (through Optional, list[...], Mapping[..., ...])."""
    if is_typeddict(hint):
        yield hint
        return
    for arg in get_args(hint):
        yield from _typeddicts(arg)


def _objects(shape: Any) -> Iterator[dict[str, Any]]:
    """The object shapes (with declared keys) inside a shape: alternatives, arrays, maps."""
    if isinstance(shape, (Required, MapOf)):
        yield from _objects(shape.shape)
    elif isinstance(shape, dict):
        if shape:  # {}: an object whose keys brctl does not read, a plain Mapping
            yield shape
    elif isinstance(shape, (tuple, list)):
        for one in shape:
            yield from _objects(one)


def _pairs(typed: Any, shape: dict[str, Any],
           path: str) -> Iterator[tuple[Any, dict[str, Any], str]]:
    yield typed, shape, path
    hints = get_type_hints(typed)
    for key, sub in shape.items():
        if key not in hints:
            continue  # reported by the key comparison
        inner = list(_typeddicts(hints[key]))
        objects = list(_objects(sub))
        assert len(inner) == len(objects) <= 1, f"{path}.{key}: {inner} vs {objects}"
        if inner:
            yield from _pairs(inner[0], objects[0], f"{path}.{key}")


def _all_pairs() -> list[tuple[Any, dict[str, Any], str]]:
    return list(_pairs(HealthDocument, DOCUMENT, "document"))


def test_every_typeddict_is_paired_with_an_object_shape() -> None:
    names = {typed.__name__ for typed, _, _ in _all_pairs()}
    declared = {name for name, value in vars(health_doc).items() if is_typeddict(value)}
    assert names == declared


@pytest.mark.parametrize(("typed", "shape", "path"), _all_pairs(),
                         ids=[p for _, _, p in _all_pairs()])
def test_the_typeddict_keys_are_the_shapes_keys(typed: Any, shape: dict[str, Any],
                                                path: str) -> None:
    assert set(get_type_hints(typed)) == set(shape), path
    required = {k for k, s in shape.items() if isinstance(s, Required)}
    assert set(typed.__required_keys__) == required, path


def test_parse_types_a_fitting_document_and_names_a_malformed_one() -> None:
    honest = doc()
    assert parse(honest) is honest
    why = parse(doc(nvml="x"))
    assert isinstance(why, str) and why.startswith("document.nvml: expected an object")


def test_a_null_disk_entry_is_malformed_not_a_crash_in_check_disk() -> None:
    why = parse(doc(disk={"/": None}))
    assert isinstance(why, str) and why.startswith("document.disk['/']: expected an object")


def test_a_key_added_to_one_side_only_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = dict(DOCUMENT["nvml"][0]["gpus"][0][0], fan_speed=(int, None))
    nvml = dict(DOCUMENT["nvml"][0], gpus=([gpu], None))
    monkeypatch.setitem(DOCUMENT, "nvml", (nvml, None))
    drifted = [p for t, s, p in _all_pairs() if set(get_type_hints(t)) != set(s)]
    assert drifted == ["document.nvml.gpus"]
