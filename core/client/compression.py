"""Body compression for tidemq's client: :mod:`tidemq.compression` (one module for both sides).

Consumers inflate bodies with the same limit as everything a peer sends (the frame limit), so a
compressed message cannot make a consumer allocate gigabytes.
"""

from __future__ import annotations

from tidemq.compression import CODECS, DecompressionLimitError, compress, decompress

__all__ = ["CODECS", "DecompressionLimitError", "compress", "decompress"]
