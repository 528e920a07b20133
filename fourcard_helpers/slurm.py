"""A practice SLURM cluster on this one machine: a controller and N nodes, started without root.

SLURM is where a learner goes when one machine's cards are no longer enough, and a first job on a
real cluster is where a day gets lost. Lesson 12's batch file runs here for real: SLURM's own
daemons (`munged` for authentication, `slurmctld` the controller, one `slurmd` per node), each node
a name with its own port, its share of the machine's cores and memory, and the address 127.0.0.1, on
which alone the daemons listen (as root, `up --own-addresses` gives the controller and each node an
address of its own instead, as a real cluster's machines have; only the network is separate, the nodes still
share the hostname, process ids and files: see _make_network). Everything is in one
folder the learner owns, except munge's socket, which must be open to all (see _munge_dir), and what
every user's clusters share in /tmp/fourcards-slurm.

    python -m fourcard_helpers.slurm up [--nodes 2] [--dir DIR] [--own-addresses]   # prints: export SLURM_CONF=...
    python -m fourcard_helpers.slurm status [--dir DIR]
    python -m fourcard_helpers.slurm down [--dir DIR]

or, from Python, a cluster that is stopped when the block ends, and also if the kernel dies:

    with practice_cluster(nodes=2) as cluster:
        subprocess.run(["sbatch", ...], env=cluster.environment())

`down` cancels every job, stops exactly the daemons `up` started (by pid, recorded in the folder, and
only while the process still carries the cluster's mark), then kills what a job left running if the
controller could not end it: each of this cluster's `slurmstepd` processes and everything under it.
With GPUs (`/dev/nvidia0`, ...), each node gets an equal share of them as a GRES, so that a batch file's
`--gpus-per-node` works unchanged. Several practice clusters may run at once (the tests and a lesson, say):
each numbers its jobs from a block of its own, since lesson 12's file takes its rendezvous port from the
job id. Needs Debian's or Ubuntu's `slurm-wlm munge` (SLURM 22.05 tried); nothing but `--own-addresses`
needs root. A job's history: `sacct --completion` (no accounting database, SLURM's slurmdbd, runs here).
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import pwd
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from .language import N_, _
from .lifecycle import (GRACE_SECONDS, KernelPipe, carries, command_line, descendants, first_dead, free_ports,
                        marked_processes, memory_mb, pids as all_pids, stop, wait_for_kernel_death, wait_until)
from .rundir import SLURM_CONF_ENV, SLURM_ENV

__all__ = ["Cluster", "ClusterError", "practice_cluster", "up", "down", "status", "missing_programs"]

DEFAULT_DIR = Path.home() / ".fourcards" / "slurm"
MARK_ENV = SLURM_ENV  # every daemon carries it (value: the cluster's folder); what `down` looks for last
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
INSTALL_HINT = N_("install SLURM and munge: on Debian or Ubuntu `sudo apt-get install slurm-wlm munge`; "
                  "elsewhere your system's slurm and munge packages")
PARTITION = "practice"
IDLE_TIMEOUT = 60.0  # bounds only a node that never comes up; the wait itself ends on `sinfo` saying idle
# Lesson 12's batch file listens for its rendezvous on port 20000 + job id % 10000, one port per job on a real
# cluster. Practice clusters on one machine would all number their jobs from 1: each takes a block of its own.
JOB_ID_BLOCK, JOB_ID_BLOCKS = 1000, 10
# What all users' clusters share (see _shared_dir). A fixed name on purpose: every user must find the same folder,
# whatever their $TMPDIR; /tmp is the one folder open to all on every Linux machine.
SHARED_DIR = Path("/tmp/fourcards-slurm")
# A job step's credential is good for CRED_EXPIRE seconds (SLURM: 120): slurm.conf's manual asks for time to
# load the user's environment, run a prolog and survive a paged-out slurmd before the step starts. A requeued
# job also waits as long before it starts again, which lesson 12b waits for once, within its 120 s. The practice
# cluster runs no prolog: 10 s is ample for the rest on one machine, also a busy one (the tests and 12b ran
# under load averages of 8 to 17 on two cores).
CRED_EXPIRE = 10
KILL_WAIT = 5  # seconds SLURM gives a cancelled job's processes between SIGTERM and SIGKILL (slurm.conf's KillWait)


class ClusterError(RuntimeError):
    """What went wrong, the likely cause and what to do, in words a learner can act on."""


@dataclass(frozen=True)
class Cluster:
    """A running practice cluster: its folder, nodes and the pids of the daemons it started."""

    dir: Path
    nodes: tuple[str, ...]
    pids: dict[str, int]  # daemon name ("munged", "slurmctld", "slurmd n1", ...) -> pid
    first_job_id: int = 1  # this cluster's jobs are numbered from here
    gpus_per_node: int = 0  # each node's share of the machine's GPUs, as the GRES gpu
    munge_dir: Path | None = None  # the folder of munge's socket, outside `dir` (see _munge_dir)
    addresses: dict[str, str] | None = None  # own addresses: "controller" and each node's (see _make_network)
    namespaces: dict[str, str] | None = None  # own addresses: the network namespace of each (same keys)

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    def environment(self) -> dict[str, str]:
        """This process's environment with SLURM_CONF naming the cluster: for sbatch, squeue, ..."""
        return {**os.environ, SLURM_CONF_ENV: str(self.conf)}

    def job_processes(self) -> list[int]:
        """The pids of every process this cluster's jobs are running now (their job steps and all below)."""
        return _job_processes(self.dir)

    def run(self, *command: str) -> str:
        """Run a SLURM command (`cluster.run("squeue")`) against this cluster; its output, or an error that shows it."""
        done = subprocess.run(command, capture_output=True, text=True, env=self.environment())
        if done.returncode:
            raise ClusterError(_("`{command}` failed: {said}").format(command=" ".join(command),
                                                                      said=(done.stderr or done.stdout).strip()))
        return done.stdout


