"""The consumer's reader of its group's control topic: operator commands (design §14).

Operators write commands to ``[ns.]wk-control.<group>`` through
:mod:`wakuwaku.admin.control` (the ``pause``, ``resume`` and ``key``
commands, the dashboard); the record format and the fold of pauses are in
:mod:`wakuwaku._control`. One :class:`ControlReader` per consumer reads the
topic whole at start (before any partition starts work, so a pause outlives
a restart), then every ``poll_interval`` for new commands. The partition
workers look at what it holds before each batch:

- a paused topic or partition is neither polled nor retried;
- a paused key's records are routed to the retry topic as *held* work
  (``wk-held: 1``: not a failure) and its attempts wait;
- a ``retry-now`` or ``give-up`` command is applied once by the worker of
  the key's partition (:meth:`~._partition.PartitionWorker`), bounded by
  the command's ``through`` offset so that reading it again changes
  nothing.

A control topic that cannot be read (the log is down) keeps the last
commands read: work goes on as it was, and the failure is logged once per
outage. A record that is not a usable command is logged and skipped.

May call: the log, :mod:`wakuwaku._control`, :mod:`._config`.
"""

from __future__ import annotations

import logging

from .._control import Command, Pauses, control_topic_name, decode_command
from ..logs import Log
from ._config import ConsumerConfig

logger = logging.getLogger("wakuwaku.consumer")

_PAGE = 1000


class ControlReader:
    """The commands of one consumer group, as read so far.

    :ivar pauses: the pauses in force.
    :ivar commands: the one-shot commands (``retry-now``, ``give-up``), as
        (control offset, command), oldest first.
    """

    def __init__(self, log: Log | None, config: ConsumerConfig) -> None:
        self._log = log
        self._config = config
        self.topic = control_topic_name(config.group, config.namespace)
        self.pauses = Pauses()
        self.commands: list[tuple[int, Command]] = []
        self._offset = 0
        self._failing = False

    async def load(self) -> None:
        """Create the control topic when missing and read it whole.

        :raises LogError: what the log raises (the consumer's start retries it).
        """
        if self._log is None:
            return
        await self._log.create_topic(self.topic, 1)
        starts = await self._log.start_offsets(self.topic)
        self._offset = max(self._offset, starts.get(0, 0))
        await self._read(announce=False)
        for pause in self.pauses.all():
            logger.warning(
                "paused by an operator",
                extra={
                    "group": self._config.group,
                    "scope": pause.scope(),
                    "by": pause.by,
                    "reason": pause.reason,
                },
            )

    async def refresh(self) -> None:
        """Read the commands written since the last read; a log that fails
        (any exception) is logged once per outage and the commands read so
        far stay: work goes on as it was."""
        try:
            await self._read(announce=True)
        except Exception as exc:  # noqa: BLE001 - logged; the commands read so far stay
            if not self._failing:
                logger.warning(
                    "control topic unreadable; operator commands wait",
                    extra={"group": self._config.group, "topic": self.topic, "error": str(exc)},
                )
                self._failing = True
            return
        if self._failing:
            logger.info(
                "control topic readable again",
                extra={"group": self._config.group, "topic": self.topic},
            )
            self._failing = False

    async def _read(self, *, announce: bool) -> None:
        assert self._log is not None
        while page := await self._log.read(self.topic, 0, self._offset, _PAGE):
            for record in page:
                found = decode_command(record)
                if isinstance(found, str):
                    logger.warning(
                        "control record skipped",
                        extra={
                            "group": self._config.group,
                            "topic": self.topic,
                            "offset": record.offset,
                            "error": found,
                        },
                    )
                    continue
                if found.one_shot:
                    self.commands.append((record.offset, found))
                elif self.pauses.apply(found, record.offset) and announce:
                    logger.warning(
                        "paused by an operator"
                        if found.action == "pause"
                        else "resumed by an operator",
                        extra={
                            "group": self._config.group,
                            "scope": found.scope(),
                            "by": found.by,
                            "reason": found.reason,
                        },
                    )
            self._offset = page[-1].offset + 1


NO_CONTROL = ControlReader(None, ConsumerConfig(topic="-", group="-"))
"""A reader that never has a command: for a worker run without a consumer."""
