"""The built-in Slurm hooks: what ``job.*_command`` templates do, for a ``job.slurm`` job
whose inventory leaves them out.

- evict: ``scontrol update NodeName=N State=DRAIN Reason="brctl: …"``;
- unevict: ``State=RESUME``, only of a machine brctl drained (its reason starts ``brctl:``):
  a drain someone else set (a repair ticket) is not brctl's to lift;
- restart on exactly the planned machines: ``scontrol requeuehold`` (``hold`` when it already
  waits), the job's ``ReqNodeList``/``ExcNodeList``/``NumNodes`` set to the plan's machines and
  the ones it leaves, then ``scontrol release``;
- status: RUNNING is running, a job that is over (FAILED, NODE_FAIL, …) is not, one that
  waits (PENDING after a requeue) is unknown; ``allocation`` is the job as Slurm shows it,
  for the daemon to reconcile its recorded machines with (the scheduler wins).

Each hook's record (``HookRun``) ends with its effect as Slurm shows it afterwards (the
machine's state and drain reason, the job's state and node lists), and ``evicted`` /
``restarted_on`` read that effect back so a daemon resuming a plan can tell done from not.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Optional

from brctl.core.errors import BrctlError
from brctl.core.nodeset import expand, fold
from brctl.operations.ledger.hookrun import HookRun
from brctl.operations.slurm.job import ACTIVE, Slurm, SlurmJob

REASON_PREFIX = "brctl: "
_REASON_MAX = 200  # characters of a drain reason (Slurm keeps it in its state files)


def drain_reason(reason: str) -> str:
    """The drain reason brctl sets: one printable line, prefixed so brctl knows its own."""
    line = re.sub(r"[\x00-\x1f\x7f]+", " ", reason).strip()
    return (REASON_PREFIX + line)[:_REASON_MAX]


class SlurmHooks:
    """Drain, resume, requeue and ask about one Slurm job."""

    def __init__(self, slurm: Slurm, job: SlurmJob | str) -> None:
        """Args: the client runner; the job (as resolved, or its id)."""
        self.slurm = slurm
        self.job_id = job.job_id if isinstance(job, SlurmJob) else job

    def _job(self) -> Optional[SlurmJob]:
        return self.slurm.job(self.job_id)

    def _steps(self, steps: Sequence[Sequence[str]], effect: Callable[[], str]) -> HookRun:
        """Run client commands in order, stopping at the first failure; one record whose
        argv is the commands run (``;`` between them) and whose stdout ends with the effect."""
        started = time.monotonic()
        argv: list[str] = []
        out: list[str] = []
        for step in steps:
            argv.extend([*([";"] if argv else []), *step])
            try:
                text = self.slurm.run(*step)
            except BrctlError as exc:
                return HookRun(tuple(argv), 1, "\n".join(out), exc.message,
                               time.monotonic() - started)
            if text.strip():
                out.append(text.strip())
        try:
            out.append(effect())
        except BrctlError as exc:
            out.append(f"effect not read back: {exc.message}")
        return HookRun(tuple(argv), 0, "\n".join(out), "", time.monotonic() - started)

    # effects ----------------------------------------------------------------------------
    def node_effect(self, node: str) -> str:
        """``node03: idle, DRAIN (brctl: xid 79)``: the machine as Slurm shows it now."""
        info = self.slurm.nodes().get(node)
        if info is None:
            return f"{node}: unknown to Slurm"
        flags = f", {'+'.join(info.flags)}" if info.flags else ""
        return f"{node}: {info.state}{flags}" + (f" ({info.reason})" if info.reason else "")

    def job_effect(self) -> str:
        """``job 42: PENDING, ReqNodeList node[01,03], ExcNodeList node02, 1 restart``."""
        job = self._job()
        if job is None:
            return f"job {self.job_id}: unknown to Slurm"
        return (f"job {job.job_id}: {job.state}, ReqNodeList {job.required or '-'}, "
                f"ExcNodeList {job.excluded or '-'}, NodeList {job.nodelist or '-'}, "
                f"restarts {job.restarts}")

    def evicted(self, node: str) -> bool:
        """The machine is drained (or draining) with brctl's reason."""
        info = self.slurm.nodes().get(node)
        return info is not None and info.drained and info.reason.startswith(REASON_PREFIX)

    def restarted_on(self, members: Sequence[str]) -> bool:
        """The job asks for exactly ``members`` and is not held (it runs, or waits to)."""
        job = self._job()
        if job is None or not job.required or set(expand(job.required)) != set(members):
            return False
        # COMPLETING and REQUEUED: the old run's tasks still end; the job then pends for members
        return job.state in ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING", "REQUEUED") and \
            "held" not in job.reason.lower()

    # the hooks --------------------------------------------------------------------------
    @staticmethod
    def drain_argv(node: str, reason: str) -> tuple[str, ...]:
        """The drain ``evict`` runs (what a dry run shows)."""
        return ("scontrol", "update", f"NodeName={node}", "State=DRAIN",
                f"Reason={drain_reason(reason)}")

    @staticmethod
    def resume_argv(node: str) -> tuple[str, ...]:
        """The resume ``unevict`` runs (what a dry run shows)."""
        return ("scontrol", "update", f"NodeName={node}", "State=RESUME")

    def evict(self, node: str, reason: str) -> HookRun:
        """Drain ``node`` with brctl's reason (the job's tasks there end with the job). A
        drain someone else set is left as it is: its reason is theirs, and it must not
        become brctl's to lift at unevict."""
        argv = ("scontrol", "update", f"NodeName={node}", "State=DRAIN")
        try:
            info = self.slurm.nodes().get(node)
        except BrctlError as exc:
            return HookRun(("sinfo", "--json"), 1, "", exc.message, 0.0)
        if info is not None and info.drained and not info.reason.startswith(REASON_PREFIX):
            return HookRun(argv, 0, f"{self.node_effect(node)}: already drained by someone "
                           "else; left as it is", "", 0.0)
        return self._steps([self.drain_argv(node, reason)], lambda: self.node_effect(node))

    def unevict(self, node: str) -> HookRun:
        """Resume ``node`` if brctl drained it; refuse a drain someone else set."""
        try:
            info = self.slurm.nodes().get(node)
        except BrctlError as exc:
            return HookRun(("sinfo", "--json"), 1, "", exc.message, 0.0)
        if info is not None and info.drained and not info.reason.startswith(REASON_PREFIX):
            return HookRun(("scontrol", "update", f"NodeName={node}", "State=RESUME"), 4, "",
                           f"{node} was drained by someone else ({info.reason}): not resumed",
                           0.0)
        if info is not None and not info.drained:
            return HookRun(("scontrol", "update", f"NodeName={node}", "State=RESUME"), 0,
                           f"{self.node_effect(node)} (not drained: nothing to resume)", "", 0.0)
        return self._steps([self.resume_argv(node)], lambda: self.node_effect(node))

    def restart(self, members: Sequence[str]) -> HookRun:
        """Requeue the job held, pin it to exactly ``members`` (excluding the machines it held
        before and no longer has), release it."""
        try:
            job = self._job()
            before = self.slurm.hostnames(job.nodelist) if job and job.nodelist else ()
        except BrctlError as exc:
            return HookRun(("squeue", "-j", self.job_id), 1, "", exc.message, 0.0)
        if job is None:
            return HookRun(("scontrol", "requeuehold", self.job_id), 2, "",
                           f"Slurm has no job {self.job_id}", 0.0)
        excluded = [n for n in before if n not in set(members)]
        hold = ("scontrol", "requeuehold", job.job_id) if job.state in (
            "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED") else ("scontrol", "hold", job.job_id)
        update = ["scontrol", "update", f"JobId={job.job_id}", f"NumNodes={len(members)}",
                  f"ReqNodeList={fold(members)}"]
        update.append(f"ExcNodeList={fold(excluded)}" if excluded else "ExcNodeList=")
        return self._steps([hold, update, ("scontrol", "release", job.job_id)],
                           self.job_effect)

    def stop(self) -> HookRun:
        """Requeue the job held: its machines are freed, the job waits for ``restart``."""
        try:
            job = self._job()
        except BrctlError as exc:
            return HookRun(("squeue", "-j", self.job_id), 1, "", exc.message, 0.0)
        if job is None or job.state not in ("RUNNING", "CONFIGURING", "SUSPENDED"):
            state = job.state if job is not None else "unknown to Slurm"
            return HookRun(("scontrol", "requeuehold", self.job_id), 0,
                           f"job {self.job_id}: {state}: nothing to stop", "", 0.0)
        return self._steps([("scontrol", "requeuehold", job.job_id)], self.job_effect)

    def running(self) -> Optional[bool]:
        """True while RUNNING; False once it is over (FAILED, NODE_FAIL, TIMEOUT, gone…);
        None while it waits (PENDING after a requeue, CONFIGURING): not a crash by itself."""
        job = self._job()
        if job is None or job.state not in ACTIVE:
            return False
        return True if job.running else None

    def allocation(self) -> Optional[SlurmJob]:
        """The job as Slurm shows it now, its machines expanded while it runs (None: gone)."""
        job = self._job()
        if job is None or not job.running:
            return job
        return replace(job, nodes=self.slurm.hostnames(job.nodelist))
