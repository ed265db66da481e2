"""``wakuwaku run module:attr``: run a consumer until SIGINT/SIGTERM (design §14).

``attr`` names a :class:`wakuwaku.engine.Consumer`, or a callable (sync or
async) returning one: with no parameter, or with one, which receives the
log ``--log`` names, opened. ``--log`` is also exported as ``WAKUWAKU_LOG``
before the module is imported, so module-level code can open the same log
with ``open_log(os.environ["WAKUWAKU_LOG"])``. The current directory is put
on ``sys.path`` first, as ``python -m`` would.

Exit status: 0 after a graceful stop (signal, ``--drain`` idle, or
:meth:`Consumer.stop`); 130 after a forced one (a second signal); 2 for a
target that cannot be found or is not a consumer; 3 when importing the
module or building the consumer failed, or the consumer cannot start
(unknown topic, partition count mismatch).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import logging
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import click

from .._errors import ConfigError
from .._events import EventType, Registry, default_registry
from .._logging import StructuredFormatter
from ..engine import Consumer
from ._exit import ExitCode
from ._status import LOG_ENV, log_option, open_existing_log

logger = logging.getLogger("wakuwaku.cli")


@contextlib.contextmanager
def logging_to_stderr(level: str) -> Iterator[None]:
    """Log to stderr at ``level`` with :class:`StructuredFormatter` while inside;
    the root logger's handlers and level are restored on exit."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(StructuredFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    previous = root.level
    root.addHandler(handler)
    root.setLevel(level.upper())
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)


