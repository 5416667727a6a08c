"""Inventory loading: every documented key works; every mistake names file, key path, form."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from brctl.analysis.inventory import from_document
from brctl.core.errors import InputError
from brctl.load.inventory import find_inventory, load_inventory

ROOT = Path(__file__).resolve().parents[2]


def test_design_example_keys_all_work(tmp_path: Path) -> None:
    text = """
ssh:
  user: root
  port: 22
  identity_file: ~/.ssh/id_ed25519
  known_hosts: ~/.ssh/known_hosts
  host_key_policy: strict
  connect_timeout: 10
  command_timeout: 600
  fanout: 64
  proxy_jump: null
  python: python3
nodes:
  - name: gpu[001-016]
    address: 10.0.1.[1-16]
    port: 22
    gpus: 8
    connection: ssh
    env: {}
standby:
  - name: spare[01-02]
    gpus: 8
job:
  name: llm-pretrain
  nodes: gpu[001-016]
  tp: 8
  pp: 2
  cp: 1
  ep: 1
  order: tp-cp-ep-dp-pp
  process_match: pretrain
  log_paths: [/var/log/train/*.log]
  restart_command: null
  evict_command: null
health: {}
diagnose: {}
update: {root: /opt/train}
ckpt: {dir: /local/ckpt, glob: "step_*"}
daemon: {}
"""
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    inv = load_inventory(path)
    assert len(inv.nodes) == 18 and inv.standby == ("spare01", "spare02")
    assert inv.nodes["gpu016"].address == "10.0.1.16"
    assert inv.job is not None and inv.job.nodes[0] == "gpu001" and inv.job.tp == 8
    assert inv.update.root == "/opt/train" and inv.ckpt.glob == "step_*"


@pytest.mark.parametrize("name", ["inventory.example.yaml", "examples/local.yaml",
                                  "examples/demo.yaml"])
def test_repository_examples_load(name: str) -> None:
    # Documentation that users copy must stay valid: a missing file fails too.
    inv = load_inventory(ROOT / name)
    assert inv.nodes and inv.job is not None


def test_per_entry_ssh_overrides_win() -> None:
    inv = from_document({
        "ssh": {"user": "ops", "port": 2200, "python": "/opt/py/bin/python"},
        "nodes": [{"name": "a[1-2]"}, {"name": "b1", "user": "root", "port": 22}],
    }, "x.yaml")
    assert (inv.nodes["a1"].user, inv.nodes["a1"].port) == ("ops", 2200)
    assert (inv.nodes["b1"].user, inv.nodes["b1"].port, inv.nodes["b1"].python) == (
        "root", 22, "/opt/py/bin/python")


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"nodes": [{"name": "a1", "gpuz": 2}]}, "x.yaml: nodes[0].gpuz: unknown key"),
        ({"nodes": [{"name": "a1", "gpus": "two"}]}, "x.yaml: nodes[0].gpus: got 'two', expected a whole number"),
        ({"nodes": [{"name": "a1", "gpus": -1}]}, "x.yaml: nodes[0].gpus: got -1, expected a whole number >= 0"),
        ({"nodes": [{"name": "a[1-2]", "gpus": 0}], "job": {"nodes": "a[1-2]"}},
         "x.yaml: job.nodes: a[1-2] declared with gpus: 0"),
        ({"nodes": [{"name": "a[1-"}]}, "x.yaml: nodes[0].name: node set"),
        ({"nodes": [{"name": "a[1-3]", "address": "10.0.0.[1-2]"}]}, "3 names"),
        ({"nodes": [{"name": "a1"}, {"name": "a1"}]}, "listed twice"),
        ({"nodes": [{"name": "a1"}], "job": {"nodes": "a[1-2]"}}, "job.nodes: not defined under nodes: a2"),
        ({"nodes": [{"name": "a1"}], "job": {"tp": 2}}, "job.nodes: required key is missing"),
        ({"nodes": [{"name": "a1", "connection": "telnet"}]}, "expected one of 'ssh' | 'local'"),
        ({"nodes": [{"name": "a1"}], "ssh": {"host_key_policy": "yolo"}}, "ssh.host_key_policy"),
        ({"nodes": [{"name": "a1"}], "job": {"nodes": "a1", "process_match": "("}}, "job.process_match: not a valid regular expression"),
        ({"nodes": "a1"}, "nodes: got a string, expected a list"),
        ({"nodes": [{"name": "a1"}], "job": {"nodes": "a1", "evict_command": "drain {nod}"}},
         "job.evict_command: unknown placeholder {nod}"),
        ({"nodes": [{"name": "a1", "env": {"A": [1]}}]}, "nodes[0].env.A"),
        ({"nodes": [{"name": "a1"}], "update": {"rooot": "/x"}}, "update.rooot: unknown key"),
        ([1, 2], "expected a mapping at the top level"),
        ({}, "nodes: required key is missing"),
        # YAML's .nan and .inf are floats; no key means one (a NaN timeout was exit 70)
        ({"nodes": [{"name": "a1"}], "ssh": {"command_timeout": float("nan")}},
         "x.yaml: ssh.command_timeout: got nan, expected a finite number"),
        ({"nodes": [{"name": "a1"}], "ssh": {"connect_timeout": float("inf")}},
         "x.yaml: ssh.connect_timeout: got inf, expected a finite number"),
        ({"nodes": [{"name": "a1"}], "ssh": {"connect_timeout": 10 ** 400}},
         "x.yaml: ssh.connect_timeout: got a 401-digit number, expected a finite number"),
    ],
)
def test_errors_name_file_key_and_form(doc: object, message: str) -> None:
    with pytest.raises(InputError) as err:
        from_document(doc, "x.yaml")
    assert message in err.value.message


@pytest.mark.parametrize(("doc", "message"), [
    ({"nodes": [{"name": "."}]}, "x.yaml: nodes[0].name: node name '.' is not a usable file name"),
    ({"nodes": [{"name": "a1"}, {"name": ".."}]}, "x.yaml: nodes[1].name: node name '..'"),
    ({"nodes": [{"name": "a1"}], "standby": [{"name": "-oProxy"}]},
     "x.yaml: standby[0].name: node name '-oProxy' starts with '-'"),
    ({"nodes": [{"name": "-a[1-2]"}]}, "nodes[0].name: node name '-a1' starts with '-'"),
    ({"nodes": [{"name": "a/b"}]}, "x.yaml: nodes[0].name: node set 'a/b': unexpected character"),
    ({"nodes": [{"name": "../etc"}]}, "x.yaml: nodes[0].name: node set '../etc': unexpected"),
    ({"nodes": [{"name": "a\0b"}]}, r"x.yaml: nodes[0].name: node set 'a\x00b': unexpected"),
])
def test_node_names_must_be_safe_path_components(doc: object, message: str) -> None:
    with pytest.raises(InputError) as err:
        from_document(doc, "x.yaml")
    assert message in err.value.message and err.value.code == 2


def test_plain_node_names_with_dots_and_dashes_still_load() -> None:
    inv = from_document({"nodes": [{"name": "gpu-1.rack2,a..b,..."}]}, "x.yaml")
    assert list(inv.nodes) == ["gpu-1.rack2", "a..b", "..."]


def test_unsafe_node_name_is_exit_2_on_the_command_line(brctl, tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes: [{name: '..', connection: local}]\n")
    res = brctl("-i", inv, "nodes")
    assert res.exit_code == 2 and "nodes[0].name" in res.stderr and "'..'" in res.stderr
    assert "Traceback" not in res.stderr


def test_malformed_yaml_names_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("nodes:\n  - name: a1\n   gpus: 2\n")
    with pytest.raises(InputError, match=r"bad.yaml:3:\d+: malformed YAML"):
        load_inventory(path)


def test_unsafe_yaml_is_not_executed(tmp_path: Path) -> None:
    path = tmp_path / "evil.yaml"
    path.write_text("nodes: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(InputError, match="malformed YAML"):
        load_inventory(path)


def test_inventory_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump({"nodes": [{"name": "a1"}]}))
    b.write_text(yaml.safe_dump({"nodes": [{"name": "b1"}]}))
    monkeypatch.chdir(tmp_path)
    assert find_inventory(str(a), {"BRCTL_INVENTORY": str(b)}) == a
    assert find_inventory(None, {"BRCTL_INVENTORY": str(b)}) == b
    with pytest.raises(InputError, match="no inventory"):
        find_inventory(None, {})
    (tmp_path / "inventory.yaml").write_text(a.read_text())
    assert find_inventory(None, {}) == Path("inventory.yaml")
    with pytest.raises(InputError, match="BRCTL_INVENTORY"):
        find_inventory(None, {"BRCTL_INVENTORY": str(tmp_path / "missing.yaml")})
