"""The cost model: ring traffic formulas, the alpha–beta fit, and the published figures."""
import math

import pytest
import torch

from fourcard_helpers import costmodel
from fourcard_helpers.costmodel import PUBLISHED, AlphaBeta, Interconnect


def test_ring_bytes_formulas():
    assert costmodel.ring_all_reduce_bytes(1000, 4) == pytest.approx(1500)
    assert costmodel.ring_all_reduce_bytes(1000, 1) == 0
    assert costmodel.ring_all_gather_bytes(1000, 4) == pytest.approx(750)
    assert costmodel.ring_reduce_scatter_bytes(1000, 4) == pytest.approx(750)
    # reduce-scatter + all-gather is exactly an all-reduce's traffic
    assert costmodel.ring_reduce_scatter_bytes(1000, 8) + costmodel.ring_all_gather_bytes(1000, 8) == pytest.approx(
        costmodel.ring_all_reduce_bytes(1000, 8))
    with pytest.raises(ValueError):
        costmodel.ring_all_reduce_bytes(1000, 0)


def test_bus_bandwidth_is_algbw_times_ring_factor():
    # 1 GB in 1 s on 4 cards: algbw 1 GB/s, busbw 1.5 GB/s
    assert costmodel.bus_bandwidth(1e9, 1.0, 4) == pytest.approx(1.5)


def test_dtype_bytes_and_gradient_bytes():
    assert costmodel.dtype_bytes("fp32") == 4
    assert costmodel.dtype_bytes("bf16") == 2
    assert costmodel.dtype_bytes(torch.float16) == 2
    assert costmodel.dtype_bytes("torch.float32") == 4
    assert costmodel.gradient_bytes(21_840) == 87_360
    with pytest.raises(ValueError):
        costmodel.dtype_bytes("int3")


def test_fit_recovers_exact_model():
    truth = AlphaBeta(alpha=50e-6, beta=1 / 2e9)
    sizes = [2**k for k in range(10, 27, 2)]
    fitted = AlphaBeta.fit(sizes, [truth.seconds(s) for s in sizes])
    assert fitted.alpha == pytest.approx(truth.alpha, rel=1e-6)
    assert fitted.beta == pytest.approx(truth.beta, rel=1e-6)
    assert max(abs(e) for e in fitted.relative_errors(sizes, [truth.seconds(s) for s in sizes])) < 1e-9


def test_fit_weights_relative_error():
    # noisy points 10% off in alternating directions: the relative fit stays within ~10%
    truth = AlphaBeta(alpha=100e-6, beta=1e-9)
    sizes = [2**k for k in range(10, 27)]
    times = [truth.seconds(s) * (1.1 if i % 2 else 0.9) for i, s in enumerate(sizes)]
    fitted = AlphaBeta.fit(sizes, times)
    assert max(abs(e) for e in fitted.relative_errors(sizes, times)) < 0.15


def test_fit_never_negative():
    sizes = [1e3, 1e4, 1e5]
    fitted = AlphaBeta.fit(sizes, [1.0, 1.0, 1.0])  # flat: pure latency
    assert fitted.alpha == pytest.approx(1.0) and fitted.beta == 0
    fitted = AlphaBeta.fit(sizes, [s * 1e-9 for s in sizes])  # proportional: pure bandwidth
    assert fitted.alpha >= 0 and fitted.beta == pytest.approx(1e-9, rel=1e-6)
    with pytest.raises(ValueError):
        AlphaBeta.fit([1e3], [1.0])


def test_derived_quantities():
    model = AlphaBeta.from_busbw(busbw_gbs=30.0, latency_s=20e-6, n=4)
    assert model.busbw_gbs(4) == pytest.approx(30.0)
    assert model.bandwidth_gbs() == pytest.approx(20.0)  # algbw = busbw / 1.5 on 4 cards
    assert model.seconds(0) == pytest.approx(20e-6)
    assert model.crossover_bytes() == pytest.approx(20e-6 * 20e9)
    # bucketing: every bucket pays alpha once
    assert model.bucketed_seconds(100e6, 25e6) == pytest.approx(4 * 20e-6 + model.beta * 100e6)
    assert model.bucketed_seconds(1, 25e6) == pytest.approx(model.seconds(1))


