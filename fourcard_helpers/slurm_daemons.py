"""Start and stop a practice cluster's daemons: munged, slurmctld and one slurmd per node.

`up` starts each daemon in a session of its own, marked with the cluster's folder, and records its pid
the moment it exists; `down` stops exactly those, then whatever the jobs left running, with
lifecycle.py's one stop sequence. Whatever fails half-way, `down` finds everything `up` started.
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

from .language import _
from .lifecycle import GRACE_SECONDS, first_dead, marked_processes, memory_mb, start_session, stop, wait_until
from .rundir import SLURM_CONF_ENV, SLURM_ENV
from .slurm_cluster import (DEFAULT_DIR, INSTALL_HINT, Cluster, ClusterError, conf_file, daemon_log, is_ours,
                            job_processes, missing_programs, program, read_state, save_state, state_file)
from .slurm_conf import KILL_WAIT, PARTITION, gpu_files, gpu_shares, write_conf
from .slurm_jobids import SHARED_DIR, claim_job_ids, machine_lock, release_job_ids
from .slurm_network import in_node, make_network, network_names, remove_network

IDLE_TIMEOUT = 60.0  # bounds only a node that never comes up; the wait itself ends on `sinfo` saying idle


def _start(folder: Path, command: list[str], output: Path) -> int:
    """Start one daemon in the foreground of a session of its own (the terminal's Ctrl-C is not its),
    marked with the cluster's folder; its pid. It outlives this process when `up` runs from the shell."""
    env = {**os.environ, SLURM_ENV: str(folder)}
    env.pop(SLURM_CONF_ENV, None)  # each daemon reads the file it is given
    with open(output, "ab") as out:
        return start_session(command, env, out).pid


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
    cluster = read_state(folder)
    if cluster is None or not all(is_ours(pid, folder) for pid in cluster.pids.values()):
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
    (make_network), as on a real cluster, though they share hostname, process ids and files; by default every node
    has the address 127.0.0.1."""
    if missing := missing_programs():
        raise ClusterError(_("this machine lacks {programs}: {hint}.").format(programs=", ".join(missing),
                                                                          hint=_(INSTALL_HINT)))
    folder = Path(folder).expanduser().resolve()
    with machine_lock():
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
    credential, which names them, and be owned by root or by whoever runs munged. A learner's home is often
    closed to others (0700, 0750), and the shared folder belongs to the first user who made it, so the socket
    lives in a folder of its own in /tmp itself (root's, sticky); its key and everything else stay in the
    cluster's folder, the learner's alone."""
    made = Path(tempfile.mkdtemp(prefix="fourcards-munge-", dir=SHARED_DIR.parent))
    made.chmod(0o711)
    return made


def _up(nodes: int, folder: Path, cpus: int, memory: int, gpus: list[str], own_addresses: bool) -> Cluster:
    if status(folder) is not None:
        raise ClusterError(_("a practice cluster already runs from {folder}: use it, or stop it first with "
                             "`python -m fourcard_helpers.slurm down --dir {folder}`.").format(folder=folder))
    if read_state(folder) is not None:  # a cluster whose processes died, or were killed, without `down`
        down(folder)
    for part in ("munge", "state", "spool", "run", "log", "etc"):
        shutil.rmtree(folder / part, ignore_errors=True)
        (folder / part).mkdir(parents=True, mode=0o700)
    folder.chmod(0o700)
    names = [f"n{i + 1}" for i in range(nodes)]
    for name in names:
        (folder / "spool" / name).mkdir()
    first_job_id, share, munge_dir = claim_job_ids(folder), gpu_shares(gpus, names), _munge_dir()
    socket_path = munge_dir / "munge.socket"
    addresses = namespaces = None
    key = folder / "munge" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)  # munged refuses a key that others can read, in a folder others can write
    logs = {"munged": daemon_log(folder, "munged"), "slurmctld": daemon_log(folder, "slurmctld"),  # in the foreground
            # munged writes its log to its standard error; slurmctld and slurmd to the files slurm.conf names
            **{f"slurmd {n}": daemon_log(folder, f"slurmd.{n}") for n in names}}
    conf = str(conf_file(folder))
    pids: dict[str, int] = {}

    def save() -> None:
        save_state(folder, names, pids, first_job_id, len(share[names[0]]), munge_dir, addresses, namespaces)

    try:
        save()  # from here, `down` finds the socket's folder
        if own_addresses:
            namespaces = network_names(first_job_id, names)[1]
            save()  # from here, `down` removes the network, also one half made
            addresses, namespaces = make_network(folder, first_job_id, names)
            save()
        write_conf(folder, names, cpus, memory, first_job_id, share, socket_path, addresses)
        pids["munged"] = _start(folder, [
            program("munged"), "--foreground", f"--socket={socket_path}", f"--key-file={key}",
            f"--pid-file={folder / 'run' / 'munged.pid'}", f"--seed-file={folder / 'munge' / 'munged.seed'}"],
            logs["munged"])
        save()
        _wait_for(_("munged's socket"), socket_path.exists, pids, logs, IDLE_TIMEOUT)
        # it locks its pid file, the claim of the block of job ids, for as long as it runs
        inside = in_node(folder, "controller", namespaces["controller"]) if namespaces else []  # the same pid
        pids["slurmctld"] = _start(folder, [*inside, program("slurmctld"), "-D", "-i", "-f", conf],
                                   folder / "log" / "slurmctld.out")
        save()
        for name in names:
            inside = in_node(folder, name, namespaces[name]) if namespaces else []  # the same pid
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
        release_job_ids(first_job_id, folder)
        raise
    return cluster


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
    cluster = read_state(folder)
    if cluster is None:
        return False
    if is_ours(cluster.pids.get("slurmctld", -1), folder):
        env = cluster.environment()
        subprocess.run(["scancel", f"--partition={PARTITION}"], env=env, capture_output=True)
        try:  # SLURM ends each job's processes, SIGKILL after KILL_WAIT; wait for it to say so
            wait_until(lambda: _jobs_ended(env), KILL_WAIT + grace)
        except TimeoutError:
            pass  # what is left of the jobs is killed below

    def left() -> list[int]:  # what a job left running (the controller was gone, or the job outlived the wait)
        return job_processes(folder) + marked_processes(SLURM_ENV, str(folder))

    nodes = [name for name in cluster.pids if name.startswith("slurmd")]
    for stage in (nodes, ["slurmctld"], ["munged"]):  # nodes first, the controller, then authentication, which the
        ours = [pid for name in stage if (pid := cluster.pids.get(name)) is not None and is_ours(pid, folder)]  # others
        stop(ours, left if stage == ["munged"] else list, grace)  # use to the end; then the jobs' steps and tasks
    for leftover in (folder / "run").glob("*"):
        leftover.unlink(missing_ok=True)
    if cluster.munge_dir is not None:
        shutil.rmtree(cluster.munge_dir, ignore_errors=True)
    if cluster.namespaces:  # after every process in them has ended
        remove_network(network_names(cluster.first_job_id, list(cluster.nodes))[0], cluster.namespaces)
    state_file(folder).unlink(missing_ok=True)
    release_job_ids(cluster.first_job_id, folder)
    if pids := left():
        raise ClusterError(_("processes of the cluster in {folder} are still running after SIGKILL: {pids}. They may "
                             "belong to another user: stop them as that user, or as root.").format(folder=folder, pids=pids))
    return True
