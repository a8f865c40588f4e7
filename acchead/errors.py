"""One error type for bad input, the CLI wrapper that turns it into a one-line message and exit code, the
help formatter of the commands that show their flags' defaults, and the argparse type every `--threads`
shares."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., int])


class AccheadError(Exception):
    """Bad input or a mismatch the user can fix; CLIs print it as one line, without a traceback."""


# The OS errors of paths a user gave (missing, a file where a folder goes or the reverse, unreadable): user
# errors, one line, like AccheadError.
USER_PATH_ERRORS: tuple[type[OSError], ...] = (
    FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError,
)  # fmt: skip


def cli_errors(main: F) -> F:
    """Wrap a console-script `main` so that expected failures print `prog: error: ...` and exit non-zero.

    `AccheadError` and the OS errors of missing or unreadable paths are user errors (exit 2); Ctrl-C exits
    130. Anything else is a bug and keeps its traceback. Set ACCHEAD_DEBUG=1 to see tracebacks anyway.
    """

    @functools.wraps(main)
    def wrapper(*args, **kwargs) -> int:
        prog = os.path.basename(sys.argv[0]) or "acchead"
        try:
            return main(*args, **kwargs)
        except (AccheadError, *USER_PATH_ERRORS) as e:
            if os.environ.get("ACCHEAD_DEBUG"):
                raise
            print(f"{prog}: error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as e:
            # A stage may say what survives the interruption (e.g. which checkpoint to resume from).
            detail = f": {e}" if str(e) else ""
            print(f"{prog}: interrupted{detail}", file=sys.stderr)
            return 130

    return wrapper  # type: ignore[return-value]


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`--help` with each flag's default appended, unless its help already says it or there is none to show
    (None, a store_true's False): argparse's own formatter would print "(default: None)" after "(default:
    the pair's)"."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default:" in text or "(default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


def int_at_least(low: int, note: str = "") -> Callable[[str], int]:
    """An argparse type: an int >= `low`, else a one-line error (`note` says what the bound means)."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}{f' ({note})' if note else ''}, got {n}")
        return n

    return parse


# `--threads` of every command that hands it to torch: a negative count would reach
# `torch.set_num_threads` and fail there with a traceback, or be taken silently as 0
thread_count = int_at_least(0, "0: torch's default")