def program(name: str) -> str | None:
    """The path of a SLURM or munge program. Daemons live in sbin, which an ordinary user's PATH may lack."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"]))


def missing_programs() -> list[str]:
    """The SLURM and munge programs this machine lacks (empty when the practice cluster can run)."""
    return [name for name in PROGRAMS if program(name) is None]


def _ours(pid: int, folder: Path) -> bool:
    """Whether `pid` runs and is a daemon of this cluster: after a reboot a recorded pid may be anyone's."""
    return carries(pid, MARK_ENV, str(folder))


def _job_processes(folder: Path) -> list[int]:
    """This cluster's `slurmstepd` processes (slurmd gives each the cluster's SLURM_CONF) and all below them."""
    conf = str(folder / "slurm.conf")
    return descendants(pid for pid in all_pids() if carries(pid, SLURM_CONF_ENV, conf)
                       and command_line(pid)[:1] and command_line(pid)[0].startswith("slurmstepd"))


def _state_file(folder: Path) -> Path:
    return folder / "cluster.json"


def _read_state(folder: Path) -> Cluster | None:
    try:
        state = json.loads(_state_file(folder).read_text())
    except (OSError, ValueError):
        return None
    return Cluster(dir=folder, nodes=tuple(state["nodes"]), pids=dict(state["pids"]),
                   first_job_id=state.get("first_job_id", 1), gpus_per_node=state.get("gpus_per_node", 0),
                   munge_dir=Path(state["munge_dir"]) if state.get("munge_dir") else None,
                   addresses=state.get("addresses"), namespaces=state.get("namespaces"))


def gpu_files() -> list[str]:
    """This machine's NVIDIA GPUs, as their device files in number order (none without a GPU)."""
    found = Path("/dev").glob("nvidia[0-9]*")
    return [str(path) for path in sorted(found, key=lambda path: int(path.name.removeprefix("nvidia")))]


def _share(files: list[str], nodes: list[str]) -> dict[str, list[str]]:
    """An equal share of the GPUs for each node, in order (what does not divide evenly is left out)."""
    each = len(files) // len(nodes)
    return {name: files[i * each:(i + 1) * each] for i, name in enumerate(nodes)}


def _shared_dir() -> Path:
    """The folder every user's practice clusters meet in: the machine lock, the job-id claims, munge's sockets.
    A fixed place, not $TMPDIR (which each user may set apart), open to all as /tmp is (sticky: each removes
    only their own files)."""
    try:
        SHARED_DIR.mkdir(mode=0o1777, exist_ok=True)
        if SHARED_DIR.stat().st_uid == os.geteuid():
            SHARED_DIR.chmod(0o1777)  # mkdir's mode passes through the umask
    except OSError as error:
        raise ClusterError(_("cannot use {folder}, where practice clusters of every user on this machine take their "
                             "job ids: {error}. Ask whoever owns it to make it writable by all (chmod 1777).").format(
                                 folder=SHARED_DIR, error=error)) from error
    if not os.access(SHARED_DIR, os.W_OK | os.X_OK):
        raise ClusterError(_("{folder} is not writable by you: practice clusters of every user on this machine take "
                             "their job ids there. Ask whoever owns it to make it writable by all (chmod 1777).").format(
                                 folder=SHARED_DIR))
    return SHARED_DIR


