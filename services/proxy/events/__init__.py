"""The events agents post themselves (rewards, their own spans; a `model_request` in Agent Lightning v1.0's
shape with the master key): what is accepted, and the ledger event built from it."""
