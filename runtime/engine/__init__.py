"""Family-neutral generation: step plans over a worker, sampling, stop rules, token digests."""
