"""Fixtures for the integration tier: real sshd "machines" on loopback (tests/kits/cluster.py).

``make_cluster(n, private_dirs=(), prefix="node")`` starts a fresh cluster that is
stopped when the test ends (use it to stop nodes or change things);
``ssh_cluster`` is a session-wide 4-node cluster with private ``/opt/train`` and
``/local/ckpt`` for read-only use. ``slurm_cluster`` (session-wide, 4 machines) and
``make_slurm_cluster(n)`` are a real Slurm whose machines run sshd and slurmd in shared
namespaces (tests/kits/slurm_cluster.py). Without root/sshd/unshare (or the Slurm packages) the
tests are skipped, unless ``BRCTL_REQUIRE_INTEGRATION=1`` (CI), where that is an error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tests.kits.cluster import SshCluster, missing_requirements
from tests.kits.slurm_cluster import SlurmCluster, missing_slurm_requirements

DEFAULT_PRIVATE_DIRS = ("/opt/train", "/local/ckpt")


def _require(why: str | None = None) -> None:
    why = why if why is not None else missing_requirements()
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


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A session-wide real Slurm: node01..node04 (sshd + slurmd each, 2 fake GPUs), partition
    ``batch``. Tests that submit jobs or drain machines call ``slurm_cluster.reset()`` after."""
    _require(missing_slurm_requirements())
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm-cluster"), 4)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture
def make_slurm_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., SlurmCluster]]:
    """Factory: ``make_slurm_cluster(n, gpus=2, private_dirs=())`` -> a started SlurmCluster,
    stopped after."""
    _require(missing_slurm_requirements())
    clusters: list[SlurmCluster] = []

    def make(n: int, gpus: int = 2, private_dirs: Sequence[str] = ()) -> SlurmCluster:
        cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), n, gpus=gpus,
                               private_dirs=private_dirs)
        clusters.append(cluster)
        return cluster.start()

    try:
        yield make
    finally:
        for cluster in clusters:
            cluster.stop()
