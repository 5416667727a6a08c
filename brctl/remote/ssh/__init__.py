"""The SSH transport: ``transport`` runs and streams over paramiko, ``config`` and ``openssh``
resolve where and how to connect as ssh would, ``connect`` makes authenticated, bounded
connections (shared attempts, jump hosts), ``liveness`` keeps them honest, ``known_hosts`` is host
trust and ``paramiko_lite`` imports paramiko without invoke."""
