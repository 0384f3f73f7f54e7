"""Shared fixtures: keep torch to one thread so parallel test workers do not fight over 2 cores."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
