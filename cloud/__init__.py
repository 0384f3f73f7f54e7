"""The cloud side: the zoo-building pipeline, the fleet simulator and its CLI commands (PyTorch lives here)."""
