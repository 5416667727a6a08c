"""The exact probability that k random machine failures destroy both copies of a shard.

Split from ``placement`` (which plans and verifies); pure arithmetic on the backup
graph, no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from fractions import Fraction
from itertools import combinations
from math import comb

MAX_K = 4  # loss probabilities are computed for k = 1..MAX_K simultaneous failures


def loss_probability(machines: Sequence[str], backups: Mapping[str, str],
                     max_k: int = MAX_K, owners: Collection[str] | None = None
                     ) -> dict[int, Fraction | None]:
    """P(some shard loses both copies | k machines fail, uniformly at random), k = 1..max_k.

    A shard of machine A is lost when A and its backup B(A) both fail; a machine
    without a backup (or backed up on itself) loses when it fails. Counting the
    k-sets that contain no such pair is counting independent sets of size k in the
    backup graph G (edges {A, B(A)}). By inclusion–exclusion over edge sets S,
    ``#k-sets hitting an edge = Σ_S (−1)^{|S|+1} C(N − v(S), k − v(S))`` where v(S)
    is the number of machines S touches, and only v(S) ≤ k ≤ 4 contributes: single
    edges, 2-paths and triangles (v = 3), and two disjoint edges, 3-paths, 3-stars,
    4-cycles, paws, diamonds and K4s (v = 4). Each pattern is counted from degrees
    and common neighbours, so a pairing plan costs O(N).

    Args:
        machines: the failure universe (every machine that may fail).
        backups: machine → its backup machine.
        max_k: largest k (at most 4).
        owners: the machines that own shards (default: all of ``machines``). A holder
            outside the job (a standby) owns none: its own failure loses nothing.

    Returns:
        ``{k: probability}`` as exact fractions; None where k exceeds the machine count.
    """
    if max_k > MAX_K:
        raise ValueError(f"loss_probability: k ≤ {MAX_K} supported")
    names = list(dict.fromkeys(machines))
    owning = set(names) if owners is None else set(owners)
    lonely = {m for m in names if m in owning and backups.get(m, m) == m}
    rest = [m for m in names if m not in lonely]
    adj: dict[str, set[str]] = {m: set() for m in rest}
    for a, b in backups.items():
        if a in adj and b in adj and a != b:
            adj[a].add(b)
            adj[b].add(a)
    n_all, n = len(names), len(rest)
    hit = _hitting_counts(adj, n)
    out: dict[int, Fraction | None] = {}
    for k in range(1, max_k + 1):
        if k > n_all:
            out[k] = None
            continue
        safe = comb(n, k) - hit[k]  # k-sets avoiding lonely machines and every edge
        out[k] = 1 - Fraction(safe, comb(n_all, k))
    return out


def _hitting_counts(adj: Mapping[str, set[str]], n: int) -> dict[int, int]:
    """For k = 1..4, the number of k-subsets of the ``n`` vertices that contain an edge."""
    deg = {v: len(nb) for v, nb in adj.items()}
    edges = [(u, w) for u, nb in adj.items() for w in nb if u < w]
    n_edges = len(edges)
    p2 = sum(comb(d, 2) for d in deg.values())  # 2-paths (edge pairs sharing a vertex)
    # Triangles through each edge and vertex (common neighbours).
    tri_edge = {(u, w): len(adj[u] & adj[w]) for u, w in edges}
    triangles = sum(tri_edge.values()) // 3
    tri_vertex = {v: 0 for v in adj}
    for (u, w), t in tri_edge.items():
        tri_vertex[u] += t
        tri_vertex[w] += t
    stars3 = sum(comb(d, 3) for d in deg.values())
    paths3 = sum((deg[u] - 1) * (deg[w] - 1) for u, w in edges) - 3 * triangles
    paws = sum((tri_vertex[v] // 2) * (deg[v] - 2) for v in adj)
    diamonds = sum(comb(t, 2) for t in tri_edge.values())
    cycles4 = _four_cycles(adj)
    k4 = _four_cliques(adj, edges)
    pairs_disjoint = comb(n_edges, 2) - p2
    hit = {1: 0, 2: n_edges}
    hit[3] = n_edges * (n - 2) - p2 + triangles
    hit[4] = (n_edges * comb(max(n - 2, 0), 2) - (p2 - triangles) * (n - 3) - pairs_disjoint
              + stars3 + paths3 - cycles4 - paws + diamonds - k4)
    return hit


def _four_cycles(adj: Mapping[str, set[str]]) -> int:
    """4-cycles (as subgraphs): Σ over vertex pairs of C(common neighbours, 2), halved."""
    common: dict[tuple[str, str], int] = {}
    for nb in adj.values():
        if len(nb) < 2:
            continue
        for u, w in combinations(sorted(nb), 2):
            common[(u, w)] = common.get((u, w), 0) + 1
    return sum(comb(c, 2) for c in common.values()) // 2


def _four_cliques(adj: Mapping[str, set[str]], edges: list[tuple[str, str]]) -> int:
    """K4 subgraphs: for each edge, pairs of adjacent common neighbours; each K4 seen 6 times."""
    total = 0
    for u, w in edges:
        common = sorted(adj[u] & adj[w])
        total += sum(1 for x, y in combinations(common, 2) if y in adj[x])
    return total // 6
