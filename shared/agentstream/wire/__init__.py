"""The wire: the events of a trace, their codec, every Redis key name, the checks on what a
client publishes, the published schemas. Pure (no Redis, no asyncio); imports only
:mod:`agentstream.errors`.
"""
