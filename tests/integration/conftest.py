"""Fixtures for the integration tier: real sshd "machines" on loopback (see cluster.py).

``make_cluster(n, private_dirs=(), prefix="node")`` starts a fresh cluster that is
stopped when the test ends (use it to stop nodes or change things);
``ssh_cluster`` is a session-wide 4-node cluster with private ``/opt/train`` and
``/local/ckpt`` for read-only use. Without root/sshd/unshare the tests are skipped,
unless ``BRCTL_REQUIRE_INTEGRATION=1`` (CI), where that is an error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tests.integration.cluster import SshCluster, missing_requirements

DEFAULT_PRIVATE_DIRS = ("/opt/train", "/local/ckpt")


def _require() -> None:
    why = missing_requirements()
    if why is None:
        return
    if os.environ.get("BRCTL_REQUIRE_INTEGRATION") == "1":
        pytest.fail(f"integration tests required but cannot run: {why}")
    pytest.skip(why)


@pytest.fixture
def make_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., SshCluster]]:
    """Factory: ``make_cluster(n, private_dirs=(), prefix="node")`` -> a started SshCluster."""
    _require()
    clusters: list[SshCluster] = []

    def make(n: int, private_dirs: Sequence[str] = (), prefix: str = "node") -> SshCluster:
        root: Path = tmp_path_factory.mktemp("cluster")
        cluster = SshCluster(root, n, private_dirs=private_dirs, prefix=prefix)
        clusters.append(cluster)
        return cluster.start()

    try:
        yield make
    finally:
        for cluster in clusters:
            cluster.stop()


@pytest.fixture(scope="session")
def ssh_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshCluster]:
    """A session-wide 4-node cluster (node01..node04) with private /opt/train and /local/ckpt."""
    _require()
    cluster = SshCluster(
        tmp_path_factory.mktemp("session-cluster"), 4, private_dirs=DEFAULT_PRIVATE_DIRS
    )
    try:
        yield cluster.start()
    finally:
        cluster.stop()
