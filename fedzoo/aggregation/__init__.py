"""The aggregation core: how accepted updates become the next global model, as a pure library (numpy only: no
Flask, database, HTTP or torch). The server's round stages (`fedzoo.server.fl.stages`) and the simulator's
in-process engine (`fedzoo.cloud.inprocess`) both call it; nothing else aggregates.

- `strategies`: FedAvg, FedProx, FedAdam, norm clipping, coordinate median, trimmed mean, Multi-Krum (Flower's
  `Strategy` shape: `configure_fit`, `aggregate_fit`, `apply_mean_delta` for a secure sum);
- `screening`, `weighting`, `direction`, composed in the server's order by `robust`: norm bound, weight bound,
  direction screening against the round's median delta;
- `running_statistics`: BatchNorm statistics, screened and averaged beside the weights;
- `per_element`: zoo-wide rounds, each supernet element averaged over the devices covering it;
- `private`: DP-FedAvg's clipping and noise and server momentum as layers around any mean-only strategy, and the
  checks a SecAgg+ sum must pass (the noise and the privacy ledger are `fedzoo.dp`'s);
- `settings`: the shapes of the settings the core reads (the server's schemas satisfy them).
"""
