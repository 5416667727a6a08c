"""Non-finite numbers (issue 35, item 10): checked where they enter, never printed.

``float()`` and YAML read ``nan``, ``inf`` and ``1e400``; Python's ``json`` reads
``NaN`` and ``Infinity`` (and writes them, which no other JSON reader takes). So a
mix rate, a ``--set``/``--sweep`` value and a node's answer are checked finite and
in range where they enter (exit 2 naming the key, or that node's error), and the
JSON writer refuses a non-finite number as the last guard (exit 2, never 70).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brctl.analysis.daemon.simulate import SWEEP_KEYS
from brctl.core.errors import BrctlError, ExitCode, InputError, UsageError
from brctl.core.transport import NodeState, RunResult
from brctl.operations.simulate import load_mix, parse_setting
from brctl.remote.probes import parse_document
from brctl.render.output import json_document

SPELLED = ("nan", "NaN", "-nan", "inf", "-inf", "Infinity", "-Infinity", "1e400", "-1e999")
YAML_SPELLED = (".nan", ".NaN", ".inf", "-.inf", ".Inf", "1e400", "-1.0e+999")
JSON_SPELLED = ("NaN", "Infinity", "-Infinity", "1e400", "-1e999", "1.5E+309")  # overflow spells infinity too
non_finite = st.sampled_from([math.nan, math.inf, -math.inf, -math.nan])


@given(key=st.sampled_from(SWEEP_KEYS), spelled=st.sampled_from(SPELLED),
       others=st.lists(st.floats(1, 100), max_size=3), at=st.integers(0, 3))
def test_set_and_sweep_refuse_a_non_finite_value_naming_the_key(
        key: str, spelled: str, others: list[float], at: int) -> None:
    values = [repr(v) for v in others]
    values.insert(min(at, len(values)), spelled)
    for flag in ("--set", "--sweep"):
        with pytest.raises(UsageError, match=f"{flag} {key}: {spelled!r} is not a finite number"):
            parse_setting(f"{key}={','.join(values)}", flag)


@given(spelled=st.sampled_from(YAML_SPELLED), at=st.integers(0, 2))
def test_a_mix_rate_that_is_not_finite_is_exit_2_naming_the_key(
        tmp_path_factory: pytest.TempPathFactory, spelled: str, at: int) -> None:
    kinds = [{"name": f"k{i}", "rate": 0.01, "signal": "crash", "resolution": "reattempt"}
             for i in range(3)]
    path = tmp_path_factory.mktemp("mix") / "mix.yaml"
    text = json.dumps({"kinds": kinds}).replace('"rate": 0.01', "@", at + 1)
    text = text.replace("@", '"rate": 0.01', at).replace("@", f'"rate": {spelled}')
    path.write_text(text.replace("@", '"rate": 0.01'))
    with pytest.raises(InputError, match=rf"kinds\[{at}\]\.rate: expected a finite number"):
        load_mix(str(path))


@given(spelled=st.sampled_from(JSON_SPELLED), where=st.sampled_from(["top", "deep", "list"]))
def test_a_node_answer_with_a_non_finite_number_is_that_node_s_error(
        spelled: str, where: str) -> None:
    body = {"top": f'{{"temp": {spelled}}}', "deep": f'{{"gpus": [{{"temp": {spelled}}}]}}',
            "list": f'{{"xs": [1, {spelled}]}}'}[where]
    doc, why = parse_document(RunResult("n1", NodeState.OK, 0, body + "\n", "", 0.0))
    assert doc is None and why is not None and f"{spelled} is not a finite number" in why


@given(value=non_finite, depth=st.integers(0, 3))
def test_the_json_writer_refuses_non_finite_numbers_naming_the_key(value: float,
                                                                   depth: int) -> None:
    payload: Any = value
    for i in range(depth):
        payload = {f"k{i}": [payload]} if i % 2 else {f"k{i}": payload}
    with pytest.raises(BrctlError) as caught:
        json_document("x", {"v": payload})
    assert caught.value.code == ExitCode.USAGE and "not a finite number" in caught.value.message
    assert caught.value.message.startswith("--json: v")  # the key path from the top


@pytest.mark.parametrize("args", [["--set", "durations.restart=nan"], ["--set", "daemon.poll=inf"],
                                  ["--set", "machines=1e400"], ["--sweep", "durations.human=1,inf"],
                                  ["--set", "machines=1e12"], ["--mix", "MIX"]])
def test_simulate_never_prints_nan_nor_exits_70(brctl: Any, tmp_path: Path,
                                                args: list[str]) -> None:
    mix = tmp_path / "mix.yaml"
    mix.write_text("kinds: [{name: a, rate: .inf, signal: crash, resolution: reattempt}]\n")
    args = [str(mix) if a == "MIX" else a for a in args]
    res = brctl("--json", "simulate", "--machines", "8", "--days", "1", *args)
    assert res.exit_code == 2, res.stdout[:300] + res.stderr
    assert "NaN" not in res.stdout and "Infinity" not in res.stdout
    assert res.json["schema"] == "brctl.error/1" and "internal error" not in res.json["message"]
