"""The ``winnow`` command: one subcommand per module, each registering its own parser."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

#: Modules that add subcommands; each has ``register(subparsers)`` setting ``func``.
COMMANDS = (
    "pipelines.curate",
    "pipelines.train",
    "pipelines.run",
    "pipelines.ablate",
    "pipelines.report.command",
    "pipelines.tokenizer",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="winnow", description="Curate multi-source text into training shards; train and report.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars, warnings only")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING if args.quiet else (logging.DEBUG if args.verbose > 1 else logging.INFO if args.verbose else logging.WARNING)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    from curate.errors import WinnowError

    errors: tuple[type[BaseException], ...] = (WinnowError,)
    try:
        from train.errors import TrainError

        errors += (TrainError,)
    except ImportError:  # the trainer's dependencies are optional for curation-only installs
        pass
    try:
        return int(args.func(args) or 0)
    except errors as err:
        print(f"winnow {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"winnow {args.command}: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
