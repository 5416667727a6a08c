"""brctl.cli.coercion: option values read without pydantic, exactly as typer reads them.

The light coercion must answer only where typer's (pydantic's) answer is the same
value of the same type, and hand everything else, errors included, to typer's.
Each case runs both on a corpus of values and compares what comes back.
"""

from __future__ import annotations

import enum
import math
from pathlib import Path
from typing import Any

import pytest
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param, resolve_type_descriptor
from typer.models import OptionInfo

from brctl.cli import coercion as cliparams

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "examples" / "local.yaml"


class Shell(enum.Enum):
    bash = "bash"
    zsh = "zsh"


NUMBERS = ["0", "-0", "7", "007", "-12", "+5", " 5", "5 ", "1_000", "1.0", "1.5", "-2.50",
           ".5", "5.", "1e3", "1E-3", "inf", "-inf", "nan", "NaN", "abc", "", " ", "0x10",
           "٣", "1.5x", "12345678901234567890", "123456789012345678", "0.1", "0.09999",
           "1." + "0" * 20 + "1", "3.141592653589793", "9" * 16, "1\n", 3, 0, -1, True,
           2.5, 0.1, 1.0, math.nan, math.inf, 2**60, b"5"]
TEXT = ["", "gpu[1-4]", "a b", "é", "\udcff", "a\x00b", "-", " x ", 5, 1.5, True, b"x", b"\xff"]
PATHS = ["x.json", "", ".", "./x", "a//b/", "/", "/tmp", "-", "a\x00b", "\udcff", "x/",
         "/etc/shadow", "/nonexistent/dir/x", 5, b"x", Path("y")]
CHOICES = ["bash", "zsh", "BASH", "fish", "", 1, Shell.bash, "Shell.bash"]
BOOLS = [True, False, "true", "yes", "0", "", "maybe", 1, 0, 2]

CASES: list[tuple[Any, dict[str, Any], list[Any]]] = [
    (str, {}, TEXT),
    (bool, {}, BOOLS),
    (int, {}, NUMBERS),
    (float, {}, NUMBERS),
    (int, {"min": 1}, NUMBERS),
    (float, {"min": 0.1}, NUMBERS),
    (float, {"min": 0.0, "max": 10}, NUMBERS),
    (Path, {}, PATHS),
    (Path, {"exists": True, "dir_okay": False}, PATHS),
    (Shell, {}, CHOICES),
    (Shell, {"case_sensitive": False}, CHOICES),
    (list[str], {}, [("a", "b"), ["a"], (), ("a", 5), ("a", b"b")]),
    (list[int], {}, [("1", "2"), ("1", "x"), ("+1",), [3]]),
]


class Param:
    """What coercion reads of typer's parameter (and the error message of its hint)."""

    def __init__(self, annotation: Any) -> None:
        self.multiple, self.nargs = False, -1 if getattr(annotation, "__origin__", None) else 1

    def get_error_hint(self) -> str:
        return "'--x'"


def outcome(runtime: Any, value: Any) -> tuple[str, Any]:
    try:
        out = runtime.coerce(value, param=Param(runtime.annotation), ctx=None)
    except BadParameter as exc:
        return "error", exc.format_message()
    except Exception as exc:  # what typer lets through must get through the same
        return "raises", f"{type(exc).__name__}: {exc}"
    return "value", (type(out), [(type(i), repr(i)) for i in out]
                     if isinstance(out, (list, tuple)) else repr(out))


@pytest.mark.parametrize(("annotation", "options", "values"), CASES,
                         ids=[f"{a}-{o}" for a, o, _ in CASES])
def test_light_coercion_is_typers(annotation: Any, options: dict[str, Any],
                                  values: list[Any]) -> None:
    descriptor = resolve_type_descriptor(annotation, OptionInfo(**options))
    light, typers = cliparams._light(descriptor), build_runtime_param(descriptor)
    assert light is not None, annotation
    for value in values:
        assert outcome(light, value) == outcome(typers, value), (annotation, options, value)


@pytest.mark.parametrize(("annotation", "value", "expected"), [
    (str, "gpu[1-4]", "gpu[1-4]"), (int, "-12", -12), (int, 8, 8), (float, "2.5", 2.5),
    (float, "30", 30.0), (float, 30, 30.0), (Path, "out.json", Path("out.json")),
    (Shell, "zsh", Shell.zsh), (list[str], ("hostname", "-f"), ["hostname", "-f"]),
    (bool, True, True),
])
def test_usual_values_need_no_pydantic(annotation: Any, value: Any, expected: Any) -> None:
    light = cliparams._light(resolve_type_descriptor(annotation, OptionInfo()))
    out = light.coerce(value, param=Param(annotation), ctx=None)
    assert out == expected and type(out) is type(expected)
    assert "own" not in vars(light)  # typer's (pydantic) coercion was never built


