"""The committed man pages are what the CLI generates (drift check)."""

from __future__ import annotations

from pathlib import Path

from brctl.cli.manpages import main, render_pages

ROOT = Path(__file__).resolve().parents[2]


def test_committed_man_pages_match_the_cli(tmp_path: Path) -> None:
    stale = [name for name, text in render_pages().items()
             if not (ROOT / "man" / name).exists() or (ROOT / "man" / name).read_text() != text]
    assert not stale, f"stale man pages {stale}: run python -m brctl.cli.manpages"
    assert main(["--check", str(ROOT / "man")]) == 0


def test_every_command_has_a_page_and_exit_codes() -> None:
    pages = render_pages()
    assert "brctl.1" in pages and "brctl-exec.1" in pages and "brctl-nodes.1" in pages
    assert all(".SH EXIT STATUS" in text for text in pages.values())


def test_check_reports_drift(tmp_path: Path) -> None:
    assert main([str(tmp_path)]) == 0
    (tmp_path / "brctl-exec.1").write_text("old\n")
    (tmp_path / "brctl-gone.1").write_text("removed command\n")
    assert main(["--check", str(tmp_path)]) == 1
    assert main([str(tmp_path)]) == 0 and not (tmp_path / "brctl-gone.1").exists()
    assert main(["--check", str(tmp_path)]) == 0


def test_inventory_page_is_present() -> None:
    text = (ROOT / "man" / "brctl-inventory.5").read_text()
    assert text.startswith(".TH BRCTL-INVENTORY 5")


def test_examples_come_from_the_readmes_what_to_run_when() -> None:
    from brctl.cli.manpages import readme_examples, render_pages

    rows = readme_examples()
    commands = {r[1] for r in rows}
    assert {"brctl diagnose", "brctl replay", "brctl update rollback",
            "brctl ckpt restore --to SPARE --for LOST"} <= commands
    pages = render_pages()
    for _situation, command, _gets in rows:
        page = pages[f"brctl-{command.split()[1]}.1"]
        assert ".SH EXAMPLES" in page and command.replace("-", "\\-") in page


def test_every_page_has_examples_that_name_its_own_command() -> None:
    pages = render_pages()
    for name, text in pages.items():
        assert "\n.SH EXAMPLES\n" in text, name
        if name != "brctl.1":
            command = name.removesuffix(".1").replace("brctl-", "brctl ", 1).replace("-", "\\-")
            examples = text.split("\n.SH EXAMPLES\n", 1)[1].split("\n.SH ", 1)[0]
            assert command in examples, name
    inventory = (ROOT / "man" / "brctl-inventory.5").read_text()
    assert "\n.SH EXAMPLES\n" in inventory and "brctl init \\-\\-local" in inventory
