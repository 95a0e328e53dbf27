"""A deadline for a request's head, against slowloris clients (Go's http.Server calls it ReadHeaderTimeout).

aiohttp closes a connection that sends nothing for its keep-alive timeout, but a client that sends a head one
byte at a time stays: 100 such sockets stayed open 40 s. Here, once the first bytes of a head arrive on an idle
connection, the whole head must follow within `head_timeout_s`, or the connection is closed. The deadline covers
the head only: bodies have the server's body-read timeout, and a streamed answer may last as long as it lasts.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

HEAD_TIMEOUT_S = 10.0  # Go servers commonly use 2-10 s; a real client sends its head in one write


class HeadDeadlineHandler(RequestHandler):
    """aiohttp's connection handler, closing the connection when a started head does not end in time."""

    __slots__ = ("_head_timer", "head_timeout_s")

    def __init__(self, manager, *, head_timeout_s: float = HEAD_TIMEOUT_S, **kwargs):
        super().__init__(manager, **kwargs)
        self.head_timeout_s = head_timeout_s
        self._head_timer: asyncio.TimerHandle | None = None

    def _idle(self) -> bool:
        """Waiting for a request's head (aiohttp's own test for an idle connection): no request is being read,
        handled or answered."""
        return self._waiter is not None and not self._waiter.done()

    def data_received(self, data: bytes) -> None:
        idle_before = self._idle()
        super().data_received(data)
        if not self._idle():  # the head is complete (or the connection is busy with a request)
            self._disarm()
        elif idle_before and self._head_timer is None:  # the first bytes of a head
            self._head_timer = asyncio.get_running_loop().call_later(self.head_timeout_s, self._head_overdue)

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self._idle():
            self.force_close()

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)


class HeadDeadlineServer(web.Server):
    """web.Server making HeadDeadlineHandlers; use_head_deadline() puts it under an AppRunner."""

    head_timeout_s = HEAD_TIMEOUT_S

    def __call__(self) -> RequestHandler:
        return HeadDeadlineHandler(self, head_timeout_s=self.head_timeout_s, loop=self._loop, **self._kwargs)


def use_head_deadline(runner: web.AppRunner, head_timeout_s: float) -> None:
    """After runner.setup(), before a site starts: its connections get the head deadline. aiohttp builds the
    web.Server itself and has no option for its handler class, so the server's class is swapped for the subclass
    (it adds no state)."""
    runner.server.__class__ = HeadDeadlineServer
    runner.server.head_timeout_s = head_timeout_s