def test_other_annotations_stay_typers() -> None:
    import datetime
    from typing import Literal

    for annotation, options in [(datetime.datetime, {}), (Literal["a"], {}), (tuple[int, int], {}),
                                (int, {"clamp": True, "min": 1}), (str, {"parser": str})]:
        assert cliparams._light(resolve_type_descriptor(annotation, OptionInfo(**options))) is None


def test_without_typers_internals_typer_runs_as_ever(monkeypatch: pytest.MonkeyPatch) -> None:
    import typer.core

    monkeypatch.setattr(cliparams, "RuntimeParam", None)
    monkeypatch.setattr(typer.core, "build_runtime_param", build_runtime_param)
    cliparams.install()
    assert typer.core.build_runtime_param is build_runtime_param
    assert cliparams._light(resolve_type_descriptor(int, OptionInfo())) is None


@pytest.mark.parametrize(("argv", "message"), [
    (["exec", "-t", "abc", "true"], "Invalid value for '-t' / '--timeout': Input should be a "
                                    "valid number, unable to parse string as a number"),
    (["exec", "-f", "2.5", "true"], "Invalid value for '-f' / '--fanout': Input should be a "
                                    "valid integer, unable to parse string as an integer"),
    (["stacks", "--dump-timeout", "0.05"], "Invalid value for '--dump-timeout': Input should be "
                                           "greater than or equal to 0.1"),
    (["update", "history", "-n", "0"], "Invalid value for '-n' / '--limit': Input should be "
                                       "greater than or equal to 1"),
    (["completion", "BASH"], "Invalid value for 'SHELL': Value error, 'BASH' is not one of "
                             "'bash', 'zsh', 'fish'."),
    (["report", "-o", "a\x00b"], "Invalid value for '-o' / '--output': Value error, embedded "
                                 "null byte"),
])
def test_bad_values_are_typers_usage_errors(brctl: Any, argv: list[str], message: str) -> None:
    res = brctl("-i", LOCAL, *argv)
    assert res.exit_code == 2 and res.stderr == (
        f"brctl: error: {message}\nhint: run 'brctl --help' (or 'brctl COMMAND --help')\n")


@pytest.mark.parametrize(("argv", "message"), [
    (["exec", "-t", "nan", "true"], "--timeout nan: expected a finite number of seconds greater than 0"),
    (["exec", "-t", "inf", "true"], "--timeout inf: expected a finite number of seconds greater than 0"),
    (["exec", "-t", "1e400", "true"], "--timeout inf: expected a finite number of seconds greater than 0"),
    (["nodes", "--probe", "-t", "-1"], "--timeout -1: expected a finite number of seconds greater than 0"),
    (["stacks", "-t", "inf"], "--timeout inf: expected a finite number of seconds greater than 0"),
    (["health", "--watch", "inf"], "--watch inf: expected a finite number of seconds greater than 0"),
    (["daemon", "run", "--for", "nan"], "--for nan: expected a finite number of seconds greater than 0"),
    (["stacks", "--dump-timeout", "inf"], "--dump-timeout inf: expected a finite number"),
    (["stacks", "--interval", "inf"], "--interval inf: expected a finite number"),
    (["simulate", "--days", "nan"], "--days nan: expected a finite number"),
    (["ettr", "--window", "nan"], "--window nan: expected a finite number of seconds greater than 0"),
    (["report", "--window", "-inf"], "--window -inf: expected a finite number of seconds greater than 0"),
    (["standby", "size", "--quantile", "nan"], "--quantile nan: expected a finite number"),
    (["standby", "size", "--daily-failure-rate", "inf"], "--daily-failure-rate inf: expected a finite number"),
])
def test_a_number_option_is_a_finite_number(brctl: Any, argv: list[str], message: str) -> None:
    """typer reads 'nan', 'inf' and '1e400' as floats; no brctl option means one: `exec -t nan`
    was an internal error (exit 70), `-t inf` an OverflowError per machine, `simulate --days
    inf` ran for ever, and `nodes --probe -t -1` was taken."""
    res = brctl("-i", LOCAL, *argv)
    assert res.exit_code == 2 and res.stderr == f"brctl: error: {message}\n", res.stderr


@pytest.mark.parametrize("scale", ["nan", "inf", "0", "x"])
def test_the_timeout_scale_is_a_finite_number_above_zero(brctl: Any, scale: str) -> None:
    res = brctl("-i", LOCAL, "nodes", "--probe", env={"BRCTL_TIMEOUT_SCALE": scale})
    assert res.exit_code == 2 and res.stderr == (
        f"brctl: error: $BRCTL_TIMEOUT_SCALE={scale!r}: expected a finite number greater than 0\n")
