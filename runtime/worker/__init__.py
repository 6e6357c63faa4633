"""One rank: boot, build the family's model runner over the booted image, execute step plans."""
