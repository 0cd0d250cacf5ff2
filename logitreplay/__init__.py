"""logitreplay: capture real sparse-attention indexer logits, share them, replay them against top-k selectors."""

from logitreplay.archive import Archive, Case
from logitreplay.errors import ArchiveError

__all__ = ["Archive", "ArchiveError", "Case"]
__version__ = "0.1.0"