@contextmanager
def _machine_lock() -> Iterator[None]:
    """One `up` at a time on this machine, whoever runs it (learners may share a server): each sees the
    job-id blocks claimed before it. An flock, which the system releases when its holder dies, however it dies."""
    fd = os.open(_shared_dir() / "up.lock", os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _claim(first_job_id: int) -> Path:
    """The machine-wide claim of the block of job ids from `first_job_id`: the pid file of the controller
    that numbers its jobs from there. slurmctld holds a lock on its pid file (fcntl's, which the system
    releases when the process ends, however it ends): the block is held exactly as long as it runs."""
    return _shared_dir() / f"jobs-{first_job_id}.pid"


def _record(first_job_id: int) -> Path:
    """Which cluster folder claimed the block (for people, and the tests): the lock is what counts."""
    return _shared_dir() / f"jobs-{first_job_id}.json"


def _locked(path: Path) -> bool:
    """Whether a process holds a lock on `path` now. Asks without taking one (F_GETLK): a lock taken, even for
    a moment, could make a controller starting just then fail to lock its pid file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        asked = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        return struct.unpack("hhqqi4x", fcntl.fcntl(fd, fcntl.F_GETLK, asked))[0] != fcntl.F_UNLCK
    finally:
        os.close(fd)


def claimed_blocks() -> dict[str, int]:
    """The job-id blocks running practice clusters hold now, whoever runs them: {cluster folder: first job id}."""
    held = {}
    for first in (1 + JOB_ID_BLOCK * k for k in range(JOB_ID_BLOCKS)):
        if _locked(_claim(first)):
            try:
                held[json.loads(_record(first).read_text())["folder"]] = first
            except (OSError, ValueError, KeyError):
                held[_("(unknown, jobs from {first})").format(first=first)] = first
    return held


def _claim_job_ids(folder: Path) -> int:
    """A block of job ids no other running practice cluster on this machine has, whoever runs it: the first
    id. Chosen under the machine lock, and held from the moment this cluster's controller starts, also under
    it. The blocks are taken in turn, after the one the last cluster took: a new cluster's first job does not
    get the rendezvous port of the last cluster's first job, which may not be free yet."""
    last = _shared_dir() / "last-block"
    try:
        after = int(last.read_text())
    except (OSError, ValueError):
        after = JOB_ID_BLOCKS - 1
    for k in ((after + 1 + i) % JOB_ID_BLOCKS for i in range(JOB_ID_BLOCKS)):
        first = 1 + JOB_ID_BLOCK * k
        claim = _claim(first)
        if _locked(claim) or (claim.exists() and not os.access(claim, os.W_OK)):
            continue  # a running cluster's, or a file another user left, which our controller could not write
        for path, text in ((_record(first), json.dumps({"folder": str(folder)})), (last, str(k))):
            try:
                with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666), "w") as out:
                    _open_to_all(out.fileno())
                    out.write(text)
            except OSError:
                pass  # another user's file we may not write: both are courtesies, the controller's lock counts
        return first
    raise ClusterError(_("{count} practice clusters already run on this machine: stop one with "
                         "`python -m fourcard_helpers.slurm down --dir ...` first.").format(count=JOB_ID_BLOCKS))


def _release_job_ids(first_job_id: int, folder: Path) -> None:
    """Remove the stopped controller's pid file and the record, if ours: a file of ours left in the shared
    folder would keep another user's controller from writing it, and so from that block."""
    claim, record = _claim(first_job_id), _record(first_job_id)
    try:
        if claim.stat().st_uid == os.geteuid() and not _locked(claim):
            claim.unlink()  # the controller removes it when it stops, not when it is killed
    except OSError:
        pass
    try:
        if json.loads(record.read_text()).get("folder") == str(folder):
            record.unlink()
    except (OSError, ValueError):
        pass


def _open_to_all(fd: int) -> None:
    """Let every user write a shared file we made (the umask may have taken that away); others' we leave."""
    if os.fstat(fd).st_uid == os.geteuid():
        os.fchmod(fd, 0o666)


