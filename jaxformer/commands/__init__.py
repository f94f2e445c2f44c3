"""Subcommands of the `jaxformer` CLI."""
