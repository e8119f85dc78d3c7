"""fewerbits: train language models with fewer bits, from FP32 down to FP4.

The numeric core (this package's foundation):

    FORMATS, FloatFormat, get_format      every element format, limits derived from the layout
    cast(x, fmt)                          the reference rounding (nearest-even or stochastic)
    encode / decode, pack / unpack        bit codes, fp4 two per byte, fp6 four per three bytes
    SCHEMES, Scheme, get_scheme           how a tensor is scaled: tensor, row, tiles, MX, NVFP4
    quantize(x, scheme) -> QuantizedTensor, .dequantize(), fake_quantize(x, scheme)

Quantized training:

    scaled_matmul(a_q, b_q)               native FP8 on Hopper, exact emulation elsewhere
    RECIPES, Recipe, get_recipe           the precision of each operand of a Linear's 3 GEMMs
    QuantizedLinear                       nn.Linear whose GEMMs follow a recipe
    convert(model, recipe, policy=...)    swap nn.Linear in place; returns a ConversionReport
    compile_model(model)                  torch.compile that keeps eager mode's quantized bits
"""

__version__ = "0.1.0"

from .codes import decode, encode, pack, unpack
from .convert import ConversionReport, Policy, compile_model, convert
from .formats import FORMATS, FloatFormat, get_format
from .gemm import scaled_matmul
from .hadamard import Hadamard
from .linear import QuantizedLinear
from .memory import MemoryEstimate, estimate_memory
from .quantize import QuantizedTensor, fake_quantize, quantize, quantized_nbytes
from .recipes import RECIPES, DelayedScaling, Gemm, Operand, Recipe, get_recipe
from .rounding import cast
from .schemes import SCHEMES, Scheme, get_scheme

__all__ = [
    "MemoryEstimate",
    "estimate_memory",
    "FORMATS",
    "FloatFormat",
    "get_format",
    "cast",
    "encode",
    "decode",
    "pack",
    "unpack",
    "SCHEMES",
    "Scheme",
    "get_scheme",
    "QuantizedTensor",
    "quantize",
    "fake_quantize",
    "quantized_nbytes",
    "scaled_matmul",
    "Hadamard",
    "RECIPES",
    "Recipe",
    "Operand",
    "Gemm",
    "DelayedScaling",
    "get_recipe",
    "QuantizedLinear",
    "convert",
    "compile_model",
    "Policy",
    "ConversionReport",
]
