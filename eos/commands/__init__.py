"""CLI subcommands: each module here has `register(subparsers)`; eos.cli discovers them all."""
