"""Lesson 13's GPT at a size whose blocks are most of it: each rank's bytes in its first training step, counted exactly
by LiveTensorBytes, for one card, DDP, FSDP2 with activation checkpointing and the 2 × 2 mesh (tensor + sequence parallel
over tp, FSDP2 over dp). Reports per strategy the bytes before the step, after forward, the peaks of forward + backward
and of the optimizer step (which makes AdamW's moments), and the bytes after it, at rest."""
import argparse
import contextlib
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel, loss_parallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel as DDP

from fourcard_helpers import detect, report, exit_without_teardown
from fourcard_helpers.gpt import GPT, Checkpointed, GPTConfig, get_batch, poem_tokens
from fourcard_helpers.memory import LiveTensorBytes

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--width", type=int, default=256, help="d: 12·d²·L, the blocks, well above V·d, the table")
parser.add_argument("--blocks", type=int, default=6)
parser.add_argument("--batch", type=int, default=4, help="windows per step, all ranks together")
args = parser.parse_args()
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
tokens, chars = poem_tokens()
config = GPTConfig(vocab_size=len(chars), n_layer=args.blocks, d_model=args.width)
mesh, flat = init_device_mesh(cards.kind, (2, 2), mesh_dim_names=("dp", "tp")), init_device_mesh(cards.kind, (4,))
mesh_dp, mesh_tp = mesh["dp"], mesh["tp"]                       # the sub-meshes, made before any count begins
BLOCK = {"attention_norm": SequenceParallel(), "mlp_norm": SequenceParallel(),   # section 5's plan
         **{name: PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate()) for name in ("attention", "mlp")},
         **{name: ColwiseParallel() for name in ("attention.wq", "attention.wk", "attention.wv", "mlp.w1")},
         **{name: RowwiseParallel(output_layouts=Shard(1)) for name in ("attention.wo", "mlp.w2")}}
def build(strategy: str) -> torch.nn.Module:                    # one card's initial weights, laid out for `strategy`
    torch.manual_seed(0)
    model = GPT(config).to(device)
    if strategy == "DDP":
        return DDP(model, device_ids=[device] if cards.kind == "cuda" else None)
    if strategy == "2 × 2 mesh":
        parallelize_module(model, mesh_tp, {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
            "layers.0": PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Shard(1), use_local_output=True),
            **{f"layers.{i}.{name}": style for i in range(config.n_layer) for name, style in BLOCK.items()}, "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)})
        model.output.weight = model.tok_embeddings.weight        # re-tie (section 5)
    if strategy == "FSDP2 + checkpointing":
        model.layers = torch.nn.ModuleList(Checkpointed(block) for block in model.layers)
    shard_over = {"FSDP2 + checkpointing": flat, "2 × 2 mesh": mesh_dp}.get(strategy)   # FSDP2 over 4 ranks, or over dp
    if shard_over is not None:
        for block in model.layers:
            fully_shard(block, mesh=shard_over)
        fully_shard(model, mesh=shard_over)
    return model
found = {}
for strategy, share in (("one card", slice(None)), ("DDP", slice(rank, None, 4)), ("FSDP2 + checkpointing", slice(rank, None, 4)),
                        ("2 × 2 mesh", slice(mesh.get_local_rank("dp"), None, 2))):   # windows of each batch this rank takes
    if strategy == "one card" and rank > 0:                      # rank 0 alone, the whole batch
        continue
    with LiveTensorBytes() as live:                              # from the model's first byte on
        live.track([tokens])                                     # the text, which every rank holds whole
        model = build(strategy)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        x, y = (t[share].to(device) for t in get_batch(tokens, args.batch, config.block_size, torch.Generator().manual_seed(0)))
        before = live.peak = live.current                        # the weights (and the batch): AdamW has no moments yet
        with loss_parallel() if strategy == "2 × 2 mesh" else contextlib.nullcontext():
            loss = model(x, y)[1]
            forward = live.current
            loss.backward()
        backward, live.peak = live.peak, live.current
        optimizer.step()                                         # the step makes AdamW's moments
        optimizer.zero_grad()
        del loss
        found[strategy] = {"before": before, "forward": forward, "backward": backward, "optimizer": live.peak, "rest": live.current}
report(**found)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
