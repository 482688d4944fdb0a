"""The admin client: :class:`AsyncAdmin` (asyncio) and its synchronous facade :class:`Admin`."""

from gms.client.admin.api import Admin, AsyncAdmin
from gms.client.admin.topics import DEFAULT_QUEUE_COUNT, TopicResult, TopicSpec

__all__ = ["DEFAULT_QUEUE_COUNT", "Admin", "AsyncAdmin", "TopicResult", "TopicSpec"]
