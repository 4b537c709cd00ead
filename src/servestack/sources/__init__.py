"""One module per outside system the lock talks to: package indexes, GitHub, OCI registries, Debian."""
