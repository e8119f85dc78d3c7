"""Training: data, the loop, checkpoints, metrics, comparisons.

    train(TrainConfig(recipe="nvfp4", preset="tiny", steps=200, out="runs/x")) -> summary
    compare(TrainConfig(...), ["bf16", "fp8_tensorwise", "mxfp4"]) -> summaries, table, figure
"""

from .compare import DEFAULT_RECIPES, compare
from .loop import TrainConfig, train

__all__ = ["TrainConfig", "train", "compare", "DEFAULT_RECIPES"]
