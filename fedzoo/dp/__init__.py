"""DP-FedAvg (McMahan et al. 2018): user-level differential privacy for federated rounds.

- `clipping` (device side, numpy only): clip a delta to an L2 norm bound and report whether it was.
- `noise` (server side): Gaussian noise on the sum of clipped deltas, equal weights, and the adaptive
  clipping bound of Andrew et al. 2021.
- `accountant` (server side, `dp-accounting`): the epsilon a plan has spent, and a budget that stops
  rounds before it is exceeded.

With SecAgg+ the server adds the noise to the unmasked sum: it never needs a clear update.
"""
