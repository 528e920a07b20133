"""How long communication takes: the alpha–beta model and published interconnect figures.

Data parallelism pays for every step with an all-reduce of the gradients. Whether that is
cheap or ruinous depends on two numbers of the link between the cards:

* alpha, the latency: what any message costs, however small (starting the operation,
  handshakes, kernel launches, the hops around the ring);
* beta, the seconds per byte: the inverse of the bandwidth.

A collective of `nbytes` then takes about ``alpha + beta * nbytes``. Lesson 06 measures
this on the course's four cards, fits alpha and beta, and uses the model (and the
published figures below) to predict what real four-GPU machines would do. Later lessons
(tensor parallelism, the capstone) reuse the same functions for their communication costs.

Units: sizes in bytes, times in seconds, bandwidths in GB/s with 1 GB = 1e9 bytes (the
convention of `nccl-tests`, whose "busbw" column the published figures come from).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from .language import _

GB = 1e9  # nccl-tests reports GB/s with 1 GB = 10**9 bytes
DTYPE_BYTES = {"fp32": 4, "float32": 4, "fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2, "fp64": 8, "float64": 8}


def dtype_bytes(dtype: object) -> int:
    """Bytes per element of a dtype given as a name ("fp32", "bf16"...) or a torch.dtype."""
    itemsize = getattr(dtype, "itemsize", None)  # torch.dtype has .itemsize
    if isinstance(itemsize, int):
        return itemsize
    name = str(dtype).removeprefix("torch.").lower()
    if name not in DTYPE_BYTES:
        raise ValueError(_("unknown dtype {dtype}: use one of {names} or a torch.dtype").format(
            dtype=repr(dtype), names=", ".join(sorted(DTYPE_BYTES))))
    return DTYPE_BYTES[name]


def gradient_bytes(num_parameters: int, dtype: object = "fp32") -> int:
    """Size of one copy of the gradients: what DDP all-reduces every step."""
    return int(num_parameters) * dtype_bytes(dtype)


_CANONICAL = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "fp16": "fp16", "float16": "fp16", "half": "fp16",
              "bf16": "bf16", "bfloat16": "bf16", "fp64": "fp64", "float64": "fp64", "double": "fp64"}


def _dtype_name(dtype: object) -> str:
    """"fp32", "bf16", "fp16" or "fp64" for a dtype given as a name or a torch.dtype."""
    name = str(dtype).removeprefix("torch.").lower()
    if name not in _CANONICAL:
        raise ValueError(_("unknown dtype {dtype}: use one of {names} or a torch.dtype").format(
            dtype=repr(dtype), names=", ".join(sorted(_CANONICAL))))
    return _CANONICAL[name]


def gradient_dtype(strategy: str, parameters: object = "fp32", compute: object | None = None, *,
                   compress_hook: str | None = None, reduce_dtype: object | None = None) -> str:
    """The dtype ("fp32", "bf16", ...) in which `strategy`, "DDP" or "FSDP", reduces the gradients.

    `parameters` is the dtype the parameters are stored in; `compute` the dtype the arithmetic runs in
    (`torch.autocast`'s for DDP, `MixedPrecisionPolicy.param_dtype` for FSDP); None means the parameters'.

    DDP: autocast casts copies of the weights for each operation, but autograd hands every gradient back in its
    leaf's dtype, so the gradients, DDP's buckets and its all-reduce are in the parameters' dtype whatever autocast
    computes in (`compute` changes nothing). Only a communication hook changes what is sent:
    `bf16_compress_hook` / `fp16_compress_hook` (`compress_hook="bf16"` or `"fp16"`) cast each bucket to that dtype
    for the all-reduce and back into the bucket after it.

    FSDP (FSDP2's `MixedPrecisionPolicy`): the gathered weights are cast to `param_dtype`, so the gradients come
    out of backward in it; the reduce-scatter runs in `reduce_dtype` if given, else in those gradients' dtype
    (`param_dtype` if given, else the parameters'). Whatever dtype it ran in, the reduced shard is then cast back to
    the parameters' own dtype (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, foreach_reduce).
    """
    if strategy == "DDP":
        if reduce_dtype is not None:
            raise ValueError(_("DDP has no reduce_dtype: a compression hook (compress_hook=\"bf16\") changes what it sends"))
        if compress_hook is None:
            return _dtype_name(parameters)
        if compress_hook not in ("bf16", "fp16"):
            raise ValueError(_("compress_hook must be None, \"bf16\" or \"fp16\", not {hook}").format(hook=repr(compress_hook)))
        return compress_hook
    if strategy == "FSDP":
        if compress_hook is not None:
            raise ValueError(_("FSDP2 has no compression hook: MixedPrecisionPolicy(reduce_dtype=...) sets what it sends"))
        return _dtype_name(reduce_dtype if reduce_dtype is not None else compute if compute is not None else parameters)
    raise ValueError(_("strategy must be \"DDP\" or \"FSDP\", not {strategy}").format(strategy=repr(strategy)))


def ring_all_reduce_bytes(nbytes: float, n: int) -> float:
    """Bytes each card sends (and receives) in a ring all-reduce of an `nbytes` tensor.

    The ring does a reduce-scatter (n−1 steps) then an all-gather (n−1 steps), each step
    moving one n-th of the tensor: 2(n−1)/n × nbytes. It tends to 2 × nbytes as n grows,
    which is why a ring's time hardly depends on the number of cards.
    """
    _check_n(n)
    return 2 * (n - 1) / n * nbytes


def ring_reduce_scatter_bytes(nbytes: float, n: int) -> float:
    """Bytes each card sends in a ring reduce-scatter (or all-gather) of `nbytes` in all: (n−1)/n × nbytes."""
    _check_n(n)
    return (n - 1) / n * nbytes


ring_all_gather_bytes = ring_reduce_scatter_bytes  # the same traffic, run the other way


def attention_flops_per_token(sequence: int, width: int, blocks: int, *, causal: bool = False) -> float:
    """Forward FLOPs per token of attention's two products that grow with the sequence, the scores q·kᵀ and the
    weighted sum of v, over `blocks` blocks of `width` (all heads together: grouped-query attention shares keys and
    values between heads, not these products).

    Why a term of its own: a rule of FLOPs per parameter leaves it out, and it grows with the context. Each product
    costs 2·width per query-key pair (a multiply and an add per term). `causal=False` counts every pair, `sequence`
    keys per query, 4·sequence·width per block: what PyTorch's plain kernel computes before masking, and the usual
    convention (nanoGPT's `estimate_mfu` after PaLM's Appendix B, torchtitan's count). `causal=True` counts only the
    pairs the mask keeps, query i against i + 1 keys, (sequence + 1)/2 on average: what a kernel that skips the
    masked part does, about half."""
    keys = (sequence + 1) / 2 if causal else sequence
    return 4 * keys * width * blocks


def training_flops_per_token(matmul_parameters: float, sequence: int, width: int, blocks: int, *,
                             causal: bool = False, recomputed_parameters: float | None = None) -> float:
    """FLOPs per token of one training step, counted as the matrix products run.

    Forward: 2 per weight of a matrix product (`matmul_parameters`: the weights that multiply activations, not an
    embedding looked up, not a norm) plus attention's products. Backward: twice forward (for each product a gradient
    for its input and one for its weight; for q·kᵀ and the sum of v, two gradients each). With activation
    checkpointing (`recomputed_parameters` given), backward first runs each block's forward again, but only as far
    as backward needs: PyTorch's non-reentrant checkpoint stops once the tensors backward uses are rebuilt, so a
    block's last product, whose output nothing keeps, is not run again. `recomputed_parameters` are the weights of
    the products run again (each block's, less its last), and attention's products run again with them."""
    attention = attention_flops_per_token(sequence, width, blocks, causal=causal)
    step = 3 * (2 * matmul_parameters + attention)
    if recomputed_parameters is not None:
        step += 2 * recomputed_parameters + attention
    return step


def bus_bandwidth(nbytes: float, seconds: float, n: int) -> float:
    """All-reduce bus bandwidth in GB/s: algbw (nbytes / seconds) × 2(n−1)/n.

    algbw alone falls as cards are added, though the links are as busy as ever; busbw is
    the rate each card's link actually carries, comparable across n and with the link's
    hardware speed (see nccl-tests, doc/PERFORMANCE.md).
    """
    return ring_all_reduce_bytes(nbytes, n) / seconds / GB


def _check_n(n: int) -> None:
    if n < 1:
        raise ValueError(_("the number of cards must be at least 1, got {n}").format(n=n))


def _minimise_convex(function: Callable[[float], float], low: float, high: float, steps: int = 100) -> float:
    """The argument in [low, high] where a convex function of one variable is smallest (golden-section search)."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = low, high
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = function(c), function(d)
    for _ in range(steps):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = function(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = function(d)
    return (a + b) / 2


def _worst_error(alpha: float, beta: float, points: Sequence[tuple[float, float]]) -> float:
    return max(abs((alpha + beta * s) / t - 1) for s, t in points)


def _best_alpha(beta: float, points: Sequence[tuple[float, float]]) -> float:
    top = max(t for _, t in points)
    return _minimise_convex(lambda alpha: _worst_error(alpha, beta, points), 0.0, top)


@dataclass(frozen=True)
class AlphaBeta:
    """time(nbytes) = alpha + beta × nbytes for one collective on a fixed number of cards.

    alpha is in seconds, beta in seconds per byte of the tensor handed to the collective
    (not of the bytes on the wire: those are folded into beta, see `busbw_gbs`).
    """

    alpha: float
    beta: float

    def seconds(self, nbytes: float) -> float:
        """Predicted time of one collective on an `nbytes` tensor."""
        return self.alpha + self.beta * nbytes

    def bucketed_seconds(self, nbytes: float, bucket_bytes: float) -> float:
        """Time to all-reduce `nbytes` sent as ceil(nbytes / bucket_bytes) separate buckets,
        as DDP does (25 MiB buckets by default): every bucket pays alpha once."""
        buckets = max(1, math.ceil(nbytes / bucket_bytes))
        return buckets * self.alpha + self.beta * nbytes

    def bandwidth_gbs(self) -> float:
        """algbw for very large messages (1 / beta), in GB/s."""
        return 1 / self.beta / GB

    def busbw_gbs(self, n: int) -> float:
        """Bus bandwidth for very large messages on `n` cards, in GB/s (comparable to nccl-tests)."""
        return ring_all_reduce_bytes(1, n) / self.beta / GB

    def crossover_bytes(self) -> float:
        """The size at which latency and bandwidth cost the same (alpha / beta): below it
        a collective is latency-bound, and sending fewer, larger messages pays off."""
        return self.alpha / self.beta

    def relative_errors(self, sizes: Sequence[float], seconds: Sequence[float]) -> list[float]:
        """(predicted − measured) / measured for each measured point."""
        return [(self.seconds(s) - t) / t for s, t in zip(sizes, seconds)]

    @classmethod
    def from_busbw(cls, busbw_gbs: float, latency_s: float, n: int) -> "AlphaBeta":
        """The all-reduce model of a link known by its bus bandwidth and small-message latency."""
        return cls(alpha=latency_s, beta=ring_all_reduce_bytes(1, n) / (busbw_gbs * GB))

    @classmethod
    def fit(cls, sizes: Iterable[float], seconds: Iterable[float], worst_case: bool = False) -> "AlphaBeta":
        """Fit alpha and beta to measured (size, time) points.

        The fit minimises the RELATIVE error: measured times span four orders of magnitude,
        and an ordinary fit would spend all its effort on the largest messages and predict
        small ones badly. By default it is a least-squares fit, sum(((alpha + beta·s) / t − 1)²);
        with `worst_case=True` it minimises the largest relative error instead, which is the
        right fit when the question is "within what percentage does the model predict every
        size?". Neither number may be negative.
        """
        points = [(float(s), float(t)) for s, t in zip(sizes, seconds)]
        if len(points) < 2 or any(t <= 0 for _, t in points):
            raise ValueError(_("fit needs at least two points with positive times"))
        if worst_case:
            return cls._fit_worst_case(points)
        # Rows [1/t, s/t] · [alpha, beta] ≈ 1: solve the 2×2 normal equations.
        a11 = sum(1 / t**2 for _, t in points)
        a12 = sum(s / t**2 for s, t in points)
        a22 = sum(s**2 / t**2 for s, t in points)
        b1 = sum(1 / t for _, t in points)
        b2 = sum(s / t for s, t in points)
        det = a11 * a22 - a12**2
        alpha, beta = ((a22 * b1 - a12 * b2) / det, (a11 * b2 - a12 * b1) / det) if det > 0 else (-1.0, -1.0)
        if alpha < 0 or beta <= 0:
            # One of them is not supported by the data: fit the better single-term model.
            only_beta = cls(0.0, b2 / a22)
            only_alpha = cls(b1 / a11, 0.0)
            def cost(model: AlphaBeta) -> float:
                return sum(e * e for e in model.relative_errors([s for s, _ in points], [t for _, t in points]))
            return min((only_beta, only_alpha), key=cost)
        return cls(alpha, beta)

    @classmethod
    def _fit_worst_case(cls, points: Sequence[tuple[float, float]]) -> "AlphaBeta":
        # The largest relative error is convex in (alpha, beta), so nested one-dimensional
        # searches find the minimum: the best alpha for each beta, then the best beta.
        steepest = max(t / s for s, t in points if s > 0)
        beta = _minimise_convex(lambda b: _worst_error(_best_alpha(b, points), b, points), 0.0, steepest)
        return cls(_best_alpha(beta, points), beta)


@dataclass(frozen=True)
class Interconnect:
    """Published all-reduce figures for a real multi-GPU machine (NOT measured here).

    busbw_gbs: nccl-tests all_reduce_perf bus bandwidth at large messages, GB/s.
    latency_us: time of a tiny all_reduce (a few bytes), microseconds.
    source: where each figure comes from and under which conditions (GPU count, driver
    and P2P state, message size), so that a lesson printing it prints the conditions too.
    note: how those conditions differ from the machine the name describes.
    """

    name: str
    busbw_gbs: float
    latency_us: float
    source: str
    note: str = ""

    def model(self, n: int = 4) -> AlphaBeta:
        """The alpha–beta model of an all-reduce on `n` cards of this machine."""
        return AlphaBeta.from_busbw(self.busbw_gbs, self.latency_us * 1e-6, n)


PUBLISHED: dict[str, Interconnect] = {
    # 4× RTX 4090. GeForce cards have no NVLink. With NVIDIA's stock driver, GPU-to-GPU
    # peer-to-peer (P2P) access is disabled on these cards, and NCCL stages the traffic
    # through host memory (blog.chlc.cc/p/rtx4090-gpudirect-p2p-unlocked: "NVIDIA disables
    # the GPUDirect P2P capability on RTX4090 GPUs"; allanchan339.github.io/bug-fixes/2025/05/21/
    # 4090-P2P.html). The busbw below was NOT measured under stock conditions: it
    # comes from a machine running tinygrad's P2P-unlocking kernel modules, so the cards
    # wrote to each other directly over PCIe.
    # busbw: github.com/tinygrad/open-gpu-kernel-modules/issues/36 (user ChihayaK):
    #   p2pBandwidthLatencyTest reports every pair "CAN Access Peer" (P2P on, patched driver);
    #   nccl-tests `all_reduce_perf -b 256M -e 2G -f 2 -g 4`, 4× RTX 4090, float sum:
    #   busbw 25.72 GB/s at 256 MiB, 25.82 at 512 MiB, 25.95 at 1 GiB. The thread is titled
    #   "RTX 4090D 48GB support?": nccl-tests lists the four cards as "NVIDIA GeForce RTX 4090",
    #   but they may be modified 48 GB cards (4090D), not stock 24 GB RTX 4090s.
    # latency: github.com/NVIDIA/nccl/issues/1530 ("Ring all-reduce shows poor bandwidth
    #   utilization on PCIe-connected GPUs"): `NCCL_BUFFSIZE=8388608 all_reduce_perf -g 8 -b 8`
    #   on 8× RTX 4090 over PCIe, 8-byte all_reduce 42.1 µs (out of place), 40.1 µs (in place);
    #   the driver's P2P state is not stated there. 8 cards, not 4: a 4-card ring has fewer hops.
    "4×RTX 4090, PCIe 4": Interconnect(
        "4×RTX 4090, PCIe 4", busbw_gbs=26.0, latency_us=40.0,
        source="nccl-tests all_reduce_perf. busbw: tinygrad/open-gpu-kernel-modules#36, 4 cards, "
               "P2P-unlocked driver (not stock), 256 MiB-1 GiB messages; latency: NVIDIA/nccl#1530, "
               "8 cards, 8-byte message, P2P state not stated",
        note="stock drivers disable P2P on RTX 4090 and route traffic through host memory: "
             "a stock machine may measure differently; latency from 8 cards",
    ),
    # A100 SXM4 with NVLink 3 through NVSwitch (DGX/HGX A100 baseboard, 8 GPUs).
    # busbw: docs.alayanew.com/en/docs/tech-blog/2026-05-06-nccl-tests ("NCCL-tests in
    #   practice"), reference table: 230-250 GB/s all_reduce busbw at large messages on
    #   8× A100 SXM4 with NVLink/NVSwitch. Measured on 8 GPUs, not 4: busbw is defined to be
    #   comparable across GPU counts (nccl-tests doc/PERFORMANCE.md), but a 4-GPU run may differ.
    # latency: github.com/NVIDIA/nccl/issues/583: a 32-byte all_reduce takes 10.1 µs on
    #   2× A100-SXM4-40GB over NVLink (nccl-tests all_reduce_perf).
    "4×A100, NVLink": Interconnect(
        "4×A100, NVLink", busbw_gbs=235.0, latency_us=10.0,
        source="nccl-tests all_reduce_perf. busbw: docs.alayanew.com nccl-tests reference table, "
               "8× A100 SXM4 NVLink/NVSwitch, large messages; latency: NVIDIA/nccl#583, "
               "2× A100-SXM4-40GB NVLink, 32-byte message",
        note="busbw measured on 8 cards, latency on 2, neither on 4",
    ),
}
