"""The stages of scripts/gpu-check: brctl's GPU paths on the real thing, each judged in one line.

``python scripts/gpu_check.py STAGE --dir DIR --gpus N`` runs one stage, writes its raw
outputs and ``stage.json`` ({name, verdict, line, figures}) into DIR and prints the
line; ``summary`` folds the stage folders into ``summary.json``. The bash script
chooses the interpreter, sets the time limits and runs the stages in order.

Everything goes through brctl's stable entry points: the CLI (``python -m brctl``) and
the node-side probe modules run as programs (``python -m brctl.diagnostics.X``), as
brctl runs them on a node. Verdicts: ``pass`` (brctl read the real thing and
answered right), ``fail`` (it did not: the line says what), ``skip`` (does not apply
here: the line says why).

Test-only (never set on a real machine): ``GPU_CHECK_TEST_GPUS`` makes the stages
run their CPU stand-ins (gloo instead of NCCL, ``device: cpu``) for that many
"GPUs", and ``GPU_CHECK_TEST_PYTHONPATH`` goes in front of the probes' PYTHONPATH
(the suite's fake pynvml, scripted by ``$FAKE_NVML``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NODE = "gpucheck"  # the one machine of the generated inventories: this one
STAGES = {"1": "health", "2": "replay", "3": "collective", "4": "stacks", "5": "dcgm",
          "6": "gpu-tests"}
# The probe fields each GPU check of brctl health reads (shown beside its verdict).
RAW_FIELDS = {
    "gpu_count": ("name", "pci", "uuid"),
    "ecc": ("ecc_volatile_uncorrected", "ecc_aggregate_uncorrected"),
    "retired_pages": ("retired_pages_pending", "retired_pages_dbe"),
    "remapped_rows": ("remapped_rows",),
    "temperature": ("temperature", "temperature_slowdown", "temperature_shutdown"),
    "throttle": ("throttle_reasons",),
    "power": ("power_mw", "power_limit_mw"),
    "nvlink": ("nvlink",),
    "pcie": ("pcie_replay",),
    "recovery_action": ("recovery_action",),
}
# The checks whose NVML error the probe keeps (under the check's own name) when a call fails.
NVML_ERRORS = frozenset(("ecc", "retired_pages", "remapped_rows", "temperature", "throttle",
                         "power", "pcie"))


@dataclass(frozen=True)
class Stage:
    """Where a stage writes and what this machine is (or stands in for)."""

    dir: Path
    gpus: int
    standin: bool  # CPU stand-ins for CUDA/NCCL (tests only)
    scale: float  # $BRCTL_TIMEOUT_SCALE

    @property
    def device(self) -> str:
        return "cpu" if self.standin else "cuda"

    @property
    def backend(self) -> str:
        return "gloo" if self.standin else "nccl"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of everything a stage runs: brctl importable, its state here."""
        path = [os.environ.get("GPU_CHECK_TEST_PYTHONPATH", ""), str(ROOT),
                os.environ.get("PYTHONPATH", "")]
        return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p),
                "BRCTL_STATE": str(self.dir / "state"), "PYTHONUNBUFFERED": "1", **extra}

    def write(self, name: str, text: str) -> Path:
        path = self.dir / name
        path.write_text(text)
        return path

    def run(self, name: str, argv: list[str], *, stdin: str | None = None,
            timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv``; keep its stdout/stderr as NAME.out/.err and the command in commands.txt."""
        with open(self.dir / "commands.txt", "a") as fh:
            fh.write(" ".join(argv) + "\n")
        proc = spawn(argv, env or self.env(),
                     stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(stdin, timeout=timeout * self.scale)
        finally:
            stop(proc)
        self.write(f"{name}.out", out)
        self.write(f"{name}.err", err)
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def brctl(self, name: str, *args: str, timeout: float = 120) -> tuple[int, dict[str, Any]]:
        """``brctl --json ARGS``: its exit code and JSON document ({} when it printed none)."""
        proc = self.run(name, [sys.executable, "-m", "brctl", "--json", *args], timeout=timeout)
        return proc.returncode, _json(proc.stdout) or {}

    def probe(self, name: str, module: str, request: dict[str, Any], *,
              timeout: float = 120, env: dict[str, str] | None = None) -> dict[str, Any]:
        """Run a node-side probe as brctl does on a node: request on stdin, one JSON document."""
        proc = self.run(name, [sys.executable, "-m", f"brctl.diagnostics.{module}"],
                        stdin=json.dumps(request), timeout=timeout, env=env)
        return _json(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "") or {
            "probe_error": f"exit {proc.returncode}: {_tail(proc.stderr)}"}

    def inventory(self, gpus: int, **sections: Any) -> Path:
        """A one-machine ``connection: local`` inventory (JSON is YAML)."""
        node_env = {"PYTHONPATH": self.env()["PYTHONPATH"]}
        if "FAKE_NVML" in os.environ:
            node_env["FAKE_NVML"] = os.environ["FAKE_NVML"]
        inv = {"nodes": [{"name": NODE, "connection": "local", "gpus": gpus,
                          "python": sys.executable, "env": node_env}], **sections}
        return self.write("inventory.yaml", json.dumps(inv, indent=2) + "\n")


def spawn(argv: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.Popen[str]:
    """Start ``argv`` in its own session, so ``stop`` ends it with everything it started."""
    return subprocess.Popen(argv, cwd=ROOT, env=env, text=True, start_new_session=True, **kwargs)


def stop(proc: subprocess.Popen[str]) -> None:
    """Kill ``proc``'s session (torch workers, spawned ranks) unless it ended on its own."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _json(text: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _tail(text: str) -> str:
    return (text.strip().splitlines() or ["no output"])[-1][:300]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


Result = tuple[str, str, dict[str, Any]]  # verdict, line, figures


# ---------------------------------------------------------------- 1: brctl health, real NVML


def _probe_cost(st: Stage, runs: int = 3) -> tuple[dict[str, Any], float, float]:
    """The health probe as brctl runs it (all checks, root /): its document, median CPU and wall."""
    cpus, walls, doc = [], [], {}
    for i in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        doc = st.probe(f"probe-{i + 1}", "health_probe", {})
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return doc, statistics.median(cpus), statistics.median(walls)


def stage_health(st: Stage) -> Result:
    from brctl.analysis.health.checks import GPU_CHECKS

    code, doc = st.brctl("health", "-i", str(st.inventory(st.gpus)), "health")
    raw, cpu, wall = _probe_cost(st)
    nvml = raw.get("nvml") or {}
    st.write("nvml-raw.json", json.dumps(nvml, indent=2) + "\n")
    figures: dict[str, Any] = {"probe_cpu_seconds": round(cpu, 3),
                               "probe_wall_seconds": round(wall, 3),
                               "driver": nvml.get("driver"), "brctl_exit": code}
    if code not in (0, 1, 3) or NODE not in doc.get("nodes", {}):
        why = _tail((st.dir / "health.err").read_text())
        return "fail", f"brctl health exited {code}: {why}", figures
    checks = {c["name"]: c for c in doc["nodes"][NODE]["checks"]}
    gpus = [g for g in nvml.get("gpus") or [] if isinstance(g, dict)]
    table = {}
    for name in GPU_CHECKS:
        c = checks.get(name, {"status": "missing", "message": "not in brctl's answer"})
        table[name] = {"status": c["status"], "message": c["message"],
                       "raw": {f"gpu{g.get('index')}": _raw(name, g) for g in gpus}}
    figures["gpu_checks"] = table
    st.write("gpu-checks.json", json.dumps(table, indent=2) + "\n")
    counts = {s: sum(1 for c in table.values() if c["status"] == s) for s in ("ok", "warn", "fail")}
    cost = f"probe {cpu:.3f} s CPU, {wall:.3f} s wall"
    if nvml.get("status") != "ok":
        return "fail", f"NVML not usable: {nvml.get('reason')} ({cost})", figures
    unsupported = [n for n, c in table.items() if _not_supported(n, c["status"], gpus)]
    unread = [f"{n} ({c['status']}: {c['message']})" for n, c in table.items()
              if c["status"] not in counts and n not in unsupported]
    absent = f"; {len(unsupported)} not supported by the GPU: {', '.join(unsupported)}" if unsupported else ""
    if unread:
        return "fail", f"{len(unread)} GPU checks without a reading: {'; '.join(unread)}{absent}", figures
    found = [f"{n}: {c['message']}" for n, c in table.items() if c["status"] in ("warn", "fail")]
    return "pass", (f"{len(table)} GPU checks on {len(gpus)} GPU(s), driver {nvml.get('driver')}: "
                    f"{counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail"
                    f"{' (' + '; '.join(found) + ')' if found else ''}{absent}; {cost}"), figures


def _raw(name: str, gpu: dict[str, Any]) -> dict[str, Any]:
    """The probe's readings behind check ``name`` on one GPU, and NVML's error if it gave one."""
    out = {key: gpu.get(key) for key in RAW_FIELDS.get(name, ())}
    error = (gpu.get("errors") or {}).get(name) if name in NVML_ERRORS else None
    if error:
        out["nvml_error"] = error
    return out


def _not_supported(name: str, status: str, gpus: list[dict[str, Any]]) -> bool:
    """A skip that is the GPU's own answer (NVML: Not Supported, e.g. page retirement on Hopper).

    Any other skip or unknown means brctl could not look: the stage fails on it.
    """
    if status != "skip" or not gpus:
        return False
    if name == "nvlink":  # the probe keeps no error here: no link answered at all
        return all(g.get("nvlink") is None for g in gpus)
    return name in NVML_ERRORS and all(_raw(name, g).get("nvml_error") == "Not Supported" for g in gpus)


# ---------------------------------------------------------------- 2: replay workload twice


def stage_replay(st: Stage) -> Result:
    nproc = 1 if st.gpus == 1 else 2
    tp = nproc  # one GPU: nproc 1; more: TP=2, so the tensor-parallel all-reduces run too
    request = {"nnodes": 1, "node_rank": 0, "nproc_per_node": nproc, "master_addr": "127.0.0.1",
               "ranks": [[r, 0, 0, 0] for r in range(tp)], "steps": 8, "device": st.device,
               "timeout": 60 * st.scale}
    runs = [st.probe(f"replay-{i}", "replay_workload", {**request, "master_port": _free_port()})
            for i in (1, 2)]
    errors = [r["probe_error"] for r in runs if "probe_error" in r]
    if errors:
        return "fail", f"replay workload failed: {errors[0][:300]}", {}
    per_step = [s for r in runs for s in (r.get("step_seconds") or [])[1:]]  # step 1 warms up
    figures = {"nproc": nproc, "tp": tp, "backend": runs[0].get("backend"),
               "run_seconds": [r.get("seconds") for r in runs], "steps": runs[0].get("steps"),
               "step_seconds_median": round(statistics.median(per_step), 6) if per_step else None}
    where = f"nproc {nproc}, TP={tp}, {runs[0].get('backend')}"
    if runs[0].get("backend") != st.backend:
        return "fail", f"ran on {runs[0].get('backend')}, not {st.backend} ({where})", figures
    first, second = runs[0].get("steps"), runs[1].get("steps")
    if not first or first != second or any(s in ("nan", "inf") for s in first):
        return "fail", f"fingerprints differ or are not finite: {first} vs {second} ({where})", figures
    step = figures["step_seconds_median"]
    return "pass", (f"{len(first)} steps bitwise equal in two runs ({where}); "
                    f"{step * 1000:.2f} ms a step (median), runs {runs[0].get('seconds')} s and "
                    f"{runs[1].get('seconds')} s with start-up"
                    if step is not None else "no step_seconds in the answer"), figures


# ---------------------------------------------------------------- 3: collective probe


def _allgather(st: Stage, size: int, iterations: int) -> dict[str, Any]:
    """All-gather over every local GPU: one probe per GPU, as one per machine across machines."""
    base = {"op": "allgather", "nnodes": st.gpus, "master_addr": "127.0.0.1",
            "master_port": _free_port(), "bytes": size, "iterations": iterations,
            "timeout": 60 * st.scale, "startup_timeout": 120 * st.scale}
    if st.standin:
        base["gloo_ifname"] = "lo"
    argv = [sys.executable, "-m", "brctl.diagnostics.collective"]
    procs = []
    for rank in range(st.gpus):  # each rank sees only its own GPU, as device 0
        env = st.env() if st.standin else st.env(CUDA_VISIBLE_DEVICES=str(rank))
        with open(st.dir / f"allgather-rank{rank}.out", "w") as out:
            proc = spawn(argv, env, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT)
        procs.append(proc)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps({**base, "node_rank": rank}))
        proc.stdin.close()
    try:
        for proc in procs:
            proc.wait(timeout=200 * st.scale)
    finally:
        for proc in procs:
            stop(proc)
    docs = []
    for rank in range(st.gpus):
        text = (st.dir / f"allgather-rank{rank}.out").read_text()
        line = next((ln for ln in reversed(text.splitlines()) if ln.startswith("{")), "")
        docs.append(_json(line) or {"status": "error", "errors": [_tail(text)]})
    worst = next((d for d in docs if d.get("status") != "pass"), docs[0])
    busbw = [float(d["busbw_gbps"]) for d in docs if d.get("busbw_gbps") is not None]
    return {**worst, "busbw_gbps": min(busbw) if busbw else None, "world": st.gpus}