def _write_conf(folder: Path, nodes: list[str], cpus: int, memory: int, first_job_id: int, gpus: dict[str, list[str]],
                munge_socket: Path, addresses: dict[str, str] | None) -> None:
    user = pwd.getpwuid(os.geteuid()).pw_name  # who runs `up`, not what $USER says
    host = socket.gethostname()
    address = (addresses or {}).get
    # free in this machine's namespace; in a namespace of the cluster's own, nothing else listens
    controller_port, *node_ports = free_ports(1 + len(nodes))
    lines = [
        "# Written by `python -m fourcard_helpers.slurm up`: a practice cluster on one machine.",
        "ClusterName=fourcards",
        f"SlurmctldHost={host}({address('controller', '127.0.0.1')})",
        f"SlurmctldPort={controller_port}",
        f"SlurmUser={user}",  # the learner runs every daemon: no root
        f"SlurmdUser={user}",
        "AuthType=auth/munge",
        # cred_expire: how long a job step's credential is good for, 120 s by default; a step must start within it,
        # and a requeued job waits that long before it may start again. CRED_EXPIRE here (see there).
        f"AuthInfo=socket={munge_socket},cred_expire={CRED_EXPIRE}",
        # every daemon listens on the address the cluster gives it, not on every interface
        "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool' / '%n'}",
        f"SlurmctldPidFile={_claim(first_job_id)}",  # its lock is the claim of the job ids (see _claim)
        f"SlurmdPidFile={folder / 'run' / 'slurmd.%n.pid'}",
        f"SlurmctldLogFile={folder / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'log' / 'slurmd.%n.log'}",
        "ProctrackType=proctrack/linuxproc",  # no cgroups: a learner's laptop or a container may not let us have them
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        # cores and memory are what a job is given (and refused beyond): `--cpus-per-task` and `--mem` as on a
        # real cluster; a job that names no memory gets its cores' share of the node's
        "SelectTypeParameters=CR_Core_Memory",
        f"DefMemPerCPU={memory // cpus}",
        "SchedulerType=sched/backfill",
        # every 2 s rather than SLURM's 60 (main loop) and 30 (backfill): a requeued job starts again as soon as it may
        "SchedulerParameters=sched_interval=2,bf_interval=2",
        "MpiDefault=none",
        "ReturnToService=2",  # a node that was down (its slurmd stopped) takes jobs again once it is back
        "SlurmdTimeout=30",  # a node whose slurmd stopped answering is marked down after 30 s (SLURM: 300)
        f"KillWait={KILL_WAIT}",  # a cancelled job's processes get 5 s between SIGTERM and SIGKILL (SLURM: 30)
        "MinJobAge=3600",  # a finished job's record stays an hour (SLURM: 300 s), for a learner who pauses
        "AccountingStorageType=accounting_storage/none",  # no slurmdbd, SLURM's accounting database
        "JobAcctGatherType=jobacct_gather/none",
        # instead, a line for each job that ends, in a text file that `sacct --completion` reads
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={folder / 'log' / 'jobcomp.txt'}",
        f"FirstJobId={first_job_id}",  # this cluster's own block of ids (see JOB_ID_BLOCK)
        f"MaxJobId={first_job_id + JOB_ID_BLOCK - 1}",  # after the block, SLURM numbers from FirstJobId again
    ]
    if any(gpus.values()):
        lines += ["GresTypes=gpu", f"TaskProlog={folder / 'task_prolog.sh'}"]
        _write_task_prolog(folder, gpus)
    for name, port in zip(nodes, node_ports):
        gres = f" Gres=gpu:{len(gpus[name])}" if gpus[name] else ""
        lines.append(f"NodeName={name} NodeHostname={host} NodeAddr={address(name, '127.0.0.1')} Port={port} CPUs={cpus} RealMemory={memory}{gres} State=UNKNOWN")
    lines.append(f"PartitionName={PARTITION} Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP")
    (folder / "slurm.conf").write_text("\n".join(lines) + "\n")
    # gres.conf, beside slurm.conf: which device files are each node's GPUs. SLURM numbers them from 0 on every
    # node in the tasks' CUDA_VISIBLE_DEVICES; the task prolog turns those numbers into the node's own cards.
    gres = ["AutoDetect=off"] + [f"NodeName={name} Name=gpu File={file}" for name in nodes for file in gpus[name]]
    (folder / "gres.conf").write_text("\n".join(gres) + "\n")


def _write_task_prolog(folder: Path, gpus: dict[str, list[str]]) -> None:
    """SLURM numbers each node's GPUs from 0 (CUDA_VISIBLE_DEVICES, and SLURM_JOB_GPUS, SLURM_STEP_GPUS,
    GPU_DEVICE_ORDINAL beside it), right on a real cluster, where each node is a machine of its own. Here every
    node is this one machine, and n2's tasks would get n1's cards: the prolog, which SLURM runs before each task
    and whose `export` lines set the task's environment, gives the node's own."""
    cards = " ".join(f'[{name}]="{" ".join(Path(f).name.removeprefix("nvidia") for f in files)}"'
                     for name, files in gpus.items())
    prolog = folder / "task_prolog.sh"
    prolog.write_text(TASK_PROLOG.replace("@CARDS@", cards))
    prolog.chmod(0o755)


