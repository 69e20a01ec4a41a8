"""The ``winnow`` command: one subcommand per module, each registering its own parser.

Only the module of the command being run is imported (``winnow curate`` never loads torch or
matplotlib; ``winnow --help`` loads none of them): the other commands appear in the parser
as stand-ins carrying their one-line help from ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import NamedTuple

from winnow.pipelines import __version__


class Command(NamedTuple):
    module: str  # has ``register(subparsers)``, which adds this command (and maybe others) and sets ``func``
    help: str  # the module's own help text for it (tests/pipelines/test_cli.py keeps the two equal)
    extra: str | None = None  # the pip extra its dependencies come with, named when one is missing


COMMANDS: dict[str, Command] = {
    "curate": Command("winnow.pipelines.curate", "run a job's curation stages and write shards"),
    "train": Command("winnow.pipelines.train", "train the MoE model on a job's shards ([train] table)", "train"),
    "plan": Command(
        "winnow.pipelines.plan", "size a run from a compute budget, or estimate a job's [train] run", "train"
    ),
    "check": Command(
        "winnow.pipelines.check", "validate a job file (every table, the inputs' paths) without running anything"
    ),
    "config": Command(
        "winnow.pipelines.config", "show a stage's or table's keys with defaults and docs; the job file's JSON schema"
    ),
    "run": Command("winnow.pipelines.run", "curate, train (when the job has [train]) and write the report", "train"),
    "ablate": Command(
        "winnow.pipelines.ablate",
        "train variants of the mix or the curation ([ablate]) and tabulate their effect",
        "train",
    ),
    "report": Command(
        "winnow.pipelines.report.command", "write report.html for a job folder, a run folder, or both", "report"
    ),
    "tokenizer": Command("winnow.pipelines.tokenizer", "tokenizer tools", "train"),
    "export": Command(
        "winnow.pipelines.export",
        "write a run's model as safetensors (and a Hugging Face Mixtral where it maps)",
        "train",
    ),
}
#: The loggers of progress lines (a progress bar's stand-in when stderr is not a terminal): shown unless ``-q``.
PROGRESS_LOGGERS = ("winnow.curate.progress", "winnow.train.progress")
#: What each extra installs (pyproject.toml), to tell a missing optional package from a bug.
EXTRA_PACKAGES = {"train": ("torch", "matplotlib", "tokenizers", "safetensors"), "report": ("matplotlib",)}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with full arguments for ``command`` (every command when None)."""
    parser = argparse.ArgumentParser(
        prog="winnow", description="Curate multi-source text into training shards; train and report."
    )
    parser.add_argument("-V", "--version", action="version", version=f"winnow {__version__}")
    _logging_options(parser, "verbose", "quiet", default=0)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, cmd in COMMANDS.items():
        if name in sub.choices:
            continue  # registered by an earlier command's module
        if command is None or name == command:
            importlib.import_module(cmd.module).register(sub)
        else:
            sub.add_parser(name, help=cmd.help, add_help=False)
    for child in _subparsers(parser):
        _logging_options(child, "sub_verbose", "sub_quiet", default=argparse.SUPPRESS)
    return parser


def _logging_options(parser: argparse.ArgumentParser, verbose: str, quiet: str, *, default) -> None:
    """``-v`` / ``-q``, on the top parser and again on every subcommand's: they work before or after the command.

    A subcommand's copies write other names (``sub_verbose``), so its parser, which argparse runs on
    a namespace of its own, never resets what was given before the command (``verbosity`` adds them).
    """
    parser.add_argument(
        "-v", "--verbose", dest=verbose, action="count", default=default, help="more logging (-vv for debug)"
    )
    parser.add_argument(
        "-q",
        "--quiet",
        dest=quiet,
        action="store_true",
        default=default,
        help="no progress bars or progress lines, warnings only",
    )


