"""asyncio networking for gms: the RPC server, the client connection, and event loops.

The bytes-to-frames work is in :mod:`gms.protocol`; this package only moves bytes.
"""

from gms.net.client import Connection
from gms.net.loop import LoopThread, new_event_loop, run
from gms.net.server import RpcServer, ServerConfig

__all__ = ["Connection", "LoopThread", "RpcServer", "ServerConfig", "new_event_loop", "run"]
