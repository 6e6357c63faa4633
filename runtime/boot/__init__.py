"""Boot a rank: open its image, allocate the device arena, upload, start CUDA early, time each phase."""