def _subparsers(parser: argparse.ArgumentParser):
    """Every subcommand's parser under ``parser``, nested ones (``config show``) included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                if child.add_help:  # not a stand-in for a command that is not being run
                    yield child
                    yield from _subparsers(child)


def verbosity(args: argparse.Namespace) -> tuple[int, bool]:
    """(``-v`` count, ``-q`` given) over both places the options may be written."""
    return args.verbose + getattr(args, "sub_verbose", 0), args.quiet or getattr(args, "sub_quiet", False)


def chosen_command(argv: list[str]) -> str | None:
    """The subcommand named on the command line (the global options take no values)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    name = chosen_command(argv)
    try:
        parser = build_parser(name if name in COMMANDS else "")
        args = parser.parse_args(argv)
    except ModuleNotFoundError as err:
        return _missing(name, err)
    verbose, args.quiet = verbosity(args)
    configure_logging(verbose=verbose, quiet=args.quiet)
    code = _run(args)
    mesh = sys.modules.get("winnow.train.parallel.mesh")  # imported only by the commands that train
    return mesh.exit_process(code) if mesh is not None else code  # a torchrun worker ends here (see there)


def configure_logging(*, verbose: int, quiet: bool) -> None:
    """Plain log lines on stderr: warnings only with ``-q``; progress lines (``PROGRESS_LOGGERS``) unless ``-q``;
    INFO with ``-v``, DEBUG with ``-vv``."""
    level = logging.WARNING if quiet or not verbose else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for name in PROGRESS_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING if quiet else min(level, logging.INFO))


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's stop, ``timeout``, ``kill``) during a command that a re-run resumes: it stops as
    Ctrl-C stops it (pool workers terminated, outputs as after a kill) and says so, exiting 143."""


#: the commands that stop on SIGTERM as on Ctrl-C (the trainer has its own handler: it checkpoints first)
_TERM_STOPS = ("curate", "run")


@contextlib.contextmanager
def _sigterm_stops(command: str | None) -> Iterator[None]:
    if command not in _TERM_STOPS or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace) -> int:
    from winnow.curate.errors import WinnowError, disk_full, no_space
    from winnow.train.errors import TrainError  # no dependencies: importable in a curation-only install

    try:
        with _sigterm_stops(args.command):
            return int(args.func(args) or 0)
    except (WinnowError, TrainError) as err:
        print(f"winnow {args.command}: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:  # an optional dependency imported where the command runs
        return _missing(args.command, err)
    except BrokenPipeError:  # the reader of stdout went away (`winnow config show | head`): stop without a word
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter flushes stdout at exit
        return 128 + signal.SIGPIPE
    except OSError as err:
        # a full disk, a read-only folder, a name too long, a folder where a file goes: the system's refusal of
        # a path the user gave or chose, said in one line with the path (-vv logs the traceback)
        if limit := _process_limit(err):
            print(f"winnow {args.command}: error: {limit}", file=sys.stderr)
            return 2
        where = next((str(f) for f in (err.filename, err.filename2) if f), None)
        if where is None and not disk_full(err):
            raise
        logging.getLogger(__name__).debug("the command's error", exc_info=True)
        what = err.strerror or str(err)
        if disk_full(err) and where is not None:
            print(
                f"winnow {args.command}: error: writing {where}: "
                f"{no_space(os.path.dirname(where) or '.', err, then='then run the same command again')}",
                file=sys.stderr,
            )
        elif disk_full(err):
            print(
                f"winnow {args.command}: error: no space left on the device ({what}); free space there and run "
                "the same command again",
                file=sys.stderr,
            )
        else:
            print(
                f"winnow {args.command}: error: {where}: {what}; check the path and its folder's permissions",
                file=sys.stderr,
            )
        return 2
    except MemoryError as err:  # numpy's too: settings that ask for more memory than the machine has
        print(f"winnow {args.command}: error: {_out_of_memory(err)}", file=sys.stderr)
        return 2
    except Exception as err:  # a full disk that reached here wrapped in another error: still one line
        if _allocation_failed(err):
            print(f"winnow {args.command}: error: {_out_of_memory(err)}", file=sys.stderr)
            return 2
        if limit := _process_limit(err):
            print(f"winnow {args.command}: error: {limit}", file=sys.stderr)
            return 2
        if loop := _symlink_loop(err):
            print(f"winnow {args.command}: error: {loop}", file=sys.stderr)
            return 2
        if not disk_full(err):
            raise
        print(
            f"winnow {args.command}: error: no space left on the device ({err}); free space there and "
            "run the same command again",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt as err:
        how = "stopped by SIGTERM" if isinstance(err, Terminated) else "interrupted"
        print(f"winnow {args.command}: {how}; re-run the same command to resume", file=sys.stderr)
        return 143 if isinstance(err, Terminated) else 130


def _symlink_loop(err: BaseException | None) -> str | None:
    """What to do when ``err`` is ``Path.resolve()``'s on a path through a symbolic link loop (a RuntimeError up to
    Python 3.12, where the other commands' path errors are OSErrors); else None."""
    from winnow.curate.errors import error_chain

    for e in error_chain(err):
        if isinstance(e, RuntimeError) and str(e).startswith("Symlink loop from "):
            where = str(e).removeprefix("Symlink loop from ")
            return (
                f"{where}: a symbolic link loop (its links lead back to themselves, not to a file or folder); point "
                "the link at a real folder, or give another path"
            )
    return None


