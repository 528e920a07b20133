"""train_any.py: train any classification model on this machine's cards, launched with torchrun
(or with plain `python train_any.py --strategy single ...` on one card).

    torchrun --nproc-per-node=4 train_any.py \\
        --model mypkg.models:build_model --data mypkg.data:build_datasets \\
        --strategy ddp --optimizer adamw --lr 1e-3 --epochs 3 --batch-size 64 \\
        --checkpoint-dir runs/exp1 --resume

--model names a function with no arguments that returns an nn.Module; --data one that returns
(train_dataset, test_dataset) whose items are (input, label). Modules are imported from the
current folder and sys.path, as `python -m` would. Needs only torch (tqdm if installed).

What the checkpoint folder holds, so that a crash costs at most one epoch and
`torchrun --max-restarts=3 ... --resume` picks up where it stopped:
    epoch-NNNN/       the latest finished epoch, written atomically (a .tmp folder, then renamed):
                      model and optimizer through torch.distributed.checkpoint (sharded for FSDP,
                      so 4 ranks can save and 2 load), meta.json, each rank's RNG state
    epoch-NNNN-step-SSSSSS/  instead, when the training was asked to stop in the middle of an epoch:
                      NNNN epochs and SSSSSS optimizer steps of the next one done
    metrics.json      one object per epoch: epoch, train_loss, test_loss, test_accuracy, samples_per_s, seconds
    model.pt          the final weights as a plain state_dict, whatever the strategy:
                      model.load_state_dict(torch.load("model.pt", weights_only=True))

Asked to stop (SIGTERM or SIGUSR1 to any rank, or --stop-file appearing, which lesson 12's SLURM
batch file writes at the time-limit warning), the ranks agree at the next optimizer step (one
all-reduce of a flag after every step), save that step's checkpoint and exit with status 0;
--resume continues from the next step, as if never stopped.

Read it from `main` at the bottom: it is the table of contents, and each step it names is a
function above it, in the order main calls them.
"""
import argparse
import importlib
import json
import math
import os
import random
import re
import shutil
import signal
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.checkpoint.state_dict import set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data import Dataset
from torch.utils.data import DistributedSampler

try:  # in the course's notebooks, results go back to the cell; anywhere else they are printed
    from fourcard_helpers import exit_without_teardown, report
except ImportError:
    def report(**values):
        print(f"report from rank {os.environ.get('RANK', '0')}: {json.dumps(values)}", flush=True)

    def exit_without_teardown():  # the course's ending (lesson 00): gloo can abort a finished rank in Python's teardown
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

try:  # the course's variables as the course reads them: FOURCARDS_DEVICE, or its name before, with a notice
    from fourcard_helpers.rundir import DEVICE_ENV, setting, setting_name
except ImportError:  # anywhere else: the one name
    DEVICE_ENV = "FOURCARDS_DEVICE"

    def setting(name, default=""):
        return os.environ.get(name, default).strip()

    def setting_name(name):
        return name

try:  # a progress bar where tqdm is installed; the training needs none
    from tqdm import tqdm
except ImportError:
    def tqdm(iterable, **_):
        return iterable

CHECKPOINT = r"epoch-\d{4}(-step-\d{6})?"  # a checkpoint folder's name


# ---------------------------------------------------------------------------------------------------
# 1. What the user gave: the command line, their model and data, an old checkpoint. All of it is
#    checked before any rank talks to another (see fail).

def parse_arguments(argv):
    """The command line (`--help` lists it). Every rank parses the same one: torchrun gives them all the same."""
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--model", required=True, help="MODULE:FUNCTION returning an nn.Module")
    parser.add_argument("--data", required=True, help="MODULE:FUNCTION returning (train_dataset, test_dataset)")
    parser.add_argument("--strategy", choices=["single", "ddp", "fsdp"], default="ddp")
    parser.add_argument("--optimizer", choices=["sgd", "adamw"], default="adamw")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--schedule", choices=["constant", "cosine"], default="constant",
                        help="cosine: warm up over the first 10%% of steps, then decay to 0")
    parser.add_argument("--epochs", type=int, default=3, help="in all: with --resume, train until this many are done")
    parser.add_argument("--batch-size", type=int, default=64, help="per card")
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-dir", default="runs/train_any")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint, if there is one")
    parser.add_argument("--stop-file", help="when this file exists, save a checkpoint at the next step and stop "
                                            "(as on SIGTERM or SIGUSR1); a finished training removes it")
    return parser.parse_args(argv)


