"""Checkpoint placement, pure: ``plan`` places each shard's copies so that no eviction loses
the last one, ``verify`` is the proof (evict every group, count the shards lost), ``conflicts``
the index of which parallel groups each machine is in, ``lossprob`` the exact probability
that k random machine failures destroy both copies of a shard."""
