"""The cloud side: data sets, the zoo-building pipeline and its CLI commands (PyTorch lives here)."""
