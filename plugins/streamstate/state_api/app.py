"""The state query API: a job's current state by key or key range, over HTTP.

Served two ways, the same app:

- inside Airflow, as a plugin app under ``/state-api`` (plugins/streamstate_plugin.py);
- on its own: ``python -m streamstate_cli state-api`` (uvicorn on ``STREAMSTATE_STATE_API_PORT``).

Routes (OpenAPI at ``/openapi.json``, browsable at ``/docs``):

- ``GET /jobs``: the addressable jobs and stores and how their keys look;
- ``GET /jobs/{job}/stores/{store}``: store metadata, the source that would answer now, the standby's lag;
- ``GET /jobs/{job}/stores/{store}/keys/{key}``: one key (windowed stores: ``?window_start=<ms>``; versioned
  stores: ``?valid_at=<ms>`` for the version valid at that event time);
- ``GET /jobs/{job}/stores/{store}/keys``: a range (``start``/``end``) or ``prefix`` scan, ``page_size``
  at most ``STREAMSTATE_STATE_API_MAX_PAGE_SIZE``, continued with the answer's ``next_page_token``.

Every answer says ``source`` (``live`` | ``standby``), ``fallback_reason``, ``batch_id``, ``as_of`` and
``staleness_ms``. Only registered jobs and stores are addressable. With ``STREAMSTATE_STATE_API_TOKEN``
set, every route needs ``Authorization: Bearer <token>``.
"""

import base64
import binascii
import hmac
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Path, Query
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from streamstate.state_api.keys import MAX_KEY_LENGTH, InvalidKey
from streamstate.state_api.service import StateQueryService, UnknownStore

from runtime.settings import Settings

API_VERSION = "1"


class Provenance(BaseModel):
    source: str
    fallback_reason: str | None
    job_state: str
    batch_id: int | None
    snapshot_version: int | None
    as_of: str | None
    staleness_ms: int | None


class KeyAnswer(Provenance):
    job: str
    version: int
    store: str
    key: dict[str, Any]
    found: bool
    value: Any


class Item(BaseModel):
    key: dict[str, Any]
    value: Any


class ScanAnswer(Provenance):
    job: str
    version: int
    store: str
    items: list[Item]
    next_page_token: str | None


class StoreAnswer(Provenance):
    job: str
    version: int
    application_id: str
    store: str
    kind: str
    key: dict[str, str]
    changelog_topic: str
    keys: int
    standby: dict[str, Any]


JobName = Annotated[str, Path(pattern=r"^[a-z][a-z0-9_]{1,62}$", description="registered job name")]
StoreName = Annotated[str, Path(pattern=r"^[a-z][a-z0-9_-]{0,62}$", description="store name")]
Version = Annotated[int | None, Query(ge=1, description="job version (default: the one serving readers)")]


def _page_token(after: str | None) -> str | None:
    return base64.urlsafe_b64encode(after.encode()).decode() if after is not None else None


def _after(token: str | None) -> str | None:
    if token is None:
        return None
    try:
        return base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise HTTPException(422, "page_token is not a token this API returned") from None


def create_app(settings: Settings | None = None) -> FastAPI:
    """The API over ``settings`` (default: from the environment)."""
    settings = settings or Settings.from_env()
    service = StateQueryService(settings)
    bearer = HTTPBearer(auto_error=False, description="only when STREAMSTATE_STATE_API_TOKEN is set")

    def authorized(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:  # noqa: B008
        if settings.state_api_token is None:
            return
        given = credentials.credentials if credentials else ""
        if not hmac.compare_digest(given.encode(), settings.state_api_token.encode()):
            raise HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})

    app = FastAPI(
        title="streamstate state queries",
        version=API_VERSION,
        dependencies=[Depends(authorized)],
        description=__doc__.split("Routes")[0].strip(),
    )
    app.state.service = service
    app.router.add_event_handler("shutdown", service.close)

    def resolve(job: str, store: str, version: int | None):
        try:
            return service.resolve(job, store, version)
        except UnknownStore as err:
            raise HTTPException(404, str(err)) from None

    @app.get("/jobs", summary="Addressable jobs and stores")
    def jobs() -> dict:
        return {"jobs": service.catalog()}

    @app.get("/jobs/{job}/stores/{store}", response_model=StoreAnswer, summary="Store metadata and freshness")
    def store_metadata(job: JobName, store: StoreName, version: Version = None) -> dict:
        return service.describe_store(*resolve(job, store, version))

    @app.get("/jobs/{job}/stores/{store}/keys/{key}", response_model=KeyAnswer, summary="One key's state")
    def get_key(
        job: JobName,
        store: StoreName,
        key: Annotated[str, Path(max_length=MAX_KEY_LENGTH)],
        window_start: Annotated[int | None, Query(ge=0, description="windowed stores: window start, epoch ms")] = None,
        valid_at: Annotated[
            int | None,
            Query(
                ge=0,
                description="versioned stores: the version valid at this "
                "event time, epoch ms (within the store's retention)",
            ),
        ] = None,
        version: Version = None,
    ) -> dict:
        spec, store_spec = resolve(job, store, version)
        try:
            return service.get(spec, store_spec, key, window_start, valid_at)
        except InvalidKey as err:
            raise HTTPException(422, str(err)) from None

    @app.get("/jobs/{job}/stores/{store}/keys", response_model=ScanAnswer, summary="A key range or prefix, paged")
    def scan(
        job: JobName,
        store: StoreName,
        prefix: Annotated[str | None, Query(max_length=MAX_KEY_LENGTH, description="keys starting with this")] = None,
        start: Annotated[str | None, Query(max_length=MAX_KEY_LENGTH, description="first key (inclusive)")] = None,
        end: Annotated[str | None, Query(max_length=MAX_KEY_LENGTH, description="last key (exclusive)")] = None,
        page_size: Annotated[int, Query(ge=1, le=settings.state_api_max_page_size)] = 100,
        page_token: Annotated[str | None, Query(max_length=4 * MAX_KEY_LENGTH)] = None,
        version: Version = None,
    ) -> dict:
        spec, store_spec = resolve(job, store, version)
        try:
            answer = service.scan(
                spec, store_spec, prefix=prefix, start=start, end=end, after=_after(page_token), limit=page_size
            )
        except InvalidKey as err:
            raise HTTPException(422, str(err)) from None
        answer["next_page_token"] = _page_token(answer.pop("next_after"))
        return answer

    return app


#: the app the Airflow plugin mounts (settings from the API server's environment)
app = create_app()
