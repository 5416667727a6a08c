"""``brctl ckpt``: checkpoint backups placed so that no eviction loses a shard's last copy.

``ops`` is plan / verify / backup / restore (the placement, ``analysis.placement``, and its
plan files), ``copy`` the copy model, the relay node → controller → node in bounded lanes and
the backup's phases, and ``restores`` an evicted machine's newest verified backup onto its
replacement. Every answer a node sends is checked before it is used; a node
that refuses is that node's error, never the run's.
"""
