"""What the tests share, in one module: the repository's folders, the lessons and their cells, a
script of ranks and the checks that nothing of a launch is left, a launch as a learner makes it with
plain torchrun, an ordinary user's Python.

Test modules import from here and never from one another, so that a test file can move to another
tier (tests/unit, tests/process, tests/lessons) or be deleted without breaking a file it never
mentions; benchmarks import from here too (benchmarks/script_stress.py runs the tests' own launch).
pyproject.toml puts this folder on pytest's path (`pythonpath`). Imports of the course's package are
made inside the functions that need them (rundir.py's names excepted: standard library only), so that
pytest's start-up (conftest.py imports this module) does not load torch.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import pytest

from fourcard_helpers.rundir import (LOCAL_RANK_ENV, PYTHONPATH_ENV, RANK_ENV, THREADS_ENV, VISIBLE_GPUS_ENV,  # standard
                                     WORLD_SIZE_ENV)  # library only: no torch

ROOT = Path(__file__).resolve().parent.parent  # the repository, whichever tier a test lives in
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]*_*.ipynb"))

# The Chinese notebooks' code is the English with the text of its figures translated, and their stored
# outputs come from running them (docs/translate.py run; test_chinese.py and test_chinese_notebooks.py
# check both, cell by cell). nbval runs these Chinese lessons again, each
# in one rounding: 00 (the launcher's and the pre-flight check's messages) and 02 (a diagram, a widget
# and the exercises' verdicts). All seventeen would add about 15 minutes to CI, whose limit is 90.
CHINESE_NBVAL = ("00_cards_and_launching", "02_data_parallelism_by_hand")

# Another machine's rounding, under which every lesson runs a second time (tests/lessons/test_other_rounding.py):
# ATen's and oneDNN's own switches, which only the tests set, and the course's one thread a rank.
ANOTHER_ROUNDING = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", THREADS_ENV: "1"}
# The threads of the background jobs (those runs, then the shipped scripts' launches: tests/lessons/conftest.py),
# which the unit tier lets start processes (tests/unit/conftest.py)
BACKGROUND_THREADS = "background-job"


# -- the lessons ----------------------------------------------------------------------------------
def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


@cache
def _cells(path: Path) -> tuple[dict, ...]:
    """A lesson's cells read once, for the lookups below, which only read them."""
    return tuple(cells(path))


def source(cell: dict) -> str:
    return "".join(cell["source"])


def code_cell(lesson: Path, marker: str) -> str:
    """The one code cell of `lesson` that contains `marker`: a test that runs a lesson's own definition."""
    found = [source(c) for c in cells(lesson) if c["cell_type"] == "code" and marker in source(c)]
    assert len(found) == 1, f"expected one code cell of {lesson.stem} containing {marker!r}, found {len(found)}"
    return found[0]


def written_by_cells(path: Path, target: str) -> str:
    """What the `%%writefile` cells of a lesson write to `target` (a path from the notebooks folder):
    the first cell writes the file, each later one appends to it (`%%writefile -a`), in order."""
    writers = [source(cell) for cell in cells(path) if cell["cell_type"] == "code"
               and source(cell).partition("\n")[0].split()[:1] == ["%%writefile"]
               and source(cell).partition("\n")[0].split()[-1] == target]
    assert writers and writers[0].startswith(f"%%writefile {target}\n"), f"no cell writes {target}"
    assert all(text.startswith(f"%%writefile -a {target}\n") for text in writers[1:]), f"{target} is written twice"
    return "".join(text.partition("\n")[2] for text in writers)


def definitions(text: str) -> str:
    """A cell's source without its top-level expression statements (the `check.exercise(...)` call)."""
    lines = text.splitlines()
    for node in ast.parse(text).body:
        if isinstance(node, ast.Expr):
            lines[node.lineno - 1:node.end_lineno] = [""] * (node.end_lineno - node.lineno + 1)
    return "\n".join(lines) + "\n"


