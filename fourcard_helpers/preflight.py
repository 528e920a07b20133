"""Pre-flight check: can this machine run the course, and on which cards?

    python -m fourcard_helpers.preflight

Instructors run it on every machine of a room before a workshop; a learner runs it once on a
new machine (a laptop, Colab with one GPU, Kaggle with two, a four-GPU workstation). It checks
what the lessons need, in the order a failure would bite: Python and the pinned packages, the
cards `detect()` will pick, the cores each rank gets, the loopback network the ranks meet on,
free disk, then a real four-rank `torchrun` launch that measures an all-reduce, compared with
the published four-GPU figures the lessons use. The last line is the verdict: READY,
READY ON SIMULATED CARDS, or NOT READY with the fix.
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .language import _
from .rundir import DEVICE_ENV

NPROC = 4
ALL_REDUCE_MB = 4  # large enough to measure bandwidth, small enough for a laptop in seconds
MIN_FREE_DISK_GB = 2.0  # the capstone's checkpoints and the shipped data need far less; leave room

# One all-reduce size, timed on every rank after a warm-up; rank 0's median is reported.
BANDWIDTH_SCRIPT = f"""
import os
import statistics
import time

import torch
import torch.distributed as dist

from fourcard_helpers import detect, report, exit_without_teardown

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
x = torch.ones({ALL_REDUCE_MB} * 2**20 // 4, device=device)
times = []
for step in range(8):
    if cards.kind == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    dist.all_reduce(x)
    if cards.kind == "cuda":
        torch.cuda.synchronize()
    if step >= 2:  # the first calls set up connections
        times.append(time.perf_counter() - start)
report(seconds=statistics.median(times), nbytes=x.numel() * 4)
dist.destroy_process_group()
exit_without_teardown()
"""


@dataclass
class Findings:
    """What the checks found: printed lines, and the problems that make the machine not ready."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # each "what is wrong. Fix: how"

    def ok(self, text: str) -> None:
        self.say("✓", text)

    def warn(self, text: str) -> None:
        self.say("!", text)

    def fail(self, text: str, fix: str = "") -> None:
        """A problem that stops the course; `fix` is empty when `text` already says what to do."""
        message = _("{problem}. Fix: {fix}").format(problem=text, fix=fix) if fix else text
        self.say("✗", message)
        self.problems.append(message)

    def say(self, mark: str, text: str) -> None:
        line = f"{mark} {text}"
        self.lines.append(line)
        print(line, flush=True)


def pinned_versions() -> dict[str, str]:
    """Exact pins (`name==version`) the course declares in its package metadata."""
    try:
        requires = importlib.metadata.requires("fourcard-helpers") or []
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return {}
    pins = {}
    for requirement in requires:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^;\s]+)", requirement.strip())
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def check_system(found: Findings, platform: str = sys.platform) -> None:
    """The course runs on Linux only: its launcher finds a launch's leftover ranks in Linux's process table and has each
    rank ask Linux to end it with its torchrun (prctl); elsewhere a failed launch could leave ranks behind."""
    if platform.startswith("linux"):
        found.ok("Linux")
    else:
        found.fail(_("this is {platform}, and the course runs on Linux only").format(platform=platform),
                   _("on Windows, use WSL 2 (a Linux); on macOS, a Linux virtual machine or container"))


def check_python_and_packages(found: Findings) -> None:
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info < (3, 10):
        found.fail(_("Python {version} is too old").format(version=version), _("use Python 3.10 or newer"))
    else:
        found.ok(f"Python {version}")
    pins = pinned_versions()
    if not pins:
        found.warn(_("fourcard-helpers is not installed, so its pins are unknown: run pip install -e . in the course "
                     "folder"))
    for name in ("torch", "numpy", "matplotlib", "ipywidgets", "jupyterlab"):
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found.fail(_("{name} is not installed").format(name=name), _("pip install -e . in the course folder"))
            continue
        want = pins.get(name)
        if want and have.split("+")[0] != want:
            found.warn(_("{name} {have}, but the stored outputs were made with {want}: lessons run, some printed "
                         "numbers may differ (pip install -e . installs {want})").format(name=name, have=have, want=want))
        else:
            found.ok(f"{name} {have}" + (_(" (the pinned version)") if want else ""))


def check_cards(found: Findings):  # -> Cards | None
    from .cards import CardsError, detect

    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for index in range(gpus):
        props = torch.cuda.get_device_properties(index)
        found.ok(_("GPU {index}: {name}, {gib} GiB").format(index=index, name=props.name,
                                                            gib=f"{props.total_memory / 2**30:.0f}"))
    if gpus >= 2:
        peers = [(i, j) for i in range(gpus) for j in range(gpus) if i != j]
        blocked = [(i, j) for i, j in peers if not torch.cuda.can_device_access_peer(i, j)]
        if blocked:
            found.warn(_("peer-to-peer access is off for {blocked} of {pairs} GPU pairs: their traffic goes through "
                         "host memory (usual on consumer cards with stock drivers)").format(
                             blocked=len(blocked), pairs=len(peers)))
        else:
            found.ok(_("peer-to-peer access on between all {gpus} GPUs").format(gpus=gpus))
        topology = gpu_topology()
        if topology:
            found.say(" ", _("nvidia-smi topo -m (NV# = NVLink, PIX/PXB/PHB/NODE/SYS = PCIe paths):"))
            for line in topology.splitlines():
                found.say(" ", f"    {line}")
    try:
        cards = detect(NPROC)
    except CardsError as error:
        found.fail(str(error))  # CardsError says what to do
        return None
    found.ok(_("cards: {cards}").format(cards=cards.describe()))
    if cards.kind == "cpu" and 0 < gpus < NPROC:
        with_gpus = (_("with {gpus} GPU, launches use simulated cards") if gpus == 1 else
                     _("with {gpus} GPUs, launches use simulated cards")).format(gpus=gpus)
        found.say(" ", "    " + with_gpus + _(" (NCCL needs one GPU per rank); single-process cells can still use "
                                              "cuda:0"))
    return cards


