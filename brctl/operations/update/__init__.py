"""``brctl update``: hot updates of the training code, pushed once and applied per job.

``ops`` is push / apply / rollback / status / history, ``pack`` packs a release once (a
directory, a tarball or a git revision), ``tables`` owns the releases, job versions and
history tables, ``report`` the reports and ``preview`` ``--dry-run``. What to send where is
``analysis.update``'s pure decision.
"""
