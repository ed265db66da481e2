"""Assembles the ``wakuwaku`` group from the command-family modules.

Every family is imported here by name: a missing or broken family module
fails the import loudly instead of leaving its commands out.
"""

from __future__ import annotations

import click

from . import (
    _control,
    _dashboard,
    _demo,
    _dlq,
    _dlq_purge,
    _inbox,
    _offsets,
    _produce,
    _run,
    _status,
    _topics,
)

# Each module defines ``register(group: click.Group) -> None``; _offsets and
# _dlq_purge add to the ``group`` and ``dlq`` families that _topics and _dlq
# register, so each comes after its family.
_FAMILIES = (
    _topics,
    _offsets,
    _produce,
    _dlq,
    _dlq_purge,
    _run,
    _status,
    _control,
    _inbox,
    _demo,
    _dashboard,
)


def build() -> click.Group:
    """A new ``wakuwaku`` group with every command family registered on it."""

    @click.group(context_settings={"help_option_names": ["-h", "--help"]})
    @click.version_option(package_name="wakuwaku")
    def wakuwaku() -> None:
        """Reliable, key-ordered consumption of typed events from partitioned logs."""

    for family in _FAMILIES:
        family.register(wakuwaku)
    return wakuwaku