def stage_collective(st: Stage) -> Result:
    size, iterations = (1 << 20, 3) if st.standin else (64 << 20, 20)
    a2a = st.probe("alltoall", "collective", {
        "op": "alltoall", "world": st.gpus, "bytes": size, "iterations": iterations,
        "timeout": 60 * st.scale, "startup_timeout": 120 * st.scale})
    ag = _allgather(st, size, iterations)
    st.write("allgather.json", json.dumps(ag, indent=2) + "\n")
    figures = {"bytes": size, "iterations": iterations, "world": st.gpus,
               "alltoall_busbw_gbps": a2a.get("busbw_gbps"), "allgather_busbw_gbps": ag.get("busbw_gbps")}
    one = " (one rank: the NCCL path without a peer, a loopback copy)" if st.gpus == 1 else ""
    for op, doc in (("all-to-all", a2a), ("all-gather", ag)):
        if doc.get("status") != "pass" or doc.get("backend") != st.backend:
            why = doc.get("probe_error") or doc.get("skipped") or "; ".join(
                (doc.get("errors") or []) + (doc.get("mismatches") or [])) or doc.get("status")
            return "fail", f"{op} on {doc.get('backend')}: {doc.get('status')}: {why}"[:400], figures
    return "pass", (f"all-to-all {a2a['busbw_gbps']:.3g} GB/s, all-gather {ag['busbw_gbps']:.3g} GB/s "
                    f"bus bandwidth, {st.backend}, {st.gpus} rank(s), {size >> 20} MiB a peer, "
                    f"data verified{one}"), figures