def _process_limit(err: BaseException | None) -> str | None:
    """What to do when ``err`` (or an error it came from) is a limit of this process the system enforced: open
    files (``ulimit -n``), or threads and processes (``ulimit -u``, a container's pids limit); else None."""
    from winnow.curate.errors import error_chain

    for e in error_chain(err):
        text = str(e).lower()
        if isinstance(e, OSError) and e.errno in (errno.EMFILE, errno.ENFILE) or "too many open files" in text:
            import resource

            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            return (
                f"too many open files ({e}): this process may hold {soft} (`ulimit -n`); raise the limit "
                "(ulimit -n 65536) or lower [job] workers, then run the same command again"
            )
        if "failed to launch worker thread" in text or "can't start new thread" in text:
            return (
                f"the system refused a new thread ({e}): a limit on threads or processes (`ulimit -u`, a "
                "container's pids limit) or on virtual memory (`ulimit -v`); raise it or lower [job] workers, then "
                "run the same command again"
            )
    return None


def _allocation_failed(err: Exception) -> bool:
    """Whether ``err`` is torch's refusal to allocate a tensor (its CPU allocator's, or a device's out-of-memory)."""
    text = str(err)
    return type(err).__name__ == "OutOfMemoryError" or (
        isinstance(err, RuntimeError) and ("can't allocate memory" in text or "not enough memory" in text)
    )


def _out_of_memory(err: BaseException) -> str:
    logging.getLogger(__name__).debug("the command's error", exc_info=True)
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return (
        f"out of memory ({first[:200]}): the settings ask for more memory than this machine has; lower the model's "
        "sizes ([train.model]) or the batch ([train.data] batch_size, seq_len; [train] grad_accum), or for curation "
        "[job] workers, batch_rows or memory_gb (`winnow plan` sizes a run for a machine)"
    )


def _missing(name: str | None, err: ModuleNotFoundError) -> int:
    """A command whose optional dependencies are not installed: say which extra brings them."""
    extra = COMMANDS[name].extra if name in COMMANDS else None
    package = (err.name or "").split(".")[0]
    if extra is None or package not in EXTRA_PACKAGES.get(extra, ()):
        raise err
    print(
        f"winnow {name}: error: this command needs {package!r}, which is not installed; "
        f"install winnow's {extra} extra: pip install 'winnow[{extra}]'",
        file=sys.stderr,
    )
    return 2


def entry() -> None:
    """The ``winnow`` program: ``main``, then the process ends."""
    code = main()
    # What is left lives to the end of the process: frozen, the interpreter's last collection does not walk
    # every module's objects (numba's and polars' type tables), a few tenths of a second after each command.
    # Finalizers of objects in reference cycles then never run: every command closes what it writes itself.
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
