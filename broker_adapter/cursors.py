"""PositionCursor: the opaque page cursor of the paged calls (``find_pending``,
``dead_letters``) of the embedded and memory adapters.

A cursor is a version tag followed by the url-safe base64 (unpadded) of the
byte position the next page starts at. The tag keeps one call's (or one
adapter's) cursors from being read as another's; the byte sizes a position may
have reject the rest.
"""

from __future__ import annotations

import base64
import binascii

from broker_adapter.errors import InvalidArgument


class PositionCursor:
    """Encodes and decodes the cursors of one paged call.

    :param tag: the version tag every cursor starts with (e.g. ``"e1"``).
    :param call: the call's name, for the error (e.g. ``"find_pending"``).
    :param sizes: the byte lengths a position may have.
    """

    def __init__(self, tag: str, call: str, sizes: tuple[int, ...]) -> None:
        self.tag = tag
        self.call = call
        self.sizes = sizes

    def encode(self, position: bytes) -> str:
        """The opaque, url-safe cursor of a page whose next one starts at ``position``."""
        return self.tag + base64.urlsafe_b64encode(position).decode().rstrip("=")

    def decode(self, cursor: str) -> bytes:
        """The position a cursor of :meth:`encode` names.

        :raises InvalidArgument: for anything else (naming the call whose cursor to
            pass back).
        """
        position = b""
        if cursor.startswith(self.tag):
            try:
                position = base64.urlsafe_b64decode(cursor[len(self.tag) :] + "==")
            except (binascii.Error, ValueError):
                position = b""
        if len(position) not in self.sizes:
            raise InvalidArgument(
                f"malformed cursor {cursor!r}: pass back the cursor of the previous page of "
                f"this broker's {self.call} (or none for the first page)"
            )
        return position


__all__ = ["PositionCursor"]
