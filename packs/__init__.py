"""Read input packs from their headers: safetensors, shards, typed configs, EXL3 groups, validation."""
