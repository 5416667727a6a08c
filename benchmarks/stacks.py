"""Benchmark ``brctl stacks``: analysis of synthetic rank dumps, and collection over sshd nodes.

``python benchmarks/stacks.py [--ranks 1024,16384,131072] [--runs 3] [--nodes 16]``

Analysis: a job of tp=8 × pp=8 (× dp) on 8-GPU machines; every stage has its own
stack of 40-80 frames (torch.distributed wait at the bottom); 1 rank in 1,000
sits in a different function and its pipeline peers wait in recv, and every
rank's frames carry its own line numbers in the innermost user frame (so stacks
are distinct tuples, as parsed from real dumps, with frames interned as the
parser does). Timed: ``analysis.stacks.tree.analyse`` over one round (signatures,
classes, prefix tree, outliers, group mapping), median of ``--runs``.

End to end (``--end-to-end 131072``): the same round as each machine's stacks
probe answers it (``diagnostics.stacks_probe``: main-thread frames in one frame
table per machine, the ranks packed in a few strings), timed on the controller from the answers' text to the
verdict: ``parse_document`` (JSON), ``operations.stacks.ops.read_answers`` (checks and
interns the frames) and ``operations.stacks.ops.analyse`` (live rank map, rounds,
analysis). CPU seconds, the best of ``--runs``, with a calibration loop
(``sum(range(10**7))``) timed beside it. Bytes shipped per rank are measured for the
reduced answers and for the raw form (py-spy's pretty-printed JSON with three
threads, as ``--save`` ships it); the raw path's controller CPU is measured at
``--raw-ranks`` and shown per rank.

With ``--recorder K`` every rank also answers its flight-recorder summary
(``diagnostics.recorder``: per group the wavefront, the pending collective and the
last K enqueue times) in the probe's ``recorder`` rows, as a job opted in with
``brctl.job`` does: groups world, tp and dp (pp's p2p is not in the summary), one
rank of one dp group never entered collective #50 (its peers wait, 120 s old), and
the verdict must come from the recorder (the stacks show only the pp hang).

Collection (``--nodes N``, needs root, sshd and ``brctl.remote.ssh``): N real
sshd machines (tests/kits/cluster.py, own PID namespaces), 2 sleeping
"ranks" on each, ``operations.stacks.ops.collect`` with real py-spy dumps; the first
round ships the probe bundle, later rounds reuse the connections and the cache.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from brctl.analysis.stacks.tree import Frame, RankSample, Round, analyse
from brctl.analysis.topology import Topology
from brctl.core.transport import NodeState, RunResult
from brctl.diagnostics.protocol import PROBE_SCHEMA
from brctl.diagnostics.pyspy_frames import PACKED, RAW, pack
from brctl.diagnostics.recorder import pack_recent
from brctl.diagnostics.stacks_probe import main_stacks
from brctl.operations.stacks.ops import Collection, JobShape, read_answers
from brctl.operations.stacks.ops import analyse as analyse_collections
from brctl.remote.probes import ProbeResult, parse_document


def synthetic(world: int, seed: int = 1) -> tuple[Topology, Round]:
    """One round of ``world`` ranks with a hang in one PP group per 1,000 ranks."""
    rng = random.Random(seed)
    tp, pp = 8, 8
    topo = Topology.build([f"gpu{i:05d}" for i in range(world // 8)], 8, tp=tp, pp=pp)
    frames: dict[Frame, Frame] = {}

    def f(name: str, file: str, line: int) -> Frame:
        fr = Frame(name, file, line)
        return frames.setdefault(fr, fr)

    bases = []
    for stage in range(pp):
        depth = rng.randint(36, 76)
        outer = [f(f"layer{stage}_{i}", f"megatron/core/module{i % 9}.py", 10 + i)
                 for i in range(depth)]
        bases.append(outer)
    wait = [f("wrapper", "torch/distributed/c10d_logger.py", 81),
            f("all_reduce", "torch/distributed/distributed_c10d.py", 2501),
            f("wait", "torch/distributed/distributed_c10d.py", 2200)]
    recv = [f("recv", "torch/distributed/distributed_c10d.py", 1900)]
    stuck = [f("load_batch", "data/loader.py", 77), f("read", "data/shard.py", 12)]
    bad = {rng.randrange(world) for _ in range(max(1, world // 1000))}
    peers = {r for b in bad for r in topo.group_ranks("pp", topo.group_id(b, "pp"))}
    samples = []
    for rank in range(world):
        stage = topo.coord(rank, "pp")
        user = f("train_step", "pretrain_gpt.py", 100 + rank % 7)
        tail = stuck if rank in bad else recv if rank in peers else wait
        stack = (*bases[stage], user, *tail)
        samples.append(RankSample(rank, topo.machine_of(rank), 10_000 + rank, stack))
    return topo, Round(tuple(samples))


def bench_analysis(sizes: list[int], runs: int) -> None:
    print("| ranks | frames/rank | analyse (median) | per rank |")
    print("|---|---|---|---|")
    for world in sizes:
        topo, rnd = synthetic(world)
        depth = statistics.mean(len(s.stack or ()) for s in rnd.samples)
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            result = analyse([rnd], topo)
            times.append(time.perf_counter() - t0)
        assert result.evict, "the synthetic hang must be found"
        med = statistics.median(times)
        print(f"| {world:,} | {depth:.0f} | {med:.3f} s | {med / world * 1e6:.1f} µs |")


_OTHER_THREADS = (  # what else a torch rank runs: a pin-memory thread, autograd's worker
    ("Thread-2 (_pin_memory_loop)", [("_pin_memory_loop", "torch/utils/data/_utils/pin_memory.py",
                                      49), ("Thread.run", "threading.py", 982),
                                     ("Thread._bootstrap_inner", "threading.py", 1045),
                                     ("Thread._bootstrap", "threading.py", 1002)]),
    ("pt_autograd_0", [("wait", "threading.py", 331), ("get", "queue.py", 180),
                       ("Thread._bootstrap", "threading.py", 1002)]))


def pyspy_json(stack: tuple[Frame, ...], pid: int) -> str:
    """``py-spy dump --json`` of a rank whose main thread is ``stack`` (pretty, as py-spy prints)."""
    def frame(name: str, file: str, line: int) -> dict[str, object]:
        return {"name": name, "filename": f"/opt/venv/lib/python3.11/site-packages/{file}",
                "module": None, "short_filename": file, "line": line, "locals": None,
                "is_entry": False, "is_shim_entry": False}

    threads = [{"pid": pid, "thread_id": 139_900_000_000_000 + i, "thread_name": name,
                "os_thread_id": pid + 1 + i, "active": False, "owns_gil": False,
                "frames": [frame(*f) for f in frames], "process_info": None}
               for i, (name, frames) in enumerate(_OTHER_THREADS)]
    threads.append({"pid": pid, "thread_id": 139_800_000_000_000, "thread_name": "MainThread",
                    "os_thread_id": pid, "active": True, "owns_gil": False,
                    "frames": [frame(*f) for f in reversed(stack)], "process_info": None})
    return json.dumps(threads, indent=2)


def recorder_rows(samples: list[RankSample], topo: Topology, k: int, skip: int) -> list[object]:
    """Each rank's ``recorder`` row with its summary, as a socket-read rank's probe sends it."""
    clock = 1_800_000_000 * 10**9
    tp_base, dp_base = 1, 1 + topo.n_groups("tp")
    rows: list[object] = []
    for s in samples:
        r = s.rank
        groups: dict[str, object] = {}
        for name, desc, last, pend in (
                ("0", "default_pg", 30, None),
                (str(tp_base + topo.group_id(r, "tp")), "TENSOR_MODEL_PARALLEL_GROUP", 400, None),
                (str(dp_base + topo.group_id(r, "dp")), "DATA_PARALLEL_GROUP",
                 49 if r == skip else 50, None if r == skip else 50)):
            t0 = clock - 130 * 10**9
            recent = [(q, t0 + q * 10**8 + (r * 7919 + q) % 3_000_000, 0)
                      for q in range(max(1, last - k + 1), last + 1)]
            groups[name] = {
                "desc": desc, "ranks": None, "last_enqueued": last,
                "last_completed": last - 1 if pend else last,
                "pending": {"seq": pend, "op": "all_reduce", "sizes": [[4096]],
                            "dtypes": ["BFloat16"], "enqueued_ns": clock - 120 * 10**9,
                            "started_ns": None} if pend else None,
                "recent": pack_recent(recent), "ops": [["all_reduce", len(recent)]]}
        rows.append({"rank": r, "pid": s.pid, "channel": "brctl-socket", "state": "read",
                     "proc_state": "S", "traceback": True, "table": True, "error": None,
                     "wchan": None, "summary": {
                         "v": 1, "clock_ns": clock, "version": "2.10", "backend": "nccl",
                         "wrapped": True, "step": 1234, "groups": groups}})
    return rows


def probe_answer(samples: list[RankSample], world: int, raw: bool,
                 recorder: list[object] | None = None) -> str:
    """One machine's stacks-probe stdout for its ranks (reduced, or ``raw`` as for --save)."""
    procs = [{"pid": s.pid, "role": "rank", "rank": s.rank, "local_rank": s.rank % 8,
              "world_size": world} for s in samples]
    doc: dict[str, object] = {"py_spy": "/usr/local/bin/py-spy", "py_spy_missing": False}
    if raw:
        doc.update(format=RAW, processes=procs, dumps=[
            {"pid": s.pid, "seconds": 0.21, "error": None,
             "output": pyspy_json(s.stack or (), s.pid)} for s in samples])
    else:  # the probe's own packing (from the py-spy text it gives the same: checked)
        doc.update(format=PACKED, **pack(procs, {s.pid: list(s.stack or ()) for s in samples}))
    if recorder is not None:
        doc.update(recorder=recorder, unread=0, socket_errors=[])
    doc["schema"] = PROBE_SCHEMA
    return json.dumps(doc, separators=(",", ":")) + "\n"