def gpu_topology() -> str:
    """`nvidia-smi topo -m`, or '' where it is missing or fails."""
    if not shutil.which("nvidia-smi"):
        return ""
    try:
        result = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return result.stdout.strip() if result.returncode == 0 else ""


def check_cores(found: Findings, cards) -> None:
    cores = os.cpu_count() or 1
    per_rank = max(1, cores // NPROC)
    text = _("{cores} CPU cores: each of {nproc} ranks gets OMP_NUM_THREADS={threads}").format(
        cores=cores, nproc=NPROC, threads=per_rank)
    if cards is not None and cards.kind == "cpu" and cores < 2:
        found.warn(text + _("; with one core, four simulated cards take turns and lessons run slowly"))
    else:
        found.ok(text)


def check_loopback(found: Findings) -> None:
    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            sock.listen(1)
            port = sock.getsockname()[1]
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
    except OSError as error:
        found.fail(_("cannot open a port on 127.0.0.1 ({error})").format(error=error),
                   _("ranks meet on the loopback interface: allow local TCP connections"))
        return
    names = {name for _, name in socket.if_nameindex()} if hasattr(socket, "if_nameindex") else set()
    where = (_(" (interface {name})").format(name="lo" if "lo" in names else "lo0") if names & {"lo", "lo0"} else "")
    found.ok(_("loopback network: a port on 127.0.0.1 opens and accepts a connection{where}").format(where=where))


def check_disk(found: Findings) -> None:
    where = Path(tempfile.gettempdir())
    free = shutil.disk_usage(where).free / 1e9
    if free < MIN_FREE_DISK_GB:
        found.fail(_("only {free} GB free for launches and checkpoints").format(free=f"{free:.1f}"),
                   _("free at least {need} GB (or point TMPDIR at a larger disk)").format(need=f"{MIN_FREE_DISK_GB:g}"))
    else:
        found.ok(_("{free} GB free disk for launches and checkpoints").format(free=f"{free:.0f}"))


def check_launch(found: Findings, cards) -> None:
    """A real four-rank launch, as every lesson does, with an all-reduce measured on the way."""
    from .costmodel import PUBLISHED, bus_bandwidth
    from .launch import LaunchError, torchrun

    started = time.perf_counter()
    try:
        result = torchrun(BANDWIDTH_SCRIPT, nproc=NPROC, timeout=120, echo=False)
    except LaunchError as error:
        found.fail(_("a {nproc}-rank launch failed: {error}").format(nproc=NPROC, error=str(error).splitlines()[0]),
                   _("read the launch's error above; {setting}=cpu rules out the GPUs").format(setting=DEVICE_ENV))
        return
    seconds = time.perf_counter() - started
    found.ok(_("a real {nproc}-rank torchrun launch ran in {seconds} s (start-up included)").format(
        nproc=NPROC, seconds=f"{seconds:.1f}"))
    report = result.reports[0]
    busbw = bus_bandwidth(report["nbytes"], report["seconds"], NPROC)
    found.ok(_("all-reduce of {mb} MB on {cards}: {ms} ms, bus bandwidth {busbw} GB/s").format(
        mb=ALL_REDUCE_MB, cards=re.split(" — |——", cards.describe())[0], ms=f"{report['seconds'] * 1e3:.2f}",
        busbw=f"{busbw:.2f}"))
    for machine in PUBLISHED.values():
        found.say(" ", "    " + _("published, {machine}: {published} GB/s ({ratio}× of it here)").format(
            machine=machine.name, published=f"{machine.busbw_gbs:g}", ratio=f"{busbw / machine.busbw_gbs:.2g}"))


def main() -> int:
    print(_("Four Cards pre-flight check"), flush=True)
    found = Findings()
    check_system(found)
    check_python_and_packages(found)
    cards = check_cards(found)
    check_cores(found, cards)
    check_loopback(found)
    check_disk(found)
    if cards is not None and not found.problems:
        check_launch(found, cards)
    if found.problems:
        print(_("NOT READY: {problem}").format(problem=found.problems[0]), flush=True)
        return 1
    if cards.kind == "cuda":
        print(_("READY: the course will run on {cards}.").format(cards=cards.describe()), flush=True)
    else:
        print(_("READY ON SIMULATED CARDS: {nproc} CPU processes over gloo ({reason}).").format(
            nproc=NPROC, reason=cards.reason), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
