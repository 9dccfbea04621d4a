"""The step decision and the fold: what the agent loop does next, decided from a trace's
events and the app (pure: no Redis, no asyncio); the rebuild of a stored trace's model calls.
Imports the wire, the context library, the model adapters' pure parts, the app's declarations.
"""
