"""Operator tools: the commands an operator runs against a server over REST (enrollment tokens, device
revocation and certificates, the model registry, the fleet, federated rounds). They use the client SDK's HTTP
client; the server never imports them."""
