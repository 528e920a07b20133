"""The `%%torchrun` cell magic: the cell body is a complete script, run on N ranks.

    %%torchrun -n 4 --timeout 60 --save scripts/train.py --result run -- --epochs 2
    import torch.distributed as dist
    ...

    %%solution
    def weighted_average(grads, sizes): ...
    check.exercise("Exercise 1", ...)

The cell's value is the LaunchResult, so the next cell can read it as `_` (or as `run`
when `--result run` is given). `--save` keeps the script as a file that runs unchanged
from a terminal with `torchrun --nproc-per-node=4 scripts/train.py`. An exercise's skeleton,
a script that still says `raise NotImplementedError` where the learner's code goes, is saved
but not launched: every rank would only raise it, after seconds of starting up.

`%fourcards_lang zh` makes the package's messages Chinese in this notebook (a Chinese lesson's first
code cell says it; see language.py); the setting FOURCARDS_LANG, where it is set, still decides.

`%%solution` runs an exercise's hidden reference solution in a copy of the notebook's
namespace, so "Run All" proves every solution passes its check while the learner's own
definitions stay as the learner wrote them.
"""
from __future__ import annotations

import ast
import contextlib
import io
import itertools
import linecache
import shlex
import sys
from pathlib import Path
from typing import Any

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.error import UsageError
from IPython.core.magic_arguments import MagicHelpFormatter, argument, kwds, magic_arguments, parse_argstring

from . import check, language
from .cards import CardsError
from .language import N_, _
from .launch import LaunchError, LaunchResult, torchrun
from .rundir import LANG_ENV, setting
from .warm_magics import RanksMagics
from .warm_session import RankSessionError


_solution_numbers = itertools.count(1)  # one linecache name per %%solution run


class CatalogHelp(MagicHelpFormatter):
    """A magic's help in the learner's language as it is shown, not as it was when the extension
    loaded: the description and each option's help are catalog entries (N_()), translated here,
    while the help is written. argparse's own words ("options", its error messages) stay its own."""

    def _get_help_string(self, action: Any) -> str | None:
        return _(action.help) if action.help else action.help

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return super()._fill_text(_(text), width, indent)


