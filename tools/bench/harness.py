"""Pieces the benchmarks that measure a source's sysbench throughput share: where the processes run
(`cores`, `pin`, `on`: the source and sysbench on one core, the rest on the others), when the
servers are idle (`settle`, `cpu_seconds`), what the machine and the clients spent (`busy`,
`children_cpu`), a `setl start` following the binlog in the background (`following`), and setl's
sources byte-compiled before the first start (`byte_compile`).
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def cores(split: bool, source: Any, target: Any, *others: int,
          source_cpu: int | None = None) -> Iterator[tuple[set[int], set[int]]]:
    """The CPUs of the source's side (its server, sysbench) and of the copy's (setl, the dump or
    verify, the target's server, the processes `others`): all of them for both, or (`split`) CPU
    `source_cpu` (the first this process may use when None) for the source and the others for the
    copy, the servers' threads and `others` pinned so until the block ends."""
    every = set(os.sched_getaffinity(0))
    if not split:
        yield every, every
        return
    if len(every) < 2:
        raise SystemExit("--source-core needs at least 2 CPUs")
    if source_cpu is not None and source_cpu not in every:
        raise SystemExit(f"--source-core {source_cpu}: not one of this process's CPUs {sorted(every)}")
    first = {min(every) if source_cpu is None else source_cpu}
    rest = every - first
    pin(source.pid, first)
    for pid in (target.pid, *others):
        pin(pid, rest)
    try:
        yield first, rest
    finally:
        for pid in (source.pid, target.pid, *others):
            pin(pid, every)


def byte_compile(*trees: Path) -> None:
    """Byte-compile the ``setl`` package of each checkout in `trees` into its ``__pycache__``, as
    ``pip install`` does for an installed package: a start then loads setl's modules instead of
    compiling each one again. Python writes them at the first import anyway, unless the environment
    says ``PYTHONDONTWRITEBYTECODE`` (as this machine's does): then every `setl start` of a bench would
    pay about 0.2 CPU s that an installed setl does not."""
    for tree in trees:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(tree) / "setl")], check=True,
                       stdout=subprocess.DEVNULL)
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print(f"byte-compiled setl in {', '.join(map(str, trees))} (PYTHONDONTWRITEBYTECODE is set here)", flush=True)


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process `pid` on `cpus` (the threads it starts later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


@contextlib.contextmanager
def on(cpus: set[int]) -> Iterator[None]:
    """Children and threads started in the block run on `cpus` (they inherit the affinity of the
    thread that starts them)."""
    every = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, every)


def cpu_seconds(*servers: Any) -> list[float]:
    """CPU seconds (user + system) each server process has used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    found = []
    for server in servers:
        fields = Path(f"/proc/{server.pid}/stat").read_text().rsplit(")", 1)[1].split()
        found.append((int(fields[11]) + int(fields[12])) / tick)
    return found


def busy(cpus: set[int]) -> float:
    """CPU seconds the machine has spent busy (not idle, not waiting for I/O) on `cpus` so far,
    whoever ran there: with the source on a core of its own, whether that core was full."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu" and int(name[3:]) in cpus:
            values = [int(v) for v in fields[:8]]
            total += sum(values) - values[3] - values[4]  # idle, iowait
    return total / tick


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's children that have ended and were waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def settle(*servers: Any, idle: float = 0.05, timeout: float = 60.0) -> None:
    """Wait (at most `timeout` seconds) until each server spends under `idle` of a core: what a
    copy, a check or a DROP DATABASE left behind (purge, page flushing, a pipeline catching up)
    must not count against the next sysbench run."""
    deadline = time.monotonic() + timeout
    before = cpu_seconds(*servers)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = cpu_seconds(*servers)
        if all(b - a < idle for a, b in zip(before, now)):
            return
        before = now


@contextlib.contextmanager
def following(conf: Path, name: str) -> Iterator[subprocess.Popen[bytes]]:
    """`setl start` of pipeline `name` (following the binlog) for the block, then stopped as an
    operator does (SIGTERM: it drains and exits); its output goes to ``NAME.log`` beside `conf`."""
    log = conf.parent / f"{name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "setl.cli", "--conf", str(conf), "start", "--pipeline", name],
                                stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise SystemExit(f"setl did not stop within 120 s of SIGTERM:\n{log.read_text()[-3000:]}") from None
    if proc.returncode not in (0, -15):
        raise SystemExit(f"setl start failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
