"""Agent Lightning v1.0's REST surface served over the ledger's gRPC (a facade, no state): its routes, its
body shapes and its gateway pause routes. Nothing outside this folder and the app that mounts it imports it."""
