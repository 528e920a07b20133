"""A practice SLURM cluster on this one machine: a controller and N nodes, started without root.

SLURM is where a learner goes when one machine's cards are no longer enough, and a first job on a
real cluster is where a day gets lost. Lesson 12's batch file runs here for real: SLURM's own
daemons (`munged` for authentication, `slurmctld` the controller, one `slurmd` per node), each node
a name with its own port, its share of the machine's cores and memory, and the address 127.0.0.1, on
which alone the daemons listen (as root, `up --own-addresses` gives the controller and each node an
address of its own instead, as a real cluster's machines have; only the network is separate, the nodes still
share the hostname, process ids and files: see slurm_network.py). Everything is in one
folder the learner owns, except munge's socket, which must be open to all (see slurm_daemons.py), and what
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

This module is the cluster's public face and its command line; the work is done in modules of one job
each: slurm_cluster.py (what a cluster is: its record, its mark, its error), slurm_daemons.py (`up`,
`down`, `status`: the daemons started and stopped), slurm_conf.py (slurm.conf and why each setting),
slurm_jobids.py (each cluster's block of job ids, machine-wide), slurm_network.py (`--own-addresses`)
and slurm_guard.py (`practice_cluster`, stopped also when the kernel dies).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .language import _
from .rundir import SLURM_CONF_ENV
from .slurm_cluster import DEFAULT_DIR, INSTALL_HINT, Cluster, ClusterError, missing_programs
from .slurm_daemons import down, status, up
from .slurm_guard import practice_cluster, run_guard
from .slurm_jobids import claimed_blocks

__all__ = ["Cluster", "ClusterError", "practice_cluster", "up", "down", "status", "missing_programs",
           "INSTALL_HINT", "claimed_blocks"]


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
            run_guard(folder)
    except ClusterError as error:
        print(_("error: {error}").format(error=error), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
