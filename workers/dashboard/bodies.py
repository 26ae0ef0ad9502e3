"""The POST bodies of the API: a JSON object, required or not (``{}`` or none)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Body

#: A body that may be left out; ``None`` then.
OptionalBody = Annotated[dict[str, Any] | None, Body()]
#: A body that must be a JSON object.
RequiredBody = Annotated[dict[str, Any], Body()]

__all__ = ["OptionalBody", "RequiredBody"]
