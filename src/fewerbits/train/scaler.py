"""Loss scaling for fp16: keep small gradients above fp16's underflow.

Dynamic (the default for fp16): multiply the loss by S before backward, divide the gradients
by S before the step. If any gradient is inf or NaN, skip the step and halve S; after
`growth_interval` clean steps in a row, double S. S starts at 2^16. Static: S never changes
(a step with inf/NaN is still skipped). "none": S = 1.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class LossScaler:
    mode: str = "none"  #: "none", "dynamic" or "static"
    scale: float = 1.0  #: the current loss scale
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    clean_steps: int = 0  #: clean steps since the last change

    @classmethod
    def create(cls, mode: str, static_scale: float = 2.0**16) -> LossScaler:
        if mode == "dynamic":
            return cls("dynamic", 2.0**16)
        if mode == "static":
            return cls("static", float(static_scale))
        if mode == "none":
            return cls("none", 1.0)
        raise ValueError(f"loss scaling must be none, dynamic or static, not {mode!r}")

    def update(self, found_inf: bool) -> None:
        """After a step: back off on overflow, grow after a run of clean steps (dynamic only)."""
        if self.mode != "dynamic":
            return
        if found_inf:
            self.scale = max(self.scale * self.backoff_factor, 1.0)
            self.clean_steps = 0
        else:
            self.clean_steps += 1
            if self.clean_steps >= self.growth_interval:
                self.scale *= self.growth_factor
                self.clean_steps = 0

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)
