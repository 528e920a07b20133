"""Run a lesson's script on N ranks with `torchrun`, as a subprocess of the notebook's kernel.

Why a subprocess and not `torch.multiprocessing.spawn` of a notebook function: spawn has
to pickle the function (a notebook's functions do not pickle), and `fork` from a kernel
that has used several threads deadlocks in OpenMP. `torchrun` is also exactly what a
learner will type on a real four-GPU machine, so the lesson's script runs unchanged there.

What the notebook gets on top of a bare `torchrun`:
* each rank's output live in the cell, prefixed with its rank (each rank writes its output
  to its own file; we follow the files, so lines never tear);
* the values each rank passed to `report()`, as Python data;
* on failure, the first failing rank's traceback instead of torchrun's summary of every
  SIGTERM it sent, and a hint at the likely cause (diagnose.py);
* no process left behind: not after a crash, a hang past `timeout`, an interrupt of the
  kernel, nor the kernel itself dying (see `_Launch.stop` and agent.py);
* `nnodes`: several torchrun agents on this machine, each standing in for one machine of a
  cluster, joined by torchrun's c10d rendezvous into one world, as on a real cluster;
* `max_restarts`: torchrun's elastic restarts. When a rank fails, torchrun (not this module)
  stops the group and starts it again, so failing fast waits until no restart is left.

Ranks, torchrun and this module talk only through the run folder (rundir.py).
"""
from __future__ import annotations

import codecs
import enum
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from . import agent, language
from .cards import Cards, detect
from .diagnose import Ending, LaunchError, diagnose
from .doctor import examine
from .language import _
from .lifecycle import (GRACE_SECONDS, POLL_SECONDS, FailFast, KernelPipe, free_ports, leftover_processes, marked_processes,
                        rank_pids, running_ranks, stop)
from .reporting import REPO_ROOT, shorten_paths
from .rundir import (CELL, DEVICE_ENV, DOCTOR, DOCTOR_ENV, ERROR, GLOO_INTERFACE_ENV, INIT_BARRIER_ENV, LABEL_ENV,
                     LAUNCHER_ENV, MPL_BACKEND_ENV, OWN_STORE_ENV, PYTHONPATH_ENV, RENAMED, RUN_DIR_ENV, STDERR, STDOUT,
                     THREADS_ENV, TORCHRUN_LOGS, UNBUFFERED_ENV, VISIBLE_GPUS_ENV, ReportReader, RunDir, rank_prefix)

__all__ = ["torchrun", "LaunchResult", "LaunchError", "leftover_processes", "rank_pids", "rank_environment"]



@dataclass
class LaunchResult:
    """What a successful launch gives back to the notebook (a failed one raises LaunchError)."""

    nproc: int
    cards: Cards
    seconds: float
    reports: dict[int, dict[str, Any]] = field(default_factory=dict)
    log: str = ""
    warnings: list[str] = field(default_factory=list)  # the DDP doctor's findings (doctor.py)

    def values(self, key: str) -> list[Any]:
        """`key` as reported by every rank, in rank order (rank 0 first)."""
        missing = [rank for rank in range(self.nproc) if key not in self.reports.get(rank, {})]
        if missing:
            raise KeyError(_("ranks {missing} did not report {key}; call report({name}=...) on every rank").format(
                missing=missing, key=repr(key), name=key))
        return [self.reports[rank][key] for rank in range(self.nproc)]

    def __repr__(self) -> str:
        ranks = sorted(self.reports)
        said = _("reports from ranks {ranks}").format(ranks=ranks) if ranks else _("no reports")
        return _("<LaunchResult: {nproc} ranks ok in {seconds} s, {said}>").format(
            nproc=self.nproc, seconds=f"{self.seconds:.1f}", said=said)


def _loopback_interface() -> str | None:
    names = {name for _, name in socket.if_nameindex()} if hasattr(socket, "if_nameindex") else set()
    return next((name for name in ("lo", "lo0") if name in names), None)


