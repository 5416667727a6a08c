"""``job.slurm:`` (the job comes from the scheduler) and the top-level ``slurm:`` section.

``job.slurm: {job: ID}`` or ``{name: NAME}`` (optionally ``user``, ``cluster``) makes Slurm the
source of the job's machines, state and restart count, resolved at every command
(``operations.slurm.job``), and the job whose allocation ``connection: slurm`` runs in. The
top-level ``slurm:`` says where machines not listed under ``nodes:`` come from (the nodes of
``partition``, addressed by their NodeAddr; allocations for standbys over ``connection:
slurm`` are made there too), where standbys come from (idle machines of that partition or of
``reservation``) and how long each Slurm client command may run. Documented in
``inventory.example.yaml`` and ``brctl-inventory(5)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Optional

from brctl.core.schema import field as sfield
from brctl.core.schema import positive

_JOB_ID = re.compile(r"\d+(_\d+|\+\d+)?")  # 1234, an array task 1234_7, a het component 1234+1
_WORD = re.compile(r"[A-Za-z0-9_.@:+-]+")


def _job_id(value: Optional[str]) -> Optional[str]:
    if value is not None and not _JOB_ID.fullmatch(str(value)):
        raise ValueError(f"got {value!r}, expected a Slurm job id (1234, 1234_7)")
    return None if value is None else str(value)


def _word(value: Optional[str]) -> Optional[str]:
    if value is not None and (not _WORD.fullmatch(value) or value.startswith("-")):
        raise ValueError(f"got {value!r}, expected one word (letters, digits, _ . @ : + -)")
    return value


@dataclass(frozen=True)
class SlurmJobSection:
    """``job.slurm:`` the job's id, or its name (narrowed by user and cluster)."""

    job: Optional[str] = sfield(None, check=_job_id)
    name: Optional[str] = sfield(None, check=_word)
    user: Optional[str] = sfield(None, check=_word)
    cluster: Optional[str] = sfield(None, check=_word)

    def describe(self) -> str:
        """``job 12345`` or ``job named 'NAME' (user U)``, for messages."""
        what = f"job {self.job}" if self.job is not None else f"job named {self.name!r}"
        extra = [f"user {self.user}"] if self.user else []
        extra += [f"cluster {self.cluster}"] if self.cluster else []
        return what + (f" ({', '.join(extra)})" if extra else "")


@dataclass(frozen=True)
class SlurmSection:
    """``slurm:`` settings for the whole inventory."""

    # The partition whose machines brctl may address without a nodes: entry (NodeAddr from
    # the scheduler) and whose idle machines are the standby pool; machines outside the
    # job's allocation that connection: slurm reaches get a short allocation of their own
    # here (None: the default partition, and no machines from the scheduler).
    partition: Optional[str] = sfield(None, check=_word)
    # Standbys: the idle machines of this reservation instead of the partition's.
    reservation: Optional[str] = sfield(None, check=_word)
    # How brctl reaches the machines it takes from Slurm (not under nodes:): ssh to their
    # NodeAddr, or slurm (srun: no ssh, and no list of machines to keep at all).
    connection: Literal["ssh", "slurm"] = "ssh"
    # Seconds each Slurm client command (squeue, sinfo, scontrol) may run.
    timeout: float = sfield(30.0, check=positive)
