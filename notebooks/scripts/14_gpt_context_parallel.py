"""Lesson 13's GPT, one sequence cut head-tail over four ranks, float64, with the lean ring and with section 2's ring.
Reports the loss, the gradients' gaps from one card, the bytes sent and held; and a mistake's: positions at 0-127."""
import copy
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from fourcard_helpers import detect, report, exit_without_teardown
from fourcard_helpers.gpt import GPT, GPTConfig, get_batch, poem_tokens
from fourcard_helpers.memory import LiveTensorBytes
from fourcard_helpers.ring import LeanRingAttention, chunk_positions, ring_attention

class Meter(LiveTensorBytes):  # the package's count of the bytes of tensors alive and their peak, at the dispatcher;
    def __init__(self):         # added here: the bytes each send carries, forward and backward
        super().__init__()
        self.phase, self.sent, self.left = "forward", dict(forward=0, backward=0), []
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.sent[self.phase] += sum(t.nbytes for t in args[0]) if func._opname == "send" else 0
        return super().__torch_dispatch__(func, types, args, kwargs)
T = 512
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
stream, chars = poem_tokens()
torch.manual_seed(0)
one_card = GPT(GPTConfig(vocab_size=len(chars), block_size=T)).to(device, torch.float64)   # the same on every rank
copies = [copy.deepcopy(one_card) for _ in range(3)]  # one for each run, made before any gradient
x, y = (t.to(device) for t in get_batch(stream, 1, T, torch.Generator().manual_seed(0)))   # one sequence of T
(one_card_loss := one_card(x, y)[1]).backward()      # the yardstick: one card, the whole sequence
mine = torch.cat(chunk_positions(rank, world, T, balanced=True)).to(device)   # front, back

def context_parallel_loss(model, attention, meter, at):   # lesson 13's GPT.forward, on my positions only
    h = model.tok_embeddings(x[:, mine]) + model.pos_embeddings(at)   # at = mine: each token at its place
    for block in model.layers:
        a, z, before = block.attention, block.attention_norm(h), meter.current
        out = attention(*(w(z).view(1, len(mine), -1, a.head_dim).transpose(1, 2) for w in (a.wq, a.wk, a.wv)), T, True)
        meter.left.append(meter.current - before)     # what q, k, v and the attention left alive for backward
        h = h + a.wo(out.transpose(1, 2).reshape(1, len(mine), -1))
        h = h + block.mlp(block.mlp_norm(h))
    logits = model.output(model.norm(h))   # my tokens' part of the mean over all T: the four parts add up to the loss
    return F.cross_entropy(logits.flatten(0, 1), y[:, mine].flatten(), reduction="sum") / T
def gaps(model):                                      # each parameter's largest |gap|, as a share of its largest entry
    return {name: ((p.grad - q.grad).abs().max() / q.grad.abs().max()).item()
            for (name, p), q in zip(model.named_parameters(), one_card.parameters())}
runs = {}
for model, (ring, attention, at) in zip(copies, (("lean", LeanRingAttention.apply, mine), ("keeps every block",
        ring_attention, mine), ("lean, positions 0-127", LeanRingAttention.apply, torch.arange(len(mine), device=device)))):
    with Meter() as meter:
        loss = context_parallel_loss(model, attention, meter, at)
        meter.phase, kept = "backward", meter.current  # what forward left for backward
        loss.backward()
    own_part = max(gaps(model).values())              # before the sum over the ranks: far from one card
    for part in [p.grad for p in model.parameters()] + [loss.detach()]:   # each rank's part of every gradient and
        dist.all_reduce(part)                                              # of the loss: added over the ranks
    runs[ring] = dict(loss=loss.item(), gaps=gaps(model), own_part=own_part, sent=meter.sent, kept=kept, peak=meter.peak,
                      left=meter.left)
report(one_card_loss=one_card_loss.item(), shape=[T, one_card.config.n_layer, one_card.config.n_head,
       one_card.config.d_model // one_card.config.n_head], **runs)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
