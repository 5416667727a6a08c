"""Topology against Megatron's closed form on many shapes."""

from __future__ import annotations

import itertools

import pytest

from brctl.analysis.topology import KINDS, Topology, TopologyError

SHAPES = [
    # (machines, gpus, tp, cp, pp, ep)
    (16, 8, 8, 1, 2, 1),
    (4, 4, 2, 1, 2, 1),
    (6, 4, 2, 2, 3, 1),
    (8, 2, 4, 1, 4, 1),
    (3, 2, 1, 2, 3, 1),
    (4, 8, 8, 2, 2, 1),
    (4, 4, 2, 1, 2, 2),
    (8, 4, 2, 2, 2, 4),
    (2, 8, 1, 1, 1, 8),
    (5, 1, 1, 1, 5, 1),
]


def closed_form(tp: int, cp: int, dp: int, pp: int, order: str) -> dict[str, list[list[int]]]:
    """Groups by brute force from rank = tp + TP*(cp + CP*(dp + DP*pp)) (or pp/dp swapped)."""
    coords = {}
    for t, c, d, p in itertools.product(range(tp), range(cp), range(dp), range(pp)):
        if order == "tp-cp-ep-dp-pp":
            rank = t + tp * (c + cp * (d + dp * p))
        else:
            rank = t + tp * (c + cp * (p + pp * d))
        coords[rank] = {"tp": t, "cp": c, "dp": d, "pp": p}
    out: dict[str, list[list[int]]] = {}
    for kind in ("tp", "cp", "dp", "pp"):
        buckets: dict[tuple[int, ...], list[int]] = {}
        for rank in sorted(coords):
            key = tuple(v for k, v in coords[rank].items() if k != kind)
            buckets.setdefault(key, []).append(rank)
        out[kind] = sorted(buckets.values())
    return out


@pytest.mark.parametrize("order", ["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"])
@pytest.mark.parametrize(("machines", "gpus", "tp", "cp", "pp", "ep"), SHAPES)
def test_dense_groups_match_closed_form(machines: int, gpus: int, tp: int, cp: int, pp: int,
                                        ep: int, order: str) -> None:
    names = [f"m{i:02d}" for i in range(machines)]
    dp = machines * gpus // (tp * cp * pp)
    if order.endswith("dp") and pp > 1 and ep > 1 and cp * dp // ep != dp:
        # Megatron refuses it (expert and dense pipeline groups would differ); this
        # test used to accept such layouts (issue 15)
        with pytest.raises(TopologyError, match="expert data-parallel size"):
            Topology.build(names, gpus, tp=tp, cp=cp, pp=pp, ep=ep, order=order)
        return
    topo = Topology.build(names, gpus, tp=tp, cp=cp, pp=pp, ep=ep, order=order)
    expected = closed_form(tp, cp, topo.dp, pp, order)
    for kind in ("tp", "cp", "dp", "pp"):
        assert sorted(topo.groups(kind)) == expected[kind]
        for gid, ranks in enumerate(topo.groups(kind)):
            assert all(topo.group_id(r, kind) == gid for r in ranks)


@pytest.mark.parametrize(("machines", "gpus", "tp", "cp", "pp", "ep"), SHAPES)
def test_every_kind_partitions_the_world(machines: int, gpus: int, tp: int, cp: int, pp: int,
                                         ep: int) -> None:
    topo = Topology.build([f"m{i}" for i in range(machines)], gpus, tp=tp, cp=cp, pp=pp, ep=ep)
    for kind in KINDS:
        flat = sorted(r for g in topo.groups(kind) for r in g)
        assert flat == list(range(topo.world)), kind
        assert all(len(g) == topo.size(kind) for g in topo.groups(kind))


