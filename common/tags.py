"""Tag subscriptions, RocketMQ style: ``*``, ``A`` or ``A || B || C``.

The broker filters by the tags' hashes from the consumeQueue (cheap, but hashes
can collide); the client then keeps only messages whose exact tag is
subscribed.  Both sides parse the expression with this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from gms.record import TAG_BYTES_MAX, tag_hash

_SEPARATOR = "||"


class BadTagExpression(ValueError):
    pass


@dataclass(frozen=True)
class TagFilter:
    """A parsed expression; ``tags is None`` means every message (``*``). ``sql``: a SQL92
    property filter the broker applies too (:mod:`gms.sql92`; empty: none)."""

    expression: str
    tags: frozenset[str] | None
    sql: str = ""

    @property
    def hashes(self) -> frozenset[int] | None:
        return None if self.tags is None else frozenset(tag_hash(t) for t in self.tags)

    def matches(self, tag: str | None) -> bool:
        return self.tags is None or (tag or "") in self.tags


MATCH_ALL = TagFilter("*", None)


def parse_tag_expression(expression: str | None) -> TagFilter:
    """Parse ``*`` / ``A`` / ``A || B``; raise :class:`BadTagExpression` saying why."""
    if expression is None or expression.strip() in ("", "*"):
        return MATCH_ALL
    tags = [part.strip() for part in expression.split(_SEPARATOR)]
    for tag in tags:
        if not tag:
            raise BadTagExpression(f"tag expression {expression!r} has an empty tag around '||'")
        if tag == "*":
            raise BadTagExpression(f"tag expression {expression!r}: '*' cannot be combined with tags")
        if "|" in tag or any(c.isspace() for c in tag):
            raise BadTagExpression(
                f"tag expression {expression!r}: tag {tag!r} may not contain '|' or spaces; "
                "separate tags with ' || '"
            )
        if len(tag.encode()) > TAG_BYTES_MAX:
            raise BadTagExpression(f"tag {tag[:20]!r}… is longer than {TAG_BYTES_MAX} bytes")
    return TagFilter(expression, frozenset(tags))
