"""Operator tools: the commands an operator runs against a server over REST (enrollment tokens, device
revocation and certificates, the model registry, the fleet, federated rounds), and `OperatorClient`, the client
SDK with the calls that take the admin token (for scripts, the simulator, the demo and tests). They use the client
SDK's HTTP client; the server never imports them."""
