"""The practice SLURM cluster (fourcard_helpers/slurm.py): real munged, slurmctld and slurmd, real jobs.

Without SLURM the tests are skipped with the line that installs it, except in CI (CI=true), where a
skip would hide a missing install step and so fails (.ci/run installs `slurm-wlm munge`)."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from fourcard_helpers.lifecycle import (alive, carries, command_line, listening, listens_on_port,
                                        marked_processes, memory_mb, owner, pids)
from fourcard_helpers.rundir import DEVICE_ENV, PYTHONPATH_ENV, RENAMED, SLURM_CONF_ENV, SLURM_ENV, VENV_ENV
from fourcard_helpers.slurm import (INSTALL_HINT, ClusterError, claimed_blocks, down, missing_programs,
                                    practice_cluster, status, up)
from fourcard_helpers.slurm_cluster import conf_file
from helpers import ROOT, wait_for

if missing_programs():
    if os.environ.get("CI"):
        pytest.fail(f"the SLURM tests must run in CI: {INSTALL_HINT}", pytrace=False)
    pytest.skip(f"SLURM tests skipped: {INSTALL_HINT}", allow_module_level=True)


def _wait_until(condition, what: str, bound: float = 60.0) -> None:
    """Wait for an event; the bound only keeps a broken cluster from hanging the suite."""
    assert wait_for(condition, bound), f"not after {bound:.0f} s: {what}"


def _tasks(name: str) -> list[int]:
    """Pids of processes whose command line starts with `name` (the job's tasks, not the srun naming them)."""
    return [pid for pid in pids() if " ".join(command_line(pid)).startswith(name)]


def _steps_of(folder: Path) -> list[int]:
    """Pids of the `slurmstepd` processes of the cluster in `folder` (slurmd hands each the cluster's SLURM_CONF):
    another practice cluster on this machine (lesson 12b, run beside the tests) has steps of its own."""
    return [pid for pid in _tasks("slurmstepd") if carries(pid, SLURM_CONF_ENV, str(conf_file(folder)))]


def _finished(cluster, job: str, bound: float = 300) -> str:
    """Wait until the job has left the queue (`sbatch --wait` looks only every few seconds); `scontrol show job`."""
    _wait_until(lambda: cluster.run("squeue", "-h", "-j", job).strip() == "", f"job {job} finished", bound=bound)
    return cluster.run("scontrol", "show", "job", job)


_claimed_blocks = claimed_blocks  # held by a running controller's lock on its pid file


def _nothing_left(folder: Path, pids: dict[str, int], munge_dir: Path | None = None) -> None:
    assert not any(alive(pid) for pid in pids.values()), pids
    assert marked_processes(SLURM_ENV, str(folder)) == []
    assert not (folder / "cluster.json").exists()
    assert list((folder / "run").glob("*")) == []
    assert munge_dir is None or not munge_dir.exists()  # munge's socket, in /tmp, is gone
    assert str(folder) not in _claimed_blocks()  # its job ids are free for the next cluster


_listening = listening  # the addresses (hex, as Linux's TCP table writes them) a process listens on


def test_up_runs_a_two_node_job_and_down_leaves_nothing(tmp_path):
    """Also what makes the practice cluster like a real one: each node a share of the machine's cores and
    memory, a job asking for more refused by SLURM itself, every daemon (and srun) listening on 127.0.0.1 only,
    munged checking its files' permissions (no --force), and a history of ended jobs that `sacct -c` reads."""
    cluster = up(2, tmp_path / "cluster")
    try:
        cores, memory = max(1, os.cpu_count() // 2), memory_mb() // 2
        nodes = cluster.run("sinfo", "-h", "-N", "-o", "%N %t %c %m").split()
        assert nodes == ["n1", "idle", str(cores), str(memory), "n2", "idle", str(cores), str(memory)]
        assert status(cluster.dir) == cluster
        assert {name: _listening(pid) for name, pid in cluster.pids.items() if name != "munged"} == {
            name: {"0100007F"} for name in cluster.pids if name != "munged"}  # 127.0.0.1, not 0.0.0.0
        assert command_line(cluster.pids["munged"]) and "--force" not in command_line(cluster.pids["munged"])
        assert (cluster.munge_dir.stat().st_mode & 0o7777, (cluster.dir / "munge" / "munge.key").stat().st_mode & 0o777) == (0o711, 0o400)
        # munged refuses a socket below a folder of another user's (the shared folder is whoever made it first)
        assert {p.stat().st_uid for p in cluster.munge_dir.parents} <= {0, os.geteuid()}
        job = tmp_path / "job.sh"
        job.write_text(textwrap.dedent("""\
            #!/bin/bash
            #SBATCH --nodes=2
            #SBATCH --ntasks-per-node=1
            srun bash -c 'echo "$SLURMD_NODENAME $SLURM_PROCID of $SLURM_NTASKS"; until [ -e go ]; do sleep 0.1; done'
            """))
        submitted = subprocess.Popen(["sbatch", "--wait", f"--chdir={tmp_path}", f"--output={tmp_path}/out-%j.txt", str(job)],
                                     env=cluster.environment(), stdout=subprocess.PIPE, text=True)
        def sruns_listening() -> set[str]:  # this cluster's srun, which the nodes call back with the tasks' output
            return {address for pid in _tasks("srun") if carries(pid, SLURM_CONF_ENV, str(cluster.conf))
                    for address in _listening(int(pid))}

        _wait_until(lambda: sruns_listening() or submitted.poll() is not None, "the job's srun listening")
        assert sruns_listening() == {"0100007F"}
        (tmp_path / "go").touch()
        assert submitted.wait() == 0
        (output,) = tmp_path.glob("out-*.txt")
        assert sorted(output.read_text().split("\n")[:2]) == ["n1 0 of 2", "n2 1 of 2"]  # one task on each node
        for asked, refusal in ((f"--mem={memory + 1}", "Memory specification can not be satisfied"),
                               (f"--cpus-per-task={cores + 1}", "CPU count per node can not be satisfied")):
            with pytest.raises(ClusterError, match=f"(?s){refusal}.*Requested node configuration is not available"):
                cluster.run("sbatch", asked, "--wrap", "true")
        history = cluster.run("sacct", "--completion", "--noheader", "--format=JobID,State,NNodes,NodeList").split()
        assert history[:4] == [str(cluster.first_job_id), "COMPLETED", "2", "n[1-2]"]
    finally:
        assert down(cluster.dir)
    _nothing_left(cluster.dir, cluster.pids, cluster.munge_dir)
    assert status(cluster.dir) is None and not down(cluster.dir)  # `down` when none runs: nothing to stop


@pytest.mark.parametrize("controller", ["running", "killed"])
def test_down_ends_a_running_job_and_its_processes(tmp_path, controller):
    """`down` with a job running: cancelled through the controller, or, the controller killed (a crash) so that
    scancel cannot reach it, ended by killing this cluster's job steps. Either way no step and no task is left."""
    cluster = up(2, tmp_path / "cluster")
    marker = f"fourcards-still-running-{os.getpid()}"
    try:
        job = tmp_path / "job.sh"
        job.write_text(f"#!/bin/bash\n#SBATCH --nodes=2\nsrun bash -c 'echo started; exec -a {marker} sleep 600'\n")
        cluster.run("sbatch", f"--chdir={tmp_path}", f"--output={tmp_path}/out.txt", str(job))
        _wait_until(lambda: len(_tasks(marker)) == 2, "both nodes' tasks running")
        assert len(_steps_of(cluster.dir)) >= 2  # each node's step of the job, found as the check below looks
        if controller == "killed":
            os.kill(cluster.pids["slurmctld"], signal.SIGKILL)
    finally:
        down(cluster.dir)
    _nothing_left(cluster.dir, cluster.pids)
    assert _tasks(marker) == [] and _steps_of(cluster.dir) == []


def test_up_while_running_refuses_and_a_stale_folder_is_cleaned(tmp_path):
    cluster = up(1, tmp_path / "cluster")
    try:
        with pytest.raises(ClusterError, match="already runs from .* down --dir"):
            up(1, cluster.dir)
        assert status(cluster.dir) == cluster  # the refusal stopped nothing
        assert _claimed_blocks()[str(cluster.dir)] == cluster.first_job_id
        for pid in cluster.pids.values():  # killed as a crash or a reboot would: no `down`, the folder left as it was
            os.kill(pid, signal.SIGKILL)
        _wait_until(lambda: not any(alive(pid) for pid in cluster.pids.values()), "the daemons gone")
        assert status(cluster.dir) is None
        assert str(cluster.dir) not in _claimed_blocks()  # the dead controller's lock went with it: no stale claim
        again = up(1, cluster.dir)  # starts afresh over the stale folder
        assert again.run("sinfo", "-h", "-N", "-o", "%t").split() == ["idle"]
    finally:
        down(cluster.dir)
    _nothing_left(cluster.dir, {**cluster.pids, **again.pids})


def test_a_port_taken_fails_in_one_sentence_and_leaves_nothing(tmp_path, monkeypatch):
    import socket

    import fourcard_helpers.slurm_conf as slurm_conf

    with socket.socket() as held:  # another program listens on the port `up` picked for the controller
        held.bind(("127.0.0.1", 0))
        held.listen()
        free_ports = slurm_conf.free_ports
        monkeypatch.setattr(slurm_conf, "free_ports", lambda count: [held.getsockname()[1], *free_ports(count - 1)])
        with pytest.raises(ClusterError, match=r"slurmctld stopped while starting .* Another program took its port"):
            up(2, tmp_path / "cluster")
    assert marked_processes(SLURM_ENV, str(tmp_path / "cluster")) == [] and not (tmp_path / "cluster" / "cluster.json").exists()


def test_the_cluster_of_a_with_block_is_stopped_when_the_kernel_dies(tmp_path):
    folder = tmp_path / "cluster"
    kernel = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""\
            import json, sys, time
            from fourcard_helpers.slurm import practice_cluster
            with practice_cluster(nodes=2, folder={str(folder)!r}) as cluster:
                print(json.dumps(cluster.pids), flush=True)
                time.sleep(600)
            """)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT)
    import json
    pids = json.loads(kernel.stdout.readline())
    assert all(alive(pid) for pid in pids.values())
    kernel.kill()  # SIGKILL: no `finally` runs in it
    kernel.wait()
    _wait_until(lambda: not any(alive(pid) for pid in pids.values()) and not (folder / "cluster.json").exists(),
                "the guard stopped the cluster")
    _nothing_left(folder, pids)


def test_the_with_block_stops_the_cluster_when_it_raises(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with practice_cluster(nodes=1, folder=tmp_path / "cluster") as cluster:
            raise KeyboardInterrupt  # as an interrupted kernel
    _nothing_left(cluster.dir, cluster.pids)


def test_command_line_up_status_down(tmp_path):
    folder = tmp_path / "cluster"
    cli = [sys.executable, "-m", "fourcard_helpers.slurm"]
    started = subprocess.run([*cli, "up", "--nodes", "2", "--dir", str(folder)], capture_output=True, text=True, cwd=ROOT)
    try:
        assert started.returncode == 0, started.stderr
        assert started.stdout.splitlines()[-1] == f"export SLURM_CONF={folder.resolve() / 'slurm.conf'}"
        shown = subprocess.run([*cli, "status", "--dir", str(folder)], capture_output=True, text=True, cwd=ROOT)
        assert shown.returncode == 0 and shown.stdout.count("idle") == 2
        again = subprocess.run([*cli, "up", "--dir", str(folder)], capture_output=True, text=True, cwd=ROOT)
        assert again.returncode == 2 and again.stderr.startswith("error: a practice cluster already runs from")
    finally:
        stopped = subprocess.run([*cli, "down", "--dir", str(folder)], capture_output=True, text=True, cwd=ROOT)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    none = subprocess.run([*cli, "down", "--dir", str(folder)], capture_output=True, text=True, cwd=ROOT)
    assert none.returncode == 1 and none.stdout.startswith("no practice cluster to stop")
    assert marked_processes(SLURM_ENV, str(folder.resolve())) == []


def test_an_ordinary_user_runs_the_cluster(tmp_path):
    """As the README's test command runs as root in CI: the same cluster and job as `nobody`, no root anywhere."""
    if os.geteuid() != 0:
        pytest.skip("not root: every test above already ran as an ordinary user")
    from helpers import AS_NOBODY, python_for_nobody

    env = {**os.environ}
    python = python_for_nobody(env)
    root = Path(tempfile.mkdtemp(prefix="fourcards-slurm-learner-"))  # pytest's own folders are root's alone
    home = root / "home"
    (home / "job").mkdir(parents=True)
    (home / "job" / "job.sh").write_text("#!/bin/bash\n#SBATCH --nodes=2\nsrun bash -c 'echo $SLURMD_NODENAME $(id -un)'\n")
    for path in [root, *root.rglob("*")]:
        os.chown(path, 65534, 65534)  # nobody's
    keep = [f"{name}={env[name]}" for name in (PYTHONPATH_ENV,) if name in env]
    folder = home / "cluster"
    as_nobody = [*AS_NOBODY, "env", f"HOME={home}", *keep]
    cli = [*as_nobody, python, "-m", "fourcard_helpers.slurm"]
    # another user's cluster, running at the same time, in a folder of root's (munged refuses to keep its files
    # below a folder another user owns, who could swap them)
    roots = practice_cluster(nodes=1, folder=tmp_path / "root's")
    roots.__enter__()
    started = subprocess.run([*cli, "up", "--dir", str(folder)], capture_output=True, text=True, cwd=ROOT)
    try:
        assert started.returncode == 0, started.stderr
        conf = started.stdout.splitlines()[-1].removeprefix(f"export {SLURM_CONF_ENV}=")
        ran = subprocess.run([*as_nobody, f"{SLURM_CONF_ENV}={conf}", "sbatch", "--wait", f"--chdir={home / 'job'}",
                              f"--output={home / 'job' / 'out.txt'}", str(home / "job" / "job.sh")],
                             capture_output=True, text=True)
        assert ran.returncode == 0, ran.stderr
        assert sorted((home / "job" / "out.txt").read_text().splitlines()) == ["n1 nobody", "n2 nobody"]
        owners = {owner(pid) for pid in marked_processes(SLURM_ENV, str(folder))}
        assert owners == {65534}  # every daemon runs as the learner
        claimed = _claimed_blocks()
        assert claimed[str(folder)] != claimed[str((tmp_path / "root's").resolve())]  # the two users' jobs are numbered apart
    finally:
        stopped = subprocess.run([*cli, "down", "--dir", str(folder)], capture_output=True, text=True, cwd=ROOT)
        roots.__exit__(None, None, None)
    assert stopped.returncode == 0, stopped.stderr
    assert marked_processes(SLURM_ENV, str(folder)) == []
    shutil.rmtree(root)


def test_lesson_12s_batch_file_runs_unchanged_survives_a_killed_rank_and_ends_with_the_same_weights(tmp_path):
    """scripts/12_two_nodes.sbatch as the lesson wrote it, on two practice nodes, one rank each: straight
    through, then with rank 1 (on the second node) killed mid-epoch. Both nodes' ranks start again, resume
    from the last checkpoint and end with the uninterrupted run's weights, bit for bit."""
    logs = {}
    with practice_cluster(nodes=2, folder=tmp_path / "cluster") as cluster:
        for run, data in (("uninterrupted", "crash_once:build_datasets"), ("killed", "crash_once:build_datasets_cut_once")):
            state = _finished(cluster, _submit(cluster, tmp_path, run, 3, data))
            logs[run] = (tmp_path / f"{run}.out").read_text()
            assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, (state, logs[run][-3000:])
    assert logs["uninterrupted"].count("train_any: ddp on 2 CPU processes") == 1 and "killed at" not in logs["uninterrupted"]
    killed = logs["killed"]
    assert "rank 1: killed at item" in killed and killed.count("train_any: ddp on 2 CPU processes") == 2  # rank 0 too
    assert killed.index("killed at item") < killed.index("resumed from epoch-0001, 1 of 3 epochs done") < killed.index("epoch 3/3")
    assert _same_weights(tmp_path / "uninterrupted", tmp_path / "killed")


def _submit(cluster, tmp_path: Path, run: str, epochs: int, data: str, *options: str, **environment: str) -> str:
    """Submit lesson 12's batch file, unchanged, from the notebooks folder: two nodes, one rank each. Slow data is
    lesson 12b's (notebooks/slow_epochs.py): each item 4 ms late, about 1 s an epoch, the same numbers."""
    # train_any.py reads the cards' setting under its old name (rundir.RENAMED), the course under the new one
    env = {**cluster.environment(), "NPROC_PER_NODE": "1", VENV_ENV: sys.prefix, DEVICE_ENV: "cpu",
           RENAMED[DEVICE_ENV]: "cpu", **environment}
    return subprocess.run(
        ["sbatch", "--parsable", *options, "--gpus-per-node=0", "--cpus-per-task=1", f"--output={tmp_path}/{run}.out",
         "scripts/12_two_nodes.sbatch", "--model", "crash_once:build_model", "--optimizer", "sgd", "--lr", "0.05",
         "--epochs", str(epochs), "--batch-size", "32", "--data", data, "--checkpoint-dir", str(tmp_path / run)],
        cwd=ROOT / "notebooks", env=env, capture_output=True, text=True, check=True).stdout.strip()


def _same_weights(a: Path, b: Path) -> bool:
    import torch

    one, other = torch.load(a / "model.pt", weights_only=True), torch.load(b / "model.pt", weights_only=True)
    return one.keys() == other.keys() and all(torch.equal(one[k], other[k]) for k in one)


@pytest.mark.slow
def test_lesson_12s_batch_file_requeues_itself_on_the_time_limit_warning(tmp_path):
    """The warning SLURM sends before the limit, sent by hand as soon as the training runs (`scancel --batch
    --signal=USR1`, what `--signal=B:USR1@...` sends): the trap writes the stop file, the ranks save the step they
    are at and exit, and only then does the script requeue the job; SLURM starts it again, it resumes from that
    very step and ends with the weights of a run never stopped. With MAX_REQUEUES=0 the same warning ends the job
    instead (it failed: the training is not done), its step saved."""
    with practice_cluster(nodes=2, folder=tmp_path / "cluster") as cluster:
        reference = _submit(cluster, tmp_path, "reference", 4, "crash_once:build_datasets")
        assert "JobState=COMPLETED" in _finished(cluster, reference)
        states = {}
        for run, requeues in (("warned", "3"), ("capped", "0")):
            job = _submit(cluster, tmp_path, run, 4, "slow_epochs:build_datasets_slow", MAX_REQUEUES=requeues)
            _wait_until(lambda: "starting fresh" in _read(tmp_path / f"{run}.out"), "the training started", bound=120)
            cluster.run("scancel", "--batch", "--signal=USR1", job)
            states[run] = _finished(cluster, job)
    capped_job = job
    log = (tmp_path / "warned.out").read_text()
    assert "JobState=COMPLETED" in states["warned"] and "ExitCode=0:0" in states["warned"] and "Restarts=1" in states["warned"], (states["warned"], log[-3000:])
    saved = re.search(r"asked to stop \(found runs/four-cards-\d+\.stop\): saved (epoch-\d{4}-step-\d{6})", log)
    assert saved, log[-3000:]
    assert (log.index("time limit near: asking the ranks to save and stop (run 0)") < saved.start()
            < log.index("the ranks saved and stopped: requeueing the job (run 0)") < log.index(f"resumed from {saved[1]}, "))
    assert _same_weights(tmp_path / "reference", tmp_path / "warned")
    capped = (tmp_path / "capped.out").read_text()
    assert "JobState=FAILED" in states["capped"] and "ExitCode=3:0" in states["capped"] and "Restarts=0" in states["capped"], (states["capped"], capped[-3000:])
    assert "requeued 0 times already: not again" in capped and re.search(r"saved epoch-\d{4}-step-\d{6}", capped)
    (ROOT / "notebooks" / "runs" / f"four-cards-{capped_job}.stop").unlink()  # capped's, left for a resume by hand


def _hex(address: str) -> str:
    """An IPv4 address as Linux's TCP table writes it (in the machine's byte order: reversed on x86 and ARM)."""
    import socket

    return socket.inet_aton(address)[::-1].hex().upper() if sys.byteorder == "little" else socket.inet_aton(address).hex().upper()


_listens_on_port = listens_on_port  # in the network namespace of the process, on its own tables


@pytest.mark.slow
def test_lesson_12s_batch_file_on_nodes_at_two_addresses_has_one_store_host(tmp_path):
    """A real cluster's nodes are machines at addresses of their own. As root, the practice cluster gives each node
    and the controller one (a network namespace each, joined by a bridge, this machine being the login node; only
    the network is separate, the nodes still share the hostname, process ids and files):
    every daemon listens on its own address; lesson 12's file, unchanged, trains on both nodes; the rendezvous
    store listens on the first node alone, at its address (the agents' store, not the ranks'); and a job whose
    port is taken on its first node fails at once, in one sentence. With loopback alone, both agents would count
    as the host and the loser would quietly connect to the winner: here, as on a real cluster, one node hosts it."""
    if os.geteuid() != 0:
        pytest.skip("nodes at addresses of their own need root (network namespaces); CI runs as root")
    with practice_cluster(nodes=2, folder=tmp_path / "cluster", own_addresses=True) as cluster:
        addresses = cluster.addresses
        assert len({addresses["controller"], addresses["n1"], addresses["n2"]}) == 3
        assert {name: _listening(pid) for name, pid in cluster.pids.items() if name != "munged"} == {
            "slurmctld": {_hex(addresses["controller"])}, "slurmd n1": {_hex(addresses["n1"])},
            "slurmd n2": {_hex(addresses["n2"])}}
        job = _submit(cluster, tmp_path, "two addresses", 2, "slow_epochs:build_datasets_slow")
        _wait_until(lambda: "starting fresh" in _read(tmp_path / "two addresses.out"), "the training started", bound=120)
        port = 20000 + int(job) % 10000  # both agents have joined the rendezvous: each has its store or its client
        hosts = {node: _listens_on_port(cluster.pids[f"slurmd {node}"], port) for node in ("n1", "n2")}
        state = _finished(cluster, job)
        log = (tmp_path / "two addresses.out").read_text()
        assert "JobState=COMPLETED" in state and "NodeList=n[1-2]" in state, (state, log[-3000:])
        assert hosts == {"n1": True, "n2": False}, hosts  # exactly one store host: the first node
        assert "epoch 2/2" in log and "train_any: ddp on 2 CPU processes" in log
        # a program holds a port on the first node: the job that would listen there fails at once, saying so
        holder = subprocess.Popen(
            ["nsenter", f"--net=/var/run/netns/{cluster.namespaces['n1']}", sys.executable, "-c",
             "import socket; s = socket.socket(); s.bind(('', 0)); s.listen(); print(s.getsockname()[1], flush=True); input()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            taken = holder.stdout.readline().strip()
            refused = _submit(cluster, tmp_path, "port taken", 2, "crash_once:build_datasets", RDZV_PORT=taken)
            state = _finished(cluster, refused)
        finally:
            holder.kill()
            holder.wait()
        log = (tmp_path / "port taken.out").read_text()
        assert "JobState=FAILED" in state and "ExitCode=1:0" in state, (state, log)
        assert f"port {taken} is taken on n1, the first node, where the rendezvous must listen" in log
        assert "torchrun" not in log and "Traceback" not in log  # it stopped before any torchrun started
    assert not any(namespace in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
                   for namespace in cluster.namespaces.values())  # `down` removed the network


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.mark.slow
def test_lesson_12s_batch_file_outlives_its_time_limit_by_requeueing_and_ends_with_the_same_weights(tmp_path):
    """SLURM's own warning, with its shortest limit (one minute) and the warning asked 30 s ahead (SLURM may send
    it up to 60 s early, so it comes 0 to 30 s into the run), on training of 40 slow epochs (at least 40 s): the
    first run is always cut; the batch file requeues the job, which resumes from the saved step and ends with the
    weights of a run with no limit. Once the warning has come, the test gives the job ten minutes: a requeued run
    keeps the job's limit, and on a busy machine its ranks can take most of a minute to start, so that a run warned
    again and again would train a step or two at a time. The reference runs first: the two would share two cores."""
    with practice_cluster(nodes=2, folder=tmp_path / "cluster") as cluster:
        reference = _submit(cluster, tmp_path, "no limit", 40, "crash_once:build_datasets")
        assert "JobState=COMPLETED" in _finished(cluster, reference)
        job = _submit(cluster, tmp_path, "one minute", 40, "slow_epochs:build_datasets_slow", "--time=1", "--signal=B:USR1@30")
        warning = "time limit near: asking the ranks to save and stop (run 0)"
        _wait_until(lambda: warning in _read(tmp_path / "one minute.out"), "SLURM's warning", bound=120)
        first_run = cluster.run("scontrol", "show", "job", job)
        cluster.run("scontrol", "update", f"JobId={job}", "TimeLimit=10")
        state = _finished(cluster, job)
    log = (tmp_path / "one minute.out").read_text()
    assert "TimeLimit=00:01:00" in first_run and "Restarts=0" in first_run, first_run
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state and "Restarts=1" in state, (state, log[-3000:])
    saved = re.search(r"asked to stop \(found runs/four-cards-\d+\.stop\): saved (epoch-\d{4}-step-\d{6})", log)
    assert saved, log[-3000:]
    assert (log.index(warning) < saved.start() < log.index("the ranks saved and stopped: requeueing the job (run 0)")
            < log.index(f"resumed from {saved[1]}, "))
    assert _same_weights(tmp_path / "no limit", tmp_path / "one minute")


def test_a_stale_record_naming_someone_elses_process_is_left_alone(tmp_path):
    """After a reboot the recorded pids may belong to other programs: neither `up` nor `down` touches them."""
    import json

    other = subprocess.Popen(["sleep", "600"])
    folder = (tmp_path / "cluster").resolve()
    folder.mkdir()
    (folder / "cluster.json").write_text(json.dumps({"nodes": ["n1"], "pids": {"munged": other.pid, "slurmctld": other.pid,
                                                                                "slurmd n1": other.pid}}))
    try:
        assert status(folder) is None  # not ours: no cluster runs
        cluster = up(1, folder)        # the stale record is cleared, the cluster starts
        assert down(cluster.dir)
        assert other.poll() is None    # still running
    finally:
        other.kill()
        other.wait()


def test_each_node_gets_its_own_share_of_the_gpus(tmp_path):
    """Four GPUs on a machine of two practice nodes: two for each, as the GRES gpu, so that the batch file's
    `--gpus-per-node` works; and each node's tasks see their own two cards, not the first node's (SLURM numbers
    a node's cards from 0). The cards here are stand-ins: device files (links to /dev/null) named as NVIDIA's."""
    cards = tmp_path / "dev"
    cards.mkdir()
    for number in range(4):
        (cards / f"nvidia{number}").symlink_to("/dev/null")
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/bash\n#SBATCH --nodes=2\nsrun bash -c 'echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES $SLURM_STEP_GPUS'\n")
    cluster = up(2, tmp_path / "cluster", gpus=[str(cards / f"nvidia{number}") for number in range(4)])
    try:
        assert cluster.gpus_per_node == 2 and status(cluster.dir) == cluster
        assert cluster.run("sinfo", "-h", "-N", "-o", "%N %G").split() == ["n1", "gpu:2", "n2", "gpu:2"]
        seen = {}
        for per_node in (2, 1):
            cluster.run("sbatch", "--wait", f"--gpus-per-node={per_node}", f"--chdir={tmp_path}",
                        f"--output={tmp_path}/{per_node}.txt", str(job))
            seen[per_node] = sorted((tmp_path / f"{per_node}.txt").read_text().splitlines())
        assert seen == {2: ["n1 0,1 0,1", "n2 2,3 2,3"], 1: ["n1 0 0", "n2 2 2"]}
        with pytest.raises(ClusterError, match="Requested node configuration is not available"):
            cluster.run("sbatch", "--gpus-per-node=3", str(job))  # more than a node's share
    finally:
        down(cluster.dir)


def test_two_clusters_at_once_number_their_jobs_apart(tmp_path):
    """Lesson 12's file takes its rendezvous port from the job id: two practice clusters running at once (a
    lesson beside the tests, say) must not both start at job 1, or their jobs would meet on one port."""
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/bash\necho $SLURM_JOB_ID\n")
    with practice_cluster(nodes=1, folder=tmp_path / "one") as one, practice_cluster(nodes=1, folder=tmp_path / "two") as two:
        claimed = _claimed_blocks()
        assert claimed[str(one.dir)] == one.first_job_id and claimed[str(two.dir)] == two.first_job_id
        assert len(set(claimed.values())) == len(claimed)  # no two running clusters share a block
        ids = [cluster.run("sbatch", "--parsable", "--wait", f"--output={tmp_path}/{cluster.dir.name}.txt", str(job)).strip()
               for cluster in (one, two)]
    assert ids == [str(one.first_job_id), str(two.first_job_id)]
    _nothing_left(one.dir, one.pids)
    _nothing_left(two.dir, two.pids)
