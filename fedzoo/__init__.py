"""fedzoo: serve every device the best model it can afford, and improve it from the devices' own data."""

__version__ = "0.1.0"
