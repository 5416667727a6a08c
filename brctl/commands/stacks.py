"""``brctl stacks``: find the hung or slow ranks from their stacks and the group to over-evict."""

from __future__ import annotations

from typing import Optional

import typer

from brctl.commands import _options as opt
from brctl.env import Env


def register(app: typer.Typer) -> None:
    """Add the command to the root app."""
    app.command("stacks")(stacks)


def stacks(
    ctx: typer.Context,
    rounds: int = typer.Option(5, "--rounds", metavar="N", min=1,
                               help="Collections to take (fail-slow votes over them); a round "
                               "that finds no training process anywhere is the last."),
    interval: float = typer.Option(10.0, "--interval", metavar="SECONDS", min=0.0, callback=opt.finite,
                                   help="Seconds between the starts of two rounds."),
    save: Optional[str] = typer.Option(None, "--save", metavar="DIR",
                                       help="Keep the dumps: DIR/<node>/<rank>-<pid>.json "
                                            "(py-spy's JSON, shipped whole), DIR/job.json; "
                                            "for a rank read through its socket, "
                                            "<rank>-<pid>.fr.json (its flight recorder as it "
                                            "answered) and .fr-meta.json (clock, group table)."),
    from_dir: Optional[str] = typer.Option(None, "--from", metavar="DIR",
                                           help="Analyse a --save directory offline (no inventory "
                                                "or nodes needed)."),
    dump_timeout: float = typer.Option(10.0, "--dump-timeout", metavar="SECONDS", min=0.1,
                                       callback=opt.finite,
                                       help="Seconds for one py-spy dump (× $BRCTL_TIMEOUT_SCALE)."),
    timeout: float = opt.timeout(120.0, "Seconds for the whole probe on one machine.",
                                   min=1.0),
) -> int:
    """Dump every training rank with py-spy, cluster the stacks and name the group to evict.

    On every job machine, finds the processes matching job.process_match and their
    process tree (launcher, ranks, data-loader and checkpoint workers), reads each
    rank's RANK from its environment and runs `py-spy dump --json` on it (a py-spy
    is shipped to machines without one). Each machine sends back only its ranks'
    main-thread frames, as one frame table and per-rank indices (~0.5 kB a rank;
    with --save, py-spy's JSON itself). The main threads' stacks are merged into
    a STAT-style prefix tree labelled with rank ranges; ranks are compared only
    with their pipeline stage; minority classes, undumpable and missing ranks are
    outliers. They are covered with whole parallel-group instances (TP, CP, EP,
    DP, PP) using the fewest machines, then the fewest groups: one group holding
    every outlier, or a union of smaller ones when that is smaller (two hung GPUs
    on two machines cost those two machines, not their DP group); those machines
    are proposed for eviction (JSON: suspect_groups, evict). With several rounds,
    groups whose every rank is an outlier in most rounds (beyond what the rounds'
    noise explains: several hung groups) are covered as one round would be;
    otherwise the group with the most outliers per rank wins (fail-slow), and a
    rank that moves while its stage stands still (or the reverse) is an outlier too.

    Where the job opted in (`python -m brctl.job -- train.py`, or
    `brctl.job.serve()` in the script: each rank serves PyTorch's worker server on
    $BRCTL_JOB_SOCKET_DIR/rank-<RANK>.sock, by default /tmp/brctl-job-<uid>/), each
    rank's socket is read first, with or without ptrace: its flight recorder,
    reduced on the machine to each group's last enqueued and completed collective,
    the pending one and the last 20 enqueue times; brctl's table of the job's
    process groups; whether a traceback answers (a recorder that answers without
    it: the main thread holds the GIL in native code). A rank whose environment
    cannot be read gets its rank from its socket. After connect and before a byte
    is sent, the socket's peer (SO_PEERCRED) must be a process of the job with its
    own uid, else it is closed unsent and that rank's error; every answer has a
    deadline and a size cap. JSON: ranks (per rank: machine, channel, state
    read/unread/unresponsive, /proc state, what answered, errors).

    Exit 0 when no outlier, 1 when an eviction is proposed, 3 when machines did not
    answer (the verdict covers only those that did).
    """
    from pathlib import Path

    from brctl.core.errors import UsageError
    from brctl.operations.stacks import ops as op
    from brctl.operations.stacks import save as stacks_save
    from brctl.operations.stacks.save_fr import save_recorder
    from brctl.render.stacks import render

    env: Env = ctx.obj
    if from_dir is not None and save is not None:
        raise UsageError("--from and --save: pick one (--from re-reads a saved directory)")
    cfg = None
    if from_dir is not None:
        collections, shape = stacks_save.load(Path(from_dir))
    else:
        scale = env.timeout_scale()
        cfg = env.inventory().stacks
        with env.output.progress("stacks", rounds) as advance:
            collections, shape = op.collect_job(
                env.inventory(), env.transport(), rounds=rounds, interval=interval,
                dump_timeout=dump_timeout * scale, timeout=timeout * scale, on_round=advance,
                raw=save is not None)
        if save is not None:
            stacks_save.save(Path(save), collections, shape)
            save_recorder(Path(save), collections)
    thresholds = {} if cfg is None else {"stuck_after": cfg.stuck_after,
                                         "straggler_threshold_ms": cfg.straggler_threshold_ms}
    report = op.analyse(collections, shape, **thresholds)
    render(env.output, report)
    return int(report.exit_code)