def calibration() -> float:
    """CPU seconds of ``sum(range(10**7))``: how fast this core is right now."""
    t0 = time.process_time()
    sum(range(10**7))
    return time.process_time() - t0


def controller_cpu(answers: dict[str, str], shape: JobShape) -> tuple[float, float, object]:
    """CPU seconds from the answers' text to the report: (parse + read, analyse), report."""
    t0 = time.process_time()
    results = {}
    for name, text in answers.items():
        run = RunResult(name, NodeState.OK, 0, text, "", 0.3)
        results[name] = ProbeResult(name, run, *parse_document(run))
    col = Collection(read_answers(results), 0.0, 0.0)
    t1 = time.process_time()
    report = analyse_collections([col], shape)
    return t1 - t0, time.process_time() - t1, report


def bench_end_to_end(world: int, raw_world: int, runs: int = 3, recorder: int = 0) -> None:
    """One round at ``world`` ranks from the probes' answers to the verdict (controller CPU);
    ``recorder``: every rank also sends its recorder summary with that many recent collectives."""
    topo, rnd = synthetic(world)
    skip = world // 3
    by_node: dict[str, list[RankSample]] = {}
    for s in rnd.samples:
        by_node.setdefault(s.node, []).append(s)
    shape = JobShape(topo.machines, tuple([8] * len(topo.machines)), tp=8, pp=8)
    first = next(iter(by_node.values()))
    # the shortcut above is the probe's reduction: same frames, same indices
    raw_doc = json.loads(probe_answer(first, world, raw=True))
    packed = pack(raw_doc["processes"], main_stacks(raw_doc["dumps"]))
    reduced_doc = json.loads(probe_answer(first, world, raw=False))
    assert {k: reduced_doc[k] for k in packed} == json.loads(json.dumps(packed))
    answers = {node: probe_answer(samples, world, raw=False, recorder=recorder_rows(
        samples, topo, recorder, skip) if recorder else None) for node, samples in by_node.items()}
    reduced = sum(len(a) for a in answers.values()) / world
    sample = list(by_node.items())[:: max(1, len(by_node) // 256)]
    raw = (sum(len(probe_answer(ss, world, raw=True)) for _, ss in sample)
           / sum(len(ss) for _, ss in sample))
    del rnd, by_node, sample, first  # the controller holds only the answers
    best = None
    for _ in range(runs):
        cal = calibration()
        parse, analysis, report = controller_cpu(answers, shape)
        print(f"run: parse + check {parse:.2f} s, analysis {analysis:.2f} s, "
              f"calibration {cal:.3f} s", file=sys.stderr)
        if best is None or parse + analysis < sum(best[:2]):
            best = (parse, analysis, cal)
    assert best is not None
    parse, analysis, cal = best
    assert report.analysis.evict, "the synthetic hang must be found"  # type: ignore[attr-defined]
    if recorder:
        coll = report.analysis.collectives  # type: ignore[attr-defined]
        assert [c.rank for c in coll.culprits] == [skip], "the recorder must name the skip"
        print(f"recorder: K={recorder}, culprit rank {skip}, evict "
              f"{len(report.analysis.evict)} machines", file=sys.stderr)  # type: ignore[attr-defined]
    print("| ranks | form | bytes shipped per rank | parse + check (CPU) | analysis (CPU) | "
          "end to end (CPU) | per rank |")
    print("|---|---|---|---|---|---|---|")
    total = parse + analysis
    form = f"reduced + recorder K={recorder}" if recorder else "reduced (default)"
    print(f"| {world:,} | {form} | {reduced:,.0f} | {parse:.2f} s | {analysis:.2f} s | "
          f"**{total:.2f} s** | {total / world * 1e6:.1f} µs |")
    if raw_world:
        rtopo, rrnd = synthetic(raw_world)
        rnodes: dict[str, list[RankSample]] = {}
        for s in rrnd.samples:
            rnodes.setdefault(s.node, []).append(s)
        ranswers = {n: probe_answer(ss, raw_world, raw=True) for n, ss in rnodes.items()}
        rshape = JobShape(rtopo.machines, tuple([8] * len(rtopo.machines)), tp=8, pp=8)
        rparse, ranalysis, _ = controller_cpu(ranswers, rshape)
        rtotal = rparse + ranalysis
        print(f"| {raw_world:,} | raw (`--save`) | {raw:,.0f} | {rparse:.2f} s | "
              f"{ranalysis:.2f} s | {rtotal:.2f} s | {rtotal / raw_world * 1e6:.1f} µs |")
        print(f"\ncalibration `sum(range(10**7))` beside the best run: {cal:.3f} s CPU")
        print(f"raw at {world:,} ranks: {raw * world / 2**30:.2f} GiB shipped, "
              f"~{rtotal / raw_world * world:.1f} s CPU (extrapolated per rank)")


def bench_collection(n: int, rounds: int) -> None:
    import subprocess
    import tempfile

    from brctl.operations.stacks.ops import collect
    from brctl.remote.probes import ProbeRunner
    from brctl.remote.ssh.transport import SshTransport
    from tests.kits.cluster import SshCluster, missing_requirements

    why = missing_requirements()
    if why:
        print(f"collection: skipped ({why})")
        return
    with tempfile.TemporaryDirectory() as tmp, SshCluster(Path(tmp), n) as cluster:
        import yaml

        from brctl.load.inventory import load_inventory

        inv_dict = cluster.inventory(job={"process_match": "brctl-bench-rank"},
                                     python=sys.executable)
        for i, entry in enumerate(inv_dict["nodes"]):
            entry["gpus"] = 2
            del i
        (Path(tmp) / "inv.yaml").write_text(yaml.safe_dump(inv_dict))
        inv = load_inventory(Path(tmp) / "inv.yaml")
        body = "import time\nwhile True: time.sleep(1)"
        for i, name in enumerate(cluster.names):
            for local in range(2):
                cmd = (f"RANK={2 * i + local} LOCAL_RANK={local} WORLD_SIZE={2 * n} setsid "
                       f"{sys.executable} -c '{body}' brctl-bench-rank </dev/null >/dev/null 2>&1 &")
                subprocess.run(["ssh", "-F", "/dev/null", "-i", str(cluster.client_key), "-o",
                                f"UserKnownHostsFile={cluster.known_hosts}", "-o", "BatchMode=yes",
                                "-p", str(cluster.port), f"root@{cluster.address(name)}", cmd],
                               check=True, timeout=30)
        transport = SshTransport()
        runner = ProbeRunner(transport)
        print("| round | machines | ranks dumped | wall |")
        print("|---|---|---|---|")
        for r in range(rounds):
            col = collect(runner, inv.job_nodes(), "brctl-bench-rank", timeout=120)
            dumped = sum(1 for nc in col.nodes.values() for rd in nc.ranks if rd.stack)
            print(f"| {r + 1}{' (ships bundle)' if r == 0 else ''} | {n} | {dumped} | "
                  f"{col.seconds:.2f} s |")
        transport.close()


def bench_fail_slow(world: int, noise: float, rounds: int = 5) -> None:
    """``analyse`` over ``rounds`` rounds where ``noise`` of the ranks sit elsewhere each round.

    The synthetic hang (its PP group) is in every round; the noise lands on
    different random ranks each time, so the vote decides. CPU seconds, one run.
    """
    topo, base = synthetic(world)
    rng = random.Random(3)
    elsewhere = (Frame("save_checkpoint", "ckpt.py", 1),)
    rnds = []
    for _ in range(rounds):
        noisy = set(rng.sample(range(world), int(world * noise)))
        rnds.append(Round(tuple(
            RankSample(s.rank, s.node, s.pid, (s.stack or ())[:-1] + elsewhere)
            if s.rank in noisy else s for s in base.samples)))
    t0 = time.process_time()
    result = analyse(rnds, topo)
    cpu = time.process_time() - t0
    groups = "; ".join(f"{g.kind} {len(g.indices)} group(s), {len(g.members)} machines"
                       for g in result.suspects)
    print(f"| {world:,} | {rounds} | {noise:.0%} | {cpu:.2f} s | {groups} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1024,16384,131072")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=16, help="sshd machines (0: skip collection)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fail-slow", type=int, metavar="RANKS", default=0,
                    help="only the fail-slow vote: 5 rounds at 1%% and 5%% noise")
    ap.add_argument("--end-to-end", type=int, metavar="RANKS", default=0,
                    help="only one round from the probes' answers to the verdict")
    ap.add_argument("--recorder", type=int, metavar="K", default=0,
                    help="end to end: ranks also answer recorder summaries, K recent each")
    ap.add_argument("--raw-ranks", type=int, default=8192,
                    help="ranks for the raw (--save) form's controller CPU (0: skip)")
    args = ap.parse_args()
    if args.end_to_end:
        bench_end_to_end(args.end_to_end, args.raw_ranks, args.runs, args.recorder)
        return
    if args.fail_slow:
        print("| ranks | rounds | noise | analyse (CPU) | suspect |")
        print("|---|---|---|---|---|")
        for noise in (0.01, 0.05):
            bench_fail_slow(args.fail_slow, noise)
        return
    bench_analysis([int(x) for x in args.ranks.split(",")], args.runs)
    if args.nodes:
        bench_collection(args.nodes, args.rounds)


if __name__ == "__main__":
    main()
