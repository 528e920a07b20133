"""The practice cluster's slurm.conf, gres.conf and task prolog: SLURM's settings, each with its reason.

Where one machine or a short wait asks for something other than SLURM's default, the line says why.
"""
from __future__ import annotations

import os
import pwd
import socket
from pathlib import Path

from .lifecycle import free_ports
from .slurm_cluster import conf_file, daemon_log
from .slurm_jobids import JOB_ID_BLOCK, claim_file

PARTITION = "practice"
# A job step's credential is good for CRED_EXPIRE seconds (SLURM: 120): slurm.conf's manual asks for time to
# load the user's environment, run a prolog and survive a paged-out slurmd before the step starts. A requeued
# job also waits as long before it starts again, which lesson 12b waits for once, within its 120 s. The practice
# cluster runs no prolog: 10 s is ample for the rest on one machine, also a busy one (the tests and 12b ran
# under load averages of 8 to 17 on two cores).
CRED_EXPIRE = 10
KILL_WAIT = 5  # seconds SLURM gives a cancelled job's processes between SIGTERM and SIGKILL (slurm.conf's KillWait)


def gpu_files() -> list[str]:
    """This machine's NVIDIA GPUs, as their device files in number order (none without a GPU)."""
    found = Path("/dev").glob("nvidia[0-9]*")
    return [str(path) for path in sorted(found, key=lambda path: int(path.name.removeprefix("nvidia")))]


def gpu_shares(files: list[str], nodes: list[str]) -> dict[str, list[str]]:
    """An equal share of the GPUs for each node, in order (what does not divide evenly is left out)."""
    each = len(files) // len(nodes)
    return {name: files[i * each:(i + 1) * each] for i, name in enumerate(nodes)}


def write_conf(folder: Path, nodes: list[str], cpus: int, memory: int, first_job_id: int, gpus: dict[str, list[str]],
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
        f"SlurmctldPidFile={claim_file(first_job_id)}",  # its lock is the claim of the job ids (see claim_file)
        f"SlurmdPidFile={folder / 'run' / 'slurmd.%n.pid'}",
        f"SlurmctldLogFile={daemon_log(folder, 'slurmctld')}",
        f"SlurmdLogFile={daemon_log(folder, 'slurmd.%n')}",
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
    conf_file(folder).write_text("\n".join(lines) + "\n")
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
