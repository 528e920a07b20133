"""Pipeline schedules, as lists of operations per stage (lesson 07).

A stage's schedule is the order of its operations: ("F", i) is the forward of micro-batch
i, ("B", i) its backward. The lesson's ranks run these orders with send/recv, and the
notebook replays the same orders on a logical clock to draw the ideal timeline.
"""
from __future__ import annotations


def pipeline_order(schedule: str, stages: int, micro_batches: int) -> list[list[tuple[str, int]]]:
    """The order of forwards and backwards on each stage, for "GPipe" or "1F1B".

    GPipe runs every forward, then every backward: simple, but stage s holds the
    activations of all `micro_batches` at once. 1F1B runs `stages - 1 - s` warm-up
    forwards, then alternates one forward with one backward, then drains the backwards:
    the same bubble, but stage s never holds more than `stages - s` micro-batches.
    """
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"need at least one stage and one micro-batch, got {stages} and {micro_batches}")
    kind = schedule.upper()
    orders = []
    for stage in range(stages):
        if kind == "GPIPE":
            ops = [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]
        elif kind == "1F1B":
            warmup = min(stages - 1 - stage, micro_batches)
            ops = [("F", i) for i in range(warmup)]
            for i in range(micro_batches - warmup):
                ops += [("F", warmup + i), ("B", i)]
            ops += [("B", i) for i in range(micro_batches - warmup, micro_batches)]
        else:
            raise ValueError(f"unknown schedule {schedule!r}: use 'GPipe' or '1F1B'")
        orders.append(ops)
    return orders


def simulate_pipeline(orders: list[list[tuple[str, int]]], forward: float = 1, backward: float = 2
                      ) -> list[tuple[int, float, float, str]]:
    """Replay per-stage orders on a logical clock: every forward takes `forward`, every
    backward `backward`, communication takes no time, and an operation starts as soon as
    its stage is free and its input exists (F(s,i) needs F(s-1,i); B(s,i) needs B(s+1,i)
    and F(s,i)). Returns (stage, start, end, "forward"/"backward") events.

    This is the schedule's own timeline, free of the noise of a busy machine; pass
    Fractions for exact arithmetic. Raises ValueError if the orders wait on each other.
    """
    stages = len(orders)
    done: dict[tuple[str, int, int], float] = {}  # (op, stage, micro-batch) -> end time
    clock = [0] * stages
    position = [0] * stages
    events: list[tuple[int, float, float, str]] = []
    while any(position[s] < len(orders[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            while position[s] < len(orders[s]):
                op, i = orders[s][position[s]]
                needs = [("F", s - 1, i)] if op == "F" and s > 0 else []
                if op == "B":
                    needs = [("F", s, i)] + ([("B", s + 1, i)] if s < stages - 1 else [])
                if any(need not in done for need in needs):
                    break
                start = max([clock[s]] + [done[need] for need in needs])
                end = start + (forward if op == "F" else backward)
                done[(op, s, i)] = clock[s] = end
                events.append((s, start, end, "forward" if op == "F" else "backward"))
                position[s] += 1
                progressed = True
        if not progressed:
            raise ValueError("these orders deadlock: every stage waits for an input that never comes")
    return events


def idle_fraction(events: list[tuple[object, float, float, str]]) -> float:
    """Share of card-time spent waiting: 1 - busy / (cards × span), where the span runs from
    the first start to the last end over all cards. Works for measured and simulated events."""
    lanes = {lane for lane, *_ in events}
    span = max(end for _, _, end, _ in events) - min(start for _, start, _, _ in events)
    busy = sum(end - start for _, start, end, _ in events)
    return 1 - busy / (len(lanes) * span)


def peak_in_flight(ops: list[tuple[str, int]]) -> int:
    """Most micro-batches whose forward is done and backward is not, along one stage's
    order: how many micro-batches' activations that stage must hold at once."""
    held, peak = 0, 0
    for op, _ in ops:
        held += 1 if op == "F" else -1
        peak = max(peak, held)
    return peak