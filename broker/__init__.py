"""The broker: storage engine, protocol handlers, topics and consumer groups."""