def import_app_module(module_name: str, spec: str, hint: str = "MODULE:ATTR") -> Any:
    """Import ``module_name`` as ``run`` does: the current directory first on
    ``sys.path``.

    :param spec: what the user gave (for the messages); :param hint: the
        option or argument it came from.
    :raises click.BadParameter: when the module does not exist (exit status 2).
    :raises ConfigError: when importing the module raised (exit status 3).
    """
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (
            module_name == exc.name or module_name.startswith(exc.name + ".")
        ):
            raise click.BadParameter(
                f"no module named {module_name!r} (from {spec!r})", param_hint=hint
            ) from None
        logger.error("importing %r failed", module_name, exc_info=True)
        raise ConfigError(f"importing module {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        logger.error("importing %r failed", module_name, exc_info=True)
        raise ConfigError(
            f"importing module {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc


def load_target(spec: str, hint: str = "MODULE:ATTR") -> Any:
    """Import ``module:attr`` (``attr`` may be dotted) and return the object.

    :raises click.BadParameter: when ``spec`` is not ``module:attr``, the
        module does not exist or has no such attribute (exit status 2).
    :raises ConfigError: when importing the module raised (exit status 3).
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise click.BadParameter(
            f"{spec!r} is not module:attr (e.g. myapp.consumers:billing)", param_hint=hint
        )
    target: Any = import_app_module(module_name, spec, hint)
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise click.BadParameter(
                f"module {module_name!r} has no attribute {attr!r}", param_hint=hint
            ) from None
    return target


async def app_types(spec: str, log_url: str) -> dict[str, EventType[Any]]:
    """The event types of the application ``spec`` names, by type tag: what
    its consumer checks records against (``wk-alg``, unknown types).

    ``spec`` is ``MODULE`` (the types its import registered with
    ``@wakuwaku.event``, in the default registry) or ``MODULE:ATTR`` as
    ``run`` takes it: a :class:`~wakuwaku.engine.Consumer` or a factory of
    one (its handlers' types), or a :class:`~wakuwaku.Registry`.

    :raises click.BadParameter: / :raises ConfigError: as :func:`load_target`
        and :func:`build_consumer`, naming ``--app``.
    """
    if ":" not in spec:
        import_app_module(spec, spec, "--app")
        return {t.tag: t for t in default_registry}
    target = load_target(spec, "--app")
    if isinstance(target, Registry):
        return {t.tag: t for t in target}
    consumer = await build_consumer(target, spec, log_url, hint="--app")
    try:
        return {tag: handler.event_type for tag, handler in consumer.handlers.items()}
    finally:
        await consumer.log.close()


def _wants_log(factory: Any) -> bool:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    required = [
        p
        for p in params
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return len(required) == 1


async def build_consumer(
    target: Any, spec: str, log_url: str, hint: str = "MODULE:ATTR"
) -> Consumer:
    """The consumer ``target`` is or builds (see the module docstring).

    :raises click.BadParameter: when ``target`` is neither a consumer nor a
        callable, or the callable returned something else (exit status 2).
    :raises ConfigError: when the callable raised (exit status 3).
    """
    if isinstance(target, Consumer):
        return target
    if not callable(target):
        raise click.BadParameter(
            f"{spec!r} is a {type(target).__name__}, not a wakuwaku Consumer or a "
            "callable returning one",
            param_hint=hint,
        )
    try:
        built = target(open_existing_log(log_url)) if _wants_log(target) else target()
        if inspect.isawaitable(built):
            built = await built
    except (click.ClickException, ConfigError):
        raise
    except Exception as exc:
        logger.error("building the consumer with %r failed", spec, exc_info=True)
        raise ConfigError(f"{spec!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(built, Consumer):
        raise click.BadParameter(
            f"{spec!r} returned a {type(built).__name__}, not a wakuwaku Consumer",
            param_hint=hint,
        )
    return built


async def _serve(
    spec: str, target: Any, log_url: str, drain: bool, metrics_port: int | None, metrics_addr: str
) -> bool:
    """Run the consumer until it stops; True when its stop was forced (a
    second SIGINT/SIGTERM)."""
    consumer = await build_consumer(target, spec, log_url)
    refresher: asyncio.Task[None] | None = None
    try:
        if metrics_port is not None:
            refresher = _start_metrics(consumer, metrics_port, metrics_addr)
        config = consumer.config
        logger.info(
            "consumer starting",
            extra={
                "topics": list(config.topics),
                "group": config.group,
                "retry_topics": [config.retry_topic(t) for t in config.topics],
                "dead_letter_topics": [config.dead_letter_topic(t) for t in config.topics],
                "log": consumer.log.url,
                "drain": drain,
            },
        )
        if drain:
            stats = await consumer.drain(install_signal_handlers=True)
        else:
            stats = await consumer.run(install_signal_handlers=True)
        logger.info("consumer stopped", extra={"stats": stats.as_dict()})
        return consumer.forced
    finally:
        if refresher is not None:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
        await consumer.log.close()


def _start_metrics(consumer: Consumer, port: int, addr: str) -> asyncio.Task[None]:
    try:
        from ..metrics import start_metrics_server
    except ImportError as exc:
        raise ConfigError(str(exc)) from exc
    try:
        collector = start_metrics_server(consumer, port, addr=addr)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {addr}:{port}: {exc}") from exc
    logger.info("serving metrics", extra={"addr": addr, "port": port})
    return asyncio.create_task(collector.keep_lag_fresh())


@click.command("run")
@click.argument("target", metavar="MODULE:ATTR")
@click.option(
    "--drain",
    is_flag=True,
    help="Stop once every partition is caught up and no key is quarantined.",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="Log to stderr from this level up.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve Prometheus metrics on this port (needs wakuwaku[prometheus]).",
)
@click.option(
    "--metrics-addr",
    default="127.0.0.1",
    show_default=True,
    help="The address the metrics server listens on (0.0.0.0: every interface).",
)
@log_option
def run_command(
    target: str,
    drain: bool,
    log_level: str,
    metrics_port: int | None,
    metrics_addr: str,
    log_url: str,
) -> int:
    """Run the consumer MODULE:ATTR names until SIGINT/SIGTERM (or idle, with --drain).

    ATTR is a wakuwaku Consumer, or a callable (sync or async) returning
    one; a callable with one parameter gets the log --log names. --log is
    exported as WAKUWAKU_LOG before MODULE is imported. On SIGINT/SIGTERM no
    new chunk starts, running chunks finish (within the consumer's
    shutdown_timeout), completed batches' offsets are stored, leases are
    released, and the exit status is 0. A second SIGINT/SIGTERM stops at
    once: it names the partitions still draining, cancels their chunks,
    releases the leases and exits with status 130 (without waiting for sync
    handler calls still running in threads).
    """
    os.environ[LOG_ENV] = log_url
    with logging_to_stderr(log_level):
        obj = load_target(target)
        forced = asyncio.run(_serve(target, obj, log_url, drain, metrics_port, metrics_addr))
        if forced:
            _exit_now_if_threads_run()
    return ExitCode.INTERRUPTED if forced else ExitCode.OK


def _exit_now_if_threads_run() -> None:
    """After a forced stop, end the process without waiting for sync handler
    calls still running in threads (the interpreter would join them at exit:
    a handler sleeping 60 s kept the "stopped now" process alive 60 s)."""
    running = [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and t.is_alive() and not t.daemon
    ]
    if not running:
        return
    logger.warning(
        "exiting without waiting for handler calls still running in threads",
        extra={"threads": running},
    )
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(ExitCode.INTERRUPTED)


def register(group: click.Group) -> None:
    """Attach ``run`` to the ``wakuwaku`` group."""
    group.add_command(run_command)
