"""Apply a recipe to a model built in fp32: which dtype holds what, decided in one place.

    master weights      fp32, always (the optimizer steps on them)
    Linears             QuantizedLinear: the recipe's schemes, or its compute dtype where the
                        policy keeps a layer (output head, embeddings, routers, kept blocks)
    embedding output    cast to the compute dtype (a forward hook), so every activation after it
                        travels in the compute dtype; norms and rotary embeddings compute in fp32
                        inside and return that dtype
    logits              cast to fp32 for the loss
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..convert import ConversionReport, Policy, convert
from ..recipes import RECIPES, Recipe, get_recipe

_HP_RECIPE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def high_precision_recipe(recipe: Recipe) -> Recipe:
    """The unquantized recipe of `recipe`'s compute dtype (for the layers the policy keeps)."""
    return RECIPES[_HP_RECIPE[recipe.compute_dtype]]


def apply_recipe(model: nn.Module, recipe: str | Recipe, policy: Policy | None = None,
                 device=None) -> ConversionReport:
    """Convert every Linear (kept ones to the compute dtype) and cast embedding outputs."""
    recipe = get_recipe(recipe)
    report = convert(model, recipe, policy=policy, device=device)
    hp = high_precision_recipe(recipe)  # what the policy kept runs in the compute dtype
    convert(model, hp, policy=Policy(keep=(), keep_last_blocks=0, min_features=0), device=device)
    dtype = recipe.compute_dtype
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            module.register_forward_hook(lambda _m, _i, out: out.to(dtype))
    return report