TASK_PROLOG = """#!/bin/bash
# Written by `python -m fourcard_helpers.slurm up`: each node's own GPUs (see _write_task_prolog).
declare -A cards=(@CARDS@)
read -ra own <<< "${cards[$SLURMD_NODENAME]}"
for name in CUDA_VISIBLE_DEVICES SLURM_JOB_GPUS SLURM_STEP_GPUS GPU_DEVICE_ORDINAL; do
    [ -n "${!name}" ] || continue
    IFS=, read -ra given <<< "${!name}"
    mapped=()
    for i in "${given[@]}"; do mapped+=("${own[$i]}"); done
    (IFS=,; echo "export $name=${mapped[*]}")
done
"""

# Own addresses: 198.18.0.0/15 is set aside for testing networks (RFC 2544), so no real network a machine is on
# uses it; each block of job ids (k) gets 198.18.k.0/24, so that clusters running at once do not meet.
NETWORK = "198.18.{k}.{host}"


def _network_names(first_job_id: int, nodes: list[str]) -> tuple[str, dict[str, str]]:
    """The bridge's name and the network namespace of the controller and of each node, from the cluster's block of
    job ids (unique on the machine)."""
    k = (first_job_id - 1) // JOB_ID_BLOCK
    return f"fourcards{k}", {name: f"fourcards{k}-{name}" for name in ["controller", *nodes]}


def _ip(*args: str) -> None:
    done = subprocess.run([program("ip") or "ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise ClusterError(_("`{command}` failed: {said}. Each node's own address needs network namespaces (root, and "
                             "a kernel that allows them); without --own-addresses every node has the address "
                             "127.0.0.1.").format(command=" ".join(["ip", *args]), said=done.stderr.strip()))