# ---------------------------------------------------------------- 4: brctl stacks, one hung rank


def _wait_ready(ready: Path, world: int, procs: list[subprocess.Popen[str]], limit: float) -> str | None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if all((ready / f"rank-{r}").exists() for r in range(world)):
            return None
        dead = [(rank, p.returncode) for rank, p in enumerate(procs) if p.poll() is not None]
        if dead:
            return f"rank {dead[0][0]} exited with code {dead[0][1]}"
        time.sleep(0.2)
    return f"not every rank was ready within {limit:.0f} s"


def _native_dumps(st: Stage, saved: Path, native: Path) -> list[str]:
    """Copy a --save folder, re-dumping each live rank with ``py-spy dump --native``."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    shutil.copytree(saved, native)
    errors = []
    for dump in sorted(native.rglob("*-*.json")):
        pid = dump.stem.split("-")[-1]
        proc = subprocess.run([py_spy, "dump", "--native", "--json", "--pid", pid],
                              capture_output=True, text=True, timeout=60 * st.scale)
        if proc.returncode == 0:
            dump.write_text(proc.stdout)
        else:
            errors.append(f"pid {pid}: {_tail(proc.stderr or proc.stdout)}")
    return errors


def _outlier_ranks(doc: dict[str, Any]) -> list[int]:
    return sorted(int(o["rank"]) for o in doc.get("outliers") or [] if o.get("rank") is not None)


def stage_stacks(st: Stage) -> Result:
    # Five ranks at least: a majority to stand out from even when one healthy rank is caught
    # mid-step rather than where its peers wait (with three, CI once saw one in opt.step():
    # no two ranks agreed and the hung one was no outlier).
    world = max(st.gpus, 5)
    hung = world // 2
    ready = st.dir / "ready"
    ready.mkdir()
    tag = uuid.uuid4().hex[:12]
    argv = [sys.executable, str(ROOT / "scripts" / "gpu_check_train.py"), "--device", st.device,
            "--gpus", str(max(st.gpus, 1)), "--hang-rank", str(hung), "--ready", str(ready),
            "--tag", tag]
    procs = []
    for rank in range(world):
        with open(st.dir / f"train-rank{rank}.log", "w") as log:
            procs.append(spawn(argv, st.env(RANK=str(rank), LOCAL_RANK=str(rank),
                                            WORLD_SIZE=str(world), OMP_NUM_THREADS="1"),
                               stdout=log, stderr=subprocess.STDOUT))
    shared = "" if st.gpus >= world or st.standin else f", {world} ranks sharing {st.gpus} GPU(s)"
    figures: dict[str, Any] = {"world": world, "hung_rank": hung}
    try:
        late = _wait_ready(ready, world, procs, 120 * st.scale)
        if late:
            return "fail", f"training loop did not start: {late} (see train-rank*.log)", figures
        inv = st.inventory(world, job={"nodes": NODE, "tp": 1, "pp": 1,
                                       "process_match": f"gpu_check_train\\.py .*--tag {tag}"})
        saved, native = st.dir / "dumps", st.dir / "dumps-native"
        code, doc = st.brctl("stacks", "-i", str(inv), "stacks", "--rounds", "1", "--save", str(saved))
        errors = sorted(p.read_text().strip() for p in saved.rglob("*.error"))
        if errors:
            return "skip", f"py-spy could not dump the ranks: {errors[0][:300]}", figures
        named = _outlier_ranks(doc)
        figures.update(brctl_exit=code, outliers=named, evict=doc.get("evict"))
        refused = _native_dumps(st, saved, native)
        if refused:
            return "skip", f"python stacks ok, py-spy --native refused: {refused[0]}", figures
        ncode, ndoc = st.brctl("stacks-native", "stacks", "--from", str(native))
        figures.update(native_outliers=_outlier_ranks(ndoc), native_exit=ncode)
    finally:
        for proc in procs:
            stop(proc)
    if hung not in named:
        return "fail", f"hung rank {hung} not named: outliers {named}, exit {code}{shared}", figures
    if hung not in figures["native_outliers"]:
        return "fail", (f"with py-spy --native frames the hung rank {hung} is not named: outliers "
                        f"{figures['native_outliers']}, exit {ncode}"), figures
    extra = [r for r in named if r != hung]
    return "pass", (f"hung rank {hung} of {world} named (evict {doc.get('evict')}), also with "
                    f"native frames{shared}" + (f"; also flagged: ranks {extra}" if extra else "")), figures


# ---------------------------------------------------------------- 5: dcgmi diag


def stage_dcgm(st: Stage) -> Result:
    from brctl.analysis.diagnose.stages import parse_dcgm

    if shutil.which("dcgmi") is None:
        return "skip", "DCGM not installed (no dcgmi on PATH)", {}
    doc = st.probe("dcgm", "dcgm", {"level": "1", "timeout": 120 * st.scale}, timeout=150)
    if doc.get("stdout"):
        st.write("dcgmi-diag.json", doc["stdout"])
    if "probe_error" in doc:
        return "fail", f"dcgm probe failed: {doc['probe_error']}", {}
    verdict = parse_dcgm(NODE, doc)
    figures = {"status": verdict.status, "evidence": list(verdict.evidence),
               "details": dict(verdict.details)}
    said = f"{verdict.status}{': ' + '; '.join(verdict.evidence[:3]) if verdict.evidence else ''}"
    if verdict.status == "error":
        return "fail", f"dcgmi diag -r 1 not read: {said}"[:400], figures
    return "pass", f"dcgmi diag -r 1 read in {doc.get('seconds', 0):.0f} s: DCGM says {said}"[:400], figures


# ---------------------------------------------------------------- 6: tests/gpu


def stage_gpu_tests(st: Stage) -> Result:
    junit = st.dir / "junit.xml"
    proc = st.run("pytest", [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                             f"--junitxml={junit}", "tests/gpu"], timeout=170,
                  env=st.env(BRCTL_TEST_GPU="1"))
    if not junit.exists():
        return "fail", f"pytest exited {proc.returncode}: {_tail(proc.stdout + proc.stderr)}", {}
    top = ET.parse(junit).getroot()
    suite = top.find("testsuite") if top.tag == "testsuites" else top
    if suite is None:
        return "fail", f"no test suite in {junit.name}", {}
    n = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    figures = {**n, "passed": passed, "seconds": float(suite.get("time", "0"))}
    line = (f"{passed} passed, {n['skipped']} skipped, {n['failures'] + n['errors']} failed "
            f"in {figures['seconds']:.0f} s")
    if n["failures"] or n["errors"] or proc.returncode not in (0, 5):
        return "fail", f"{line}: {_tail(proc.stdout)}", figures
    if not passed:
        reasons = sorted(set(re.findall(r"SKIPPED \[\d+\] [^:]+:\d+: (.*)", proc.stdout)))
        return "skip", f"{line}: {'; '.join(reasons) or 'nothing ran'}", figures
    return "pass", line, figures


# ---------------------------------------------------------------- machine and summary


def machine(out: Path) -> dict[str, Any]:
    """What this machine is: the figures' context (python, torch, CUDA, NCCL, GPUs, driver)."""
    info: dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable,
                            "kernel": platform.release(), "host": platform.node()}
    try:
        import torch

        info.update(torch=torch.__version__, cuda=torch.version.cuda,
                    cuda_available=torch.cuda.is_available(), cuda_devices=torch.cuda.device_count())
        if torch.cuda.is_available():
            nccl = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
            info["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception as exc:  # recorded: stages 2-4 and 6 will say more
        info["torch_error"] = f"{type(exc).__name__}: {exc}"
    if shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,pci.bus_id",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        info["gpus"] = [dict(zip(("name", "driver", "memory", "pci"), (f.strip() for f in ln.split(","))))
                        for ln in q.stdout.splitlines() if ln.strip()]
    scope = Path("/proc/sys/kernel/yama/ptrace_scope")  # py-spy needs ptrace (stage 4)
    info["ptrace_scope"] = scope.read_text().strip() if scope.exists() else None
    (out / "machine.json").write_text(json.dumps(info, indent=2) + "\n")
    gpu = (info.get("gpus") or [{}])[0]
    print(f"machine: {info['host']}, {len(info.get('gpus') or [])} x {gpu.get('name', '?')}, driver "
          f"{gpu.get('driver', '?')}, torch {info.get('torch', '?')} (CUDA {info.get('cuda')}, NCCL "
          f"{info.get('nccl')}), python {info['python']}")
    return info


