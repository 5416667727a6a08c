"""Replay, pure: ``groups`` plans the replay groups and the rounds that re-pair them, ``judge`` the
votes that name a machine, ``shape`` the parallel roles the replay keeps."""
