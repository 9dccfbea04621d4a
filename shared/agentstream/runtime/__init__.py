"""The runtime on Redis: the only code that sends Redis commands, as named operations (the
trace store, consuming work streams, claims, cancels, deltas, work-stream retention, the service
runner, and the operations the services call in the field's words). Imports the pure layers and
:mod:`agentstream.ops`; the services import this, never ``redis``.
"""
