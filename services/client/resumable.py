"""One resumable server stream: the loop under every watch of LedgerClient.

The stream is opened again after a cut the ledger means to be resumed (a restart, a slow consumer cut off: see
`errors.STREAM_RESUMABLE`) and after the ledger ends it, with a growing pause between failed tries. `open_call`
builds the request from the caller's resume point each time, so a reconnect misses nothing and repeats nothing;
the caller moves that point as messages arrive. OUT_OF_RANGE (the point is no longer kept) calls `restart`, which
resets it for a fresh snapshot; a stream without a resume point ends on it like on any other error. `on_cut` is told
at each cut that is resumed: a consumer holding the state a stream delivers knows it may be behind until the next
message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from . import errors
from .retry import RetryPolicy

log = logging.getLogger(__name__)


def revision_watch(
    what: str, open_after: Callable[[int], Any], after_revision: int, snapshot_type: int, retry: RetryPolicy
) -> AsyncIterator[Any]:
    """A snapshot-then-changes watch resumed after the last revision it delivered: `open_after(revision)` opens the
    call. Snapshot items all carry the snapshot's revision, so the resume point moves only past the snapshot
    (SYNCED): a cut mid-snapshot replays it. OUT_OF_RANGE starts over from revision 0, with a fresh snapshot."""
    revision = after_revision

    def restart() -> str:
        nonlocal revision
        was, revision = revision, 0
        return f"revision {was}"

    def open_call() -> Any:  # reads the resume point when it opens, so a reconnect starts from the latest one
        return open_after(revision)

    async def messages() -> AsyncIterator[Any]:
        nonlocal revision
        # Closed with its consumer: the call ends then, not when the generator is collected.
        async with contextlib.aclosing(resumable(what, open_call, retry, restart)) as stream:
            async for message in stream:
                if message.type != snapshot_type:
                    revision = message.revision
                yield message

    return messages()


async def resumable(
    what: str,
    open_call: Callable[[], Any],
    retry: RetryPolicy,
    restart: Callable[[], str] | None = None,
    on_cut: Callable[[], None] | None = None,
) -> AsyncIterator[Any]:
    """Yields the messages of `open_call()`'s stream, re-opened as the module docstring says; raises the
    client's typed error for a cut it does not resume. `restart` resets the resume point and says what it was;
    `on_cut` is told when the stream is cut and will be opened again."""
    failures = 0
    while True:
        call = open_call()
        try:
            async for message in call:
                failures = 0
                yield message
            failures += 1  # the server ended the stream (e.g. shutting down): reconnect after a pause
            if on_cut is not None:
                on_cut()
            await asyncio.sleep(retry.reconnect_delay(failures))
        except grpc.aio.AioRpcError as raw:
            err = errors.typed(raw)
            if isinstance(err, errors.OutOfRange) and restart is not None:
                log.warning("%s: %s no longer kept (%s); re-listing", what, restart(), err.details())
                continue
            if not isinstance(err, errors.STREAM_RESUMABLE):
                raise err from None
            failures += 1
            log.info("%s interrupted (%s: %s); resuming", what, err.code_name, err.details())
            if on_cut is not None:
                on_cut()
            await asyncio.sleep(retry.reconnect_delay(failures))
        finally:
            call.cancel()
