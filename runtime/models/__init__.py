"""Model families the runtime can run, each a package with its model runners and chat format."""