def rank_environment(cards: Cards, run_dir: Path, label: str, extra: Mapping[str, str] | None) -> dict[str, str]:
    """The environment every rank starts with."""
    cores = os.cpu_count() or 1
    env = dict(os.environ)
    env.update(
        {
            UNBUFFERED_ENV: "1",  # lines reach the notebook as they are printed
            THREADS_ENV: str(max(1, cores // cards.count)),  # share cores, do not fight
            DEVICE_ENV: cards.kind,  # every rank makes the kernel's choice of cards
            # and under its old name too, for a script of the learner's that still reads it (rundir.RENAMED)
            RENAMED[DEVICE_ENV]: cards.kind,
            MPL_BACKEND_ENV: "Agg",  # the kernel's inline backend does not exist in a rank
            RUN_DIR_ENV: str(run_dir),
            LAUNCHER_ENV: str(os.getpid()),  # lets leftover_processes() find what we started
            LABEL_ENV: label,
            PYTHONPATH_ENV: os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get(PYTHONPATH_ENV)])),
            # A script with a collective meets there anyway; one without (init, report, destroy) failed
            # so, now and then, on a busy machine (rundir.INIT_BARRIER_ENV).
            INIT_BARRIER_ENV: os.environ.get(INIT_BARRIER_ENV, "1"),
        }
    )
    loopback = _loopback_interface()
    if cards.kind == "cpu" and loopback and GLOO_INTERFACE_ENV not in os.environ:
        env[GLOO_INTERFACE_ENV] = loopback  # simulated cards talk over loopback only
    env.update(language.for_ranks())  # a rank speaks as the notebook does (language.py)
    env.update(extra or {})
    return env


class _RankStream:
    """Follows one rank's output file and hands out whole lines (or carriage-return updates)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.pending = ""

    def read(self, final: bool = False) -> list[str]:
        """New complete lines; with `final` (the rank has ended), also its unfinished last
        line, ended with a newline so that it is not glued to another rank's next line."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            data = b""
        self.offset += len(data)
        self.pending += self.decoder.decode(data, final=final)
        pieces = re.split(r"(?<=[\n\r])", self.pending)
        self.pending = pieces.pop()
        if final and self.pending:
            pieces.append(self.pending.rstrip("\r") + "\n")
            self.pending = ""
        return [piece for piece in pieces if piece.strip("\r\n") or piece.endswith("\n")]


def _script_file(script: str | Path, run_dir: Path) -> tuple[Path, str]:
    """A Path (or a str naming an existing .py file) runs as is; any other str is source code."""
    if isinstance(script, Path) or ("\n" not in script and script.endswith(".py") and Path(script).is_file()):
        path = Path(script)
        if not path.is_file():
            raise FileNotFoundError(_("script {path} not found (relative paths start at {folder}/)").format(
                path=path, folder=Path.cwd().name))
        return path, str(script)
    path = RunDir(run_dir).part(CELL)
    path.write_text(script, encoding="utf-8")
    return path, CELL


def _node_gpus(cards: Cards, node: int, per_node: int) -> dict[str, str]:
    """On GPUs, each local agent ("machine") sees its own GPUs, numbered from 0 as on a machine
    of its own; simulated cards need nothing."""
    if cards.kind != "cuda":
        return {}
    visible = os.environ.get(VISIBLE_GPUS_ENV)
    ids = visible.split(",") if visible else [str(i) for i in range(cards.count)]
    return {VISIBLE_GPUS_ENV: ",".join(ids[node * per_node:(node + 1) * per_node])}


class Over(enum.Enum):
    """How the wait for a launch ended."""
    FINISHED = "every agent exited"
    FAILED = "a rank or an agent failed, and the others had their time to end"
    TIMED_OUT = "the launch ran past its timeout"


