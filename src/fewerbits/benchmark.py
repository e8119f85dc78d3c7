"""Timing on a GPU the way every benchmark here does it: CUDA events, warm-up, the median."""

from __future__ import annotations

import statistics

import torch


def cuda_time_ms(fn, iters: int = 10, warmup: int = 3) -> float:
    """Median milliseconds of `fn()` over `iters` runs after `warmup` runs, by CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