def test_expert_groups_follow_megatron_expert_generator() -> None:
    # tp=2, ep=2, pp=2 over 16 ranks: expert dp = cp*dp/ep = 2; order tp-ep-dp-pp.
    topo = Topology.build(["a", "b", "c", "d"], 4, tp=2, pp=2, ep=2)
    assert topo.dp == 4 and topo.edp == 2
    assert topo.groups("ep")[:2] == [[0, 2], [1, 3]]
    assert topo.groups("edp")[:2] == [[0, 4], [1, 5]]
    # PP groups of the expert generator equal the dense ones (Megatron asserts this).
    assert topo.groups("pp") == [[r, r + 8] for r in range(8)]


def test_machines_of_groups_worked_example() -> None:
    # reference §2.6/§3.5: 16 machines, TP=8 inside each machine, PP=2, DP=8.
    names = [f"gpu{i:02d}" for i in range(16)]
    topo = Topology.build(names, 8, tp=8, pp=2)
    assert topo.dp == 8
    assert topo.group_machines("pp", 0) == ["gpu00", "gpu08"]
    assert topo.group_machines("dp", 0) == names[:8]
    assert topo.group_machines("tp", 9) == ["gpu09"]


def test_live_rank_mapping_wins() -> None:
    live = ["b", "b", "a", "a"]
    topo = Topology.build(["a", "b"], 2, tp=2, rank_machines=live)
    assert topo.machine_of(0) == "b" and topo.ranks_on("a") == [2, 3]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"tp": 3}, "cannot be split"),
        ({"tp": 2, "pp": 3}, "cannot be split"),
        ({"ep": 3}, "ep=3 must divide"),
        ({"tp": 2, "pp": 2, "order": "pp-dp-tp"}, "not supported"),  # TP not first
    ],
)
def test_sizes_that_do_not_divide_are_clear_errors(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(TopologyError, match=needle):
        Topology.build(["a", "b"], 4, **kwargs)  # type: ignore[arg-type]


def test_short_orders_are_megatrons_too() -> None:
    """Megatron appends the size-1 axes left out of a short order; they were refused."""
    names = [f"m{i}" for i in range(4)]
    assert Topology.build(names, 4, tp=2, pp=2, order="tp-dp-pp").order == "tp-cp-ep-dp-pp"
    assert Topology.build(names, 4, tp=2, pp=2, order="tp-pp-dp").order == "tp-cp-ep-pp-dp"
    with pytest.raises(TopologyError, match="leaves out cp"):
        Topology.build(names, 4, tp=2, cp=2, order="tp-dp-pp")
    with pytest.raises(TopologyError, match="not an order"):
        Topology.build(names, 4, tp=2, order="tp-dp-dp")


def test_expert_layouts_megatron_refuses_are_refused() -> None:
    """tp-cp-ep-pp-dp with EP > 1 and PP > 1 needs CP·DP/EP = DP (Megatron's assertion)."""
    names = [f"m{i}" for i in range(4)]
    with pytest.raises(TopologyError, match="expert data-parallel size"):
        Topology.build(names, 4, tp=2, pp=2, ep=2, order="tp-cp-ep-pp-dp")
    ok = Topology.build(names, 4, tp=1, pp=2, cp=2, ep=2, order="tp-cp-ep-pp-dp")
    assert ok.edp == ok.dp


def test_megatron_tests_the_order_as_typed() -> None:
    """Megatron asserts ``order.endswith("pp")`` on the typed string: tp-ep-dp-pp-cp with
    CP = 1 ranks like the default order, but Megatron refuses it (144 such layouts were
    accepted: brctl tested the canonical order)."""
    names = [f"m{i}" for i in range(8)]
    for order in ("tp-ep-dp-pp-cp", "ep-dp-pp-tp-cp", "ep-dp-tp-pp-cp"):
        with pytest.raises(TopologyError, match="expert data-parallel size"):
            Topology.build(names, 4, tp=1, pp=2, ep=2, order=order)
    assert Topology.build(names, 4, tp=1, pp=2, ep=2, order="tp-cp-ep-dp-pp").edp == 8
    # without expert parallelism there is no expert generator to disagree
    assert Topology.build(names, 4, pp=2, order="tp-dp-pp-cp").order == "tp-cp-ep-dp-pp"
