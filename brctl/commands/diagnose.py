"""``brctl diagnose``: hierarchical stop-time diagnosis of a failed job, driven by playbooks."""

from __future__ import annotations

from typing import Optional

import typer

from brctl.commands import _options as opt
from brctl.env import Env

HELP = """Diagnose a stopped training job: which machines must leave, and what to do next.

Reads the job's evidence from every machine (the tails of job.log_paths, torchrun's
exit codes, kernel Xid lines; or --logs DIR with one DIR/<node>.log per machine,
which replaces only the log collection), classifies the symptom with the playbooks
(playbooks/*.yaml; --playbooks DIR or $BRCTL_PLAYBOOKS add to and override the
built-in set), then runs the playbook's stop-time stages, each only on the machines
still in doubt, stopping at the first stage that names faulty machines:

Stage eud: dcgmi diag -r LEVEL -j on each machine (exit codes 226 and 205 mean
a fault, 242 no data and 255 a bad parameter give no verdict; a pass with warnings
is not clean; no dcgmi: skipped).

Stage alltoall: torch.distributed all-to-all over the GPUs of each machine (NCCL
on GPUs, gloo with one CPU process per GPU otherwise): a machine fails on an error,
a hang past the timeout, wrong data, or bus bandwidth far below the fleet median.

Stage allgather: one all-gather over all machines (rendezvous among the machines
themselves); when it fails, pairs, re-paired in later rounds with machines that
passed, so the bad machine (not just a bad pair) is named.

Symptoms shipped: gpu-lost (Xid 79), xid-hardware (ECC/NVLink Xids), cuda-error,
oom, user-code (a Python exception in the training code), nan-loss, nccl, hang,
unknown. Decisions: evict (a confident hardware fault: the named machines),
rollback (user code: never evict; or the same symptom again after a reattempt),
reattempt (every stage passed), replay (still failing after a rollback). Verdicts
are recorded in the state database so repeats are seen.

A stage that cannot run on a machine (no dcgmi, no torch) skips it with the reason;
skipped is never passed: the reason names the stages that ran and those skipped,
and a machine that no stage could test gets no verdict (exit 3). The collective
stages' timeouts count from the moment every worker is ready (torch imported, all
ranks at the rendezvous); getting ready has its own limit (diagnose.startup_timeout).

Stop-time stages take the GPUs: when the job's training processes (job.process_match)
are still alive on a machine, diagnose refuses (exit 4) unless --force.
Exit 0: nothing faulty, reattempt; 1: faulty machines or another decision;
2: bad playbook or input; 3: some machines got no verdict; 4: refused.
"""


def register(app: typer.Typer) -> None:
    """Add the command to the root app."""
    app.command("diagnose", help=HELP)(diagnose_command)


def diagnose_command(
    ctx: typer.Context,
    select: Optional[str] = opt.nodes("the job's machines"),
    exclude: Optional[str] = opt.EXCLUDE,
    logs: Optional[str] = typer.Option(None, "--logs", metavar="DIR",
                                       help="Read DIR/<node>.log instead of the job's logs."),
    playbooks: Optional[str] = typer.Option(None, "--playbooks", metavar="DIR",
                                            help="More playbooks (same name: replaces built-in)."),
    symptom: Optional[str] = typer.Option(None, "--symptom", metavar="NAME",
                                          help="Use this playbook instead of classifying."),
    force: bool = typer.Option(False, "--force",
                               help="Run the stages even if training processes are alive."),
) -> int:
    """Diagnose a stopped training job (see brctl diagnose --help)."""
    from pathlib import Path

    from brctl.core.errors import UsageError
    from brctl.load.playbooks import load_playbooks, playbook_dirs
    from brctl.operations.diagnose import Options, diagnose
    from brctl.render.diagnose import render

    env: Env = ctx.obj
    books = load_playbooks(playbook_dirs(playbooks, env.environ))
    if logs is not None and not Path(logs).is_dir():
        raise UsageError(f"--logs {logs}: no such directory")
    inv = env.inventory()
    nodes = None
    if select or exclude:
        base = set(inv.job.nodes) if inv.job and not select else set(inv.nodes)
        nodes = [n for n in inv.select(select, exclude) if n.name in base]
        if not nodes:
            raise UsageError("diagnose: the selection is empty", hint="check -w / -x")
    with env.output.stages("diagnose") as track:
        options = Options(logs_dir=Path(logs) if logs else None, symptom=symptom, force=force,
                          timeout_scale=env.timeout_scale(), concurrency=inv.ssh.fanout,
                          track=track)
        report = diagnose(inv, env.transport(), books, options, nodes=nodes, store=env.store(),
                          progress=env.output.info)
    render(env.output, report)
    return int(report.exit_code)
