"""Argv templates never go through a shell; secrets never come out."""

from __future__ import annotations

import pytest

from brctl.analysis.redact import redact_text
from brctl.core.errors import InputError
from brctl.core.templates import check_template, placeholders, render_argv


def test_string_template_is_split_then_substituted_per_argument() -> None:
    argv = render_argv("scontrol update nodename={node} reason='{reason}'",
                       {"node": "gpu01", "reason": "xid 79; rm -rf /"})
    assert argv == ["scontrol", "update", "nodename=gpu01", "reason=xid 79; rm -rf /"]


def test_list_template_and_placeholders() -> None:
    tpl = ["torchrun", "--nnodes={nnodes}", "--node-rank={node_rank}", "train.py"]
    assert placeholders(tpl) == {"nnodes", "node_rank"}
    assert render_argv(tpl, {"nnodes": 2, "node_rank": 1})[1:3] == ["--nnodes=2", "--node-rank=1"]


@pytest.mark.parametrize(("tpl", "needle"), [
    ("", "empty command template"),
    ("run {bogus}", "unknown placeholder {bogus}"),
    ("run 'unterminated", "No closing quotation"),
])
def test_bad_templates_are_input_errors(tpl: str, needle: str) -> None:
    with pytest.raises(InputError, match=needle):
        check_template(tpl, "job.restart_command")


def test_missing_value_names_the_placeholder() -> None:
    with pytest.raises(InputError, match=r"no value for \{node\}"):
        render_argv("drain {node}", {"reason": "x"})


def test_redaction() -> None:
    env = {"RANK": "3", "HF_TOKEN": "hf_abcdef", "AWS_SECRET_ACCESS_KEY": "s3cr3t!", "PATH": "/bin"}
    assert redact_text("login hf_abcdef with s3cr3t! ok", env) == "login *** with *** ok"
