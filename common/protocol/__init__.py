"""The wire protocol shared by broker, nameserver and clients."""