def _make_network(folder: Path, first_job_id: int, nodes: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The controller and each node in a network namespace of its own, as machines of their own: each its own
    address, on an interface eth0 joined by a virtual Ethernet pair to a bridge (the cluster's switch) in this
    machine's namespace, from which the learner submits, as from a login node. Only what runs in a node's
    namespace sees its address: slurmd, the jobs it starts, their torchrun and ranks. Each also has a /etc/hosts
    of its own (_in_node), which resolves this machine's name to its own address, as a real node's does:
    slurmctld (NoCtldInAddrAny) and `srun` (NoInAddrAny) listen there, and gloo finds its interface by it.
    Needs root (`ip netns`).
    Returns the addresses and the namespaces, of "controller" and of each node."""
    if os.geteuid() != 0 or not all(map(program, ("ip", "nsenter", "unshare"))):
        raise ClusterError(_("each node's own address needs root and the programs `ip`, `nsenter` and `unshare` "
                             "(network namespaces; Debian's iproute2 and util-linux): run `up` as root, or without "
                             "--own-addresses, where every node has the address 127.0.0.1."))
    bridge, namespaces = _network_names(first_job_id, nodes)
    k = (first_job_id - 1) // JOB_ID_BLOCK
    _remove_network(bridge, namespaces)  # what a cluster of this block left when it was killed without `down`
    addresses = {"controller": NETWORK.format(k=k, host=1),
                 **{name: NETWORK.format(k=k, host=11 + i) for i, name in enumerate(nodes)}}
    _ip("link", "add", bridge, "type", "bridge")
    _ip("addr", "add", f"{NETWORK.format(k=k, host=254)}/24", "dev", bridge)  # the login node's address
    _ip("link", "set", bridge, "up")
    for name, namespace in namespaces.items():
        _ip("netns", "add", namespace)
        end = f"{bridge}{name[:5]}"  # this machine's end of the node's cable, on the bridge (15 characters at most)
        _ip("link", "add", end, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _ip("link", "set", end, "master", bridge, "up")
        _ip("-n", namespace, "addr", "add", f"{addresses[name]}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
    login = NETWORK.format(k=k, host=254)
    for own in namespaces:  # every machine of the cluster by its name, as a site's /etc/hosts or DNS has them
        lines = ["127.0.0.1 localhost", f"{login} login"]
        lines += [f"{address} {socket.gethostname()} {name}" if name == own else f"{address} {name}"
                  for name, address in addresses.items()]
        _hosts_file(folder, own).write_text("\n".join(lines) + "\n")
    return addresses, namespaces


def _hosts_file(folder: Path, node: str) -> Path:
    return folder / "etc" / f"hosts.{node}"


def _in_node(folder: Path, node: str, namespace: str) -> list[str]:
    """The command line that runs a command in the node's network namespace with the node's /etc/hosts, in
    the same process (each program execs the next). Not `ip netns exec`, which also mounts a /sys of its own,
    without the cgroup file systems slurmd needs."""
    return [program("nsenter") or "nsenter", f"--net=/var/run/netns/{namespace}",
            program("unshare") or "unshare", "--mount", "--propagation", "private",
            "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(_hosts_file(folder, node))]


def _remove_network(bridge: str, namespaces: dict[str, str]) -> None:
    """Remove the namespaces (their end of each cable goes with them, and so the other end) and the bridge;
    what is not there is skipped."""
    ip = program("ip") or "ip"
    for namespace in namespaces.values():
        subprocess.run([ip, "netns", "delete", namespace], capture_output=True)
    subprocess.run([ip, "link", "delete", bridge], capture_output=True)


def _start(folder: Path, command: list[str], output: Path) -> int:
    """Start one daemon in the foreground of a session of its own (the terminal's Ctrl-C is not its),
    marked with the cluster's folder; its pid. It outlives this process when `up` runs from the shell."""
    env = {**os.environ, MARK_ENV: str(folder)}
    env.pop(SLURM_CONF_ENV, None)  # each daemon reads the file it is given
    with open(output, "ab") as out:
        return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True).pid


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_for(what: str, ready: Callable[[], bool], pids: dict[str, int], logs: dict[str, Path], timeout: float) -> None:
    """Wait until `ready()`; fail at once, with the daemon's log, if a daemon it needs has exited (lifecycle.wait_until)."""
    try:
        name = wait_until(ready, timeout, lambda: first_dead(pids))
    except TimeoutError:
        raise ClusterError(_("{what}: not after {seconds} s. The logs end:").format(what=what, seconds=f"{timeout:.0f}")
                           + "\n" + "\n".join(f"--- {n}\n{_tail(logs[n])}" for n in pids)) from None
    if name is not None:
        log = _tail(logs[name])
        likely = (_("Another program took its port after `up` chose it: run `up` again, it picks free ports.")
                  if "Address already in use" in log else "")
        raise ClusterError(" ".join(filter(None, [_("{name} stopped while starting (waiting for {what}).").format(
            name=name, what=what), likely, _("Its log ends:")])) + "\n" + log)


def status(folder: Path = DEFAULT_DIR) -> Cluster | None:
    """The cluster running from `folder`, or None."""
    folder = Path(folder).expanduser().resolve()
    cluster = _read_state(folder)
    if cluster is None or not all(_ours(pid, folder) for pid in cluster.pids.values()):
        return None
    return cluster


def up(nodes: int = 2, folder: Path = DEFAULT_DIR, cpus: int | None = None, gpus: list[str] | None = None,
       own_addresses: bool = False) -> Cluster:
    """Start a practice cluster of `nodes` nodes in `folder` and wait until every node is idle.

    `cpus`: each node's cores (default: an equal share of this machine's, at least one); each node also gets
    an equal share of its memory. `gpus`: the GPU device files to share among the nodes (default: this
    machine's, `gpu_files()`). The shares are what SLURM gives out, as on a real cluster whose nodes are
    machines of their own: a job asking for more cores or memory than a node has is refused.
    `own_addresses` (root only): each node at an address of its own, in a network namespace of its own
    (_make_network), as on a real cluster, though they share hostname, process ids and files; by default every node
    has the address 127.0.0.1."""
    if missing := missing_programs():
        raise ClusterError(_("this machine lacks {programs}: {hint}.").format(programs=", ".join(missing),
                                                                          hint=_(INSTALL_HINT)))
    folder = Path(folder).expanduser().resolve()
    with _machine_lock():
        return _up(nodes, folder, cpus or max(1, (os.cpu_count() or 1) // nodes), max(1, _memory_mb() // nodes),
                   gpu_files() if gpus is None else gpus, own_addresses)


def _memory_mb() -> int:
    """This machine's memory in MB, as slurmd counts it (MemTotal)."""
    if not (memory := memory_mb()):
        raise ClusterError(_("cannot read this machine's memory (MemTotal), which SLURM shares among the nodes"))
    return memory


def _munge_dir() -> Path:
    """A folder for munge's socket that munged accepts without --force: every folder above the socket must
    let everyone through (execute permission), as its clients, whoever they are, must reach it to ask for a
    credential, which names them. A learner's home is often closed to others (0700, 0750), so the socket
    lives in the shared folder; its key and everything else stay in the cluster's folder, the learner's alone."""
    made = Path(tempfile.mkdtemp(prefix="munge-", dir=_shared_dir()))
    made.chmod(0o711)
    return made


def _up(nodes: int, folder: Path, cpus: int, memory: int, gpus: list[str], own_addresses: bool) -> Cluster:
    if status(folder) is not None:
        raise ClusterError(_("a practice cluster already runs from {folder}: use it, or stop it first with "
                             "`python -m fourcard_helpers.slurm down --dir {folder}`.").format(folder=folder))
    if _read_state(folder) is not None:  # a cluster whose processes died, or were killed, without `down`
        down(folder)
    for part in ("munge", "state", "spool", "run", "log", "etc"):
        shutil.rmtree(folder / part, ignore_errors=True)
        (folder / part).mkdir(parents=True, mode=0o700)
    folder.chmod(0o700)
    names = [f"n{i + 1}" for i in range(nodes)]
    for name in names:
        (folder / "spool" / name).mkdir()
    first_job_id, share, munge_dir = _claim_job_ids(folder), _share(gpus, names), _munge_dir()
    socket_path = munge_dir / "munge.socket"
    addresses = namespaces = None
    key = folder / "munge" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)  # munged refuses a key that others can read, in a folder others can write
    logs = {"munged": folder / "log" / "munged.log", "slurmctld": folder / "log" / "slurmctld.log",  # in the foreground
            # munged writes its log to its standard error; slurmctld and slurmd to the files slurm.conf names
            **{f"slurmd {n}": folder / "log" / f"slurmd.{n}.log" for n in names}}
    conf = str(folder / "slurm.conf")
    pids: dict[str, int] = {}

    def save() -> None:
        _save(folder, names, pids, first_job_id, len(share[names[0]]), munge_dir, addresses, namespaces)

    try:
        save()  # from here, `down` finds the socket's folder
        if own_addresses:
            namespaces = _network_names(first_job_id, names)[1]
            save()  # from here, `down` removes the network, also one half made
            addresses, namespaces = _make_network(folder, first_job_id, names)
            save()
        _write_conf(folder, names, cpus, memory, first_job_id, share, socket_path, addresses)
        pids["munged"] = _start(folder, [
            program("munged"), "--foreground", f"--socket={socket_path}", f"--key-file={key}",
            f"--pid-file={folder / 'run' / 'munged.pid'}", f"--seed-file={folder / 'munge' / 'munged.seed'}"],
            logs["munged"])
        save()
        _wait_for(_("munged's socket"), socket_path.exists, pids, logs, IDLE_TIMEOUT)
        # it locks its pid file, the claim of the block of job ids, for as long as it runs
        inside = _in_node(folder, "controller", namespaces["controller"]) if namespaces else []  # the same pid
        pids["slurmctld"] = _start(folder, [*inside, program("slurmctld"), "-D", "-i", "-f", conf],
                                   folder / "log" / "slurmctld.out")
        save()
        for name in names:
            inside = _in_node(folder, name, namespaces[name]) if namespaces else []  # the same pid
            pids[f"slurmd {name}"] = _start(folder, [*inside, program("slurmd"), "-D", "-N", name, "-f", conf],
                                            folder / "log" / f"slurmd.{name}.out")
            save()
        cluster = Cluster(dir=folder, nodes=tuple(names), pids=dict(pids), first_job_id=first_job_id,
                          gpus_per_node=len(share[names[0]]), munge_dir=munge_dir, addresses=addresses,
                          namespaces=namespaces)
        _wait_for(_("every node idle"), lambda: _all_idle(cluster), pids, logs, IDLE_TIMEOUT)
    except BaseException:
        down(folder)
        shutil.rmtree(munge_dir, ignore_errors=True)  # also when `down` found no record
        _release_job_ids(first_job_id, folder)
        raise
    return cluster


def _save(folder: Path, names: list[str], pids: dict[str, int], first_job_id: int, gpus_per_node: int,
          munge_dir: Path, addresses: dict[str, str] | None, namespaces: dict[str, str] | None) -> None:
    """Record each pid as soon as it exists: a `down` after any failure finds every daemon (and the network)."""
    temporary = _state_file(folder).with_suffix(".tmp")
    temporary.write_text(json.dumps({"nodes": names, "pids": pids, "first_job_id": first_job_id,
                                     "gpus_per_node": gpus_per_node, "munge_dir": str(munge_dir),
                                     "addresses": addresses, "namespaces": namespaces}, indent=1))
    temporary.replace(_state_file(folder))


def _all_idle(cluster: Cluster) -> bool:
    done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True,
                          env=cluster.environment())
    states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
    return done.returncode == 0 and all(states.get(name) == "idle" for name in cluster.nodes)


def _jobs_ended(env: dict[str, str]) -> bool:
    jobs = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True)
    return bool(jobs.returncode or not jobs.stdout.strip())


