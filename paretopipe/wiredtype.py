"""The dtypes a cut may cross in, for every model, and what a row of float32 values costs in each.

Torch-free, so ``--help``, ``split --list`` and the cost model read them without torch;
:mod:`paretopipe.partition.wirequant` does the casting and quantising.
"""

from __future__ import annotations

#: float16 and bfloat16 are casts (the frame's codec); int8 and int4 are quantised before it.
WIRE_DTYPE_NAMES = ("float32", "float16", "bfloat16", "int8", "int4")
QUANTISED = ("int8", "int4")
#: ``--wire-dtype auto``: per cut, the first of these whose measured fidelity reaches the target
#: (the fewest bytes first; float16 before bfloat16, the same bytes with more mantissa).
AUTO = "auto"
AUTO_ORDER = ("int4", "int8", "float16", "bfloat16", "float32")
#: What --wire-dtype takes: a dtype, or auto (resolved by stage 1 before a run starts).
WIRE_DTYPE_CHOICES = WIRE_DTYPE_NAMES + (AUTO,)
#: Values that share one int4 scale.
INT4_GROUP = 32
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def int8_token_groups(length: int) -> int:
    """The int8 scales of one token of a hidden state: one per :data:`INT4_GROUP` values where the
    hidden size is a multiple of it, else one. A trained model's hidden state has a few channels
    hundreds of times larger than the rest: one scale for the token left SmolLM2-135M's
    perplexity 1-2% off float32 at middle cuts, one per 32 values within 0.3% (for an eighth of a
    byte more a value)."""
    return length // INT4_GROUP if length and length % INT4_GROUP == 0 else 1


def token_nbytes(hidden_size: int, dtype: str) -> int:
    """Bytes one token of a hidden state crosses in, its scales included."""
    if dtype == "int8":
        return hidden_size + 4 * int8_token_groups(hidden_size)
    return row_nbytes(hidden_size, dtype)


def row_nbytes(length: int, dtype: str) -> int:
    """Bytes a row of ``length`` float32 values crosses in (a row: an image sample's channel), its
    scales included; an int4 tensor's shape, a few bytes a frame, is left out."""
    if dtype == "int8":
        return length + 4  # one float32 scale per row
    if dtype == "int4":
        groups = -(-length // INT4_GROUP)
        return groups * INT4_GROUP // 2 + 4 * groups  # two values a byte, one float32 scale a group
    return length * _ITEMSIZE[dtype]
