"""The fleet's shared records: what the daemon, evict, standby, report, update and ckpt keep.

``state`` is ``DaemonState``: the daemon's tables (events, the action log and plans,
quarantine, the standby checks, the job's members, ETTR intervals, the last status) behind
one lease-generation fence: every fenced write checks the generation in the same
``BEGIN IMMEDIATE`` transaction as its effect; ``records`` holds the rows it returns
(``Action``, ``Eviction``, ``Lease``). ``members`` reads the recorded members
read-only (``Env``), ``audit`` records a hand change (who, what, logged, announced) and
``hookrun`` is the record of one controller-side hook kept in the action log.

Issue 36 splits ``state`` into one repository per table here; the ``Component("daemon", …)``
migration chain keeps its name and order.
"""
