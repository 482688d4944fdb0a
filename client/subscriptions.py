"""What a consumer subscribes to: per topic a tag expression or a SQL92 property filter."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gms.errors import BadTagExpressionError
from gms.record.builder import RecordEncoder
from gms.sql92 import BadFilterExpression, compile_filter
from gms.tags import BadTagExpression, TagFilter, parse_tag_expression


@dataclass(frozen=True)
class Sql:
    """A subscription by SQL92 over message properties (and ``TAGS``), evaluated on the broker:
    ``subscription={"orders": Sql("region = 'eu' AND amount > 100")}`` (RocketMQ's
    ``MessageSelector.bySql``). A bad expression raises BadTagExpressionError naming the position."""

    expression: str


def parse_subscription(subscription: Mapping[str, str | Sql]) -> dict[str, TagFilter]:
    """Each topic's filter, checked here (InvalidTopicError, BadTagExpressionError naming the
    position), not at the first request."""
    encoder = RecordEncoder()
    filters = {}
    for topic, expression in subscription.items():
        encoder.topic(topic)  # InvalidTopicError for a bad name
        try:
            if isinstance(expression, Sql):
                compile_filter(expression.expression)  # refused here, not at the first pull
                filters[topic] = TagFilter("*", None, expression.expression)
            else:
                filters[topic] = parse_tag_expression(expression)
        except (BadTagExpression, BadFilterExpression) as err:
            raise BadTagExpressionError(str(err)) from err
    return filters