def summary(out: Path, work: Path, stages: list[str], limits: dict[str, str], seconds: float) -> int:
    """Fold the stage folders into summary.json; exit 1 when a stage failed."""
    doc: dict[str, Any] = {"schema": "brctl.gpu-check/1",
                           "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           "machine": _json((work / "machine.json").read_text()) if (
                               work / "machine.json").exists() else None,
                           "seconds": round(seconds, 1), "stages": {}}
    for n in stages:
        d = work / f"{n}-{STAGES[n]}"
        got = _json((d / "stage.json").read_text()) if (d / "stage.json").exists() else None
        if got is None:
            rc = (d / "rc").read_text().strip() if (d / "rc").exists() else "?"
            err = (d / "helper.err").read_text() if (d / "helper.err").exists() else ""
            why = (f"timed out after {limits.get(n)} s" if rc in ("124", "137") else
                   f"stage helper exited {rc}: {_tail(err)}")
            got = {"name": STAGES[n], "verdict": "fail", "line": why, "figures": {}}
            (d / "stage.json").write_text(json.dumps(got, indent=2) + "\n")
        doc["stages"][n] = got
    verdicts = [s["verdict"] for s in doc["stages"].values()]
    doc["status"] = "fail" if "fail" in verdicts else "pass"
    (out / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in ("pass", "skip", "fail"))
    print(f"gpu-check: {counts} in {seconds:.0f} s; summary: {out / 'summary.json'}")
    return 1 if "fail" in verdicts else 0


