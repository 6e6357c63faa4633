"""The DeepSeek-V4.1 chat format: encoding, DSML tool calls, grammars and reading a reply."""
