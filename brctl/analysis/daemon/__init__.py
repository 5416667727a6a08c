"""The daemon's policy, pure: no I/O, no clock.

``policy`` detects the incident from a poll, plans the response and picks standbys
(``detect``, ``plan_for``, ``refusal``, ``pick_standbys``), ``plan`` is a plan's steps with
fixed targets (``PlanRecord``, the resume rules), and ``simulate`` the discrete-event ETTR
simulation of the same policy (``brctl simulate``).
"""