def test_published_figures_are_cited_and_sane():
    assert {"4×RTX 4090, PCIe 4", "4×A100, NVLink"} <= set(PUBLISHED)
    for name, link in PUBLISHED.items():
        assert isinstance(link, Interconnect) and link.name == name
        assert link.source and 0 < link.busbw_gbs < 2000 and 0 < link.latency_us < 1000
        model = link.model(4)
        assert model.busbw_gbs(4) == pytest.approx(link.busbw_gbs)
        assert model.alpha == pytest.approx(link.latency_us * 1e-6)
    # NVLink is roughly an order of magnitude ahead of PCIe
    assert PUBLISHED["4×A100, NVLink"].busbw_gbs > 5 * PUBLISHED["4×RTX 4090, PCIe 4"].busbw_gbs
    # a 100 MB all-reduce on 4 A100s: 10 µs + 1.5 × 100e6 / 235e9 s ≈ 0.65 ms
    assert PUBLISHED["4×A100, NVLink"].model(4).seconds(100e6) == pytest.approx(10e-6 + 1.5e8 / 235e9)
    assert not math.isnan(PUBLISHED["4×RTX 4090, PCIe 4"].model(2).seconds(1e6))


def test_worst_case_fit_bounds_the_largest_error():
    truth = AlphaBeta(alpha=2e-3, beta=3e-9)
    sizes = [2**k for k in range(16, 27)]
    wobble = [1.0, 1.2, 0.85, 1.1, 0.9, 1.25, 0.8, 1.05, 0.95, 1.15, 0.9]
    times = [truth.seconds(s) * w for s, w in zip(sizes, wobble)]
    least_squares = AlphaBeta.fit(sizes, times)
    worst_case = AlphaBeta.fit(sizes, times, worst_case=True)
    worst = max(abs(e) for e in worst_case.relative_errors(sizes, times))
    assert worst <= max(abs(e) for e in least_squares.relative_errors(sizes, times)) + 1e-9
    assert worst < 0.25 and worst_case.alpha >= 0 and worst_case.beta > 0
    exact = AlphaBeta.fit(sizes, [truth.seconds(s) for s in sizes], worst_case=True)
    assert exact.alpha == pytest.approx(truth.alpha, rel=1e-4) and exact.beta == pytest.approx(truth.beta, rel=1e-4)


def test_published_figures_state_their_conditions():
    """Each figure says how many GPUs it was measured on, and the 4090 one that its driver was P2P-unlocked."""
    rtx = PUBLISHED["4×RTX 4090, PCIe 4"]
    assert "P2P-unlocked" in rtx.source and "4 cards" in rtx.source and "8 cards" in rtx.source
    assert "stock drivers disable P2P" in rtx.note
    a100 = PUBLISHED["4×A100, NVLink"]
    assert "8× A100" in a100.source and "2× A100" in a100.source and "8 cards" in a100.note


def test_gradient_dtype_rule():
    # DDP reduces in the parameters' dtype whatever autocast computes in, unless a compression hook casts it
    assert costmodel.gradient_dtype("DDP", "fp32", "bf16") == "fp32"
    assert costmodel.gradient_dtype("DDP", torch.float32, torch.float16) == "fp32"
    assert costmodel.gradient_dtype("DDP", "bf16") == "bf16"
    assert costmodel.gradient_dtype("DDP", "fp32", "bf16", compress_hook="bf16") == "bf16"
    assert costmodel.gradient_dtype("DDP", "fp32", compress_hook="fp16") == "fp16"
    # FSDP2: reduce_dtype, else param_dtype, else the parameters' dtype
    assert costmodel.gradient_dtype("FSDP", "fp32", "bf16", reduce_dtype="fp32") == "fp32"
    assert costmodel.gradient_dtype("FSDP", "fp32", "bf16") == "bf16"
    assert costmodel.gradient_dtype("FSDP", "fp32", reduce_dtype=torch.bfloat16) == "bf16"
    assert costmodel.gradient_dtype("FSDP", "float64") == "fp64"
    for wrong in (dict(strategy="DDP", reduce_dtype="fp32"), dict(strategy="FSDP", compress_hook="bf16"),
                  dict(strategy="DDP", compress_hook="int8"), dict(strategy="ZeRO"),
                  dict(strategy="FSDP", parameters="int3")):
        with pytest.raises(ValueError):
            costmodel.gradient_dtype(**wrong)


