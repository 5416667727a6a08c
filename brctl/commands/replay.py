"""``brctl replay``: find the machine that silently corrupts data in few rounds (2 with a grid)."""

from __future__ import annotations

from typing import Optional

import typer

from brctl.commands import _options as opt
from brctl.env import Env


def register(app: typer.Typer) -> None:
    """Add the command to the root app."""
    app.command("replay")(replay_command)


def replay_command(
    ctx: typer.Context,
    dp: Optional[int] = typer.Option(None, "--dp", metavar="N",
                                     help="Replay data-parallel size DP' (default: the smallest "
                                          "that gives a majority vote and a 2-round grid)."),
    repeat: int = typer.Option(1, "--repeat", metavar="R",
                               help="Run each round R times; a deviation seen once and not "
                                    "again is reported as not_reproduced."),
    command: Optional[str] = typer.Option(None, "--command", metavar="TEMPLATE",
                                          help="User workload run on each machine of a group "
                                               "(split like a shell, never run by one); "
                                               "placeholders {nodes} {nnodes} {node_rank} "
                                               "{nproc_per_node} {master_addr} {master_port}. "
                                               "Rank 0 prints 'brctl-fingerprint STEP HEX'."),
    steps: int = typer.Option(4, "--steps", metavar="N",
                              help="Training steps of the built-in workload."),
    seed: int = typer.Option(1234, "--seed", metavar="N",
                             help="Seed of the built-in workload's weights and data."),
    device: str = typer.Option("auto", "--device", metavar="auto|cpu|cuda",
                               help="Built-in workload device: CUDA+NCCL when every rank has "
                                    "a GPU (auto), else CPU+gloo."),
    timeout: float = opt.timeout(300.0, "Time one run of a round may take."),
    port: Optional[int] = typer.Option(None, "--port", metavar="PORT",
                                       help="First rendezvous port on each group's first "
                                            "machine (default: random in 20000-39999); each "
                                            "group run takes the next."),
    max_rounds: Optional[int] = typer.Option(
        None, "--max-rounds", metavar="N",
        help="Stop with 'ambiguous' after N rounds (default: the rounds one fault needs "
             "for this shape, plus 2; --plan-only shows it)."),
    plan_only: bool = typer.Option(False, "--plan-only",
                                   help="Print the groups of rounds 1 and 2 and the round "
                                        "bound for this shape; run nothing."),
) -> int:
    """Dual-phase replay: name the machine producing silent data corruption.

    Keeps the job's TP and PP and shrinks DP: round 1 runs the same deterministic
    workload on disjoint groups of machines, each a complete smaller job with every
    machine on its own pipeline stage; round 2 regroups them so that each new group
    meets each round-1 group in at most one machine. Groups are compared with each
    other (majority of bitwise per-step fingerprints of loss and gradients), so the
    faulty machine is where the deviant groups meet: 2 rounds when each pipeline
    position has at least as many machines as there are positions per group.
    Otherwise later rounds split the suspects over as many jobs of known-good
    machines as there are groups (g), at most 1 + ceil(log_g S) rounds for S
    suspects; with only 3 groups a lone candidate is confirmed, 3 rounds with a
    grid and 2 + ceil(log2 S) without; --plan-only prints the bound for the job's
    shape. Two faulty machines get a further round that replays each candidate
    with known-good machines. With only 3 groups two machines corrupting alike can out-vote the
    healthy one: a lone candidate is found only after a control job without it,
    staffed by machines no such reading can blame, replays clean (with one machine
    of each position per group, one of another position takes its slot: that job
    alone moves a machine off its stage). Only 3 machines that each hold the whole
    model cannot tell one odd one out from two alike: ambiguous there, unless the
    value is NaN/inf. The built-in workload
    needs torch for ssh.python on the nodes; a group's ranks meet over TCP at its first
    machine's inventory address (set GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME in a
    node's env: when the default interface is the wrong one). Exit 0 none, 1 found,
    ambiguous or not_reproduced, 3 incomplete (groups could not run), 4 incomplete
    because brctl refused a machine (a safety rule).
    """
    from brctl.core.errors import ExitCode, UsageError
    from brctl.operations.replay import (
        BuiltinWorkload,
        Workload,
        command_workload,
        replay,
        replay_plan,
    )
    from brctl.render.replay import render, render_plan

    env: Env = ctx.obj
    for name, value in (("--steps", steps), ("--repeat", repeat), ("--max-rounds", max_rounds)):
        if value is not None and value < 1:
            raise UsageError(f"{name} {value}: expected a whole number >= 1")
    if device not in ("auto", "cpu", "cuda"):
        raise UsageError(f"--device {device!r}: expected auto, cpu or cuda")
    inv = env.inventory()
    the_plan = replay_plan(inv, dp)
    if plan_only:
        render_plan(env.output, the_plan)
        return ExitCode.OK  # a plan judges nothing
    if not the_plan.can_vote:
        env.output.warn(f"only {len(the_plan.round1)} replay group(s) per round: if they "
                        "disagree, no majority says which is wrong (NaN/Inf still does)")
    workload: Workload = (command_workload(command) if command is not None
                          else BuiltinWorkload(steps=steps, seed=seed, device=device))
    if port is None:
        import random

        port = random.SystemRandom().randrange(20000, 40000)
    with env.output.stages("replay") as track:
        report = replay(env.transport(), inv, workload=workload, dp=dp, repeat=repeat,
                        timeout=timeout * env.timeout_scale(), port_base=port,
                        max_rounds=max_rounds,
                        on_round=lambda spec, i: env.output.info(
                            f"round {i} ({spec.kind}): {len(spec.groups)} group(s)"),
                        track=track)
    render(env.output, report)
    return int(report.exit_code)
