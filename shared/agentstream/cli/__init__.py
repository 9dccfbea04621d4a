"""The ``agentstream`` command and what only it uses (following a turn, the local model, the
AsyncAPI document).
"""
