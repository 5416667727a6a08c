"""Stacks, pure: ``tree`` is the prefix tree of every rank's stack and its outlier classes,
``pyspy`` decodes py-spy's dump and the packed answer (bulk checks at C speed), ``evictset``
the smallest cover of the outliers by whole groups."""
