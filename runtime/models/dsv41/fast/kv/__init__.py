"""The fast forward's KV memory: row formats, layout, pages, device memory and slot snapshots."""
