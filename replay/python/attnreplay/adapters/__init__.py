"""Adapters: third-party attention kernels as attnreplay backends (imported lazily)."""
