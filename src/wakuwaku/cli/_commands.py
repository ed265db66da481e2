"""Assembles the ``wakuwaku`` group from the command-family modules."""

from __future__ import annotations

import importlib

import click

# Each module defines ``register(group: click.Group) -> None``.
_FAMILIES = ("_topics", "_dlq", "_run", "_status", "_inbox", "_demo", "_dashboard")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="wakuwaku")
def _group() -> None:
    """Reliable, key-ordered consumption of typed events from partitioned logs."""


def build() -> click.Group:
    """The group with every family that is present registered on it."""
    for name in _FAMILIES:
        try:
            module = importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.{name}":
                raise
            continue
        module.register(_group)
    return _group
