"""The one exit-code rule every report uses: 4 refused > 3 incomplete > 1 findings > 0."""

from __future__ import annotations

import itertools

import pytest

from brctl.core.errors import ExitCode, exit_code_of


@pytest.mark.parametrize(("refused", "incomplete", "findings"),
                         list(itertools.product((False, True), repeat=3)))
def test_a_refusal_beats_no_answer_beats_findings(refused: bool, incomplete: bool,
                                                  findings: bool) -> None:
    expected = (ExitCode.REFUSED if refused else ExitCode.INCOMPLETE if incomplete
                else ExitCode.FINDINGS if findings else ExitCode.OK)
    assert exit_code_of(refused=refused, incomplete=incomplete, findings=findings) is expected


@pytest.mark.parametrize(("codes", "expected"), [
    ((), ExitCode.OK),
    ((ExitCode.OK, ExitCode.FINDINGS), ExitCode.FINDINGS),
    ((ExitCode.FINDINGS, ExitCode.INCOMPLETE), ExitCode.INCOMPLETE),
    ((ExitCode.REFUSED, ExitCode.INCOMPLETE, ExitCode.FINDINGS), ExitCode.REFUSED),
    ((ExitCode.INCOMPLETE, ExitCode.REFUSED), ExitCode.REFUSED),
])
def test_the_worst_of_several_outcomes_wins(codes: tuple[ExitCode, ...],
                                            expected: ExitCode) -> None:
    assert ExitCode.worst(*codes) is expected
