"""The processes a chaos run starts and controls: ``runnode`` nodes, each with a wall clock the
nemesis can step.

- :class:`NodeProcess`  one incarnation of a node (a node id keeps its name across restarts, as a
                        host would; each incarnation writes its own log);
- :class:`NodeClock`    the offset of one node's wall clock, read by the clock shim
                        (``clockshim.c``, loaded with LD_PRELOAD) from a file mapped shared;
- :class:`LocalCluster` the nodes, with an environment of their own each (their links).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.redis_server import terminate

SHIM_SOURCE = Path(__file__).with_name("clockshim.c")
ERR_NO_COMPILER = "no C compiler (cc) to build the clock shim: clock jumps are not dealt"


def build_clock_shim(run_dir: Path) -> Path | None:
    """Compile the clock shim into ``run_dir``; None (with no clock faults) without a compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    target = run_dir / "clockshim.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(target), str(SHIM_SOURCE), "-ldl"],
        check=True,
        capture_output=True,
    )
    return target


class NodeClock:
    """One node's wall-clock offset (seconds), shared with its processes through a mapped file.
    Every incarnation of the node reads the same file: a node restarted during a jump keeps it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_bytes(struct.pack("<q", 0))
        self._file = open(path, "r+b")  # closed in close()
        self._map = mmap.mmap(self._file.fileno(), 8)
        self.offset_s = 0.0

    def step(self, offset_s: float) -> None:
        """Set the node's wall clock ``offset_s`` seconds off the machine's (0: back in step)."""
        self._map[:8] = struct.pack("<q", round(offset_s * 1e9))
        self.offset_s = offset_s

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.step(0.0)
            self._map.close()
            self._file.close()


@dataclass
class NodeProcess:
    node_id: str
    incarnation: int
    process: subprocess.Popen
    log_path: Path
    log_file: Any
    frozen: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None


class LocalCluster:
    """``runnode`` processes; ``env_for(node_id)`` gives each node its own environment (its
    database and Redis addresses are its own links). With a clock shim, every node runs under it
    with a :class:`NodeClock` of its own."""

    def __init__(
        self,
        *,
        root: Path,
        run_dir: Path,
        env_for: Callable[[str], dict[str, str]],
        args: Sequence[str],
        clock_shim: Path | None = None,
    ) -> None:
        self.root = root
        self.run_dir = run_dir
        self.env_for = env_for
        self.args = list(args)
        self.clock_shim = clock_shim
        self.nodes: dict[str, NodeProcess] = {}
        self.logs: dict[str, list[Path]] = {}
        self.clocks: dict[str, NodeClock] = {}
        self._incarnations: dict[str, int] = {}
        self._retired: list[NodeProcess] = []

    def clock(self, node_id: str) -> NodeClock | None:
        if self.clock_shim is None:
            return None
        if node_id not in self.clocks:
            self.clocks[node_id] = NodeClock(self.run_dir / f"{node_id}.clock")
        return self.clocks[node_id]

    def start(self, node_id: str) -> NodeProcess:
        incarnation = self._incarnations.get(node_id, -1) + 1
        self._incarnations[node_id] = incarnation
        log_path = self.run_dir / f"{node_id}.{incarnation}.log"
        log_file = open(log_path, "wb")  # closed in stop_all() / kill_all() / _retire()
        env = {**self.env_for(node_id), "SCHEDULER_NODE_ID": node_id}
        clock = self.clock(node_id)
        if clock is not None and self.clock_shim is not None:
            env["LD_PRELOAD"] = str(self.clock_shim)
            env["CLOCK_SHIM_FILE"] = str(clock.path)
        process = subprocess.Popen(
            [sys.executable, "manage.py", "runnode", "--node-id", node_id, *self.args],
            cwd=self.root,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        previous = self.nodes.get(node_id)
        if previous is not None:
            self._retire(previous)
        node = NodeProcess(node_id, incarnation, process, log_path, log_file)
        self.nodes[node_id] = node
        self.logs.setdefault(node_id, []).append(log_path)
        return node

    def _retire(self, node: NodeProcess) -> None:
        if node.alive():
            terminate(node.process)
        node.log_file.close()
        self._retired.append(node)

    def live(self) -> list[NodeProcess]:
        """Running and not frozen."""
        return [n for n in self.nodes.values() if n.alive() and not n.frozen]

    def signal(self, node: NodeProcess, signum: int) -> None:
        if node.alive():
            os.kill(node.pid, signum)
            if signum == signal.SIGSTOP:
                node.frozen = True
            elif signum == signal.SIGCONT:
                node.frozen = False

    def stop_all(self, timeout: float) -> list[str]:
        """Graceful: SIGCONT and SIGTERM to every node at once, wait, SIGKILL what is left.
        Returns the node ids that had to be killed."""
        for node in self.nodes.values():
            if node.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.pid, signal.SIGCONT)
                    node.frozen = False
                    os.kill(node.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        killed = []
        for node in self.nodes.values():
            try:
                node.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                killed.append(node.node_id)
                node.process.kill()
                node.process.wait(timeout=5)
        for node in [*self.nodes.values(), *self._retired]:
            with contextlib.suppress(Exception):
                node.log_file.close()
        return killed

    def kill_all(self) -> None:
        """Last resort (an exception, Ctrl-C): every process we started, by PID."""
        for node in [*self.nodes.values(), *self._retired]:
            if node.alive():
                terminate(node.process, timeout=5)
            with contextlib.suppress(Exception):
                node.log_file.close()
        for clock in self.clocks.values():
            clock.close()
