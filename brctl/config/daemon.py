"""``daemon:``: settings of ``brctl daemon``, ``brctl standby`` and ``brctl ettr``.

Every key is optional; the defaults suit a large job with a ~1 s step that
checkpoints every few minutes. Documented in ``inventory.example.yaml`` and
``brctl-inventory(5)``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional, Union

from brctl.core.schema import field, non_negative, positive, regex
from brctl.core.templates import REPLAY_PLACEHOLDERS, check_template

# Placeholders a notify command may use (one notification per action or refusal).
NOTIFY_PLACEHOLDERS = frozenset({"job", "kind", "node", "reason", "state"})

# Matches Megatron's " iteration      120/  500000 |", torchtitan's "step: 120",
# Lightning's "step=120", "global_step 120" and plain "Step 120" lines; group 1
# is the step.
DEFAULT_PROGRESS_REGEX = r"(?i)(?:^|[^a-z])(?:iteration|step)[\s:=#]*(\d+)"


def _progress_regex(value: str) -> str:
    if re.compile(regex(value)).groups < 1:
        raise ValueError("needs a capturing group for the step number, e.g. 'step (\\d+)'")
    return value


def _fraction(value: float) -> float:
    if not 0 < value <= 1:
        raise ValueError(f"got {value!r}, expected a fraction in (0, 1]")
    return value


def _factor(value: float) -> float:
    if value <= 1:
        raise ValueError(f"got {value!r}, expected a factor greater than 1")
    return value


def _port(value: int) -> int:
    if not 0 <= value <= 65535:
        raise ValueError(f"got {value!r}, expected a TCP port (0 turns /metrics off)")
    return value


def _template(name: str, placeholders: frozenset[str]
              ) -> Callable[[Union[str, list[str], None]], Union[str, list[str], None]]:
    """Field check: an optional argv template using only ``placeholders``."""
    def check(value: Union[str, list[str], None]) -> Union[str, list[str], None]:
        if value is None:
            return None
        from brctl.core.errors import InputError

        try:
            check_template(value, name, placeholders)
        except InputError as exc:
            raise ValueError(exc.message.removeprefix(f"{name}: ")) from None
        return value
    return check


def _standby_stages(value: list[str]) -> list[str]:
    unknown = [v for v in value if v not in ("eud", "alltoall")]
    if unknown:
        raise ValueError(f"unknown stage(s) {', '.join(unknown)}; expected eud and/or alltoall")
    return value


def _webhook(value: Optional[str]) -> Optional[str]:
    """An http(s) URL that urllib can POST to, checked whole now (not at the first page,
    mid-plan). The message never echoes the value: a webhook's path is its secret."""
    if value is None:
        return None
    import urllib.parse

    hidden = "(the value is not shown: a webhook URL's path is a secret)"
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"not a URL: it holds whitespace or control characters {hidden}")
    if not value.isascii():  # urllib would fail at the first page (percent-encode it)
        raise ValueError(f"not a URL: it holds non-ASCII characters {hidden}")
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"expected an http:// or https:// URL {hidden}")
    if "@" in parts.netloc:  # a password in the URL would be logged and sent in the clear
        raise ValueError(f"not a valid URL: user:password@ is not allowed {hidden}")
    try:
        port = parts.port
        host = parts.hostname
    except ValueError:
        raise ValueError(f"not a valid URL: bad host or port {hidden}") from None
    if not host or port == 0:
        raise ValueError(f"not a valid URL: no host{' or port' if port == 0 else ''} {hidden}")
    try:
        host.encode("idna")  # an empty or over-long label: http.client fails on it
    except UnicodeError:
        raise ValueError(f"not a valid URL: bad host name {hidden}") from None
    return value


@dataclass(frozen=True)
class DaemonSection:
    """Settings of the unattended loop (``brctl daemon run``) and its safety limits."""

    # Seconds between polls (health + progress). One poll bounds GPU-fault detection.
    poll_interval: float = field(10.0, check=positive)
    # No new step for this long (seconds) is a hang. Longer than the slowest step
    # plus a checkpoint save, or every checkpoint looks like a hang.
    stall_after: float = field(300.0, check=positive)
    # After a (re)start, the job gets this long (seconds) to print its first step
    # before a missing step counts as a hang (model load, NCCL init, ckpt load).
    startup_grace: float = field(600.0, check=positive)
    # Regex on the job's log lines; group 1 is the step number.
    progress_regex: str = field(DEFAULT_PROGRESS_REGEX, check=_progress_regex)
    # Bytes read from the end of each log per poll (bounds controller CPU and traffic).
    log_tail_bytes: int = field(16384, check=positive)
    # A step that took this many times the recent median step time is fail-slow.
    fail_slow_factor: float = field(3.0, check=_factor)
    # Step times kept for that median; fewer than fail_slow_min_samples → no verdict.
    fail_slow_window: int = field(20, check=positive)
    fail_slow_min_samples: int = field(5, check=positive)
    # Caps: more evictions than this in any hour are refused (exit 4, recorded, paged).
    max_evictions_per_hour: int = field(4, check=non_negative)
    # …and evicting more than this fraction of the job's machines in a replenish window.
    max_evict_fraction: float = field(0.25, check=_fraction)
    # Restarts with no new step in between; at this many the daemon pages and stops acting.
    max_restarts_without_progress: int = field(3, check=non_negative)
    # Notification per action and refusal: a JSON POST to a webhook, and/or a command
    # (argv template; placeholders {job} {kind} {node} {reason} {state}; the JSON on stdin).
    notify_webhook: Optional[str] = field(None, check=_webhook)
    notify_command: Optional[Union[str, list[str]]] = field(
        None, check=_template("notify_command", NOTIFY_PLACEHOLDERS))
    # Hours to replace a failed machine in the standby pool (sizing window, fraction cap).
    replenish_window: float = field(24.0, check=positive)
    # Seconds a daemon's lease on the job lasts without renewal; a heartbeat renews it
    # every lease_ttl/4 while the daemon works. A successor on the same host takes a
    # dead holder's lease over at once; one elsewhere waits this long.
    lease_ttl: float = field(60.0, check=positive)
    # Seconds after which an unfinished plan (the daemon was killed mid-way) is not
    # resumed but abandoned with a page: what it was based on is stale by then.
    max_plan_age: float = field(600.0, check=positive)
    # Prometheus /metrics; 0 turns it off. Loopback by default: metrics name machines.
    metrics_port: int = field(9469, check=_port)
    metrics_address: str = "127.0.0.1"
    # JSON-lines event log (default: daemon-events.jsonl in the state directory).
    event_log: Optional[str] = None
    # The diagnose stages a standby self-check runs after the health sweep (brctl standby
    # check, and the daemon at start): eud (dcgmi diag, where dcgmi exists) and alltoall
    # (inside the machine). A machine whose stages all skip is "untested", never checked;
    # [] checks health only (machines without GPUs, e.g. the local demo).
    standby_stages: list[str] = field(factory=lambda: ["eud", "alltoall"], check=_standby_stages)
    # The replay workload the daemon runs when the ladder says replay (silent data
    # corruption): brctl replay's built-in tiny GPT when unset, else this argv template
    # on every machine of each group (brctl replay --command's placeholders); each
    # group run may take command_timeout seconds.
    replay_command: Optional[Union[str, list[str]]] = field(
        None, check=_template("replay_command", REPLAY_PLACEHOLDERS))
    # Seconds each adapter command (restart/stop/status/evict) may run.
    command_timeout: float = field(300.0, check=positive)
