"""Timing the way every benchmark here does it: warm-up, then the median of timed runs (CUDA
events on a GPU, the wall clock on a CPU)."""

from __future__ import annotations

import statistics
import time

import torch


def time_ms(fn, iters: int = 10, warmup: int = 3, device: torch.device | str | None = None) -> float:
    """Median milliseconds of `fn()` over `iters` runs after `warmup` runs."""
    return statistics.median(time_samples(fn, iters, warmup, device))


def time_samples(fn, iters: int = 10, warmup: int = 3, device: torch.device | str | None = None,
                 host: list[float] | None = None) -> list[float]:
    """Milliseconds of each of `iters` runs of `fn()` after `warmup` runs. host, if given, gets
    each timed run's milliseconds of the host: until `fn()` returns, which on a GPU is before
    the work it queued is done (a run whose host time is near its time kept the GPU waiting on
    the host, or waited on the GPU itself); on a CPU it is the run's time."""
    if iters < 1 or warmup < 0:
        raise ValueError("iters must be at least 1 and warmup at least 0")
    cuda = device is not None and torch.device(device).type == "cuda"
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            fn()
            returned = time.perf_counter()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            returned = time.perf_counter()
            times.append(1e3 * (returned - t0))
        if host is not None:
            host.append(1e3 * (returned - t0))
    return times


def cuda_time_ms(fn, iters: int = 10, warmup: int = 3) -> float:
    """time_ms on the current CUDA device."""
    return time_ms(fn, iters, warmup, "cuda")
