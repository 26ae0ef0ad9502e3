"""The dashboard's ASGI app: :func:`build_app` puts the API routes, the pages of
``static/``, the error answers and :class:`~workers.dashboard.auth.SecurityMiddleware`
together on FastAPI.

OpenAPI's document is served (``openapi.json``); FastAPI's Swagger and ReDoc
pages are off, since they load their scripts from a CDN.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from broker_adapter.errors import ChronoqError, InvalidArgument
from workers.dashboard import api_dead, api_messages, api_overview, api_schedules
from workers.dashboard.auth import Guard, SecurityMiddleware
from workers.dashboard.context import Dashboard, version
from workers.dashboard.errors import RouteNotFound, http_status

#: The pages, scripts and styles (all shipped in the package; nothing from a CDN).
STATIC_DIR = Path(__file__).resolve().parent / "static"


def _error(error: Exception, status: int) -> JSONResponse:
    return JSONResponse({"error": type(error).__name__, "message": str(error)}, status)


def _bad_input(exc: RequestValidationError) -> InvalidArgument:
    """The typed error of a request FastAPI could not validate."""
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("query", "path"))
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return InvalidArgument("bad request: " + "; ".join(parts))


def build_app(dash: Dashboard, guard: Guard) -> FastAPI:
    """The dashboard app on ``dash``, protected by ``guard``.

    When served on its own (not mounted), its lifespan starts the fire-rate sampler
    and closes ``dash`` at shutdown.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        dash.start()
        try:
            yield
        finally:
            dash.close()

    app = FastAPI(
        title="chronoq dashboard",
        version=version(),
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.chronoq_dashboard = dash

    @app.exception_handler(ChronoqError)
    async def chronoq_error(request: Request, exc: ChronoqError) -> JSONResponse:
        return _error(exc, http_status(exc))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # Unknown paths and methods (and missing static files) answer in the API's shape.
        what = f"{request.method} {request.url.path}"
        return _error(RouteNotFound(f"{what}: {exc.detail}; see openapi.json"), exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(_bad_input(exc), 400)

    app.include_router(api_overview.routes(dash, guard.token_required))
    app.include_router(api_messages.routes(dash))
    app.include_router(api_schedules.routes(dash))
    app.include_router(api_dead.routes(dash))

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR, check_dir=False), name="static")
    app.add_middleware(SecurityMiddleware, guard=guard)
    return app


__all__ = ["STATIC_DIR", "build_app"]
