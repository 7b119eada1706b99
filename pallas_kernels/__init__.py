"""Pallas kernels, one file per kernel, each with a BlockSizes dataclass, a custom_vjp,
an ``interpret`` flag and a pure-jnp reference it is tested against."""

from pallas_kernels.entmax_attention import (
    BlockSizes as EntmaxBlockSizes,
)
from pallas_kernels.entmax_attention import (
    entmax_attention_pallas,
    entmax_attention_reference,
)

__all__ = ["EntmaxBlockSizes", "entmax_attention_pallas", "entmax_attention_reference"]