def down(folder: Path = DEFAULT_DIR, grace: float = GRACE_SECONDS) -> bool:
    """Stop the cluster of `folder`: cancel its jobs, stop its daemons by pid, then what its jobs left running,
    each with lifecycle.py's one stop sequence.

    True if there was a cluster to stop. Raises ClusterError naming any process it could not stop.
    Leaves the folder's logs; removes its state, sockets and pid files."""
    folder = Path(folder).expanduser().resolve()
    cluster = _read_state(folder)
    if cluster is None:
        return False
    if _ours(cluster.pids.get("slurmctld", -1), folder):
        env = cluster.environment()
        subprocess.run(["scancel", f"--partition={PARTITION}"], env=env, capture_output=True)
        try:  # SLURM ends each job's processes, SIGKILL after KILL_WAIT; wait for it to say so
            wait_until(lambda: _jobs_ended(env), KILL_WAIT + grace)
        except TimeoutError:
            pass  # what is left of the jobs is killed below

    def left() -> list[int]:  # what a job left running (the controller was gone, or the job outlived the wait)
        return _job_processes(folder) + marked_processes(MARK_ENV, str(folder))

    nodes = [name for name in cluster.pids if name.startswith("slurmd")]
    for stage in (nodes, ["slurmctld"], ["munged"]):  # nodes first, the controller, then authentication, which the
        ours = [pid for name in stage if (pid := cluster.pids.get(name)) is not None and _ours(pid, folder)]  # others
        stop(ours, left if stage == ["munged"] else list, grace)  # use to the end; then the jobs' steps and tasks
    for leftover in (folder / "run").glob("*"):
        leftover.unlink(missing_ok=True)
    if cluster.munge_dir is not None:
        shutil.rmtree(cluster.munge_dir, ignore_errors=True)
    if cluster.namespaces:  # after every process in them has ended
        _remove_network(_network_names(cluster.first_job_id, list(cluster.nodes))[0], cluster.namespaces)
    _state_file(folder).unlink(missing_ok=True)
    _release_job_ids(cluster.first_job_id, folder)
    if pids := left():
        raise ClusterError(_("processes of the cluster in {folder} are still running after SIGKILL: {pids}. They may "
                             "belong to another user: stop them as that user, or as root.").format(folder=folder, pids=pids))
    return True


