"""The image store: format, keys, manifests, digests, atomic publish, lookup, verify, prune."""
