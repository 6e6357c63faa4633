"""DSpark, DeepSeek-V4.1's drafter: over the reference weights, on the arena, and drafting on both runners."""
