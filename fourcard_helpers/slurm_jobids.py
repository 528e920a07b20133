"""Which block of job ids each practice cluster on this machine numbers its jobs from, whoever runs it.

Lesson 12's batch file takes its rendezvous port from the job id, so two clusters on one machine must
not hand out the same ids. Each takes a block of its own, under one machine-wide lock, and holds it
exactly as long as its controller runs: the claim is the controller's pid file, which slurmctld locks.
"""
from __future__ import annotations

import fcntl
import json
import os
import struct
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .language import _
from .slurm_cluster import ClusterError

# Lesson 12's batch file listens for its rendezvous on port 20000 + job id % 10000, one port per job on a real
# cluster. Practice clusters on one machine would all number their jobs from 1: each takes a block of its own.
JOB_ID_BLOCK, JOB_ID_BLOCKS = 1000, 10
# What all users' clusters share (see shared_dir). A fixed name on purpose: every user must find the same folder,
# whatever their $TMPDIR; /tmp is the one folder open to all on every Linux machine.
SHARED_DIR = Path("/tmp/fourcards-slurm")


def shared_dir() -> Path:
    """The folder every user's practice clusters meet in: the machine lock and the job-id claims (munge's sockets
    live beside it in /tmp: munged refuses a folder another user owns, and this one is whoever made it first).
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
def machine_lock() -> Iterator[None]:
    """One `up` at a time on this machine, whoever runs it (learners may share a server): each sees the
    job-id blocks claimed before it. An flock, which the system releases when its holder dies, however it dies."""
    fd = os.open(shared_dir() / "up.lock", os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def claim_file(first_job_id: int) -> Path:
    """The machine-wide claim of the block of job ids from `first_job_id`: the pid file of the controller
    that numbers its jobs from there. slurmctld holds a lock on its pid file (fcntl's, which the system
    releases when the process ends, however it ends): the block is held exactly as long as it runs."""
    return shared_dir() / f"jobs-{first_job_id}.pid"


def _record(first_job_id: int) -> Path:
    """Which cluster folder claimed the block (for people, and the tests): the lock is what counts."""
    return shared_dir() / f"jobs-{first_job_id}.json"


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
        if _locked(claim_file(first)):
            try:
                held[json.loads(_record(first).read_text())["folder"]] = first
            except (OSError, ValueError, KeyError):
                held[_("(unknown, jobs from {first})").format(first=first)] = first
    return held


def claim_job_ids(folder: Path) -> int:
    """A block of job ids no other running practice cluster on this machine has, whoever runs it: the first
    id. Chosen under the machine lock, and held from the moment this cluster's controller starts, also under
    it. The blocks are taken in turn, after the one the last cluster took: a new cluster's first job does not
    get the rendezvous port of the last cluster's first job, which may not be free yet."""
    last = shared_dir() / "last-block"
    try:
        after = int(last.read_text())
    except (OSError, ValueError):
        after = JOB_ID_BLOCKS - 1
    for k in ((after + 1 + i) % JOB_ID_BLOCKS for i in range(JOB_ID_BLOCKS)):
        first = 1 + JOB_ID_BLOCK * k
        claim = claim_file(first)
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


def release_job_ids(first_job_id: int, folder: Path) -> None:
    """Remove the stopped controller's pid file and the record, if ours: a file of ours left in the shared
    folder would keep another user's controller from writing it, and so from that block."""
    claim, record = claim_file(first_job_id), _record(first_job_id)
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