def _counted(model, x, y):
    """FLOPs of one forward and one backward pass as FlopCounterMode counts them, on PyTorch's plain attention kernel
    (the fused CPU kernel has no FLOP formula in torch 2.13 and counts as zero)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with sdpa_kernel(SDPBackend.MATH):
        with FlopCounterMode(display=False) as forward:
            loss = model(x, y)[1]
        with FlopCounterMode(display=False) as backward:
            loss.backward()
    return forward.get_total_flops(), backward.get_total_flops()


@pytest.mark.parametrize("checkpointing", [False, True])
def test_training_flops_per_token_is_what_the_lessons_gpt_computes(checkpointing):
    """Lesson 13's GPT at a small size (a vocabulary of 24, 3 blocks of width 16, a context of 8): the count of
    costmodel.training_flops_per_token, attention's full square included, equals FlopCounterMode's count of the
    matrix products the step runs, with and without activation checkpointing. Checkpointing runs each block again
    but for its last product, w2 (non-reentrant checkpoint stops early): a count of one whole forward more fails."""
    from fourcard_helpers.gpt import GPT, Checkpointed, GPTConfig

    config = GPTConfig(vocab_size=24, block_size=8, n_layer=3, n_head=4, d_model=16)
    torch.manual_seed(0)
    model = GPT(config).double()
    if checkpointing:
        model.layers = torch.nn.ModuleList(Checkpointed(block) for block in model.layers)
    x = torch.randint(24, (2, 8))
    forward, backward = _counted(model, x, x)
    d, L = config.d_model, config.n_layer
    matmul = L * 12 * d * d + config.vocab_size * d        # six linear layers a block; the tied table once, as output
    tokens = x.numel()
    assert forward == tokens * (2 * matmul + costmodel.attention_flops_per_token(8, d, L))
    recomputed = L * (12 - 4) * d * d if checkpointing else None   # each block's products but w2's (4·d² weights)
    assert forward + backward == tokens * costmodel.training_flops_per_token(matmul, 8, d, L, recomputed_parameters=recomputed)
    if checkpointing:   # one whole forward of the blocks more is not what runs
        assert forward + backward != tokens * costmodel.training_flops_per_token(matmul, 8, d, L,
                                                                                recomputed_parameters=L * 12 * d * d)
    assert costmodel.attention_flops_per_token(8, d, L) == 4 * 8 * d * L   # arithmetic: the formula's full square


def test_causal_attention_flops_count_the_pairs_the_mask_keeps():
    """Attention computed query by query against only the keys the causal mask keeps (0 … i), as a kernel that skips
    the masked part does: FlopCounterMode counts (T + 1)/2 keys per query on average, half the square and a little
    more, and the causal result equals the masked full one."""
    from torch.utils.flop_counter import FlopCounterMode

    T, width = 9, 8
    q, k, v = (torch.randn(T, width, dtype=torch.float64) for _ in range(3))
    with FlopCounterMode(display=False) as counter:
        rows = [torch.softmax(q[i:i + 1] @ k[:i + 1].T / width**0.5, dim=-1) @ v[:i + 1] for i in range(T)]
    masked = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
    assert torch.allclose(torch.cat(rows), masked, rtol=0, atol=1e-12)
    assert counter.get_total_flops() == T * costmodel.attention_flops_per_token(T, width, 1, causal=True)
    assert costmodel.attention_flops_per_token(T, width, 1, causal=True) == (T + 1) / 2 / T * \
        costmodel.attention_flops_per_token(T, width, 1)   # arithmetic: (T + 1)/2 of T keys
