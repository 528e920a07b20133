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

Asked to stop (SIGTERM or SIGUSR1 to any rank, or --stop-file appearing, which lesson 12's SLURM
batch file writes at the time-limit warning), the ranks agree at the next optimizer step (one
all-reduce of a flag after every step), save that step's checkpoint and exit with status 0;
--resume continues from the next step, as if never stopped.
    metrics.json      one object per epoch: epoch, train_loss, test_loss, test_accuracy, samples_per_s, seconds
    model.pt          the final weights as a plain state_dict, whatever the strategy:
                      model.load_state_dict(torch.load("model.pt", weights_only=True))
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
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

try:  # in the course's notebooks, results go back to the cell; anywhere else they are printed
    from fourcard_helpers import report
except ImportError:
    def report(**values):
        print(f"report from rank {os.environ.get('RANK', '0')}: {json.dumps(values)}", flush=True)
CHECKPOINT = r"epoch-\d{4}(-step-\d{6})?"  # a checkpoint folder's name

try:
    from tqdm import tqdm
except ImportError:
    def tqdm(iterable, **_):
        return iterable


def main(argv=None):
    """Train as the command line `argv` (default: sys.argv[1:]) says. A function, so that tests can call it
    in-process; read it top to bottom as a script: numbered steps, comments say why."""
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
    args = parser.parse_args(argv)

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))


    def fail(message):
        """Stop every rank with the same message (printed once). Every check below runs before the
        process group exists, so no rank can be left waiting in a collective for a rank that left."""
        if rank == 0:
            print(f"train_any: error: {message}", file=sys.stderr, flush=True)
        sys.exit(2)


    def load_function(spec, flag):
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


    # 1. Everything the user gave, checked before any rank talks to another.
    sys.path.insert(0, os.getcwd())  # like `python -m`; `python script.py` alone looks only next to the script
    if args.epochs < 1 or args.batch_size < 1 or args.accumulate < 1:
        fail("--epochs, --batch-size and --accumulate must be at least 1")
    if args.strategy == "single" and world > 1:
        fail(f"--strategy single trains on one card, but torchrun started {world} ranks: use --nproc-per-node=1")
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

    # The checkpoint names every tensor and its shape: resuming another model's folder must fail clearly.
    shapes = {name: list(value.shape) for name, value in model.state_dict().items()}
    folder = Path(args.checkpoint_dir)
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

    # 2. Cards: GPUs with NCCL when there is one per rank, else CPU processes with gloo.
    wanted = os.environ.get("FOURCARD_DEVICE", "auto")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    on_gpu = wanted != "cpu" and gpus >= local_world
    if wanted == "cuda" and not on_gpu:
        fail(f"FOURCARD_DEVICE=cuda but {gpus} GPU(s) for {local_world} ranks on this machine")
    device = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)  # otherwise every rank's NCCL work lands on cuda:0
    backend = "nccl" if on_gpu else "gloo"
    if "RANK" in os.environ:  # under torchrun (even with one rank): join the others
        dist.init_process_group(backend, device_id=device if on_gpu else None)
    else:  # plain `python train_any.py`: a group of one, with an in-memory store, so the code below has one path
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, device_id=device if on_gpu else None)
    if rank == 0:
        cards = f"{world} GPU{'s' * (world > 1)} with NCCL" if on_gpu else f"{world} CPU process{'es' * (world > 1)} with gloo"
        why = "" if on_gpu else f" ({'FOURCARD_DEVICE=cpu' if wanted == 'cpu' else f'{gpus} GPU(s) for {local_world} ranks'})"
        print(f"train_any: {args.strategy} on {cards}{why}", flush=True)


    def all_sum(*values):
        """Sum numbers over the ranks (one all_reduce for all of them)."""
        total = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(total)
        return total.tolist()


    def set_rng(state):
        torch.set_rng_state(state["torch"])
        random.setstate(state["python"])
        if on_gpu and state["cuda"] is not None:
            torch.cuda.set_rng_state(state["cuda"])


    # A request to stop early: SLURM's SIGTERM (preemption, scancel; torchrun passes its own on to its ranks),
    # SIGUSR1, or the stop file. The handler only takes note: the ranks act on it together, between two steps.
    asked = {"by": None}

    def take_note(signum, frame):
        asked["by"] = signal.Signals(signum).name

    handled = (signal.SIGTERM, signal.SIGUSR1)
    previous = {s: signal.signal(s, take_note) for s in handled} if threading.current_thread() is threading.main_thread() else {}


    def stop_now():
        """Whether any rank was asked to stop: one all-reduce, so that every rank stops after the same step.
        Each node's first rank looks for the stop file: the node that wrote it sees it at once, even where
        a shared file system shows other nodes a new file only seconds later."""
        if asked["by"] is None and args.stop_file and local_rank == 0 and os.path.exists(args.stop_file):
            asked["by"] = f"found {args.stop_file}"
        return all_sum(float(asked["by"] is not None))[0] > 0


    # 3. Wrap the model for its strategy. Every rank built the same weights from the same seed.
    model.to(device)
    if args.strategy == "ddp":
        model = DDP(model, device_ids=[local_rank] if on_gpu else None)
    elif args.strategy == "fsdp":
        # FSDP2: each child with parameters becomes a unit that is gathered just before it runs and
        # freed after, then the root collects what is left. Each rank stores 1/world of every tensor.
        # The mesh is named: FSDP2's default is CUDA in any CUDA build of torch, even for CPU ranks.
        mesh = init_device_mesh(device.type, (world,))
        for child in model.children():
            if any(p.requires_grad for p in child.parameters()):
                fully_shard(child, mesh=mesh)
        fully_shard(model, mesh=mesh)
    if args.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    # 4. Data. Training: DistributedSampler gives each rank a 1/world share of one shuffle, a new
    #    one each epoch (set_epoch); it pads with a few repeats so that every rank has as many batches.
    train_sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)


    class WeightedTest(Dataset):
        """The test set padded to a multiple of the ranks, each item with a weight: 1, or 0 for a
        padding repeat. Every rank gets as many batches (FSDP needs every rank in every forward),
        and the weights keep the repeats out of the loss and accuracy: no sample counted twice."""

        def __init__(self, data):
            self.data, self.size = data, math.ceil(len(data) / world) * world

        def __len__(self):
            return self.size

        def __getitem__(self, index):
            x, y = self.data[index % len(self.data)]
            return x, y, float(index < len(self.data))


    weighted_test = WeightedTest(test_set)
    test_loader = DataLoader(weighted_test, batch_size=args.batch_size,
                             sampler=DistributedSampler(weighted_test, world, rank, shuffle=False))
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")

    # 5. Resume: model and optimizer through torch.distributed.checkpoint (it reshards FSDP's pieces
    #    for however many ranks load them), then the epoch and this rank's random number generators.
    start_epoch, start_step, start_loss, metrics, pending_rng = 0, 0, 0.0, [], None
    if meta:
        state = dict(zip(("model", "optimizer"), get_state_dict(model, optimizer)))
        dcp.load(state, checkpoint_id=latest)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        start_epoch, start_step = meta["epoch"], meta.get("step", 0)
        rng_file = latest / f"rng-rank{rank}.pt"
        if meta["world"] == world:
            rng = torch.load(rng_file, weights_only=True)
            start_loss = rng.get("loss_sum", 0.0)  # this rank's loss so far in a stopped epoch
            if start_step:  # in the middle of an epoch: after the epoch's DataLoader iterator has drawn its seed
                pending_rng = rng
            else:
                set_rng(rng)
        elif rank == 0:
            print(f"train_any: saved on {meta['world']} ranks, resumed on {world}: weights and optimizer are exact, "
                  "the random streams (dropout, augmentation) start afresh", flush=True)
        if (folder / "metrics.json").is_file():
            metrics = [m for m in json.loads((folder / "metrics.json").read_text()) if m["epoch"] <= start_epoch]
        if rank == 0:
            steps_done = f" and {start_step} step{'s' * (start_step > 1)}" if start_step else ""
            print(f"train_any: resumed from {latest.name}, {start_epoch} of {args.epochs} epochs{steps_done} done", flush=True)
    elif args.resume and rank == 0:
        print(f"train_any: no checkpoint in {folder} yet, starting fresh", flush=True)
    if not meta:
        torch.manual_seed(args.seed * 1000 + rank + 1)  # each rank its own stream (dropout, augmentation)


    def save_checkpoint(epoch, step=0, loss_sum=0.0):
        """Write epoch-NNNN.tmp, then rename it: a crash mid-save leaves the previous epoch intact.
        `step` > 0: `epoch` epochs and `step` optimizer steps of the next one are done (epoch-NNNN-step-SSSSSS)."""
        name = f"epoch-{epoch:04d}" + (f"-step-{step:06d}" if step else "")
        final, tmp = folder / name, folder / f"{name}.tmp"
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=tmp)
        rng = {"torch": torch.get_rng_state(), "python": random.getstate(),
               "cuda": torch.cuda.get_rng_state() if on_gpu else None, "loss_sum": loss_sum}
        torch.save(rng, tmp / f"rng-rank{rank}.pt")
        dist.barrier()
        if rank == 0:
            meta = {"epoch": epoch, "step": step, "sampler_epoch": epoch, "world": world, "strategy": args.strategy,
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
        partial = path.with_name(path.name + ".partial")
        save(partial)
        os.replace(partial, path)


    # 6. Train. With --accumulate N, gradients of N micro-batches add up before one optimizer step;
    #    only the last micro-batch of a group synchronises them (DDP no_sync, FSDP's gradient sync flag).
    steps = len(train_loader)
    updates_per_epoch = math.ceil(steps / args.accumulate)


    def learning_rate(update):
        """The learning rate of optimizer step `update` (counted from the start of training). A pure
        function of the step, not a scheduler object: nothing to checkpoint, and resuming is exact."""
        total = args.epochs * updates_per_epoch
        warmup = max(1, total // 10)
        if args.schedule == "constant":
            return args.lr
        if update < warmup:
            return args.lr * (update + 1) / warmup
        return args.lr * 0.5 * (1 + math.cos(math.pi * (update - warmup) / max(1, total - warmup)))


    for epoch in range(start_epoch, args.epochs):
        started = time.perf_counter()
        train_sampler.set_epoch(epoch)  # without it every epoch repeats the first epoch's shuffle
        model.train()
        first, loss_sum, loader = 0, 0.0, train_loader
        if epoch == start_epoch and start_step:  # the rest of a stopped epoch: its batches after the first start_step
            first, loss_sum = start_step, start_loss
            loader = DataLoader(train_set, batch_size=args.batch_size,
                                sampler=list(train_sampler)[start_step * args.accumulate * args.batch_size:])
        batches = iter(loader)  # draws one number from the random generator, as the uninterrupted run did
        if pending_rng is not None:
            set_rng(pending_rng)
            pending_rng = None
        bar = tqdm(batches, total=len(loader), desc=f"epoch {epoch + 1}", disable=rank != 0 or None)
        for i, (x, y) in enumerate(bar, start=first * args.accumulate):
            x, y = x.to(device), y.to(device)
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
                    param_group["lr"] = learning_rate(epoch * updates_per_epoch + i // args.accumulate)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            loss_sum += loss.item()
            if last and stop_now():  # between two optimizer steps: no gradient half accumulated
                done = i // args.accumulate + 1
                name = save_checkpoint(epoch, step=done, loss_sum=loss_sum)
                if rank == 0:
                    print(f"train_any: asked to stop ({asked['by'] or 'by another rank'}): saved {name} after step "
                          f"{done} of {updates_per_epoch} in epoch {epoch + 1}; --resume continues from it", flush=True)
                for handled_signal, handler in previous.items():
                    signal.signal(handled_signal, handler)
                return  # every rank has passed the save's last barrier; the process ends below, group and all
        train_seconds = time.perf_counter() - started

        # Evaluate on every rank's share of the test set; sums over the ranks give the whole set.
        model.eval()
        test_loss = correct = counted = 0.0
        with torch.no_grad():
            for x, y, weight in test_loader:
                x, y, weight = x.to(device), y.to(device), weight.to(device)
                with autocast:
                    logits = model(x).float()
                test_loss += (F.cross_entropy(logits, y, reduction="none") * weight).sum().item()
                correct += ((logits.argmax(1) == y).double() * weight).sum().item()
                counted += weight.sum().item()
        loss_sum, test_loss, correct, counted = all_sum(loss_sum, test_loss, correct, counted)
        assert counted == len(test_set), "every test sample is counted exactly once"
        metrics.append({"epoch": epoch + 1, "train_loss": loss_sum / (steps * world), "test_loss": test_loss / counted,
                        "test_accuracy": correct / counted,
                        "samples_per_s": len(loader.sampler) * world / train_seconds,  # padding repeats included: they are trained on
                        "seconds": time.perf_counter() - started})
        save_checkpoint(epoch + 1)
        if rank == 0:
            write_atomically(folder / "metrics.json", lambda p: p.write_text(json.dumps(metrics, indent=1)))
            m = metrics[-1]
            print(f"epoch {m['epoch']}/{args.epochs}: train loss {m['train_loss']:.4f}, test loss {m['test_loss']:.4f}, "
                  f"accuracy {m['test_accuracy']:.2%}, {m['samples_per_s']:.0f} samples/s", flush=True)

    # 7. The final weights as one plain state_dict (gathered from FSDP's shards, without DDP's
    #    "module." prefix): torch.load(..., weights_only=True) into a fresh build_model().
    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        write_atomically(folder / "model.pt", lambda p: torch.save(weights, p))
        if args.stop_file:
            Path(args.stop_file).unlink(missing_ok=True)  # finished: a stop asked too late needs no second run
    for handled_signal, handler in previous.items():
        signal.signal(handled_signal, handler)
    report(strategy=args.strategy, world=world, device=device.type, **(metrics[-1] if metrics else {}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush(); os._exit(0)  # skip Python's teardown, which can abort a gloo rank (lesson 00)
