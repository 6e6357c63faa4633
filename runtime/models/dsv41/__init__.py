"""DeepSeek-V4.1: config from the manifest, the reference forward (the oracle), the chat format."""
