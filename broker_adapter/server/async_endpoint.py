"""AsyncEndpoint: one broker server of an
:class:`~broker_adapter.server.async_client.AsyncRemoteBroker`, and its
:class:`~broker_adapter.server.async_link.AsyncLink` made (again) on demand (the
asyncio twin of :class:`~broker_adapter.server.endpoint.Endpoint`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from broker_adapter.errors import ChronoqError, ConnectionFailed, InvalidArgument
from broker_adapter.server.async_link import AsyncLink


class AsyncEndpoint:
    """One broker server: its address and an :class:`AsyncLink` made (again) on demand.

    :param index: its position in the client's endpoint list.
    """

    def __init__(
        self, index: int, host: str, port: int | None, token: str | None, connect_timeout_s: float
    ) -> None:
        self.index = index
        self.host, self.port = host, port
        self.address = host if port is None else f"{host}:{port}"  # None: a Unix socket path
        self._token = token
        self._timeout = connect_timeout_s
        self._link: AsyncLink | None = None
        self._connecting: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self.node = ""

    async def link(self, check_open: Callable[[], None]) -> AsyncLink:
        """The live link, connecting first if there is none (one connect at a time:
        the callers that arrive meanwhile share it).

        :raises ConnectionFailed: when the server cannot be reached.
        :raises AuthenticationFailed: when it refuses the token.
        :raises BrokerClosed: via ``check_open``.
        :raises InvalidArgument: when called from another event loop than the link's.
        """
        link = self._link
        loop = asyncio.get_running_loop()
        if link is not None and link.alive and link.loop is loop:
            return link
        if link is not None and link.alive:
            if link.loop is not loop:
                raise InvalidArgument(
                    f"this client's connection to {self.address} belongs to another running "
                    "event loop; open one client per event loop"
                )
            return link
        # A lock belongs to one loop; a client outliving its loop (asyncio.run returned:
        # the link's reader was cancelled, the link is dead) connects again on the next.
        if self._connecting is None or self._connecting[0] is not loop:
            self._connecting = (loop, asyncio.Lock())
        async with self._connecting[1]:
            check_open()
            link = self._link
            if link is None or not link.alive:
                link = await AsyncLink.open(self.host, self.port, self._token, self._timeout)
                self._link = link
                self.node = link.node
            return link

    async def known_node(self, check_open: Callable[[], None]) -> str:
        """This endpoint's node id (connecting to learn it; ``""`` if unreachable)."""
        if not self.node:
            try:
                await self.link(check_open)
            except ConnectionFailed:
                return ""
        return self.node

    async def close(self, error: ChronoqError) -> None:
        """Close the link; its waiting requests fail with ``error``."""
        link, self._link = self._link, None
        if link is not None:
            await link.close(error)


__all__ = ["AsyncEndpoint"]
