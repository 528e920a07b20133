"""The training template `notebooks/scripts/train_any.py` under plain torchrun on simulated cards, and its
input checks in-process through `main(argv)` (its learning-rate schedule too, one of its steps' functions).

A model and data set of the test's own (a small MLP on 301 random points) are written to a
module in a temporary folder, and the template is pointed at them with MODULE:FUNCTION, as a
learner would point it at theirs. What is checked: every strategy trains and leaves a plain
state_dict; evaluation counts each test sample once; resuming is exact; FSDP's sharded
checkpoint from four ranks loads on two; accumulation equals a bigger batch; bad input stops
every rank with a message that names the problem; no process outlives a run.
"""
from __future__ import annotations

import importlib.util
import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

from fourcard_helpers.rundir import DEVICE_ENV, LOCAL_RANK_ENV, RANK_ENV, WORLD_SIZE_ENV
from helpers import ROOT, end_group, plain_environment, plain_torchrun_command

SCRIPT = ROOT / "notebooks" / "scripts" / "train_any.py"

TINY = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset

CONSTANT = 3


def build_model():  # dropout: resuming must restore each rank's random stream
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))


def build_plain_model():  # no randomness in training: runs that differ in layout can be compared
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def build_other_model():
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))


def build_datasets():  # 200 training points, 101 test points: 101 does not split evenly over 4 ranks
    g = torch.Generator().manual_seed(0)
    x = torch.randn(301, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return TensorDataset(x[:200], y[:200]), TensorDataset(x[200:], y[200:])


def not_a_model():
    return [nn.Linear(8, 3)]


def one_dataset():
    return build_datasets()[0]


def triples():
    train, test = build_datasets()
    return TensorDataset(*train.tensors, train.tensors[1]), test
'''


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("train_any")
    (folder / "tiny.py").write_text(TINY, encoding="utf-8")
    return folder


def run(workdir: Path, nproc: int | None, *args: str, ok: bool = True) -> str:
    """Run the template with plain torchrun (or plain python when nproc is None) in `workdir`."""
    command = (plain_torchrun_command(["--standalone", f"--nproc-per-node={nproc}"], SCRIPT, *args) if nproc
               else [sys.executable, str(SCRIPT), *args])
    proc = subprocess.Popen(command, cwd=workdir, env=plain_environment(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output = proc.communicate(timeout=300)[0].decode("utf-8", "replace")
    finally:
        left = end_group(proc)  # is any process of this run still there?
    assert not left, f"a process of the run outlived it:\n{output[-2000:]}"
    assert (proc.returncode == 0) == ok, f"exit code {proc.returncode}:\n{output[-3000:]}"
    return output


def train(workdir: Path, nproc: int, folder: str, *args: str, model: str = "build_model", ok: bool = True) -> str:
    return run(workdir, nproc, "--model", f"tiny:{model}", "--data", "tiny:build_datasets", "--batch-size", "8",
               "--optimizer", "adamw", "--lr", "0.01", "--checkpoint-dir", folder, *args, ok=ok)


def weights(workdir: Path, folder: str) -> dict[str, torch.Tensor]:
    return torch.load(workdir / folder / "model.pt", weights_only=True)


def metrics(workdir: Path, folder: str) -> list[dict]:
    return json.loads((workdir / folder / "metrics.json").read_text())


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], exact: bool) -> bool:
    assert a.keys() == b.keys()
    # Not exact: the same arithmetic, but gradients summed in another order (reduce-scatter
    # instead of all-reduce, or micro-batches added one after the other), so float32 rounding
    # differs in the last bits; after 14 AdamW steps that stays far below 1e-5.
    return all(torch.equal(a[k], b[k]) if exact else torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-5) for k in a)


@pytest.fixture(scope="module")
def ddp_two_epochs(workdir: Path) -> str:
    return train(workdir, 4, "ddp2", "--strategy", "ddp", "--epochs", "2")


@pytest.mark.slow  # starts ranks
def test_ddp_trains_and_leaves_a_plain_state_dict_and_metrics(workdir: Path, ddp_two_epochs: str) -> None:
    sys.path.insert(0, str(workdir))
    try:
        import tiny
    finally:
        sys.path.remove(str(workdir))
    assert f"ddp on 4 CPU processes with gloo ({DEVICE_ENV}=cpu)" in ddp_two_epochs  # the one name, read
    model = tiny.build_model()
    model.load_state_dict(weights(workdir, "ddp2"))  # no "module." prefix, no missing key
    rows = metrics(workdir, "ddp2")
    assert [row["epoch"] for row in rows] == [1, 2]
    assert all(set(row) == {"epoch", "train_loss", "test_loss", "test_accuracy", "samples_per_s", "seconds"}
               for row in rows)
    # Evaluation on 4 ranks (101 samples, padded to 104) gives what one process computes on all 101.
    x, y = tiny.build_datasets()[1].tensors
    model.eval()
    with torch.no_grad():
        logits = model(x)
    assert rows[-1]["test_accuracy"] == (logits.argmax(1) == y).sum().item() / 101
    assert rows[-1]["test_loss"] == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-5)


@pytest.mark.slow  # starts ranks
def test_one_epoch_then_resume_equals_two_epochs_straight(workdir: Path, ddp_two_epochs: str) -> None:
    train(workdir, 4, "ddp1", "--strategy", "ddp", "--epochs", "1")
    output = train(workdir, 4, "ddp1", "--strategy", "ddp", "--epochs", "2", "--resume")
    assert "resumed from epoch-0001, 1 of 2 epochs done" in output
    # The same samples in the same order with the same dropout masks: every epoch's training loss
    # is bit for bit the same (a different mask or sample order would change it at the 3rd digit).
    assert [row["train_loss"] for row in metrics(workdir, "ddp1")] == [row["train_loss"] for row in metrics(workdir, "ddp2")]
    # The weights agree to the last bit or two, not always to all of them: DDP lays its gradient
    # buckets out again after the first step of every run, and the resumed run's first step
    # (the 8th of the straight run) sums its gradients over the ranks with the initial layout,
    # hence in another order. (With find_unused_parameters=True, which skips that re-layout, the
    # two runs agree bit for bit.) One rounding in one step: differences of about 1e-8 on weights
    # of about 0.1-1, far inside the tolerance below, and far outside it for any real difference.
    a, b = weights(workdir, "ddp1"), weights(workdir, "ddp2")
    assert all(torch.allclose(a[k], b[k], rtol=0, atol=1e-6) for k in a)
    assert sorted(p.name for p in (workdir / "ddp1").glob("epoch-*")) == ["epoch-0002"]


@pytest.mark.slow  # starts ranks
def test_fsdp_trains_the_same_model_as_ddp(workdir: Path, ddp_two_epochs: str) -> None:
    output = train(workdir, 4, "fsdp2", "--strategy", "fsdp", "--epochs", "2")
    assert "fsdp on 4 CPU processes" in output
    assert same(weights(workdir, "fsdp2"), weights(workdir, "ddp2"), exact=False)


@pytest.mark.slow  # starts ranks
def test_single_card_in_bf16(workdir: Path) -> None:
    output = train(workdir, 1, "single", "--strategy", "single", "--epochs", "1", "--precision", "bf16")
    assert "single on 1 CPU process with gloo" in output
    assert [row["epoch"] for row in metrics(workdir, "single")] == [1]
    assert weights(workdir, "single")["0.weight"].dtype == torch.float32  # autocast: weights stay fp32


@pytest.mark.slow  # starts ranks
def test_accumulation_equals_the_bigger_batch_and_fsdp_resumes_from_4_ranks_on_2(workdir: Path) -> None:
    plain = ("--model", "tiny:build_plain_model")
    run_plain = lambda folder, nproc, *args: run(  # noqa: E731
        workdir, nproc, *plain, "--data", "tiny:build_datasets", "--lr", "0.01", "--checkpoint-dir", folder, *args)
    run_plain("big", 4, "--strategy", "ddp", "--epochs", "2", "--batch-size", "8")
    run_plain("accumulated", 4, "--strategy", "ddp", "--epochs", "2", "--batch-size", "4", "--accumulate", "2")
    assert same(weights(workdir, "accumulated"), weights(workdir, "big"), exact=False)
    # FSDP on 4 ranks × 8 per card for one epoch, then 2 ranks × 16: the same 32 samples per step,
    # so the resumed run must land where 4 ranks do in two epochs, if weights AND optimizer
    # state were resharded right.
    run_plain("fsdp42", 4, "--strategy", "fsdp", "--epochs", "1", "--batch-size", "8")
    output = run_plain("fsdp42", 2, "--strategy", "fsdp", "--epochs", "2", "--batch-size", "16", "--resume")
    assert "saved on 4 ranks, resumed on 2" in output
    assert same(weights(workdir, "fsdp42"), weights(workdir, "big"), exact=False)


BAD_INPUTS = [
    (("--model", "tiny"), "is not MODULE:FUNCTION"),
    (("--model", "no_such_module:build_model"), "cannot import 'no_such_module'"),
    (("--model", "tiny:build_modle"), "'build_modle' is not defined"),
    (("--model", "tiny:CONSTANT"), "has type int, not a function"),
    (("--model", "tiny:not_a_model"), "returned a list; it must return an nn.Module"),
    (("--data", "tiny:one_dataset"), "it must return (train_dataset, test_dataset)"),
    (("--data", "tiny:triples"), "train items must be (input, label) pairs, but item 0 is a tuple of 3 values"),
]


@pytest.fixture(scope="module")
def train_any() -> ModuleType:
    """The template as a module: its checks run in this process through main(argv), no launch needed."""
    spec = importlib.util.spec_from_file_location("train_any", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines main(); trains nothing until main() is called
    return module


@pytest.mark.parametrize("args, message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_input_gets_a_clear_message(workdir: Path, train_any: ModuleType, args: tuple[str, ...], message: str,
                                        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    given = dict(zip(args[::2], args[1::2]))
    given = {"--model": "tiny:build_model", "--data": "tiny:build_datasets", **given}
    monkeypatch.chdir(workdir)  # main() imports MODULE from the current folder, as `python -m` would
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in (RANK_ENV, WORLD_SIZE_ENV, LOCAL_RANK_ENV, "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as stopped:
        train_any.main([*[v for kv in given.items() for v in kv], "--strategy", "single", "--checkpoint-dir", "bad"])
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and error.startswith("train_any: error:") and message in error, error
    assert not (workdir / "bad").exists()  # stopped before anything was written


def test_the_cosine_schedule_warms_up_to_lr_then_decays_to_zero(train_any: ModuleType) -> None:
    """What --help promises for --schedule cosine: a warm-up over the first 10% of the optimizer steps that
    ends at --lr, then a decay that reaches 0 where the training ends; --schedule constant keeps --lr."""
    given = ["--model", "m:f", "--data", "m:g", "--lr", "0.1", "--epochs", "4"]
    cosine = train_any.parse_arguments([*given, "--schedule", "cosine"])
    rates = [train_any.learning_rate(update, cosine, 25) for update in range(101)]  # 4 epochs of 25 steps, and one past
    warmup, decay = rates[:10], rates[10:]  # the warm-up's last step and the decay's first both take --lr
    assert all(a < b for a, b in zip(warmup, warmup[1:])) and 0 < warmup[0] < 0.1 / 5 and warmup[-1] == 0.1
    assert decay[0] == 0.1 and all(a > b for a, b in zip(decay, decay[1:])) and rates[99] > 0 and rates[100] == 0.0
    constant = train_any.parse_arguments([*given, "--schedule", "constant"])
    assert {train_any.learning_rate(update, constant, 25) for update in range(100)} == {0.1}


@pytest.mark.slow  # starts ranks
def test_every_rank_stops_on_bad_input_and_one_says_why(workdir: Path, ddp_two_epochs: str) -> None:
    output = train(workdir, 4, "ddp2", "--strategy", "ddp", "--epochs", "3", "--resume",
                   model="build_other_model", ok=False)
    assert output.count("train_any: error:") == 1
    assert "was written by another model" in output and "'0.bias': [16] there, [32] here" in output
    single = train(workdir, 4, "ddp2", "--strategy", "single", ok=False)
    assert "use --nproc-per-node=1" in single
    again = run(workdir, None, "--model", "tiny:build_model", "--data", "tiny:build_datasets", "--strategy",
                "single", "--checkpoint-dir", "ddp2", ok=False)
    assert "already holds checkpoints: pass --resume" in again


@pytest.mark.slow  # starts ranks
def test_a_stop_request_saves_that_step_and_the_resumed_run_ends_bit_for_bit_as_one_never_stopped(workdir: Path) -> None:
    """The stop file, there from the start (as SLURM's warning would leave it): every rank stops after the first
    optimizer step, saves it and exits cleanly; --resume goes on from the second step, through the rest of the
    epoch (its batches, its dropout masks: the DataLoader's draw from the random generator replayed) to the end."""
    straight = train(workdir, 2, "straight2", "--strategy", "ddp", "--epochs", "2")
    stop = workdir / "stop-now"
    stop.touch()
    stopped = train(workdir, 2, "stopped2", "--strategy", "ddp", "--epochs", "2", "--stop-file", str(stop))
    assert "asked to stop (found " in stopped and "saved epoch-0000-step-000001 after step 1 of 13 in epoch 1" in stopped
    assert "epoch 1/2" not in stopped and not (workdir / "stopped2" / "model.pt").exists()
    stop.unlink()  # what the batch file does when SLURM starts the requeued job
    resumed = train(workdir, 2, "stopped2", "--strategy", "ddp", "--epochs", "2", "--stop-file", str(stop), "--resume")
    assert "resumed from epoch-0000-step-000001, 0 of 2 epochs and 1 step done" in resumed
    assert [row["train_loss"] for row in metrics(workdir, "stopped2")] == [row["train_loss"] for row in metrics(workdir, "straight2")]
    a, b = weights(workdir, "straight2"), weights(workdir, "stopped2")
    assert all(torch.equal(a[k], b[k]) for k in a)  # one bucket: DDP's re-layout after the first step changes no order
    assert sorted(p.name for p in (workdir / "stopped2").glob("epoch-*")) == ["epoch-0002"] and "report from rank 0" in straight


@pytest.mark.slow  # starts ranks
def test_sigterm_to_torchrun_reaches_the_ranks_which_save_their_step_and_exit(workdir: Path) -> None:
    """SLURM's SIGTERM (preemption, scancel) reaches each node's torchrun, which sends it on to its ranks: they
    finish the step they are in, agree, save it and exit, before torchrun's 30 s of grace end in SIGKILL."""
    agent = subprocess.Popen(
        plain_torchrun_command(["--standalone", "--nproc-per-node=2"], SCRIPT, "--model", "tiny:build_model", "--data",
                               "tiny:build_datasets", "--batch-size", "8", "--epochs", "1000", "--checkpoint-dir",
                               "terminated"),
        cwd=workdir, env=plain_environment(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    try:
        for line in agent.stdout:
            lines.append(line)
            if line.startswith("epoch 1/1000"):  # the ranks are training (their handlers are in place)
                agent.send_signal(signal.SIGTERM)
                break
        lines += agent.stdout.readlines()
        agent.wait(timeout=120)
    finally:
        left = end_group(agent)  # anything left of the run (nothing, asserted below)
    output = "".join(lines)
    assert not left, output[-2000:]
    stop = re.search(r"asked to stop \(SIGTERM\): saved (epoch-\d{4}-step-\d{6}) after step", output)
    assert stop, output[-3000:]
    assert [p.name for p in (workdir / "terminated").glob("epoch-*")] == [stop[1]]  # the step saved, nothing after it