@dataclass(frozen=True)
class Place:
    """This process among the ranks, as torchrun's environment says (rank 0 of 1 without torchrun),
    and the device it trains on, once the set-up has chosen it."""
    rank: int
    world: int
    local_rank: int  # among this node's ranks: it picks the GPU
    local_world: int
    device: torch.device = torch.device("cpu")


def place_from_torchrun():
    """torchrun gives every rank these four numbers in its environment; plain `python` gives none."""
    return Place(rank=int(os.environ.get("RANK", 0)), world=int(os.environ.get("WORLD_SIZE", 1)),
                 local_rank=int(os.environ.get("LOCAL_RANK", 0)), local_world=int(os.environ.get("LOCAL_WORLD_SIZE", 1)))


def fail(message):
    """Stop every rank with the same message (printed once, by rank 0). Every check that calls it runs
    before the process group exists, so no rank can be left waiting in a collective for a rank that left."""
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"train_any: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def check_arguments(args, world):
    """The numbers and the strategy, before anything is imported or built."""
    if args.epochs < 1 or args.batch_size < 1 or args.accumulate < 1:
        fail("--epochs, --batch-size and --accumulate must be at least 1")
    if args.strategy == "single" and world > 1:
        fail(f"--strategy single trains on one card, but torchrun started {world} ranks: use --nproc-per-node=1")


def load_function(spec, flag):
    """The function that MODULE:FUNCTION names, or a message that says which part is wrong and what to do."""
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        fail(f"{flag} {spec!r} is not MODULE:FUNCTION, e.g. {flag} my_model:build_model")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - any import failure gets the same advice
        fail(f"{flag} {spec}: cannot import {module_name!r} ({type(error).__name__}: {error}). "
             f"Run from the folder that holds {module_name.replace('.', '/')}.py, or add its folder to PYTHONPATH.")
    function = getattr(module, function_name, None)
    if not callable(function):
        found = "is not defined" if function is None else f"has type {type(function).__name__}, not a function"
        fail(f"{flag} {spec}: {function_name!r} {found} in {module.__file__}")
    return function


def build_model_and_data(args):
    """Call the user's two functions and check what they return, so that a mistake is named here and not
    deep inside DataLoader or DDP. Reads item 0 of each data set, once."""
    sys.path.insert(0, os.getcwd())  # like `python -m`; `python script.py` alone looks only next to the script
    build_model, build_datasets = load_function(args.model, "--model"), load_function(args.data, "--data")
    torch.manual_seed(args.seed)  # the same initial weights on every rank (and in every rerun)
    model = build_model()
    if not isinstance(model, nn.Module):
        fail(f"--model {args.model} returned a {type(model).__name__}; it must return an nn.Module")
    datasets = build_datasets()
    if not (isinstance(datasets, (tuple, list)) and len(datasets) == 2):
        fail(f"--data {args.data} returned a {type(datasets).__name__}; it must return (train_dataset, test_dataset)")
    train_set, test_set = datasets
    for name, data in (("train", train_set), ("test", test_set)):
        if not (hasattr(data, "__getitem__") and hasattr(data, "__len__") and len(data) > 0):
            fail(f"--data {args.data}: the {name} dataset must have __len__ and __getitem__ and not be empty")
        item = data[0]
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            fail(f"--data {args.data}: {name} items must be (input, label) pairs, but item 0 is a "
                 f"{type(item).__name__}{f' of {len(item)} values' if isinstance(item, (tuple, list)) else ''}")
    return model, train_set, test_set