def needs_slurm(notebook: Path) -> bool:
    """Whether the lesson's metadata says it needs SLURM (`"fourcards": {"needs": "slurm"}`): lesson 12b."""
    return json.loads(Path(notebook).read_text(encoding="utf-8"))["metadata"].get("fourcards", {}).get("needs") == "slurm"


@cache
def cannot_run_here(notebook: Path) -> str | None:
    """Why this lesson cannot run on this machine, or None when it can (always None in CI)."""
    if not needs_slurm(notebook) or os.environ.get("CI"):
        return None
    from fourcard_helpers.slurm import INSTALL_HINT, missing_programs

    return f"{Path(notebook).name} needs SLURM: {INSTALL_HINT}" if missing_programs() else None


# -- the kernel's side -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shell() -> "Iterator[InteractiveShell]":
    """IPython's shell with the course's magics loaded (%%torchrun, %%solution): a fixture, which a test
    module imports by this name. The shell is IPython's one instance, so it is cleared after the module:
    a later test that starts its own shell (as a kernel starts one) must not find the extension loaded."""
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "fourcard_helpers")
    yield ip
    InteractiveShell.clear_instance()


# -- a script of ranks, launched by the course's launcher -------------------------------------------
INIT = """
import os, sys, time
import torch
import torch.distributed as dist
from fourcard_helpers import detect, report
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank = dist.get_rank()
"""


def write(tmp_path: Path, text: str, name: str) -> Path:
    """A learner's answer file: what an exercise's check is given, written where the check reads it."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def mistake(reference: str, old: str, new: str) -> str:
    """The reference answer with one change, `old` made `new`: a mistake an exercise's check must name.
    `old` must occur in the reference exactly once, so that the mistake is the change the test names."""
    assert reference.count(old) == 1, f"the reference has {reference.count(old)} copies of {old!r}, not one"
    return reference.replace(old, new)


def script(tmp_path: Path, body: str, name: str = "job.py") -> Path:
    path = tmp_path / name
    path.write_text(INIT + textwrap.dedent(body))
    return path


def assert_nothing_left(launcher_pid: int | None = None) -> None:
    """No torchrun and no rank of this process's launches (or of `launcher_pid`'s) still runs.
    Waits for the event, with a deadline far beyond what stopping takes."""
    from fourcard_helpers.launch import leftover_processes
    from fourcard_helpers.lifecycle import wait_until

    try:
        wait_until(lambda: not leftover_processes(launcher_pid), 60)
    except TimeoutError:
        pass  # the assert below names what is left
    assert leftover_processes(launcher_pid) == []


KERNEL = """
import signal
import sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as ipykernel does while a cell runs: a
# process started with SIGINT ignored (a background job of a shell) would otherwise ignore the stop button
from fourcard_helpers.launch import torchrun
try:
    torchrun(sys.argv[1], nproc=4, timeout=300)
except KeyboardInterrupt:
    print("KeyboardInterrupt reached the caller", flush=True)
    sys.exit(3)
