"""Where encoded images come from: folders, file lists, memory, LMDB and a shared RAM cache."""
from .base import Item, Source

__all__ = ["Item", "Source"]