def find_checkpoint(folder, args, shapes, world):
    """The newest finished checkpoint in `folder` and, with --resume, its meta.json (else None). The
    checkpoint names every tensor and its shape: resuming another model's folder must fail clearly."""
    finished = sorted(p for p in folder.glob("epoch-*") if re.fullmatch(CHECKPOINT, p.name) and (p / "meta.json").is_file())
    latest = finished[-1] if finished else None
    if latest and not args.resume:
        fail(f"{folder} already holds checkpoints: pass --resume to continue them, or choose a new --checkpoint-dir")
    meta = json.loads((latest / "meta.json").read_text()) if latest and args.resume else None
    if meta and meta["shapes"] != shapes:
        differ = sorted(k for k in set(meta["shapes"]) | set(shapes) if meta["shapes"].get(k) != shapes.get(k))
        fail(f"{latest} was written by another model ({len(differ)} tensors differ, e.g. {differ[0]!r}: "
             f"{meta['shapes'].get(differ[0])} there, {shapes.get(differ[0])} here). "
             f"Use a new --checkpoint-dir, or the --model that wrote it ({meta['model']}).")
    if meta and meta.get("step") and meta["world"] != world:  # the rest of the epoch is each rank's share of it
        fail(f"{latest} stopped in the middle of an epoch on {meta['world']} ranks; its epoch can only be finished "
             f"on {meta['world']}: resume with {meta['world']} ranks, or from a finished epoch's checkpoint")
    return latest, meta


# ---------------------------------------------------------------------------------------------------
# 2. Set-up: the cards and the process group over them, and the ear for a request to stop.

def join_process_group(strategy, place):
    """GPUs with NCCL when there is one per rank, else CPU processes with gloo; rank 0 says which, and why.
    Returns `place` with its device."""
    wanted, named = setting(DEVICE_ENV, "auto") or "auto", setting_name(DEVICE_ENV)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    on_gpu = wanted != "cpu" and gpus >= place.local_world
    if wanted == "cuda" and not on_gpu:
        fail(f"{named}=cuda but {gpus} GPU(s) for {place.local_world} ranks on this machine")
    device = torch.device("cuda", place.local_rank) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)  # otherwise every rank's NCCL work lands on cuda:0
    backend = "nccl" if on_gpu else "gloo"
    if "RANK" in os.environ:  # under torchrun (even with one rank): join the others
        dist.init_process_group(backend, device_id=device if on_gpu else None)
    else:  # plain `python train_any.py`: a group of one, with an in-memory store, so the code below has one path
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, device_id=device if on_gpu else None)
    if place.rank == 0:
        world = place.world
        cards = f"{world} GPU{'s' * (world > 1)} with NCCL" if on_gpu else f"{world} CPU process{'es' * (world > 1)} with gloo"
        why = "" if on_gpu else f" ({named + '=cpu' if wanted == 'cpu' else f'{gpus} GPU(s) for {place.local_world} ranks'})"
        print(f"train_any: {strategy} on {cards}{why}", flush=True)
    return replace(place, device=device)


def all_sum(device, *values):
    """Sum numbers over the ranks (one all_reduce for all of them)."""
    total = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return total.tolist()


class StopRequest:
    """A request to stop early: SLURM's SIGTERM (preemption, scancel; torchrun passes its own on to its
    ranks), SIGUSR1, or the stop file. The signal handler only takes note: the ranks act on it together,
    between two steps (asked_anywhere)."""

    def __init__(self, stop_file, local_rank):
        self.by, self.stop_file, self.local_rank = None, stop_file, local_rank
        handled = (signal.SIGTERM, signal.SIGUSR1)
        in_main_thread = threading.current_thread() is threading.main_thread()  # only there can Python set handlers
        self.previous = {s: signal.signal(s, self.take_note) for s in handled} if in_main_thread else {}

    def take_note(self, signum, frame):
        # Only a note: Python runs a handler between any two lines, and a rank that stopped there would
        # leave the others waiting for it in their next collective.
        self.by = signal.Signals(signum).name

    def asked_anywhere(self, device):
        """Whether any rank was asked to stop: one all-reduce, so that every rank stops after the same step.
        Each node's first rank looks for the stop file: the node that wrote it sees it at once, even where
        a shared file system shows other nodes a new file only seconds later."""
        if self.by is None and self.stop_file and self.local_rank == 0 and os.path.exists(self.stop_file):
            self.by = f"found {self.stop_file}"
        return all_sum(device, float(self.by is not None))[0] > 0

    def say_saved(self, name, step, steps_per_epoch, epoch):
        """Rank 0's line for the log: who asked, and which checkpoint --resume will continue from."""
        print(f"train_any: asked to stop ({self.by or 'by another rank'}): saved {name} after step {step} "
              f"of {steps_per_epoch} in epoch {epoch + 1}; --resume continues from it", flush=True)

    def restore_handlers(self):
        """Give SIGTERM and SIGUSR1 back to whoever had them (a test or notebook calling main in-process)."""
        for handled_signal, handler in self.previous.items():
            signal.signal(handled_signal, handler)


