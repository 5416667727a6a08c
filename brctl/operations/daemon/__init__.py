"""The daemon: the unattended loop, poll → detect → decide → execute.

``loop`` holds ``Daemon`` (one poll: the job's state, the incident detected by
``analysis.daemon.policy``, the plan for it, its execution), ``steps`` runs a recorded plan's
steps at most once each across crashes, ``hooks`` is the ``Hooks`` protocol and ``LiveHooks``
(the daemon's window on the machines), ``lease`` the lease from this process's side (who
holds it, ``proven_dead``, the heartbeat), ``serve`` the wiring of the live daemon (its real
hooks, notifier and metrics), ``metrics`` the Prometheus ``/metrics`` and ``report`` what a
run reports (``brctl.daemon/1``) and what ``brctl daemon status`` reads. What it records
lives in ``operations.ledger``.
"""
