"""Federated fine-tuning driven by the server: rounds, selection, strategies, update routes."""
