"""Where a workload's CPU went: the CPU time each process of the run used between two instants
(from /proc, Linux only), and the time the hypervisor gave to others (steal). A rate of runs per
second follows the CPU the host grants; CPU per run, by component, is what the code controls."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (every thread), or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    # After the command: state is field 3, utime 14 and stime 15 (1-based, proc(5)).
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def machine_ticks() -> tuple[int, int]:
    """(all CPU ticks, steal ticks) of the machine so far (/proc/stat's first line)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    steal = values[7] if len(values) > 7 else 0
    return sum(values[:8]), steal


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (a worker's pool of children), as found now."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def local_pids(name: str) -> list[int]:
    """PIDs of a server program running on this machine (a database on loopback), if any."""
    try:
        found = subprocess.run(["pidof", name], capture_output=True, text=True, timeout=5)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return []
    return [int(pid) for pid in found.stdout.split()]


@dataclass
class CpuMeter:
    """CPU seconds per named group of processes between ``start`` and ``stop``."""

    groups: dict[str, list[int]]
    _start: dict[str, float] = field(default_factory=dict)
    _ticks: tuple[int, int] = (0, 0)
    used_s: dict[str, float] = field(default_factory=dict)
    steal_share: float = 0.0

    def _read(self) -> dict[str, float]:
        return {
            name: sum(cpu for pid in pids if (cpu := process_cpu_s(pid)) is not None)
            for name, pids in self.groups.items()
        }

    def start(self) -> None:
        self._start = self._read()
        self._ticks = machine_ticks()

    def stop(self) -> None:
        end = self._read()
        self.used_s = {name: end[name] - self._start.get(name, 0.0) for name in end}
        total, steal = machine_ticks()
        elapsed = total - self._ticks[0]
        self.steal_share = (steal - self._ticks[1]) / elapsed if elapsed else 0.0

    def per_run_us(self, runs: int) -> dict[str, float]:
        """CPU microseconds per run by group, and their sum (``total``)."""
        if not runs:
            return {}
        out = {name: used / runs * 1e6 for name, used in self.used_s.items()}
        out["total"] = sum(self.used_s.values()) / runs * 1e6
        return out


SPEED_PROBE_STEPS = 200_000


def _probe_work(steps: int) -> int:
    """A fixed mix of what a node's Python does (integer arithmetic, dict and list work, string
    formatting): the same instructions on every machine and every run."""
    table: dict[int, str] = {}
    total = 0
    for step in range(steps):
        key = step % 1024
        table[key] = f"run-{step}"
        total += len(table[key]) + (step * 7) % 13
    return total


def speed_probe_ms(*, steps: int = SPEED_PROBE_STEPS, rounds: int = 5) -> float:
    """The CPU milliseconds the fixed ``_probe_work`` takes here, the fastest of ``rounds``: how
    fast this host's cores are at the moment (lower is faster). CPU time, not wall time: it does
    not count time spent waiting for a core (a busy machine), only how much work a core does per
    second it gives — which is what changes a run's CPU cost between a host's faster and slower
    hours. Two benchmark runs' rates compare only at a similar figure."""
    best = float("inf")
    for _ in range(rounds):
        began = time.process_time()
        _probe_work(steps)
        best = min(best, time.process_time() - began)
    return best * 1000
