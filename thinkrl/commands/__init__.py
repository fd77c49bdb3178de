"""One module per `thinkrl` subcommand, each with `add_parser(subparsers)`
and `run(args) -> int`. Modules import heavy libraries inside `run`, so
`thinkrl --help` stays fast."""
