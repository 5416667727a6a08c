"""The stop-time diagnosis, pure: ``decide`` is the ladder's decision (evict / reattempt /
rollback / replay), ``stages`` judges each stage's answers, ``doc`` declares the shape of a
node's answer (checked once where it arrives)."""