@magics_class
class TorchrunMagics(Magics):
    """Holds the `%%torchrun` magic."""

    @magic_arguments()
    @kwds(formatter_class=CatalogHelp, description=N_("Run the cell as a script on N ranks with torchrun; everything "
                                                      "after `--` goes to the script."))
    @argument("-n", "--nproc", type=int, default=4, help=N_("ranks to start (per node; default 4)"))
    @argument("--nnodes", type=int, default=1, help=N_("torchrun agents to start on this machine, one per node"))
    @argument("--max-restarts", type=int, default=0, help=N_("times torchrun restarts every rank after a failure"))
    @argument("--timeout", type=float, default=600, help=N_("seconds before every rank is stopped"))
    @argument("--save", default=None, help=N_("also write the script to this file and run it from there"))
    @argument("--result", default=None, help=N_("store the LaunchResult under this name"))
    @argument("--no-doctor", action="store_true", help=N_("do not check the script for data-parallel mistakes"))
    @cell_magic
    def torchrun(self, line: str, cell: str) -> LaunchResult | None:
        """Run the cell as a script on N ranks with torchrun (its help is the parser's: see getdoc below)."""
        __tracebackhide__ = True  # noqa: F841
        words = shlex.split(line)
        script_args = words[words.index("--") + 1:] if "--" in words else []
        try:
            options = parse_argstring(self.torchrun,
                                      shlex.join(words[: words.index("--")] if "--" in words else words))
        except UsageError as error:  # argparse's own words, then where the options are explained
            raise UsageError(_("%%torchrun: {error}. `%%torchrun?` shows its options and what each does.").format(
                error=error)) from None
        script: str | Path = cell
        if options.save:
            path = Path(options.save)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(cell, encoding="utf-8")
            script = path
        if options.result:
            self.shell.user_ns.pop(options.result, None)  # a check must judge this run, never an earlier one
        placeholder = placeholder_line(cell)
        if placeholder is not None:
            print("○ " + _("not launched: line {line} of this cell still says `raise NotImplementedError`, the "
                           "place for your code. Write your code there (and remove that line), then run this cell "
                           "again.").format(line=placeholder + 1))
            return None
        result = torchrun(script, nproc=options.nproc, args=script_args, timeout=options.timeout,
                          doctor=not options.no_doctor, nnodes=options.nnodes,
                          max_restarts=options.max_restarts)
        if options.result:
            self.shell.user_ns[options.result] = result
        return result

    # `%%torchrun?` asks IPython's getdoc(), which calls an object's getdoc() first: the help written
    # now, in the language of now (the docstring magic_arguments wrote at import is in the language of then).
    torchrun.getdoc = torchrun.parser.format_help  # type: ignore[attr-defined]

    @line_magic
    def fourcards_lang(self, line: str) -> None:
        """`%fourcards_lang zh` (or `en`): the language of the package's messages in this notebook.
        The setting FOURCARDS_LANG, where it is set, still decides; without an argument, say what
        decides now."""
        words = line.split("#")[0].split()
        if words:
            language.choose(words[0])
            return
        if setting(LANG_ENV):
            print(_("Messages follow the setting {setting}={value}.").format(setting=LANG_ENV, value=setting(LANG_ENV)))
        elif language.chosen():
            print(_("Messages are in the language this notebook chose: {value} (`%fourcards_lang en` switches "
                    "to English; the setting {setting} wins over it).").format(value=language.chosen(),
                                                                            setting=LANG_ENV))
        else:
            print(_("Messages follow this machine's locale (`%fourcards_lang zh` switches to Chinese, "
                    "`%fourcards_lang en` to English)."))

    @cell_magic
    def solution(self, line: str, cell: str) -> None:
        """Run a reference solution and its check without touching the learner's names.

        The cell runs in a shallow copy of the notebook's namespace: functions and variables
        it defines vanish with the copy (objects it mutates in place are shared, so a
        solution should not mutate what the lesson uses later). Only the check's verdict is
        shown: what the solution prints stays hidden unless it fails.
        """
        namespace = dict(self.shell.user_ns)
        code = self.shell.transform_cell(cell)  # magics inside the solution still work
        # Registered like an IPython cell, so that inspect.getsource() finds what the solution
        # defines (a check may copy a solution's function into a four-rank script).
        filename = f"<solution-{next(_solution_numbers)}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        # What the solution prints (its numbers, a launch's output) would give the answer away in the
        # stored outputs of Run All: it is shown only if the solution fails, with the error.
        printed = io.StringIO()
        try:
            with check.reference_solution() as verdicts, contextlib.redirect_stdout(printed):
                exec(compile(code, filename, "exec"), namespace)  # noqa: S102 - the lesson's own cell
        except BaseException:
            print(printed.getvalue(), end="")
            raise
        print("\n".join(verdicts))


def placeholder_line(script: str) -> int | None:
    """The first line of the script (1 = its first) with a bare `raise NotImplementedError`, the place an
    exercise leaves for the learner's code, or None. Not counted: one with a message
    (`raise NotImplementedError("no GPU")`, a script's own deliberate error) and one in a method of a class
    (an abstract method, meant to be overridden). A script that does not parse launches all the same: the
    ranks' traceback shows the syntax error."""
    try:
        tree = ast.parse(script)
    except SyntaxError:
        return None
    methods = {id(node) for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef) for body in cls.body
               if isinstance(body, (ast.FunctionDef, ast.AsyncFunctionDef)) for node in ast.walk(body)}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None and id(node) not in methods:
            call = isinstance(node.exc, ast.Call)
            raised = node.exc.func if call else node.exc
            bare = not call or not (node.exc.args or node.exc.keywords)
            if bare and isinstance(raised, ast.Name) and raised.id == "NotImplementedError":
                lines.append(node.lineno)
    return min(lines, default=None)


def _show_error(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None = None) -> list[str]:
    """Show a failed launch as its message alone: the ranks' traceback is in it already,
    and the kernel-side frames (this package, IPython) would only bury it."""
    stb = [f"\x1b[31m{etype.__name__}\x1b[0m: {value}"]
    sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb  # as IPython itself would
    shell._showtraceback(etype, value, stb)
    return stb


def register(ipython: Any) -> None:
    """Register the magics (`%%torchrun`, `%%solution`, `%fourcards_lang`, `%ranks`/`%%ranks`) and the error display."""
    ipython.register_magics(TorchrunMagics)
    ipython.register_magics(RanksMagics)
    ipython.set_custom_exc((LaunchError, CardsError, RankSessionError), _show_error)
