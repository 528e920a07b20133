"""Run a lesson's script on N ranks with `torchrun`, as a subprocess of the notebook's kernel.

Why a subprocess and not `torch.multiprocessing.spawn` of a notebook function: spawn has
to pickle the function (a notebook's functions do not pickle), and `fork` from a kernel
that has used several threads deadlocks in OpenMP. `torchrun` is also exactly what a
learner will type on a real four-GPU machine, so the lesson's script runs unchanged there.

What the notebook gets on top of a bare `torchrun`:
* each rank's output live in the cell, prefixed with its rank (torchrun writes every rank's
  stdout/stderr to its own file; we follow the files, so lines never tear);
* the values each rank passed to `report()`, as Python data;
* on failure, the first failing rank's traceback instead of torchrun's summary of every
  SIGTERM it sent, and a hint at the likely cause;
* no process left behind: not after a crash, a hang past `timeout`, an interrupt of the
  kernel, nor the kernel itself dying (see `_Launch.stop` and the parent-death signals).
"""
from __future__ import annotations

import codecs
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, TextIO

from .cards import Cards, detect
from .doctor import examine
from .worker import DOCTOR_ENV, LABEL_ENV, REPO_ROOT, RUN_DIR_ENV, shorten_paths

LAUNCHER_ENV = "FOURCARD_LAUNCHER_PID"
POLL_SECONDS = 0.05  # how often rank output is forwarded; small against a 5 s launch
GRACE_SECONDS = 3.0  # how long torchrun gets to stop its ranks before we kill them
FAIL_FAST_SECONDS = 5.0  # after a rank raised, how long torchrun gets to notice

SIGNAL_HINTS = {
    signal.SIGABRT: (
        "SIGABRT means the C++ runtime gave up; the rank's last output usually says why. "
        "If it happened while the rank was exiting ('terminate called without an active "
        "exception'), gloo work objects were destroyed during interpreter shutdown: end the "
        "script with dist.destroy_process_group()."
    ),
    signal.SIGKILL: "SIGKILL from outside usually means the machine ran out of memory.",
    signal.SIGSEGV: "SIGSEGV is a crash inside native code; the rank's log above may say where.",
}