RUNNERS = {"health": stage_health, "replay": stage_replay, "collective": stage_collective,
           "stacks": stage_stacks, "dcgm": stage_dcgm, "gpu-tests": stage_gpu_tests}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check.py")
    parser.add_argument("what", choices=[*RUNNERS, "machine", "summary"])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--stages", default="")
    parser.add_argument("--limits", default="")
    parser.add_argument("--seconds", type=float, default=0.0)
    args = parser.parse_args(argv)
    if args.what == "machine":
        machine(args.dir)
        return 0
    if args.what == "summary":
        limits = dict(item.split("=", 1) for item in args.limits.split() if "=" in item)
        return summary(args.out, args.dir, args.stages.split(), limits, args.seconds)
    # scripts/gpu-check's time limit sends SIGTERM: unwind, so every started session is killed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    st = Stage(args.dir, args.gpus, standin="GPU_CHECK_TEST_GPUS" in os.environ,
               scale=float(os.environ.get("BRCTL_TIMEOUT_SCALE") or 1))
    start = time.monotonic()
    try:
        verdict, line, figures = RUNNERS[args.what](st)
    except subprocess.TimeoutExpired as exc:
        what = " ".join(map(str, exc.cmd))[:120]
        verdict, line, figures = "fail", f"{what} timed out after {exc.timeout:.0f} s", {}
    doc = {"name": args.what, "verdict": verdict, "line": line, "figures": figures,
           "seconds": round(time.monotonic() - start, 2)}
    st.write("stage.json", json.dumps(doc, indent=2) + "\n")
    print(f"{verdict}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
