"""Review of 2ed9bf1 (leave-one-out noise rate in ``_persistent_ranks``): a regression it brought."""

from __future__ import annotations

from brctl.analysis.stacks import analyse
from brctl.analysis.topology import Topology
from tests.unit.test_stacks_analysis import HEALTHY, RECV, STUCK, round_of, stack


def test_noise_beside_a_hung_rank_does_not_make_its_dp_group_persistent() -> None:
    """tp=2 pp=2 dp=2 on 4 machines: PP group {3, 7} hangs in every round, and noise lands on
    rank 5 in 3 of 5 rounds. DP group {5, 7} is then 'full' in 3 rounds only because rank 7
    hangs; with q counted outside the instance (7 of 30 rank-rounds) and p = q**2 it passed
    as more than noise explains, and the healthy machine m002 (rank 5) was evicted with the
    hung group. Before 2ed9bf1 (q over the whole job) the eviction was the PP group alone.
    In simulation this happens in 3-6 % of 4-5-round runs of this shape (0-1 % before)."""
    topo = Topology.build(["m000", "m001", "m002", "m003"], 2, tp=2, pp=2)
    assert topo.dp == 2 and topo.group_ranks("pp", topo.group_id(3, "pp")) == [3, 7]
    noise = [5, 5, 5, 0, 1]
    rounds = []
    for i in range(5):
        stacks = dict.fromkeys(range(topo.world), HEALTHY)
        stacks[3], stacks[7] = STUCK, RECV
        stacks[noise[i]] = stack(("save_checkpoint", "ckpt.py"))
        rounds.append(round_of(topo, stacks))
    a = analyse(rounds, topo)
    assert a.evict == ("m001", "m003")