class _Launch:
    """One launch: its run folder, its torchrun agents (one per node), the ranks' output, the
    means to stop them."""

    def __init__(self, cards: Cards, echo: bool, doctor: bool = True, nnodes: int = 1, max_restarts: int = 0) -> None:
        self.cards = cards
        self.nproc = cards.count  # the world: every rank of every node
        self.nnodes = nnodes
        self.max_restarts = max_restarts
        self.echo = echo
        self.doctor = doctor  # check a successful script for data-parallel mistakes (doctor.py)
        self.run = RunDir(tempfile.mkdtemp(prefix="fourcard-"))
        self.started = time.monotonic()
        self.commands: list[list[str]] = []  # one torchrun agent per node
        self.env: dict[str, str] = {}
        self.streams: dict[tuple[str, int], _RankStream] = {}
        self.lines: list[str] = []
        self.torchrun_output: list[str] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.readers: list[threading.Thread] = []
        self.pipe: KernelPipe | None = None  # closing our end stops the agents (lifecycle.py)

    def prepare(self, script: str | Path, args: Iterable[str], env: Mapping[str, str] | None,
                label: str | None) -> None:
        """The script file, the ranks' environment and each agent's torchrun command line.

        One node hosts the rendezvous store (the first agent; on a cluster, the node named in
        --rdzv-endpoint); the c10d rendezvous numbers the nodes (GROUP_RANK) in the sorted order of
        their (host address, agent pid), not in the order they join (dynamic_rendezvous.py)."""
        path, default_label = _script_file(script, self.run.path)
        restarts = {OWN_STORE_ENV: "1"} if self.max_restarts else {}
        self.env = rank_environment(self.cards, self.run.path, label or default_label,
                                    {DOCTOR_ENV: "1" if self.doctor else "0", **restarts, **(env or {})})
        per_node = self.nproc // self.nnodes
        # Several agents must all be told the rendezvous endpoint before any of them starts, so the host
        # cannot pick its own port (0) as a single agent does.
        endpoint = f"127.0.0.1:{free_ports(1)[0] if self.nnodes > 1 else 0}"
        run_id = uuid.uuid4().hex[:12]
        for node in range(self.nnodes):
            self.commands.append(agent.command(
                self.nnodes, per_node, endpoint, run_id, "fourcard_helpers.worker", [str(path), *map(str, args)],
                self.max_restarts, is_host=node == 0 if self.nnodes > 1 else None,
                log_dir=self.run.part(TORCHRUN_LOGS) / str(node)))
        if self.echo:
            cores = os.cpu_count() or 1
            sharing = (_("; OMP_NUM_THREADS={threads} per rank ({cores} CPU cores shared)").format(
                threads=self.env[THREADS_ENV], cores=cores) if self.cards.kind == "cpu" else "")
            nodes = (_(" ({nnodes} nodes × {per_node}, one torchrun agent each)").format(
                nnodes=self.nnodes, per_node=per_node) if self.nnodes > 1 else "")
            print(_("torchrun: {nproc} ranks{nodes} on {cards}{sharing}").format(
                nproc=self.nproc, nodes=nodes, cards=self.cards.describe(), sharing=sharing), flush=True)

    def start(self) -> None:
        """Start each torchrun agent (through agent.py) as the root of a tree (lifecycle.py): a
        process group of its own, stopped by the kernel's death."""
        self.pipe = KernelPipe()
        try:
            for node, command in enumerate(self.commands):
                proc = self.pipe.start(command, {**self.env, **_node_gpus(self.cards, node, self.nproc // self.nnodes)},
                                       subprocess.PIPE)
                self.procs.append(proc)
                reader = threading.Thread(target=self._read_torchrun, args=(proc, node), daemon=True)
                reader.start()
                self.readers.append(reader)
        finally:
            self.pipe.started()

    def _read_torchrun(self, proc: subprocess.Popen[bytes], node: int) -> None:
        """torchrun's own messages: kept for diagnosis, not shown (they are not the lesson)."""
        assert proc.stdout
        prefix = f"[node{node}] " if self.nnodes > 1 else ""
        for raw in proc.stdout:
            self.torchrun_output.append(prefix + raw.decode("utf-8", "replace"))

    def returncode(self) -> int | None:
        """The agents' exit status: the first non-zero one, 0 when all succeeded, None while one runs."""
        codes = [proc.poll() for proc in self.procs]
        return next((code for code in codes if code), None if None in codes else 0)

    def wait(self, timeout: float) -> Over:
        """Forward the ranks' output until the launch is over: FINISHED (every agent exited),
        FAILED (a rank raised, or an agent failed, and the partners had FAIL_FAST_SECONDS to
        end, since they may sit in a collective forever) or TIMED_OUT."""
        fail_fast = FailFast()
        while any(proc.poll() is None for proc in self.procs):
            self.pump()
            now = time.monotonic()
            if now - self.started > timeout:
                return Over.TIMED_OUT
            if fail_fast.expired(lambda: bool((self.run.ranks(ERROR) and not self.max_restarts) or self.returncode()), now):
                return Over.FAILED
            time.sleep(POLL_SECONDS)
        return Over.FINISHED

    def pump(self, final: bool = False) -> None:
        """Forward every new line of every rank to the notebook, with this machine's paths shortened
        (a stack a rank writes itself, such as faulthandler's, names the files it passes through)."""
        for kind, out in ((STDOUT, sys.stdout), (STDERR, sys.stderr)):
            for rank, path in self.run.ranks(kind).items():
                stream = self.streams.setdefault((kind, rank), _RankStream(path))
                for piece in stream.read(final):
                    line = rank_prefix(rank) + shorten_paths(piece)
                    self.lines.append(line)
                    if self.echo:
                        out.write(line)
                        out.flush()

    def stop(self) -> None:
        """Stop every agent and rank (lifecycle.py's sequence); ranks live in sessions of their own,
        found from their pid records, and, for a rank stopped before it wrote its record, from the
        launch's folder in its environment."""
        stop(self.procs, lambda: sorted(set(running_ranks(self.run).values())
                                        | set(marked_processes(RUN_DIR_ENV, str(self.run.path)))))
        for reader in self.readers:  # each ends at its agent's end of output, which the stop just brought
            reader.join(timeout=GRACE_SECONDS)

    def explain(self, how: Over, timeout: float) -> LaunchResult:
        """The result of a launch that is over, or the LaunchError that explains its failure."""
        __tracebackhide__ = True  # noqa: F841
        self.pump(final=True)
        log = "".join(self.lines)
        ending = Ending(self.returncode() if how is Over.FINISHED else None, "".join(self.torchrun_output),
                        timeout if how is Over.TIMED_OUT else None)
        error = diagnose(self.run, self.nproc, log, ending, simulated=self.cards.kind == "cpu")
        if error is not None:
            raise error
        reports = ReportReader(self.run)
        reports.take()
        seconds = time.monotonic() - self.started
        warnings = examine(self.run.read_json(DOCTOR), self.nproc) if self.doctor else []
        if self.echo:
            for warning in warnings:
                print(_("torchrun: doctor: {warning}").format(warning=warning), flush=True)
            print(_("torchrun: {nproc} ranks finished in {seconds} s").format(nproc=self.nproc, seconds=f"{seconds:.1f}"),
                  flush=True)
        return LaunchResult(self.nproc, self.cards, seconds, reports.values, log, warnings)

    def cleanup(self) -> None:
        if self.pipe is not None:
            self.pipe.close()  # if anything of the launch still runs, the agent stops it
        shutil.rmtree(self.run.path, ignore_errors=True)


def torchrun(script: str | Path, nproc: int = 4, args: Iterable[str] = (), timeout: float = 600,
             env: Mapping[str, str] | None = None, echo: bool = True, label: str | None = None,
             doctor: bool = True, nnodes: int = 1, max_restarts: int = 0) -> LaunchResult:
    """Run `script` on `nproc` ranks with torchrun and return what the ranks reported.

    `nnodes` > 1 starts that many torchrun agents on this machine, `nproc` ranks each, as
    `torchrun --nnodes=N --nproc-per-node=nproc` does on each machine of a cluster: one world
    of nnodes × nproc ranks, whose results and output are keyed by global rank.

    `max_restarts` > 0: when a rank fails, torchrun restarts every rank, up to that many times
    (`torchrun --max-restarts`); the script must resume from its own checkpoint. The output
    shows every attempt; a report made again by a later attempt replaces the earlier value.

    `script` is a path to a .py file, or the source of one. Each rank's output is printed
    live, prefixed with its rank. Raises LaunchError (naming the first failing rank, with
    its traceback) if a rank fails, or if the launch runs past `timeout` seconds. No rank
    outlives this call: not on success, failure, timeout or KeyboardInterrupt. After a launch
    that succeeded, the DDP doctor's warnings (doctor.py) are printed and kept in
    `LaunchResult.warnings`; `doctor=False` turns it off.
    """
    __tracebackhide__ = True  # noqa: F841 - IPython: show the learner's error, not ours
    if not timeout > 0:  # also refuses NaN
        raise LaunchError(_("timeout must be a positive number of seconds, not {timeout}: it is how long the ranks "
                            "may run before they are all stopped.").format(timeout=repr(timeout)))
    if nnodes < 1:
        raise LaunchError(_("nnodes must be at least 1, not {nnodes}: it is how many torchrun agents (machines of a "
                            "cluster) to start on this one.").format(nnodes=repr(nnodes)))
    launch = _Launch(detect(nproc * nnodes), echo, doctor, nnodes, max_restarts)
    try:
        launch.prepare(script, args, env, label)
        launch.start()
        try:
            how = launch.wait(timeout)
        finally:
            launch.stop()  # the one place a launch ends: finished, failed, timed out or interrupted
        return launch.explain(how, timeout)
    except KeyboardInterrupt:
        print(_("torchrun: interrupted; all {world} ranks stopped").format(world=nproc * nnodes), file=sys.stderr,
              flush=True)
        raise
    finally:
        launch.cleanup()
