"""A warm session, on the notebook's side: N ranks started once by `torchrun`, then driven cell by cell.

    %ranks start -n 4          # torchrun starts 4 ranks; each forms the process group once
    %%ranks                    # this cell runs on every rank, in milliseconds
    x = torch.tensor([rank + 1.0]); dist.all_reduce(x)
    xs = %ranks pull x         # every rank's x, as a list indexed by rank
    %ranks push lr             # the notebook's lr, now defined on every rank
    %ranks reports             # what each rank passed to report(), as a list indexed by rank
    %ranks stop

Why: a `%%torchrun` cell pays seconds to start four interpreters and import torch, and what the
ranks computed is gone when it ends. A collective is best understood by poking at it: all-reduce,
look at rank 2's tensor, try a reduce-scatter on the same data. So the ranks stay alive between
cells. They are still real torchrun ranks (RANK, WORLD_SIZE, MASTER_ADDR/PORT from torchrun, one
process group), each an ipyparallel engine: ipyparallel carries code and values between the
notebook and the ranks, torchrun starts and watches the ranks.

What the session guarantees, as `torchrun()` does for a launch:
* a rank that raises is named, with its traceback;
* a cell that does not finish in time (a collective one rank never joined) ends with the waiting
  ranks named, and the session is stopped: nothing can free a rank stuck in a collective;
* stopping the session, interrupting a cell, restarting or killing the kernel leaves no controller,
  torchrun or rank process (each carries the launcher's marker, so `leftover_processes()` lists
  them; the controller and torchrun die with the kernel, each rank with torchrun; `close` sends
  SIGTERM to torchrun and the controller, SIGKILL after lifecycle.GRACE_SECONDS, then SIGKILL to
  every marked process of the session still there);
* a session that lost a rank says so; `%ranks start` begins a new one.

The session's other parts, one job each: warm_rank_side.py (what runs on each rank), warm_engines.py
(the controller and the ranks themselves, and how they die), warm_magics.py (`%ranks`, `%%ranks`).
"""
from __future__ import annotations

import atexit
import concurrent.futures
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
from pathlib import Path
from typing import Any, Callable

from . import agent
from .cards import Cards, detect
from .diagnose import raised
from .language import _
from .launch import rank_environment
from .lifecycle import GRACE_SECONDS, POLL_SECONDS, FailFast, KernelPipe, alive, marked_processes, stop, wait_until
from .reporting import error_record, shorten_paths
from .rundir import (CONTROLLER_LOG, EXIT, IPYTHON, IPYTHONDIR_ENV, PROFILE, SESSION_ENV, TORCHRUN_LOG, ReportReader,
                     RunDir, rank_prefix)
from .warm_rank_side import execute, fetch, identity, store

VERDICT_SECONDS = 60.0  # at most how long to wait for torchrun's verdict on which rank failed first
CELL_LABEL = "<ranks cell {}>"  # numbered, so that every cell's source stays readable on the ranks

SETUP = """\
import os
import torch
import torch.distributed as dist
from fourcard_helpers import detect

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
"""
SETUP_NAMES = "os, torch, dist, cards, rank, world, device"

_live: weakref.WeakSet[RankSession] = weakref.WeakSet()


