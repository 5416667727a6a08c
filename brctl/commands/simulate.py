"""``brctl simulate``: the ETTR a job would get under the daemon's own policy."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from brctl.commands import _options as opt
from brctl.env import Env


def register(app: typer.Typer) -> None:
    """Add the command to the root app."""
    app.command("simulate")(simulate)


def simulate(
    ctx: typer.Context,
    mix: str = typer.Option("byterobust", "--mix", metavar="NAME|FILE",
                            help="Incident mix: byterobust (built in); history (the incidents "
                                 "brctl daemon handled for the inventory's job, from the state "
                                 "database: rate = count / (job machines x days recorded), "
                                 "resolved as the daemon did); or a YAML file with "
                                 "kinds: [{name, rate, signal, resolution}] (rate per machine-day)."),
    machines: Optional[int] = typer.Option(None, "--machines", metavar="N",
                                           help="Job machines (default: the inventory job's count)."),
    standby: Optional[int] = typer.Option(None, "--standby", metavar="N",
                                          help="Warm standby pool size (default: the inventory's "
                                               "standby: count; 0 with --machines and no "
                                               "inventory)."),
    days: float = typer.Option(90.0, "--days", metavar="D", callback=opt.finite,
                               help="Simulated job length in days."),
    ckpt_interval: str = typer.Option("30m", "--ckpt-interval", metavar="DURATION",
                                      help="Checkpoint every DURATION of training (90s, 30m, 2h)."),
    runs: int = typer.Option(1, "--runs", metavar="N",
                             help="Independent runs (seeds S..S+N-1); several give percentiles."),
    seed: int = typer.Option(0, "--seed", metavar="S", help="First random seed."),
    settings: Optional[list[str]] = typer.Option(
        None, "--set", metavar="KEY=VALUE",
        help="Override a setting (repeatable). Keys (--sweep takes the same): standby.size, "
             "machines, ckpt_interval; daemon.poll, .stall_after, .startup_grace, "
             ".max_evictions_per_hour, .max_evict_fraction, .max_restarts_without_progress, "
             ".replenish_window (hours); durations.diagnose, .stacks, .swap, "
             ".rollback, .replay, .restart, .recur (a failed attempt), .human (a page) "
             "in seconds."),
    sweep: Optional[str] = typer.Option(None, "--sweep", metavar="KEY=A,B,C",
                                        help="One row per value, e.g. standby.size=2,4,8 or "
                                             "daemon.poll=5,30,60."),
    window: str = typer.Option("1d", "--window", metavar="DURATION",
                               help="The windowed ETTR's window (ettr_series in --json, the "
                                    "line of the -o page): 6h, 1d."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", metavar="FILE.html",
                                          help="Also write the picture brctl report draws: "
                                               "one self-contained HTML page with the "
                                               "windowed ETTR chart (a line per sweep value) "
                                               "and lost time by cause."),
) -> int:
    """Simulate months of incidents through the daemon's own decision code, in seconds.

    Incidents arrive at the mix's rates while the job trains; each is detected,
    analysed, escalated (reattempt, rollback, replay), capped and swapped by the
    same functions brctl daemon calls, on a synthetic clock. Prints cumulative and
    worst-day ETTR, lost time by cause, standby exhaustion, cap refusals and human
    pages, and what resolved the incidents; -o writes the same as an HTML page. The
    inventory supplies the machine count, the standby pool and the
    daemon: settings unless --machines is given (and --standby, or no inventory) (--mix history
    always reads it: the job's records and settings). Exit 0; exit 2 when --mix history finds nothing
    recorded for the job.
    """
    from brctl.commands._options import parse_duration
    from brctl.core.errors import UsageError
    from brctl.operations.simulate import parse_setting
    from brctl.operations.simulate import simulate as run
    from brctl.render.simulate import render_simulate

    env: Env = ctx.obj
    interval = parse_duration(ckpt_interval, "--ckpt-interval")
    step = parse_duration(window, "--window")
    if runs < 1:
        raise UsageError(f"--runs {runs}: expected at least 1")
    if days <= 0:
        raise UsageError(f"--days {days:g}: expected a number of days greater than 0")
    if machines is not None and machines < 1:
        raise UsageError(f"--machines {machines}: expected at least 1")
    if standby is not None and standby < 0:
        raise UsageError(f"--standby {standby}: expected a whole number >= 0")
    daemon = None
    history_of = None
    if machines is None or mix == "history" or (standby is None and _has_inventory(env)):
        inv = env.inventory()
        if mix == "history":
            if inv.job is None:
                raise UsageError(f"simulate --mix history: {inv.source} has no job: section")
            history_of = (env.store(), inv.job.name, len(inv.job.nodes))
        if machines is None:
            if inv.job is None:
                raise UsageError(f"simulate: {inv.source} has no job: section; give --machines")
            machines = len(inv.job.nodes)
        standby = len(inv.standby) if standby is None else standby
        daemon = inv.daemon
    standby = 0 if standby is None else standby  # --machines and no inventory: no pool
    overrides = [(key, values[0]) for key, values in
                 (parse_setting(text, "--set") for text in settings or [])]
    report = run(mix_name=mix, machines=machines, standby=standby, days=days,
                 ckpt_interval=interval, daemon=daemon, runs=runs, seed=seed, window=step,
                 settings=overrides,
                 sweep=parse_setting(sweep, "--sweep") if sweep else None, history_of=history_of)
    if output is not None:
        from brctl.operations.simulate import write_page
        from brctl.render.simulate import simulate_page

        write_page(output, simulate_page(report))
    render_simulate(env.output, report)
    return int(report.exit_code)


def _has_inventory(env: Env) -> bool:
    """Whether an inventory is named or in its usual place (``find_inventory``'s order)."""
    return bool(env.inventory_path or env.environ.get("BRCTL_INVENTORY")) \
        or Path("inventory.yaml").is_file()
