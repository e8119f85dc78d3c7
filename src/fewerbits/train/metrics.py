"""What a run reports: metrics.jsonl, TensorBoard events (if installed), a progress line."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


class Metrics:
    """Appends one JSON object per line to RUN/metrics.jsonl; mirrors scalars to TensorBoard."""

    def __init__(self, run_dir: Path, tensorboard: bool = True):
        self.path = Path(run_dir) / "metrics.jsonl"
        self._file = open(self.path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
            except ImportError:  # tensorboard is optional
                self._tb = None

    def log(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(k, v, record["step"])

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Progress:
    """One self-rewriting line on stderr: step, loss, tokens/s, ETA."""

    def __init__(self, total: int, label: str = "", enabled: bool = True):
        self.total, self.label, self.enabled = total, label, enabled and sys.stderr.isatty()
        self.start = time.perf_counter()
        self.first_step = None

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        if not self.enabled:
            return
        if self.first_step is None:
            self.first_step, self.start = step, time.perf_counter()
        done = step - self.first_step + 1
        rate = done / max(time.perf_counter() - self.start, 1e-9)
        eta = (self.total - step) / rate if rate > 0 else 0
        bar = "#" * int(20 * step / self.total)
        sys.stderr.write(
            f"\r{self.label}[{bar:<20}] {step}/{self.total} loss {loss:.3f} "
            f"{tokens_per_s / 1e3:.1f}k tok/s ETA {int(eta) // 60}:{int(eta) % 60:02d} "
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