# ---------------------------------------------------------------------------------------------------
# 3. The model wrapped for its strategy, and its optimizer. Every rank built the same weights from
#    the same seed: FSDP2 keeps each rank's slice of that rank's own copy, so the copies must agree
#    (DDP would broadcast rank 0's at the start anyway).

def wrap_for_strategy(model, strategy, place):
    """single: the model as it is, on its device; ddp: gradients averaged over the ranks at every
    optimizer step; fsdp: every tensor sharded over the ranks."""
    model.to(place.device)
    if strategy == "ddp":
        model = DDP(model, device_ids=[place.local_rank] if place.device.type == "cuda" else None)
    elif strategy == "fsdp":
        # FSDP2: each child with parameters becomes a unit that is gathered just before it runs and
        # freed after, then the root collects what is left. Each rank stores 1/world of every tensor.
        # The mesh is named: FSDP2's default is CUDA in any CUDA build of torch, even for CPU ranks.
        mesh = init_device_mesh(place.device.type, (place.world,))
        for child in model.children():
            if any(p.requires_grad for p in child.parameters()):
                fully_shard(child, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model


def make_optimizer(model, args):
    """Built after wrapping: under FSDP it must hold each rank's shards, not the whole tensors."""
    if args.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=args.lr)


def learning_rate(update, args, updates_per_epoch):
    """The learning rate of optimizer step `update` (counted from the start of training). A pure
    function of the step, not a scheduler object: nothing to checkpoint, and resuming is exact."""
    total = args.epochs * updates_per_epoch
    warmup = max(1, total // 10)
    if args.schedule == "constant":
        return args.lr
    if update < warmup:
        return args.lr * (update + 1) / warmup
    return args.lr * 0.5 * (1 + math.cos(math.pi * (update - warmup) / max(1, total - warmup)))


# ---------------------------------------------------------------------------------------------------
# 4. Data: each rank reads its own share.

class WeightedTest(Dataset):
    """The test set padded to a multiple of the ranks, each item with a weight: 1, or 0 for a
    padding repeat. Every rank gets as many batches (FSDP needs every rank in every forward),
    and the weights keep the repeats out of the loss and accuracy: no sample counted twice."""

    def __init__(self, data, world):
        self.data, self.size = data, math.ceil(len(data) / world) * world

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        x, y = self.data[index % len(self.data)]
        return x, y, float(index < len(self.data))


def make_loaders(train_set, test_set, args, place):
    """Training: DistributedSampler gives each rank a 1/world share of one shuffle, a new one each epoch
    (set_epoch); it pads with a few repeats so that every rank has as many batches. Test: the weighted,
    padded set above, each rank its share, in order."""
    train_sampler = DistributedSampler(train_set, num_replicas=place.world, rank=place.rank, shuffle=True, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    weighted_test = WeightedTest(test_set, place.world)
    test_loader = DataLoader(weighted_test, batch_size=args.batch_size,
                             sampler=DistributedSampler(weighted_test, place.world, place.rank, shuffle=False))
    return train_sampler, train_loader, test_loader


# ---------------------------------------------------------------------------------------------------
# 5. Checkpoints: resume from one, save one.

class Start(NamedTuple):
    """Where the training starts: `epoch` epochs and `step` optimizer steps of the next one done."""
    epoch: int
    step: int
    loss_sum: float  # this rank's training loss so far in a stopped epoch
    metrics: list    # one row per finished epoch, from metrics.json
    rng: dict | None  # random streams to restore once the stopped epoch's DataLoader has drawn its seed


def set_rng(state, place):
    """Put this rank's random streams back where a checkpoint found them: the same dropout masks and
    augmentations follow as in a run that never stopped."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if place.device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"])


def resume_or_start_fresh(model, optimizer, folder, latest, meta, args, place):
    """Model and optimizer through torch.distributed.checkpoint (it reshards FSDP's pieces for however
    many ranks load them), then the epoch and this rank's random number generators. Without a checkpoint:
    each rank its own random stream (dropout, augmentation)."""
    if not meta:
        if args.resume and place.rank == 0:
            print(f"train_any: no checkpoint in {folder} yet, starting fresh", flush=True)
        torch.manual_seed(args.seed * 1000 + place.rank + 1)
        return Start(epoch=0, step=0, loss_sum=0.0, metrics=[], rng=None)
    state = dict(zip(("model", "optimizer"), get_state_dict(model, optimizer)))
    dcp.load(state, checkpoint_id=latest)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    epoch, step, loss_sum, pending_rng, metrics = meta["epoch"], meta.get("step", 0), 0.0, None, []
    if meta["world"] == place.world:
        rng = torch.load(latest / f"rng-rank{place.rank}.pt", weights_only=True)
        loss_sum = rng.get("loss_sum", 0.0)
        if step:  # in the middle of an epoch: after the epoch's DataLoader iterator has drawn its seed
            pending_rng = rng
        else:
            set_rng(rng, place)
    elif place.rank == 0:
        print(f"train_any: saved on {meta['world']} ranks, resumed on {place.world}: weights and optimizer are exact, "
              "the random streams (dropout, augmentation) start afresh", flush=True)
    if (folder / "metrics.json").is_file():
        metrics = [m for m in json.loads((folder / "metrics.json").read_text()) if m["epoch"] <= epoch]
    if place.rank == 0:
        steps_done = f" and {step} step{'s' * (step > 1)}" if step else ""
        print(f"train_any: resumed from {latest.name}, {epoch} of {args.epochs} epochs{steps_done} done", flush=True)
    return Start(epoch=epoch, step=step, loss_sum=loss_sum, metrics=metrics, rng=pending_rng)


def save_checkpoint(folder, model, optimizer, args, shapes, place, epoch, step=0, loss_sum=0.0):
    """Write epoch-NNNN.tmp, then rename it: a crash mid-save leaves the previous epoch intact.
    `step` > 0: `epoch` epochs and `step` optimizer steps of the next one are done (epoch-NNNN-step-SSSSSS).
    Returns the checkpoint's name."""
    name = f"epoch-{epoch:04d}" + (f"-step-{step:06d}" if step else "")
    final, tmp = folder / name, folder / f"{name}.tmp"
    if place.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=tmp)
    rng = {"torch": torch.get_rng_state(), "python": random.getstate(),
           "cuda": torch.cuda.get_rng_state() if place.device.type == "cuda" else None, "loss_sum": loss_sum}
    torch.save(rng, tmp / f"rng-rank{place.rank}.pt")
    dist.barrier()
    if place.rank == 0:
        meta = {"epoch": epoch, "step": step, "sampler_epoch": epoch, "world": place.world, "strategy": args.strategy,
                "model": args.model, "shapes": shapes}
        (tmp / "meta.json").write_text(json.dumps(meta))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in folder.glob("epoch-*"):  # keep only the newest checkpoint
            if old != final and re.fullmatch(CHECKPOINT, old.name):
                shutil.rmtree(old)
    dist.barrier()
    return name


def write_atomically(path, save):
    """Save to a .partial file, then rename it: a reader never sees half a file."""
    partial = path.with_name(path.name + ".partial")
    save(partial)
    os.replace(partial, path)


# ---------------------------------------------------------------------------------------------------
# 6. The training step and the epoch around it; the evaluation after it.

def train_one_epoch(model, optimizer, train_set, train_sampler, train_loader, epoch, start, stop, autocast, args, place):
    """One epoch (or, when resuming, the rest of a stopped one). With --accumulate N, gradients of N
    micro-batches add up before one optimizer step; only the last micro-batch of a group synchronises
    them (DDP no_sync, FSDP's gradient sync flag). Returns this rank's summed loss, the number of
    samples this rank trained on, and the optimizer steps done in this epoch if asked to stop (else 0)."""
    steps = len(train_loader)  # micro-batches in a whole epoch
    updates_per_epoch = math.ceil(steps / args.accumulate)
    train_sampler.set_epoch(epoch)  # without it every epoch repeats the first epoch's shuffle
    model.train()
    first, loss_sum, loader = 0, 0.0, train_loader
    if epoch == start.epoch and start.step:  # the rest of a stopped epoch: its batches after the first start.step
        first, loss_sum = start.step, start.loss_sum
        loader = DataLoader(train_set, batch_size=args.batch_size,
                            sampler=list(train_sampler)[start.step * args.accumulate * args.batch_size:])
    batches = iter(loader)  # draws one number from the random generator, as the uninterrupted run did
    if first and start.rng is not None:
        set_rng(start.rng, place)
    bar = tqdm(batches, total=len(loader), desc=f"epoch {epoch + 1}", disable=place.rank != 0 or None)
    for i, (x, y) in enumerate(bar, start=first * args.accumulate):
        x, y = x.to(place.device), y.to(place.device)
        group_start = i - i % args.accumulate
        group = min(args.accumulate, steps - group_start)  # the epoch's last group may be shorter
        last = i == group_start + group - 1
        if args.strategy == "fsdp":
            model.set_requires_gradient_sync(last)
        with model.no_sync() if args.strategy == "ddp" and not last else nullcontext():
            with autocast:
                loss = F.cross_entropy(model(x).float(), y)
            (loss / group).backward()  # the mean over the group's samples, as one big batch
        if last:
            for param_group in optimizer.param_groups:
                param_group["lr"] = learning_rate(epoch * updates_per_epoch + i // args.accumulate, args, updates_per_epoch)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        loss_sum += loss.item()
        if last and stop.asked_anywhere(place.device):  # between two optimizer steps: no gradient half accumulated
            return loss_sum, len(loader.sampler), i // args.accumulate + 1
    return loss_sum, len(loader.sampler), 0


def evaluate(model, test_loader, autocast, place):
    """This rank's share of the test set: summed loss, right answers and samples counted (padding repeats
    weigh 0). Sums over the ranks give the whole set."""
    model.eval()
    test_loss = correct = counted = 0.0
    with torch.no_grad():
        for x, y, weight in test_loader:
            x, y, weight = x.to(place.device), y.to(place.device), weight.to(place.device)
            with autocast:
                logits = model(x).float()
            test_loss += (F.cross_entropy(logits, y, reduction="none") * weight).sum().item()
            correct += ((logits.argmax(1) == y).double() * weight).sum().item()
            counted += weight.sum().item()
    return test_loss, correct, counted


# ---------------------------------------------------------------------------------------------------
# 7. The report: one row per epoch, and the final weights as one plain state_dict.

def epoch_metrics(epoch, sums, test_size, steps, trained, train_seconds, started, place):
    """One row of metrics.json from the sums over the ranks: the training loss per micro-batch, the test
    loss and accuracy per sample, the samples trained per second (padding repeats included: they are
    trained on) and the epoch's seconds, its evaluation included."""
    loss_sum, test_loss, correct, counted = sums
    assert counted == test_size, "every test sample is counted exactly once"
    return {"epoch": epoch + 1, "train_loss": loss_sum / (steps * place.world), "test_loss": test_loss / counted,
            "test_accuracy": correct / counted, "samples_per_s": trained * place.world / train_seconds,
            "seconds": time.perf_counter() - started}


def record_epoch(folder, metrics, epochs):
    """metrics.json rewritten whole (atomically) after every epoch, and one line for the reader. Rank 0 only."""
    write_atomically(folder / "metrics.json", lambda p: p.write_text(json.dumps(metrics, indent=1)))
    m = metrics[-1]
    print(f"epoch {m['epoch']}/{epochs}: train loss {m['train_loss']:.4f}, test loss {m['test_loss']:.4f}, "
          f"accuracy {m['test_accuracy']:.2%}, {m['samples_per_s']:.0f} samples/s", flush=True)


def save_final_weights(model, folder, stop_file, place):
    """Gathered from FSDP's shards, without DDP's "module." prefix: torch.load(..., weights_only=True)
    into a fresh build_model(). Every rank takes part in the gathering; rank 0 writes."""
    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if place.rank == 0:
        write_atomically(folder / "model.pt", lambda p: torch.save(weights, p))
        if stop_file:
            Path(stop_file).unlink(missing_ok=True)  # finished: a stop asked too late needs no second run


def main(argv=None):
    """Train as the command line `argv` (default: sys.argv[1:]) says. A function, so that tests can call it
    in-process. Read it as the table of contents: one line per step, each step a function above."""
    args = parse_arguments(argv)
    place = place_from_torchrun()

    # 1. What the user gave, checked before the process group exists: a failure stops every rank alike.
    check_arguments(args, place.world)
    model, train_set, test_set = build_model_and_data(args)
    shapes = {name: list(value.shape) for name, value in model.state_dict().items()}  # before wrapping renames them
    folder = Path(args.checkpoint_dir)
    latest, meta = find_checkpoint(folder, args, shapes, place.world)

    # 2. Set-up: the device and the process group; from here on SIGTERM and SIGUSR1 only ask for a stop.
    place = join_process_group(args.strategy, place)
    stop = StopRequest(args.stop_file, place.local_rank)

    # 3. The model wrapped for its strategy, and the optimizer over what this rank holds of it.
    model = wrap_for_strategy(model, args.strategy, place)
    optimizer = make_optimizer(model, args)

    # 4. Data, each rank its share.
    train_sampler, train_loader, test_loader = make_loaders(train_set, test_set, args, place)
    autocast = torch.autocast(place.device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")

    # 5. Resume from the latest checkpoint (with --resume), or start fresh.
    start = resume_or_start_fresh(model, optimizer, folder, latest, meta, args, place)
    metrics = start.metrics

    # 6. Train: an epoch, its evaluation, its checkpoint; or, asked to stop, that step's checkpoint and out.
    for epoch in range(start.epoch, args.epochs):
        started = time.perf_counter()
        loss_sum, trained, stopped_after = train_one_epoch(model, optimizer, train_set, train_sampler, train_loader,
                                                           epoch, start, stop, autocast, args, place)
        if stopped_after:
            name = save_checkpoint(folder, model, optimizer, args, shapes, place, epoch, stopped_after, loss_sum)
            if place.rank == 0:
                stop.say_saved(name, stopped_after, math.ceil(len(train_loader) / args.accumulate), epoch)
            stop.restore_handlers()
            return  # every rank has passed the save's last barrier; the process ends below, group and all
        train_seconds = time.perf_counter() - started
        sums = all_sum(place.device, loss_sum, *evaluate(model, test_loader, autocast, place))  # one all-reduce
        metrics.append(epoch_metrics(epoch, sums, len(test_set), len(train_loader), trained, train_seconds, started, place))
        save_checkpoint(folder, model, optimizer, args, shapes, place, epoch + 1)
        if place.rank == 0:
            record_epoch(folder, metrics, args.epochs)

    # 7. The final weights, the report back to the cell (or the terminal), and a clean exit from the group.
    save_final_weights(model, folder, args.stop_file, place)
    stop.restore_handlers()
    report(strategy=args.strategy, world=place.world, device=place.device.type, **(metrics[-1] if metrics else {}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
