"""The one place the console turns failures into answers: ``{"error": what to do, "kind": class}``
with an HTTP status, never a stack trace. Unexpected errors are logged with their traceback and
answered 500 with a pointer to the log."""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from gms.client.routing import NameserversUnavailableError
from gms.console.data import BadInput
from gms.errors import (
    BadRequestError,
    ForbiddenError,
    GmsError,
    GroupNotEmptyError,
    GroupNotFoundError,
    InvalidTopicError,
    MessageNotFoundError,
    OffsetIllegalError,
    QueueNotFoundError,
    TopicAlreadyExistsError,
    TopicNotFoundError,
    UnauthenticatedError,
)

log = logging.getLogger("gms.console")

# Errors of the request itself; everything else from the cluster is 502 (or 503 when retriable).
_STATUS: dict[type[GmsError], int] = {
    BadRequestError: 400, InvalidTopicError: 400, OffsetIllegalError: 400,
    ForbiddenError: 403,
    TopicNotFoundError: 404, QueueNotFoundError: 404, GroupNotFoundError: 404, MessageNotFoundError: 404,
    TopicAlreadyExistsError: 409, GroupNotEmptyError: 409,
}


class Refused(Exception):
    """A request the console answers itself, with ``status`` and a ``message`` saying what to do."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def error_response(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": message, "kind": kind}, status=status)


def gms_error_response(err: GmsError) -> web.Response:
    """The answer for an error the cluster (or the SDK talking to it) raised."""
    kind = type(err).__name__
    if isinstance(err, NameserversUnavailableError):
        return error_response(503, f"no nameserver at {','.join(err.nameservers)} answers: start the cluster"
                                   " (`gms standalone`), or restart the console with --nameserver pointing at a"
                                   f" running one ({'; '.join(err.failures)})", kind)
    if isinstance(err, UnauthenticatedError):
        return error_response(503, f"the cluster refused the console's credentials ({err}): restart the console"
                                   " with GMS_USER / GMS_PASSWORD (or a client certificate) the cluster knows", kind)
    if isinstance(err, ForbiddenError):
        return error_response(403, f"{err}: the console's user lacks this permission; a super user can grant it"
                                   " with `gms acl add`", kind)
    status = next((code for cls, code in _STATUS.items() if isinstance(err, cls)), None)
    if status is not None:
        return error_response(status, str(err), kind)
    if err.retriable:
        return error_response(503, f"{err}: is the broker running? The cluster page lists the live ones; retry once"
                                   " it is back", kind)
    return error_response(502, f"the cluster answered an error: {err}", kind)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answers API failures in JSON; pages and static files keep aiohttp's plain answers."""
    try:
        return await handler(request)
    except web.HTTPException as err:
        if not request.path.startswith("/api/") or err.status < 400:
            raise
        return error_response(err.status, f"{err.reason}: {request.method} {request.path} (see docs/console.md for"
                                          " the API)", type(err).__name__)
    except Refused as err:
        return error_response(err.status, str(err), err.kind)
    except BadInput as err:
        return error_response(400, str(err), "BadInput")
    except GmsError as err:
        return gms_error_response(err)
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return error_response(500, "the console failed on this request (a bug): its log has the details",
                              "InternalError")
