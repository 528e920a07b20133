"""What a practice SLURM cluster is, for every part that starts, reads or stops one (see slurm.py).

A cluster is a folder and a record in it (cluster.json): its nodes, the pids of its daemons, its block of
job ids, its shares of GPUs and addresses. `up` writes the record as each daemon starts, `status` and
`down` read it, and a daemon is the cluster's only while it still carries the cluster's mark: the
record alone could name a pid that has since become someone else's.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .language import N_, _
from .lifecycle import carries, command_line, descendants, pids as all_pids
from .rundir import PATH_ENV, SLURM_CONF_ENV, SLURM_ENV

DEFAULT_DIR = Path.home() / ".fourcards" / "slurm"
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
INSTALL_HINT = N_("install SLURM and munge: on Debian or Ubuntu `sudo apt-get install slurm-wlm munge`; "
                  "elsewhere your system's slurm and munge packages")


class ClusterError(RuntimeError):
    """What went wrong, the likely cause and what to do, in words a learner can act on."""


def conf_file(folder: Path) -> Path:
    """The cluster's slurm.conf, in its folder: where slurm_conf.py writes it and SLURM_CONF names it."""
    return folder / "slurm.conf"


def daemon_log(folder: Path, daemon: str) -> Path:
    """Where a daemon of the cluster in `folder` logs ("munged", "slurmctld", "slurmd.NODE"; slurm.conf says
    "slurmd.%n", SLURM's own name for the node): what slurm.conf names and what is shown when a daemon fails."""
    return folder / "log" / f"{daemon}.log"


@dataclass(frozen=True)
class Cluster:
    """A running practice cluster: its folder, nodes and the pids of the daemons it started."""

    dir: Path
    nodes: tuple[str, ...]
    pids: dict[str, int]  # daemon name ("munged", "slurmctld", "slurmd n1", ...) -> pid
    first_job_id: int = 1  # this cluster's jobs are numbered from here
    gpus_per_node: int = 0  # each node's share of the machine's GPUs, as the GRES gpu
    munge_dir: Path | None = None  # the folder of munge's socket, outside `dir` (slurm_daemons._munge_dir)
    addresses: dict[str, str] | None = None  # own addresses: "controller" and each node's (slurm_network)
    namespaces: dict[str, str] | None = None  # own addresses: the network namespace of each (same keys)

    @property
    def conf(self) -> Path:
        return conf_file(self.dir)

    def environment(self) -> dict[str, str]:
        """This process's environment with SLURM_CONF naming the cluster: for sbatch, squeue, ..."""
        return {**os.environ, SLURM_CONF_ENV: str(self.conf)}

    def job_processes(self) -> list[int]:
        """The pids of every process this cluster's jobs are running now (their job steps and all below)."""
        return job_processes(self.dir)

    def run(self, *command: str) -> str:
        """Run a SLURM command (`cluster.run("squeue")`) against this cluster; its output, or an error that shows it."""
        done = subprocess.run(command, capture_output=True, text=True, env=self.environment())
        if done.returncode:
            raise ClusterError(_("`{command}` failed: {said}").format(command=" ".join(command),
                                                                      said=(done.stderr or done.stdout).strip()))
        return done.stdout


def program(name: str) -> str | None:
    """The path of a SLURM or munge program. Daemons live in sbin, which an ordinary user's PATH may lack."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get(PATH_ENV, ""), "/usr/local/sbin", "/usr/sbin", "/sbin"]))


def missing_programs() -> list[str]:
    """The SLURM and munge programs this machine lacks (empty when the practice cluster can run)."""
    return [name for name in PROGRAMS if program(name) is None]


def is_ours(pid: int, folder: Path) -> bool:
    """Whether `pid` runs and is a daemon of this cluster: after a reboot a recorded pid may be anyone's."""
    return carries(pid, SLURM_ENV, str(folder))  # every daemon carries it: the cluster's folder


def job_processes(folder: Path) -> list[int]:
    """This cluster's `slurmstepd` processes (slurmd gives each the cluster's SLURM_CONF) and all below them."""
    conf = str(conf_file(folder))
    return descendants(pid for pid in all_pids() if carries(pid, SLURM_CONF_ENV, conf)
                       and command_line(pid)[:1] and command_line(pid)[0].startswith("slurmstepd"))


def state_file(folder: Path) -> Path:
    return folder / "cluster.json"


def read_state(folder: Path) -> Cluster | None:
    try:
        state = json.loads(state_file(folder).read_text())
    except (OSError, ValueError):
        return None
    return Cluster(dir=folder, nodes=tuple(state["nodes"]), pids=dict(state["pids"]),
                   first_job_id=state.get("first_job_id", 1), gpus_per_node=state.get("gpus_per_node", 0),
                   munge_dir=Path(state["munge_dir"]) if state.get("munge_dir") else None,
                   addresses=state.get("addresses"), namespaces=state.get("namespaces"))


def save_state(folder: Path, names: list[str], pids: dict[str, int], first_job_id: int, gpus_per_node: int,
               munge_dir: Path, addresses: dict[str, str] | None, namespaces: dict[str, str] | None) -> None:
    """Record each pid as soon as it exists: a `down` after any failure finds every daemon (and the network)."""
    temporary = state_file(folder).with_suffix(".tmp")
    temporary.write_text(json.dumps({"nodes": names, "pids": pids, "first_job_id": first_job_id,
                                     "gpus_per_node": gpus_per_node, "munge_dir": str(munge_dir),
                                     "addresses": addresses, "namespaces": namespaces}, indent=1))
    temporary.replace(state_file(folder))
