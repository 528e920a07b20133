"""Each node of a practice cluster at an address of its own (`up --own-addresses`, root only).

A real cluster's nodes are machines of their own, each with its address; here each is a Linux network
namespace joined to a bridge, which shows what an address changes (who listens where, which node hosts
the rendezvous) while the nodes still share this machine's hostname, process ids and files.
"""
from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from .language import _
from .slurm_cluster import ClusterError, program
from .slurm_jobids import JOB_ID_BLOCK

# Own addresses: 198.18.0.0/15 is set aside for testing networks (RFC 2544), so no real network a machine is on
# uses it; each block of job ids (k) gets 198.18.k.0/24, so that clusters running at once do not meet.
NETWORK = "198.18.{k}.{host}"


def network_names(first_job_id: int, nodes: list[str]) -> tuple[str, dict[str, str]]:
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


def make_network(folder: Path, first_job_id: int, nodes: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The controller and each node in a network namespace of its own, as machines of their own: each its own
    address, on an interface eth0 joined by a virtual Ethernet pair to a bridge (the cluster's switch) in this
    machine's namespace, from which the learner submits, as from a login node. Only what runs in a node's
    namespace sees its address: slurmd, the jobs it starts, their torchrun and ranks. Each also has a /etc/hosts
    of its own (in_node), which resolves this machine's name to its own address, as a real node's does:
    slurmctld (NoCtldInAddrAny) and `srun` (NoInAddrAny) listen there, and gloo finds its interface by it.
    Needs root (`ip netns`).
    Returns the addresses and the namespaces, of "controller" and of each node."""
    if os.geteuid() != 0 or not all(map(program, ("ip", "nsenter", "unshare"))):
        raise ClusterError(_("each node's own address needs root and the programs `ip`, `nsenter` and `unshare` "
                             "(network namespaces; Debian's iproute2 and util-linux): run `up` as root, or without "
                             "--own-addresses, where every node has the address 127.0.0.1."))
    bridge, namespaces = network_names(first_job_id, nodes)
    k = (first_job_id - 1) // JOB_ID_BLOCK
    remove_network(bridge, namespaces)  # what a cluster of this block left when it was killed without `down`
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


def in_node(folder: Path, node: str, namespace: str) -> list[str]:
    """The command line that runs a command in the node's network namespace with the node's /etc/hosts, in
    the same process (each program execs the next). Not `ip netns exec`, which also mounts a /sys of its own,
    without the cgroup file systems slurmd needs."""
    return [program("nsenter") or "nsenter", f"--net=/var/run/netns/{namespace}",
            program("unshare") or "unshare", "--mount", "--propagation", "private",
            "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(_hosts_file(folder, node))]


def remove_network(bridge: str, namespaces: dict[str, str]) -> None:
    """Remove the namespaces (their end of each cable goes with them, and so the other end) and the bridge;
    what is not there is skipped."""
    ip = program("ip") or "ip"
    for namespace in namespaces.values():
        subprocess.run([ip, "netns", "delete", namespace], capture_output=True)
    subprocess.run([ip, "link", "delete", bridge], capture_output=True)
