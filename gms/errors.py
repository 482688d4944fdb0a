"""The one error root of gms: every typed error carries a wire status and a retry hint."""


class GmsError(Exception):
    """Base of all gms errors; ``status`` maps to a wire status code, ``retriable`` tells clients
    whether the same request may succeed later."""

    status: int = 1
    retriable: bool = False