"""


def start_kernel_like_launch(tmp_path: Path, kernel_code: str = KERNEL) -> subprocess.Popen[str]:
    """A Python process standing in for the notebook kernel (running `kernel_code`), launching 4
    ranks that sleep; returns once all four have said they are ready."""
    path = script(tmp_path, """
        print("ready", flush=True)
        time.sleep(600)
    """)
    kernel = subprocess.Popen([sys.executable, "-c", kernel_code, str(path)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    assert kernel.stdout is not None
    ready = 0
    for line in kernel.stdout:
        ready += line.endswith("] ready\n")
        if ready == 4:
            return kernel
    pytest.fail("the ranks never started")


# -- a lesson's saved scripts, launched as a learner would, with plain torchrun ----------------------
@cache
def shipped_launches() -> tuple[tuple[str, int, int, float, bool], ...]:
    """(script path relative to notebooks/, ranks per node, nodes, timeout, expected to fail) of every
    saved launch."""
    from fourcard_helpers.magic import placeholder_line

    found = []
    for path in NOTEBOOKS:
        for cell in _cells(path):
            text = source(cell)
            if cell["cell_type"] != "code" or not text.startswith("%%torchrun"):
                continue
            line = text.partition("\n")[0]
            saved = re.search(r"--save\s+(\S+)", line)
            if not saved:
                continue
            nproc = re.search(r"(?:-n|--nproc)\s+(\d+)", line)
            nnodes = re.search(r"--nnodes\s+(\d+)", line)
            timeout = re.search(r"--timeout\s+([\d.]+)", line)
            fails = ("raises-exception" in cell["metadata"].get("tags", [])
                     or placeholder_line(text.partition("\n")[2]) is not None)
            found.append((saved.group(1), int(nproc.group(1)) if nproc else 4, int(nnodes.group(1)) if nnodes else 1,
                          float(timeout.group(1)) if timeout else 300.0, fails))
    return tuple(found)


@cache
def cell_arguments(script: str) -> tuple[str, ...]:
    """What the cell that saves `script` passes it after `--`, split as the magic splits them (empty: the
    script's defaults, as a learner's plain launch runs it)."""
    for path in NOTEBOOKS:
        for cell in _cells(path):
            line = source(cell).partition("\n")[0]
            words = shlex.split(line) if cell["cell_type"] == "code" and line.startswith("%%torchrun") else []
            if "--save" in words and words[words.index("--save") + 1] == script:
                return tuple(words[words.index("--") + 1:]) if "--" in words else ()
    raise LookupError(f"no cell saves {script}")


# The variables a script may read itself: torchrun's, and on a GPU machine those of CUDA and NCCL
# (tests/unit/test_script_text.py). Anything else the launcher sets reaches a script through torch or the package.
SCRIPT_VARIABLES = {RANK_ENV, LOCAL_RANK_ENV, WORLD_SIZE_ENV, "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                    VISIBLE_GPUS_ENV, "TORCH_NCCL_ASYNC_ERROR_HANDLING"}
# What a collective looks like in a script's text: a script with none meets the other ranks only at the barrier the
# launcher asks init_process_group for (rundir.INIT_BARRIER_ENV), which a plain launch does not.
COLLECTIVE = re.compile(r"\b(all_reduce|all_gather\w*|reduce_scatter\w*|broadcast\w*|barrier|monitored_barrier|all_to_all\w*"
                        r"|send|recv|isend|irecv|batch_isend_irecv|gather|scatter|reduce|DDP|DistributedDataParallel"
                        r"|fully_shard|parallelize_module|distribute_tensor|full_tensor|redistribute|ZeroRedundancyOptimizer)\(")


@cache
def plain_launch_reasons(script: str, nproc: int, nnodes: int, timeout: float, fails: bool) -> tuple[str, ...]:
    """Why `script` is launched plain (tests/lessons/test_scripts.py lists how the notebook's launch of a saved
    file differs from a learner's plain one, and which reason covers each difference): what such a launch shows
    that the notebook's own launch of the same file does not, or that no other script of its lesson that
    succeeds is launched plain (so each lesson's promise is shown by a script that runs); empty where nothing."""
    reasons = list(_what_only_a_plain_launch_shows(script, nnodes, fails))
    lesson = [launch for launch in shipped_launches() if Path(launch[0]).name[:3] == Path(script).name[:3]]
    succeeding = [launch for launch in lesson if not launch[4]]
    if (not reasons and succeeding and succeeding[0][0] == script
            and not any(_what_only_a_plain_launch_shows(other[0], other[2], other[4]) for other in succeeding)):
        reasons.append("the first of its lesson's scripts that succeed: no other of them needs a plain launch")
    return tuple(reasons)


@cache
def _what_only_a_plain_launch_shows(script: str, nnodes: int, fails: bool) -> tuple[str, ...]:
    text = (NOTEBOOK_DIR / script).read_text()
    beside = {path.stem for folder in (NOTEBOOK_DIR / "scripts", NOTEBOOK_DIR, ROOT) for path in folder.glob("*.py")}
    imported = {name.split(".")[0] for node in ast.walk(ast.parse(text)) if isinstance(node, (ast.Import, ast.ImportFrom))
                for name in ([alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""])}
    after_init = text.partition("init_process_group(")[2]
    reasons = {"fails by design, and must end by itself: no notebook stops it": fails,
               "several agents at one rendezvous": nnodes > 1,
               "its defaults: the notebook passes it arguments": bool(cell_arguments(script)),
               "keeps files in the temporary folder: two learners' runs side by side": writes_temporary_files(script),
               "imports a module of the course's folders, which only the notebook's launch puts on the path":
                   bool(imported & beside),
               "imports matplotlib, whose backend only the notebook's launch chooses": "matplotlib" in imported,
               "joins a group but names no collective: only the notebook's launch ends init with a barrier":
                   "init_process_group(" in text and not COLLECTIVE.search(after_init)}
    return tuple(reason for reason, holds in reasons.items() if holds)


def plain_torchrun(nproc: int, nnodes: int) -> list[list[str]]:
    """The arguments of each torchrun agent: one `--standalone` agent, or (a cell's `--nnodes N`)
    N agents joined at one c10d rendezvous endpoint on 127.0.0.1, as on N machines of a cluster."""
    from fourcard_helpers.lifecycle import free_ports

    if nnodes == 1:
        return [["--standalone", f"--nproc-per-node={nproc}"]]
    port = free_ports(1)[0]
    return [[f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
             f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=plain"] for _ in range(nnodes)]


def plain_torchrun_command(agent: list[str], script: str | Path, *args: str) -> list[str]:
    """The command line of one torchrun agent as a learner types it (`torchrun AGENT SCRIPT ARGS`), run
    by this Python: the one place the tests build it (benchmarks that time a bare launch build their own)."""
    return [sys.executable, "-m", "torch.distributed.run", *agent, str(script), *args]


def plain_environment(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment of a launch a learner starts by hand on simulated cards: this one (or `base`), with
    the course's choice of cards and one thread a rank, lines unbuffered, and no run folder of a launcher
    (under either of its names), so that the script's report() prints what it would have sent back."""
    from fourcard_helpers.rundir import (DEVICE_ENV, GLOO_INTERFACE_ENV, RENAMED, RUN_DIR_ENV, UNBUFFERED_ENV)

    env = {**(os.environ if base is None else base), DEVICE_ENV: "cpu", THREADS_ENV: "1", GLOO_INTERFACE_ENV: "lo",
           UNBUFFERED_ENV: "1", **extra}
    env.pop(RUN_DIR_ENV, None)
    env.pop(RENAMED[RUN_DIR_ENV], None)
    return env


def wait_for(condition: Callable[[], bool], bound: float = 120.0) -> bool:
    """Wait for an event (`condition()` true) through the package's one wait; whether it came. `bound`
    only ends a failure, far beyond what the event takes."""
    from fourcard_helpers.lifecycle import wait_until

    try:
        return wait_until(condition, bound) is None
    except TimeoutError:
        return condition()


def end_group(proc: subprocess.Popen) -> bool:
    """Kill whatever is left of the process group `proc` leads (started with start_new_session); whether
    anything was left."""
    from fourcard_helpers.lifecycle import group_alive, quiet_kill

    left = group_alive(proc.pid)
    quiet_kill(proc.pid, signal.SIGKILL, group=True)
    return left


# How long torchrun's agent gives its ranks between SIGTERM and SIGKILL when it stops (torch.distributed.elastic's
# PContext.close, timeout=30), and the agents of plain launches running now: a session stopped early ends them.
TORCHRUN_CLOSE_SECONDS = 30
PLAIN_LAUNCHES: set[subprocess.Popen[bytes]] = set()


def run_with_plain_torchrun(script: str, nproc: int, nnodes: int, timeout: float, extra_env: dict[str, str] | None = None,
                            base_env: Mapping[str, str] | None = None) -> tuple[list[int | None], str]:
    """Launch `script` once as a learner would, with bare torchrun agents; return each agent's exit
    code (None: it ran past `timeout` + 60 s and was stopped) and the launch's output, a stopped
    agent's as far as it got. Each agent writes to a file, which no reader must keep up with. Nothing of
    the launch outlives the call: an agent still running is stopped with SIGTERM, which it passes on to
    its ranks (giving them TORCHRUN_CLOSE_SECONDS), then SIGKILL; its ranks, each in a session of its own
    out of reach of the agent's group, are listed before the stop and killed if still there after it.
    benchmarks/script_stress.py runs the same launch many times."""
    from fourcard_helpers.lifecycle import GRACE_SECONDS, alive, descendants, stop

    env = plain_environment(base_env, **(extra_env or {}))
    with tempfile.TemporaryDirectory(prefix="fourcard-plain-") as logs:
        outputs = [Path(logs, f"agent{index}.log") for index in range(nnodes)]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for agent, output in zip(plain_torchrun(nproc, nnodes), outputs):
                with open(output, "wb") as out:
                    procs.append(subprocess.Popen(plain_torchrun_command(agent, script), cwd=NOTEBOOK_DIR, env=env,
                                                  stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                                  start_new_session=True))
                PLAIN_LAUNCHES.add(procs[-1])
            codes: list[int | None] = []
            deadline = time.monotonic() + timeout + 60  # the script's own timeout, with a margin, for the whole launch
            for proc in procs:
                try:
                    codes.append(proc.wait(timeout=max(deadline - time.monotonic(), 1)))
                except subprocess.TimeoutExpired:
                    codes.append(None)
        finally:
            ranks = descendants(proc.pid for proc in procs if proc.poll() is None)  # before their agents are stopped
            stop(procs, lambda: [pid for pid in ranks if alive(pid)], grace=TORCHRUN_CLOSE_SECONDS + GRACE_SECONDS)
            PLAIN_LAUNCHES.difference_update(procs)
        return codes, "".join(output.read_text(encoding="utf-8", errors="replace") for output in outputs)


# Two learners may run the same script on one machine: one that keeps files in the temporary folder runs twice
# side by side (tests/lessons/test_scripts.py), each run with a folder of its own.
SHARED_RUNS = 2


def writes_temporary_files(script: str) -> bool:
    """Whether a script keeps files in the temporary folder (checkpoints: 05's recipe and its evaluation,
    12's FSDP save and load, 13's 2 × 2 save and DCP load), where two learners' runs must not collide."""
    return re.search(r"\btempfile\b|\bgettempdir\b|\bTMPDIR\b", (NOTEBOOK_DIR / script).read_text()) is not None


def launch_shipped_script(script: str, nproc: int, nnodes: int, timeout: float, fails: bool, temp_dirs: list[Path],
                          side_by_side: ThreadPoolExecutor, stopping: threading.Event,
                          base_env: Mapping[str, str] | None = None) -> list[tuple[list[int | None], str]]:
    """A shipped script launched as a learner launches it (run_with_plain_torchrun): once; SHARED_RUNS times,
    started side by side, for one that keeps files in the temporary folder, run N with `temp_dirs[N]` as its
    TMPDIR (run N of one script finds what run N of the script before it left: a checkpoint saved, then
    loaded). A staged failure fails by design: once is enough. Launches of several agents run one after
    another, because their rendezvous port is chosen before the agents start, and none starts once `stopping`
    is set. Each launch's exit codes and output. The runs side by side wait in the threads of `side_by_side`
    (SHARED_RUNS of them)."""
    runs = SHARED_RUNS if writes_temporary_files(script) and not fails else 1

    def launch(run: int) -> tuple[list[int | None], str]:
        return run_with_plain_torchrun(script, nproc, nnodes, timeout, {"TMPDIR": str(temp_dirs[run])}, base_env)

    if nnodes > 1 or runs == 1:
        return [launch(run) for run in range(runs) if not stopping.is_set()]
    return list(side_by_side.map(launch, range(runs)))


# -- an ordinary user ---------------------------------------------------------------------------------
# What a learner's machine is and this one is not (tests/lessons/test_hostile_conditions.py says why each):
# lesson 00 meets all of it in its run under another rounding (tests/lessons/conftest.py).
ACCOUNT, HOME, LOCALE, ONE_CORE = ("a learner's account", "a home folder named with a space and Chinese characters",
                                   "a Chinese locale", "one core")
LEARNERS_HOME, LOCALE_NAME = "我的 课程", "zh_CN.UTF-8"


def missing_for_a_learners_machine() -> dict[str, str]:
    """The conditions above this machine cannot give, each with what it lacks for it: taskset (util-linux) for one
    core, the locale for a Chinese one (Debian: the locales package, zh_CN.UTF-8 generated; .ci/run does both)."""
    listed = subprocess.run(["locale", "-a"], capture_output=True, text=True).stdout.lower().split()
    return {**({} if shutil.which("taskset") else {ONE_CORE: "taskset (util-linux)"}),
            **({} if LOCALE_NAME.lower().replace("utf-8", "utf8") in listed else {LOCALE: f"the locale {LOCALE_NAME}"})}


def learners_machine(notebook: Path) -> tuple[str, ...]:
    """What of a learner's machine the lesson's run meets besides another rounding: lesson 00 every condition
    above that this machine can give (test_hostile_conditions.py fails in CI, and skips elsewhere, for the
    others); lesson 12b, the practice cluster's, a learner's account where the suite runs as root (its daemons
    run as whoever runs it: root's run of the suite and this one cover both)."""
    if notebook == NOTEBOOKS[0]:
        missing = missing_for_a_learners_machine()
        return tuple(condition for condition in (ACCOUNT, HOME, LOCALE, ONE_CORE) if condition not in missing)
    return (ACCOUNT,) if needs_slurm(notebook) and os.geteuid() == 0 else ()


AS_NOBODY = ["runuser", "-u", "nobody", "--"]  # runuser drops root's rights as a login would


def python_for_nobody(env: dict[str, str]) -> str:
    """An interpreter `nobody` may run that imports this environment's packages; sets PYTHONPATH if needed."""
    if subprocess.run([*AS_NOBODY, sys.executable, "-c", "pass"], capture_output=True).returncode == 0:
        return sys.executable
    system = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/bin:/usr/local/bin")
    if system is None:
        pytest.skip(f"this Python is out of the ordinary user's reach and no system Python "
                    f"{sys.version_info.major}.{sys.version_info.minor} exists")
    env[PYTHONPATH_ENV] = os.pathsep.join([*site.getsitepackages(), str(ROOT)])
    return system


def venv_for_nobody(scratch: Path) -> str:
    """A virtual environment `nobody` may run, with this one's packages and programs (python_for_nobody's
    PYTHONPATH is not enough where something activates the environment: lesson 12b's batch file does, on every
    node): this one where that user may run its interpreter; where it lies in root's home, out of their reach,
    one made in `scratch` from the system's Python of the same version, as a learner's own would be."""
    if subprocess.run([*AS_NOBODY, sys.executable, "-c", "pass"], capture_output=True).returncode == 0:
        return sys.executable
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/bin:/usr/local/bin")
    if system is None:
        raise RuntimeError(f"an environment for nobody: this Python is out of that user's reach, and no system {version} exists")
    venv = scratch / "venv"
    subprocess.run([system, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    (site_packages,) = venv.glob("lib/python*/site-packages")
    (site_packages / "fourcards.pth").write_text(  # addsitedir: their own .pth files too (the course's editable install)
        "".join(f"import site; site.addsitedir({folder!r})\n" for folder in site.getsitepackages()))
    for program in Path(sys.prefix, "bin").iterdir():  # the packages' programs (torchrun, py-spy), as pip would install them
        own = venv / "bin" / program.name
        if own.exists() or own.is_symlink() or not program.is_file():
            continue
        text = program.read_bytes()
        if text.startswith(b"#!") and b"python" in text.split(b"\n", 1)[0]:  # a script: started by the learner's Python
            own.write_bytes(b"#!" + str(venv / "bin" / "python").encode() + b"\n" + text.split(b"\n", 1)[1])
            own.chmod(0o755)
        else:
            own.symlink_to(program)
    return str(venv / "bin" / "python")
