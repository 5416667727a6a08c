"""libyaml's fast path reads every inventory text exactly as the pure-Python loader does.

``brctl.load.inventory`` parses with libyaml where PyYAML has it (~10x faster) and falls
back to the pure loader, whose errors it reports, on any error; text with a character
where the two were seen to disagree (``_PURE_ONLY``) goes to the pure loader alone.
So a text must never be accepted by the fast path and refused, or read differently, by
the pure one. This seeded differential fuzz builds YAML from fragments an inventory
(or a mistyped one) is made of, and mutations of the shipped example, and compares.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from brctl.load import inventory

pytestmark = pytest.mark.skipif(inventory._FastStrictLoader is None, reason="PyYAML without libyaml")

# the shipped example, its "?" and "!" (comments) made "." so its mutations reach the fast path
EXAMPLE = inventory._PURE_ONLY.sub(
    ".", (Path(__file__).resolve().parents[2] / "inventory.example.yaml").read_text())
FRAGMENTS = [
    "nodes:", "- name: gpu[01-04]", "  gpus: 8", "job:", "  nodes: gpu[01-04]", "ssh:", " ",
    "  ", "    ", "- ", ": ", ":", "#", " # c", "'", '"', "\\", "[", "]", "{", "}", ",", "&a", "*a",
    "<<: *a", "|", ">", "|-", "---", "...", "~", "null", "true", "0x1F", "1e3", "0o7", ".inf",
    "1_000", "2001-12-14", "é", "日本", "\\u00e9", "- [a, b]", "{a: 1}", "key: 'it''s'",
    'key: "a\\"b"', "@", "`", "=", "*", "&", "<<", "\n", "\n", "\n", "\n  ", "x", "a b",
]


def _read(loader_class: Any, text: str) -> tuple[str, Any]:
    loader = loader_class(text)
    try:
        root = loader.get_single_node()
        return "ok", loader.construct_document(root) if root is not None else None
    except yaml.YAMLError:
        return "error", None
    finally:
        loader.dispose()


def _fast(text: str) -> tuple[str, Any]:
    return _read(inventory._FastStrictLoader, text)


def _pure(text: str) -> tuple[str, Any]:
    return _read(inventory._StrictLoader, text)


def _texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    lines = EXAMPLE.splitlines(keepends=True)
    for _ in range(count):
        if rng.random() < 0.5:
            out.append("".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 14))))
        else:  # the example with a few lines swapped, cut or sprinkled with a fragment
            mutated = list(lines)
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(len(mutated))
                how = rng.randrange(3)
                if how == 0:
                    mutated[i] = rng.choice(FRAGMENTS) + mutated[i]
                elif how == 1:
                    cut = rng.randrange(len(mutated[i]) + 1)
                    mutated[i] = mutated[i][:cut] + rng.choice(FRAGMENTS) + mutated[i][cut:]
                else:
                    del mutated[i]
            out.append("".join(mutated))
    return out


@pytest.mark.slow  # ~25 s a seed on 2 loaded cores: the full run's, not --quick's
@pytest.mark.parametrize("seed", range(4))
def test_the_fast_path_never_accepts_or_reads_what_the_pure_loader_does_not(seed: int) -> None:
    texts = [t for t in _texts(seed, 1500) if not inventory._PURE_ONLY.search(t)]
    assert len(texts) > 900  # most cases reach the fast path
    accepted = 0
    for text in texts:
        fast = _fast(text)
        if fast[0] == "error":
            continue  # the pure loader reads it again and reports: nothing rides on libyaml
        accepted += 1
        assert _pure(text) == fast, f"libyaml and the pure loader disagree on {text!r}"
    assert accepted > 200  # and many are accepted, so the comparison is not vacuous