class LaunchError(RuntimeError):
    """A launch failed. `rank` is the first rank that failed (None when none could be named)."""

    def __init__(self, message: str, rank: int | None = None, log: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.log = log


@dataclass
class LaunchResult:
    """What a finished launch gives back to the notebook."""

    nproc: int
    cards: Cards
    returncode: int
    seconds: float
    reports: dict[int, dict[str, Any]] = field(default_factory=dict)
    log: str = ""
    warnings: list[str] = field(default_factory=list)  # the DDP doctor's findings (doctor.py)

    def values(self, key: str) -> list[Any]:
        """`key` as reported by every rank, in rank order (rank 0 first)."""
        missing = [rank for rank in range(self.nproc) if key not in self.reports.get(rank, {})]
        if missing:
            raise KeyError(f"ranks {missing} did not report {key!r}; call report({key}=...) on every rank")
        return [self.reports[rank][key] for rank in range(self.nproc)]

    def __repr__(self) -> str:
        ranks = sorted(self.reports)
        said = f"reports from ranks {ranks}" if ranks else "no reports"
        return f"<LaunchResult: {self.nproc} ranks ok in {self.seconds:.1f} s, {said}>"


def leftover_processes(launcher_pid: int | None = None) -> list[int]:
    """Pids of torchrun or rank processes that launches from this process (or from the
    process `launcher_pid`, such as a kernel a test drives) left running.

    Always empty after a launch returns, fails or is interrupted; lessons and tests assert it.
    """
    marker = f"{LAUNCHER_ENV}={launcher_pid or os.getpid()}".encode()
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":  # a zombie has exited; only its exit code is left to collect
                    pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _set_parent_death_signal() -> None:
    """Runs in the child before exec: torchrun gets SIGTERM if the kernel dies."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _loopback_interface() -> str | None:
    names = {name for _, name in socket.if_nameindex()} if hasattr(socket, "if_nameindex") else set()
    return next((name for name in ("lo", "lo0") if name in names), None)


def rank_environment(cards: Cards, run_dir: Path, label: str, extra: Mapping[str, str] | None) -> dict[str, str]:
    """The environment every rank starts with."""
    cores = os.cpu_count() or 1
    env = dict(os.environ)
    env.update(
        {
            "PYTHONUNBUFFERED": "1",  # lines reach the notebook as they are printed
            "OMP_NUM_THREADS": str(max(1, cores // cards.count)),  # share cores, do not fight
            "FOURCARD_DEVICE": cards.kind,  # every rank makes the kernel's choice of cards
            "MPLBACKEND": "Agg",  # the kernel's inline backend does not exist in a rank
            RUN_DIR_ENV: str(run_dir),
            LAUNCHER_ENV: str(os.getpid()),  # lets leftover_processes() find what we started
            LABEL_ENV: label,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        }
    )
    loopback = _loopback_interface()
    if cards.kind == "cpu" and loopback and "GLOO_SOCKET_IFNAME" not in os.environ:
        env["GLOO_SOCKET_IFNAME"] = loopback  # simulated cards talk over loopback only
    env.update(extra or {})
    return env


class _RankStream:
    """Follows one rank's log file and hands out whole lines (or carriage-return updates)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.pending = ""

    def read(self, final: bool = False) -> list[str]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            data = b""
        self.offset += len(data)
        self.pending += self.decoder.decode(data, final=final)
        pieces = re.split(r"(?<=[\n\r])", self.pending)
        self.pending = "" if final else pieces.pop()
        return [piece for piece in pieces if piece.strip("\r\n") or piece.endswith("\n")]


class _Launch:
    """One torchrun subprocess, its ranks' log files, and the means to stop them all."""

    def __init__(self, cards: Cards, echo: bool) -> None:
        self.cards = cards
        self.nproc = cards.count
        self.echo = echo
        self.run_dir = Path(tempfile.mkdtemp(prefix="fourcard-"))
        self.log_dir = self.run_dir / "torchrun-logs"
        self.streams: dict[tuple[int, str], _RankStream] = {}
        self.lines: list[str] = []
        self.torchrun_output: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.reader: threading.Thread | None = None

    # -- starting and following ------------------------------------------------------
    def start(self, script: Path, args: Iterable[str], env: Mapping[str, str]) -> None:
        command = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes=1", f"--nproc-per-node={self.nproc}",
            "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", f"--rdzv-id={uuid.uuid4().hex[:12]}",
            "--max-restarts=0", "--monitor-interval=0.1",
            f"--log-dir={self.log_dir}", "--redirects=3",
            "-m", "fourcard_helpers.worker", str(script), *map(str, args),
        ]
        self.proc = subprocess.Popen(
            command, env=dict(env), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,  # a process group of its own: we can signal all of it
            preexec_fn=_set_parent_death_signal,
        )
        self.reader = threading.Thread(target=self._read_torchrun, daemon=True)
        self.reader.start()

    def _read_torchrun(self) -> None:
        """torchrun's own messages: kept for diagnosis, not shown (they are not the lesson)."""
        assert self.proc and self.proc.stdout
        for raw in self.proc.stdout:
            self.torchrun_output.append(raw.decode("utf-8", "replace"))

    def pump(self, final: bool = False) -> None:
        """Forward every new line of every rank to the notebook."""
        for path in sorted(self.log_dir.glob("*/attempt_*/*/std*.log")):
            rank = int(path.parent.name)
            key = (rank, path.stem)
            if key not in self.streams:
                self.streams[key] = _RankStream(path)
            for piece in self.streams[key].read(final):
                line = f"[rank{rank}] {piece}"
                self.lines.append(line)
                if self.echo:
                    out: TextIO = sys.stderr if path.stem == "stderr" else sys.stdout
                    out.write(line)
                    out.flush()

    def files(self, kind: str) -> dict[int, Path]:
        found = {}
        for path in self.run_dir.glob(f"{kind}.*"):
            suffix = path.name.split(".", 1)[1]
            if suffix.isdigit():
                found[int(suffix)] = path
        return found

    # -- stopping ---------------------------------------------------------------------
    def _worker_pids(self) -> list[int]:
        pids = []
        for path in self.files("pid").values():
            try:
                pid = int(path.read_text())
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            if b"fourcard_helpers.worker" in cmdline:  # still ours, not a reused pid
                pids.append(pid)
        return pids

    def stop(self) -> None:
        """Stop torchrun and every rank: SIGTERM first (torchrun passes it on), then SIGKILL."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(GRACE_SECONDS)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for pid in self._worker_pids():  # ranks live in sessions of their own
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + GRACE_SECONDS
        while self._worker_pids() and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.reader:
            self.reader.join(timeout=1)

    def cleanup(self) -> None:
        shutil.rmtree(self.run_dir, ignore_errors=True)

    # -- results ----------------------------------------------------------------------
    def reports(self) -> dict[int, dict[str, Any]]:
        merged: dict[int, dict[str, Any]] = {}
        for rank, path in sorted(self.files("report").items()):
            for line in path.read_text(encoding="utf-8").splitlines():
                merged.setdefault(rank, {}).update(json.loads(line))
        return merged

    def rank_tail(self, rank: int, lines: int = 8) -> str:
        mine = [line for line in self.lines if line.startswith(f"[rank{rank}] ")]
        return "".join(mine[-lines:])

    def failure(self) -> LaunchError:
        """Explain a failed launch by its first failing rank.

        A rank that raised leaves an error file; a rank that crashed in native code leaves a
        crash file (faulthandler's report). Whichever was written first names the culprit:
        the errors of the other ranks ("connection reset by peer", ...) follow from it.
        """
        log = "".join(self.lines)
        failures = [(error["time"], error["rank"], error) for error in
                    (json.loads(path.read_text()) for path in self.files("error").values())]
        failures += [(path.stat().st_mtime, rank, path) for rank, path in self.files("crash").items()
                     if path.stat().st_size]
        summary = "".join(self.torchrun_output)
        codes = _exit_codes(summary)
        if failures:
            _, rank, what = min(failures, key=lambda failure: failure[0])
            if isinstance(what, dict):
                head = f"rank {rank} of {self.nproc} raised {what['type']}: {what['message']}\n\n{what['traceback']}"
            else:
                code = codes.get(rank, 0)
                name = f" ({signal.Signals(-code).name})" if code < 0 else ""
                hint = SIGNAL_HINTS.get(signal.Signals(-code), "") if code < 0 else ""
                stack = "".join(  # the script's frames; not the worker's nor the module list
                    line for line in what.read_text(encoding="utf-8", errors="replace").splitlines(True)
                    if not re.search(r"fourcard_helpers.worker|<frozen runpy>|^Extension modules", line))
                tail = self.rank_tail(rank)
                head = (f"rank {rank} of {self.nproc} crashed in native code{name}. {hint}\n"
                        + (f"Its last output:\n{tail}" if tail else "") + shorten_paths(stack).strip() + "\n")
            return LaunchError(
                f"{head}\nThe other ranks were stopped. Fix the error above (it happened on rank {rank}; "
                "errors on other ranks, if any, followed from it).",
                rank, log,
            )
        if codes:
            start = summary.find("Root Cause")  # torchrun's heading for the first failure it saw
            root = _exit_codes(summary[start:]) if start >= 0 else codes
            rank, code = next(iter(root.items()))
            done = rank in self.files("done")
            if code < 0:
                name = signal.Signals(-code).name
                what = "finished its script, then died while exiting," if done else "was killed"
                hint = SIGNAL_HINTS.get(signal.Signals(-code), "")
                message = f"rank {rank} of {self.nproc} {what} by {name}. {hint}"
            else:
                message = f"rank {rank} of {self.nproc} exited with code {code}."
            tail = self.rank_tail(rank)
            return LaunchError(message + (f"\nIts last output:\n{tail}" if tail else ""), rank, log)
        return LaunchError(
            "torchrun failed before the ranks could run. Its own output:\n" + summary[-3000:],
            None, log,
        )


def _exit_codes(summary: str) -> dict[int, int]:
    """Rank → exit code, from torchrun's failure summary (in the order it lists them)."""
    found = re.findall(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", summary)
    return {int(rank): int(code) for rank, code in found}


def _script_file(script: str | Path, run_dir: Path) -> tuple[Path, str]:
    """A Path (or a str naming an existing .py file) runs as is; any other str is source code."""
    if isinstance(script, Path) or ("\n" not in script and script.endswith(".py") and Path(script).is_file()):
        path = Path(script)
        if not path.is_file():
            raise FileNotFoundError(f"script {path} not found (relative paths start at {Path.cwd().name}/)")
        return path, str(script)
    path = run_dir / "cell.py"
    path.write_text(script, encoding="utf-8")
    return path, "cell.py"


def torchrun(script: str | Path, nproc: int = 4, args: Iterable[str] = (), timeout: float = 600,
             env: Mapping[str, str] | None = None, echo: bool = True, label: str | None = None,
             doctor: bool = True) -> LaunchResult:
    """Run `script` on `nproc` ranks with torchrun and return what the ranks reported.

    `script` is a path to a .py file, or the source of one. Each rank's output is printed
    live, prefixed with its rank. Raises LaunchError (naming the first failing rank, with
    its traceback) if a rank fails, or if the launch runs past `timeout` seconds. No rank
    outlives this call: not on success, failure, timeout or KeyboardInterrupt.
    """
    __tracebackhide__ = True  # noqa: F841 - IPython: show the learner's error, not ours
    cards = detect(nproc)
    started = time.monotonic()
    launch = _Launch(cards, echo)
    try:
        path, default_label = _script_file(script, launch.run_dir)
        rank_env = rank_environment(cards, launch.run_dir, label or default_label, {DOCTOR_ENV: "1" if doctor else "0", **(env or {})})
        if echo:
            threads = rank_env["OMP_NUM_THREADS"]
            cores = os.cpu_count() or 1
            sharing = f"; OMP_NUM_THREADS={threads} per rank ({cores} CPU cores shared)" if cards.kind == "cpu" else ""
            print(f"torchrun: {nproc} ranks on {cards.describe()}{sharing}", flush=True)
        launch.start(path, args, rank_env)
        assert launch.proc is not None
        first_error: float | None = None
        while launch.proc.poll() is None:
            launch.pump()
            now = time.monotonic()
            if now - started > timeout:
                running = sorted(set(range(nproc)) - set(launch.files("done")) - set(launch.files("error")))
                launch.stop()
                launch.pump(final=True)
                raise LaunchError(
                    f"the launch ran past its timeout of {timeout:g} s; rank(s) {running} were still "
                    f"running and all ranks were stopped. A rank that waits forever usually sits in "
                    "a collective (all_reduce, barrier, ...) that another rank never called; "
                    "if the work is just slow, pass a larger timeout.",
                    running[0] if running else None, "".join(launch.lines),
                )
            if first_error is None and launch.files("error"):
                first_error = now
            if first_error is not None and now - first_error > FAIL_FAST_SECONDS:
                launch.stop()  # a failed rank's partners may sit in a collective forever
                break
            time.sleep(POLL_SECONDS)
        launch.stop()
        launch.pump(final=True)
        seconds = time.monotonic() - started
        if launch.proc.returncode != 0 or launch.files("error"):
            raise launch.failure()
        result = LaunchResult(nproc, cards, 0, seconds, launch.reports(), "".join(launch.lines))
        if doctor:
            records = {rank: json.loads(path.read_text()) for rank, path in launch.files("doctor").items()}
            result.warnings = examine(records, nproc)
            for warning in result.warnings if echo else ():
                print(f"torchrun: doctor: {warning}", flush=True)
        if echo:
            print(f"torchrun: {nproc} ranks finished in {seconds:.1f} s", flush=True)
        return result
    except KeyboardInterrupt:
        launch.stop()
        print(f"torchrun: interrupted; all {nproc} ranks stopped", file=sys.stderr, flush=True)
        raise
    finally:
        launch.stop()
        launch.cleanup()
