"""Model profiles, loading (hub id, local dir, GGUF shipped in a PyPI package), surface formats."""
