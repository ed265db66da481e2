"""The ``wakuwaku`` command line (click).

The parser is built by :func:`build_cli`, apart from :func:`main`, which runs
it and turns the outcome into one of the named exit codes
(:class:`ExitCode`). Each command family lives in its own module and adds
itself to the group (:mod:`._commands` lists them all).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from .._errors import WakuwakuError
from ._commands import build
from ._exit import ExitCode

__all__ = ("ExitCode", "build_cli", "main")


def build_cli() -> click.Group:
    """The ``wakuwaku`` command group with every command family attached."""
    return build()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    cli = build_cli()
    try:
        result = cli.main(
            args=list(argv) if argv is not None else None,
            prog_name="wakuwaku",
            standalone_mode=False,
        )
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return ExitCode.INTERRUPTED
    except click.ClickException as exc:
        exc.show()
        return ExitCode.USAGE if isinstance(exc, click.UsageError) else ExitCode.FAILURE
    except WakuwakuError as exc:
        click.echo(f"error: {exc}", err=True)
        return ExitCode.ERROR
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    if isinstance(result, int):
        return result
    return ExitCode.OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
