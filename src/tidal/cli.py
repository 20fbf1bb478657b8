"""The ``tidal`` command: ``inspect``, ``bench``, ``plan``, ``convert``, ``state show|skip|verify``, ``trace`` and ``demo``.

This module only builds the parser from the command modules (:mod:`tidal.commands`) and runs
the one asked for. An error is one line on stderr, ``tidal COMMAND: what went wrong``, naming
the file or URL it concerns, and exit status 2; ``--verbose`` (before or after the command)
also prints the traceback. Ctrl-C is exit status 130; output cut short by its reader (``| head``) is not an error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from tidal import __version__
from tidal.commands import MODULES

# errors that say what is wrong in their message; anything else is reported with its type
_CLEAR = (OSError, ValueError, LookupError, ImportError)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="tidal", description="Stream training data larger than memory into PyTorch and JAX training."
    )
    top.add_argument("-v", "--verbose", action="store_true", help="print the traceback of an error")
    top.add_argument("--version", action="version", version=f"tidal {__version__}")
    # the same flag after the command; SUPPRESS: a command without it keeps what came before it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="print the traceback of an error"
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in MODULES:
        importlib.import_module(name).add(sub, [common])
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        print(f"tidal {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of the output went away (`tidal inspect ... | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        if args.verbose:
            traceback.print_exc()
        print(f"tidal {args.command}: {one_line(exc)}", file=sys.stderr)
        return 2


def one_line(exc: BaseException) -> str:
    """An error as one line: its message (the last line of a traceback a DataLoader worker sent,
    if that is what it holds), with its type where the message alone would not say it."""
    from tidal.errors import TidalError

    text = str(exc)
    if "Original Traceback" in text:  # torch re-raises a worker's error with the worker's traceback
        last = [line for line in text.splitlines() if line.strip()][-1]
        name, sep, message = last.partition(": ")
        text = message if sep and "." in name and " " not in name else last
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    text = "; ".join(lines) or type(exc).__name__
    if isinstance(exc, TidalError) or (isinstance(exc, _CLEAR) and not isinstance(exc, KeyError)):
        return text
    return f"{type(exc).__name__}: {text} (unexpected: --verbose prints the traceback)"


if __name__ == "__main__":
    sys.exit(main())
