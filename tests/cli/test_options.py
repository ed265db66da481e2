"""Every option in seconds of every command is read by one check (cli/_options.py):
nan, inf, values out of bounds and empty list items are refused by name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from wakuwaku.cli import ExitCode, build_cli, main
from wakuwaku.cli._options import Seconds


def commands(
    group: click.Group, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command of ``group`` with its path of names (``("dlq", "list")``)."""
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


def args_for(command: click.Command) -> list[str]:
    """Placeholder values for the command's arguments and required options."""
    args = []
    for param in command.params:
        if isinstance(param, click.Argument) and param.required:
            args.append("x")
        elif isinstance(param, click.Option) and param.required:
            args += [param.opts[0], "x"]
    return args


def seconds_options() -> list[tuple[tuple[str, ...], click.Command, str]]:
    return [
        (path, command, param.opts[0])
        for path, command in commands(build_cli())
        for param in command.params
        if isinstance(param, click.Option) and isinstance(param.type, Seconds)
    ]


def test_no_option_of_any_command_is_a_plain_float() -> None:
    """A click FLOAT or FloatRange takes nan: every float option is a Seconds."""
    plain = [
        (" ".join(path), param.opts[0])
        for path, command in commands(build_cli())
        for param in command.params
        if isinstance(param.type, click.types.FloatParamType)
    ]
    assert plain == []
    found = {(" ".join(path), option) for path, _, option in seconds_options()}
    assert {
        ("dashboard", "--interval"),
        ("demo flights", "--lock-seconds"),
        ("demo flights", "--kill-at"),
    } <= found


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "-1", "1e9", "", "soon"])
def test_every_seconds_option_refuses_what_is_not_finite_seconds_in_bounds(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for path, command, option in seconds_options():
        argv = [*path, *args_for(command), option, value]
        if path[0] == "demo":
            argv += ["--workdir", str(tmp_path / "demo")]
        assert main(argv) == ExitCode.USAGE, argv
        err = capsys.readouterr().err
        assert option in err and "finite seconds" in err, (argv, err)
    assert not (tmp_path / "demo").exists()


def test_the_dashboard_interval_is_bounded_above_zero(capsys: pytest.CaptureFixture[str]) -> None:
    # The page polls every --interval seconds: nan polled hundreds of times a second.
    for value in ("nan", "0", "0.1"):
        assert main(["dashboard", "--interval", value]) == ExitCode.USAGE
        assert "finite seconds >= 0.2" in capsys.readouterr().err


def retry_delays_commands() -> list[list[str]]:
    return [
        [*path, *args_for(command)]
        for path, command in commands(build_cli())
        for param in command.params
        if isinstance(param, click.Option) and "--retry-delays" in param.opts
    ]


def test_the_retry_delays_options_are_found() -> None:
    assert sorted(c[0] for c in retry_delays_commands()) == ["demo", "status"]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("1,,2", "item 2 of '1,,2' is empty"),
        ("1,2,", "item 3 of '1,2,' is empty"),
        (",", "item 1 of ',' is empty"),
        ("", "'' is empty"),
        ("1, ,2", "item 2 of '1, ,2' is empty"),
        ("1,nan", "item 2 of '1,nan': 'nan' is not finite seconds >= 0"),
        ("1,x", "item 2 of '1,x': 'x' is not a number"),
    ],
)
def test_every_retry_delays_option_refuses_an_empty_or_broken_item(
    value: str, problem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in retry_delays_commands():
        argv = [*command, "--retry-delays", value]
        argv += ["--workdir", str(tmp_path)] if command[0] == "demo" else ["--log", "sqlite:///x"]
        assert main(argv) == ExitCode.USAGE, argv
        err = capsys.readouterr().err
        assert "--retry-delays" in err and problem in err, err


def test_a_good_schedule_is_read_with_its_spaces() -> None:
    from wakuwaku.cli._options import parse_retry_delays

    assert parse_retry_delays("0, 1.5,2592000") == (0.0, 1.5, 2592000.0)


def log_commands() -> list[tuple[tuple[str, ...], click.Command]]:
    """Every command that takes ``--log`` (the demo has its own, below)."""
    return [
        (path, command)
        for path, command in commands(build_cli())
        for param in command.params
        if isinstance(param, click.Option) and "--log" in param.opts and path[0] != "demo"
    ]


def test_the_log_commands_are_found() -> None:
    found = {" ".join(path) for path, _ in log_commands()}
    assert {
        "topic create",
        "produce",
        "tail",
        "status",
        "dlq replay",
        "dlq purge",
        "group reset-offsets",
        "pause",
        "resume",
        "pauses",
        "key retry-now",
        "key give-up",
        "run",
        "dashboard",
    } <= found
    assert len(found) == 19


@pytest.mark.parametrize("url", ["memory://", "MEMORY://", "memory://?x=1"])
def test_every_command_refuses_a_memory_log(
    url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``topic create orders --log memory://`` said "created", and the next
    command could not see it: the log ended with the first command."""
    monkeypatch.chdir(tmp_path)
    for path, command in log_commands():
        argv = [*path, *args_for(command), "--log", url]
        assert main(argv) == ExitCode.ERROR, argv
        err = capsys.readouterr().err
        assert f"--log {url!r}: a memory log lives only as long as this command" in err, argv
        assert "sqlite:///wakuwaku.db" in err
        monkeypatch.setenv("WAKUWAKU_LOG", url)
        assert main([*path, *args_for(command)]) == ExitCode.ERROR
        assert f"WAKUWAKU_LOG {url!r}: a memory log" in capsys.readouterr().err
        monkeypatch.delenv("WAKUWAKU_LOG")
    assert list(tmp_path.iterdir()) == []


def test_the_demo_refuses_a_memory_log_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["demo", "flights", "--log", "memory://", "--workdir", str(tmp_path / "out")]
    assert main(argv) == ExitCode.ERROR
    assert "sqlite:///" in capsys.readouterr().err
