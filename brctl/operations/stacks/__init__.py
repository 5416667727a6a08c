"""``brctl stacks``: every rank's Python stack, grouped, with the outliers named.

``ops`` ships py-spy to the machines, collects the rounds and screens each answer before
``analysis.stacks`` builds the prefix tree; ``save`` is ``--save`` / ``--from``, and
``controller`` what the controller lends a collection (py-spy to ship, a paused collector).
"""
