"""The stages of a federated round, composed by `fedzoo.server.fl.rounds.RoundService`:
selection → collection → screening → aggregation → publication (with the round's lifecycle beside them)."""