@contextmanager
def practice_cluster(nodes: int = 2, folder: Path | None = None, own_addresses: bool = False) -> Iterator[Cluster]:
    """A practice cluster for a `with` block, stopped when the block ends, also if the kernel dies in it.

    A guard process holds the read end of a pipe whose write end only this process holds
    (lifecycle.KernelPipe): if this process dies, however it dies, even while `up` is still starting the
    daemons, the guard runs `down`, which finds each daemon in the folder's record as soon as it exists."""
    folder = Path(folder).expanduser().resolve() if folder is not None else Path(tempfile.mkdtemp(prefix="fourcards-slurm-"))
    folder.mkdir(parents=True, exist_ok=True)
    pipe = KernelPipe()
    with open(folder / "guard.log", "ab") as log:
        guard = pipe.start([sys.executable, "-m", "fourcard_helpers.slurm", "guard", "--dir", str(folder)],
                           dict(os.environ), log)
    pipe.started()
    try:
        cluster = up(nodes, folder, own_addresses=own_addresses)
        yield cluster
    finally:
        down(folder)
        pipe.close()
        guard.wait()


def _guard(folder: Path) -> None:
    """Wait for the kernel's pipe to close, then stop the cluster (already stopped: nothing to do)."""
    wait_for_kernel_death()
    down(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fourcard_helpers.slurm",
                                     description=_("A practice SLURM cluster on this one machine."))
    parser.add_argument("action", choices=["up", "status", "down", "guard"])
    parser.add_argument("--nodes", type=int, default=2, help=_("nodes for `up` (default 2)"))
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                        help=_("the cluster's folder (default {folder})").format(folder=DEFAULT_DIR))
    parser.add_argument("--own-addresses", action="store_true",
                        help=_("`up`: each node at an address of its own, in a network namespace (root only)"))
    args = parser.parse_args(argv)
    folder = args.dir.expanduser().resolve()
    try:
        if args.action == "up":
            cluster = up(args.nodes, folder, own_addresses=args.own_addresses)
            up_line = (_("practice cluster up: {count} node ({nodes}) idle, folder {folder}") if len(cluster.nodes) == 1
                       else _("practice cluster up: {count} nodes ({nodes}) idle, folder {folder}"))
            cards = (_(", {gpus} GPUs each").format(gpus=cluster.gpus_per_node) if cluster.gpus_per_node else "")
            print(up_line.format(count=len(cluster.nodes), nodes=", ".join(cluster.nodes), folder=folder) + cards)
            print(f"export {SLURM_CONF_ENV}={cluster.conf}")
        elif args.action == "status":
            cluster = status(folder)
            if cluster is None:
                print(_("no practice cluster runs from {folder}").format(folder=folder))
                return 1
            print(cluster.run("sinfo", "-N"), end="")
        elif args.action == "down":
            if not down(folder):
                print(_("no practice cluster to stop in {folder}").format(folder=folder))
                return 1
            print(_("practice cluster in {folder} stopped: no daemon left").format(folder=folder))
        else:
            _guard(folder)
    except ClusterError as error:
        print(_("error: {error}").format(error=error), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
