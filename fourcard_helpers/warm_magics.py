"""`%ranks` and `%%ranks`: the notebook's words for a warm session (warm_session.py).

    %ranks start [-n 4] [--timeout S] | stop | pull NAME | push NAME... | reports ; %%ranks [--timeout S]

One session at a time per kernel, held by the class: `%ranks start` stops the one before, so that
no forgotten session keeps four ranks alive. magic.py registers these beside `%%torchrun`.
"""
from __future__ import annotations

import shlex
from typing import Any, Callable

from IPython.core.magic import Magics, line_cell_magic, magics_class, needs_local_scope

from .language import _
from .warm_session import RankSession, RankSessionError


@magics_class
class RanksMagics(Magics):
    """`%ranks start|stop|pull NAME|push NAME...|reports` and `%%ranks` (the cell runs on every rank)."""

    session: RankSession | None = None

    @needs_local_scope
    @line_cell_magic
    def ranks(self, line: str, cell: str | None = None, local_ns: dict[str, Any] | None = None) -> Any:
        """%ranks start [-n 4] [--timeout S] | stop | pull NAME | push NAME... | reports ; %%ranks [--timeout S]"""
        __tracebackhide__ = True  # noqa: F841
        words = shlex.split(line)
        if cell is not None:
            timeout = _option(words, "--timeout", float, None)
            values = self._running().run(cell, timeout=timeout)
            return values if any(value is not None for value in values) else None
        command = words[0] if words else ""
        if command == "start":
            nproc = _option(words, "-n", int, _option(words, "--nproc", int, 4))
            timeout = _option(words, "--timeout", float, 60.0)
            self.stop(quiet=True)
            RanksMagics.session = RankSession(nproc, timeout=timeout)
            return None
        if command == "stop":
            self.stop()
            return None
        if command == "reports" and len(words) == 1:
            session = self._running()
            return [session.reports.get(rank, {}) for rank in range(session.nproc)]
        if command == "pull" and len(words) == 2:
            return self._running().pull(words[1])
        if command == "push" and len(words) >= 2:
            scope = {**self.shell.user_ns, **(local_ns or {})}
            missing = [name for name in words[1:] if name not in scope]
            if missing:
                raise RankSessionError(_("%ranks push: {names} not defined in the notebook").format(names=missing))
            self._running().push(**{name: scope[name] for name in words[1:]})
            return None
        raise RankSessionError(_("usage: %ranks start [-n 4] [--timeout S] | %ranks pull NAME | %ranks push "
                                 "NAME... | %ranks reports | %ranks stop, and %%ranks [--timeout S] for a cell "
                                 "that runs on every rank."))

    def _running(self) -> RankSession:
        if RanksMagics.session is None:
            raise RankSessionError(_("No warm session is running: start one with `%ranks start -n 4`."))
        return RanksMagics.session

    def stop(self, quiet: bool = False) -> None:
        session, RanksMagics.session = RanksMagics.session, None
        if session is not None:
            session.close()
            left = session.processes()
            if left:
                raise RankSessionError(_("processes {pids} of the session outlived it; stop them with "
                                         "`kill -9` and report this as a bug in the course.").format(pids=left))
            if not quiet:
                print(_("ranks: session stopped; none of its {nproc} ranks, its torchrun or its controller is "
                        "running").format(nproc=session.nproc), flush=True)
        elif not quiet:
            print(_("ranks: no session was running"), flush=True)


def _option(words: list[str], name: str, kind: Callable[[str], Any], default: Any) -> Any:
    if name not in words:
        return default
    at = words.index(name)
    if at + 1 >= len(words):
        raise RankSessionError(_("{option} needs a value").format(option=name))
    return kind(words[at + 1])