class RankSessionError(RuntimeError):
    """A warm session could not run a cell. `rank` is the rank to blame (None when none is)."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank



class RankSession:
    """`nproc` ranks started by torchrun on the cards `detect()` picks, kept alive between cells.

    Use as a context manager (`with RankSession(4) as ranks: ranks.run("...")`) or call
    `close()`. Every rank starts with the names os, torch, dist, cards, rank, world and device,
    and the process group formed. `timeout` (seconds) bounds each `run`, `pull` and `push`.

    A cell costs one ipyparallel round trip and no more: it is sent to every rank through one view,
    and while ranks are answering the notebook only collects replies, looking at the processes (is
    every rank still there?) once per POLL_SECONDS that passes. benchmarks/warm_session.py measures
    a cell beside ipyparallel's own round trip of the same all-reduce.
    """

    def __init__(self, nproc: int = 4, timeout: float = 60.0, start_timeout: float = 300.0,
                 echo: bool = True) -> None:
        self.cards: Cards = detect(nproc)
        self.nproc = nproc
        self.timeout = timeout
        self.echo = echo
        self.session_id = uuid.uuid4().hex[:12]
        self.run_dir = Path(tempfile.mkdtemp(prefix="fourcard-ranks-"))
        self.controller: subprocess.Popen[bytes] | None = None
        self.torchrun_proc: subprocess.Popen[bytes] | None = None
        self.pipe = KernelPipe()  # the controller and torchrun stop when the kernel dies (lifecycle.py)
        self.client: Any = None
        self.every_rank: Any = None  # one ipyparallel view of every rank's engine, in rank order
        self.pids: dict[int, int] = {}
        self.lost: str | None = None  # why the session ended on its own, once it has
        self.cells = 0  # cells run so far: names each cell's source on the ranks
        self._reports = ReportReader(RunDir(self.run_dir))  # what each rank passed to report(), later values winning
        self.closed = False
        _live.add(self)
        try:
            self._start(start_timeout)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> RankSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = _("stopped") if self.closed else (_("lost: {why}").format(why=self.lost) if self.lost else _("running"))
        return _("<RankSession: {nproc} ranks on {kind}, {state}>").format(nproc=self.nproc, kind=self.cards.kind,
                                                                          state=state)

    @property
    def reports(self) -> dict[int, dict[str, Any]]:
        """Rank -> what it passed to report() so far (a later value of a name replacing the earlier one)."""
        return self._reports.values

    # -- starting ----------------------------------------------------------------------------
    def _spawn(self, command: list[str], log: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(RunDir(self.run_dir).part(log), "wb") as out:
            return self.pipe.start(command, env, out)

    def _start(self, start_timeout: float) -> None:
        import ipyparallel

        started = time.monotonic()
        run = RunDir(self.run_dir)
        profile = run.part(PROFILE)
        profile.mkdir()
        env = rank_environment(self.cards, self.run_dir, "<ranks>",
                               {SESSION_ENV: self.session_id, IPYTHONDIR_ENV: str(run.part(IPYTHON))})
        self.controller = self._spawn(
            [sys.executable, "-m", "fourcard_helpers.warm_engines", "controller", f"--profile-dir={profile}",
             f"--cluster-id={self.session_id}", "--ip=127.0.0.1", "--usethreads", "--nodb", "--log-level=WARN"],
            CONTROLLER_LOG, env)  # on SIGTERM or the kernel's death it kills its process group (warm_engines.py)
        # --nodb: the controller keeps no record of each task (the session reads results from the
        # replies alone), which is work on every cell and memory that grows with them.
        security = profile / "security"
        engine_file = security / f"ipcontroller-{self.session_id}-engine.json"
        client_file = security / f"ipcontroller-{self.session_id}-client.json"
        self._wait_for(lambda: engine_file.exists() and client_file.exists(), started + start_timeout,
                       _("the ipyparallel controller did not start"))
        self.torchrun_proc = self._spawn(
            agent.command(1, self.nproc, "127.0.0.1:0", self.session_id, "fourcard_helpers.warm_engines",
                          ["engine", f"--file={engine_file}", f"--profile-dir={profile}",
                           "--IPEngine.enable_nanny=False", "--log-level=WARN"]),
            TORCHRUN_LOG, env)  # its ranks die with it (warm_engines.py)
        self.pipe.started()
        self.client = ipyparallel.Client(str(client_file), profile_dir=str(profile))
        self._wait_for(lambda: len(self.client.ids) >= self.nproc, started + start_timeout,
                       _("{nproc} ranks did not all register").format(nproc=self.nproc))
        engines: dict[int, int] = {}  # rank -> its engine's id (ipyparallel numbers engines as they register)
        for engine in self.client.ids:
            engines[self.client[engine].apply_sync(identity)] = engine
        self.pids = run.pids()  # each rank recorded its pid before it registered (warm_engines.py)
        if sorted(self.pids) != list(range(self.nproc)):  # without them a dead rank would go unnoticed
            raise RankSessionError(_("The ranks did not all record their process ids in the run folder (ranks {found} "
                                     "of {nproc}): the session cannot watch them.").format(found=sorted(self.pids),
                                                                                           nproc=self.nproc))
        # One view of all the engines: a cell is serialised once and sent to each, where a view per
        # engine would serialise it once per rank (a few ms a cell on a small machine).
        self.every_rank = self.client[[engines[rank] for rank in range(self.nproc)]]
        self.run(SETUP, echo=False)
        if self.echo:
            print(_("ranks: {nproc} ranks on {cards}, started by torchrun in {seconds} s; each rank has {names} "
                    "and the process group").format(nproc=self.nproc, cards=self.cards.describe(),
                                                    seconds=f"{time.monotonic() - started:.1f}", names=SETUP_NAMES),
                  flush=True)

    def _wait_for(self, condition: Callable[[], bool], deadline: float, what: str) -> None:
        """Until `condition()`, failing at once if a process of the session has ended (lifecycle.wait_until)."""
        try:
            problem = wait_until(condition, deadline - time.monotonic(), self._problem)
        except TimeoutError:
            problem = _("it ran past the start timeout")
        if problem:
            tail = self._log_tail()
            raise RankSessionError(_("{what}: {problem}.").format(what=what, problem=problem)
                                   + (_("\nThe processes' last output:\n{tail}").format(tail=tail) if tail else ""))

    def _log_tail(self, lines: int = 15) -> str:
        text = ""
        for name in (CONTROLLER_LOG, TORCHRUN_LOG):
            try:
                text += shorten_paths(RunDir(self.run_dir).part(name).read_text(errors="replace"))
            except OSError:
                pass
        return "".join(text.splitlines(True)[-lines:])

    # -- health ------------------------------------------------------------------------------
    def _problem(self) -> str | None:
        """Why the session cannot run cells any more, or None while every process is there."""
        if self.closed:
            return _("the session was stopped")
        if self.lost:
            return self.lost
        if self.controller and self.controller.poll() is not None:
            self.lost = _("the ipyparallel controller exited")
        gone = sorted(rank for rank, pid in self.pids.items() if not alive(pid))
        if self.torchrun_proc and self.torchrun_proc.poll() is not None or gone:
            # One rank gone while the others live is the one that died. Several gone at once:
            # torchrun noticed first and stopped the rest, so only its verdict, which the agent
            # writes down as it exits (agent.py), can say which rank failed first. Wait for it
            # (torchrun exits once its ranks are down; the bound is only a backstop).
            if len(gone) > 1 and self.torchrun_proc and self.torchrun_proc.poll() is None:
                try:
                    self.torchrun_proc.wait(VERDICT_SECONDS)
                except subprocess.TimeoutExpired:
                    pass
            blamed = self._root_cause()
            if blamed is not None:
                self.lost = _("rank {rank} of {nproc} was lost (exit code {code})").format(
                    rank=blamed[0], nproc=self.nproc, code=blamed[1])
            elif len(gone) == 1:
                self.lost = _("rank {rank} of {nproc} was lost: the process ended").format(
                    rank=gone[0], nproc=self.nproc)
            elif gone:
                self.lost = _("ranks {ranks} of {nproc} were lost: the processes ended").format(
                    ranks=gone, nproc=self.nproc)
            else:
                self.lost = _("torchrun exited")
        return self.lost

    def _root_cause(self) -> tuple[int, int] | None:
        """The rank torchrun saw fail first, with its exit code (None until torchrun has ended):
        from the agent's `exit` records (agent.py)."""
        first = [(rank, record["exitcode"]) for rank, record in RunDir(self.run_dir).read_json(EXIT).items()
                 if record.get("first")]
        return first[0] if first else None

    def _require_alive(self) -> None:
        problem = self._problem()
        if problem:
            if not self.closed:
                self.close()
            raise RankSessionError(_("The warm session has ended: {problem}. Start a new one with "
                                     "`%ranks start` (or a new RankSession).").format(problem=problem))

    # -- running -----------------------------------------------------------------------------
    def _on_every_rank(self, function: Callable[..., dict[str, Any]], *args: Any, timeout: float | None = None,
                       echo: bool = True, kwargs: dict[str, Any] | None = None) -> list[Any]:
        """Call `function(*args)` on every rank; per-rank values, or an error naming a rank."""
        __tracebackhide__ = True  # noqa: F841
        self._require_alive()
        timeout = self.timeout if timeout is None else timeout
        started = looked = time.monotonic()
        sent = self.every_rank.apply_async(function, *args, **(kwargs or {}))
        pending = dict(zip(sent.split(), range(self.nproc)))  # one result per rank, in rank order
        done: dict[int, Any] = {}
        fail_fast = FailFast()
        try:
            while pending:
                finished = concurrent.futures.wait(list(pending), timeout=POLL_SECONDS,
                                                   return_when=concurrent.futures.FIRST_COMPLETED).done
                for future in finished:
                    done[pending.pop(future)] = future
                if not pending:
                    break
                now = time.monotonic()
                failed = fail_fast.expired(lambda: any(self._outcome(f).get("error") for f in done.values()), now)
                if finished and now - looked < POLL_SECONDS:
                    continue  # ranks are answering: look at the processes again once POLL_SECONDS have passed
                looked = now
                problem = self._problem()
                if problem or now - started > timeout or failed:
                    waiting = sorted(pending.values())
                    self._show(done, echo)
                    self.close()
                    raise self._stuck(done, waiting, problem, timeout)
        except KeyboardInterrupt:
            self.close()
            print(_("ranks: interrupted; the session's {nproc} ranks were stopped. "
                    "Start a new one with `%ranks start`.").format(nproc=self.nproc), file=sys.stderr, flush=True)
            raise
        self._show(done, echo)
        outcomes = {rank: self._outcome(future) for rank, future in done.items()}
        failed = [(outcome["error"]["time"], rank) for rank, outcome in outcomes.items() if outcome.get("error")]
        if failed:
            rank = min(failed)[1]
            others = sorted(other for _when, other in failed if other != rank)
            raise RankSessionError(self._describe(rank, outcomes[rank]) + (
                _("\nRanks {ranks} raised too.").format(ranks=others) if others else "")
                + _("\nThe session is still running."), rank)
        return [outcomes[rank]["value"] for rank in range(self.nproc)]

    @staticmethod
    def _outcome(future: Any) -> dict[str, Any]:
        try:
            return future.result()
        except Exception as error:  # noqa: BLE001 - the engine itself failed (e.g. it died)
            return {"error": {**error_record(error, -1, []), "traceback": ""}}

    def _describe(self, rank: int, outcome: dict[str, Any]) -> str:
        return raised(rank, self.nproc, outcome["error"])

    def _stuck(self, done: dict[int, Any], waiting: list[int], problem: str | None,
               timeout: float) -> RankSessionError:
        failed = sorted((o["error"]["time"], rank, o) for rank, f in done.items() if (o := self._outcome(f)).get("error"))
        if problem:
            head, blamed = _("The warm session ended during the cell: {problem}.").format(problem=problem), None
        elif failed:
            blamed, outcome = failed[0][1:]
            head = self._describe(blamed, outcome) + _(
                "\n\nRank(s) {waiting} were still waiting, most likely in a collective that rank {rank} never "
                "reached.").format(waiting=waiting, rank=blamed)
        else:
            head, blamed = _(
                "The cell ran past its timeout of {timeout} s; rank(s) {waiting} were still waiting (rank(s) "
                "{finished} had finished). A rank that waits forever usually sits in a collective (all_reduce, "
                "barrier, ...) that another rank never called; if the work is just slow, pass a larger "
                "--timeout.").format(timeout=f"{timeout:g}", waiting=waiting, finished=sorted(done)), (
                waiting[0] if waiting else None)
        return RankSessionError(head + _("\nA rank stuck in a collective cannot be freed, so all ranks were "
                                         "stopped. Start a new session with `%ranks start`."), blamed)

    def _show(self, done: dict[int, Any], echo: bool) -> None:
        """Each rank's printed output, grouped and in rank order, prefixed like %%torchrun's; then
        what the ranks passed to report() during the cell."""
        if echo and self.echo:
            for rank in sorted(done):
                done[rank].wait_for_output(GRACE_SECONDS)  # printed output may arrive after the result
                for stream, out in (("stdout", sys.stdout), ("stderr", sys.stderr)):
                    text = getattr(done[rank], stream, "") or ""
                    for line in text.splitlines(True):
                        out.write(rank_prefix(rank) + line + ("" if line.endswith("\n") else "\n"))
            sys.stdout.flush()
            sys.stderr.flush()
        self._take_reports(echo and self.echo)

    def _take_reports(self, echo: bool) -> None:
        """`report()` on a rank appends a JSON line to its record in the session's run folder, as in
        a launch (worker.py): the new lines join `reports` (as `LaunchResult.reports`: a later value
        of a name replaces the earlier one) and, with `echo`, are shown as `[rankN] report: {...}`."""
        for rank, line in self._reports.take():
            if echo:
                print(f"{rank_prefix(rank)}report: {line.rstrip()}", flush=True)

    def run(self, code: str, timeout: float | None = None, echo: bool = True) -> list[Any]:
        """Run `code` on every rank; returns each rank's value of its last expression (rank order).

        Raises RankSessionError naming the first rank that raised, with its traceback.
        """
        self.cells += 1
        return self._on_every_rank(execute, code, CELL_LABEL.format(self.cells), timeout=timeout, echo=echo)

    def pull(self, name: str, timeout: float | None = None) -> list[Any]:
        """Every rank's value of `name`, as a list indexed by rank (tensors on the CPU)."""
        return self._on_every_rank(fetch, name, timeout=timeout)

    def push(self, timeout: float | None = None, **values: Any) -> None:
        """Give every rank the same `values`, as names in its namespace.

        Functions defined in the notebook travel as their code (ipyparallel's canning) and run
        with the rank's names as their globals (`dist`, `rank`, ...).
        """
        self._on_every_rank(store, timeout=timeout, kwargs=values)

    # -- stopping ----------------------------------------------------------------------------
    def processes(self) -> list[int]:
        """Pids of this session's live processes: controller (and its helpers), torchrun, ranks."""
        return marked_processes(SESSION_ENV, self.session_id)

    def close(self) -> None:
        """Stop every process of the session: ranks, torchrun and controller. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        if self.client is not None:
            try:
                self.client.close(linger=0)
            except Exception:  # noqa: BLE001 - the sockets go either way
                pass
        # torchrun passes SIGTERM on to its ranks; ranks live in sessions of their own, the
        # controller's helpers too: what is left of the session's marked processes is killed.
        stop([proc for proc in (self.torchrun_proc, self.controller) if proc is not None], self.processes)
        self.pipe.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)


@atexit.register
def _close_all() -> None:
    for session in list(_live):
        session.close()
