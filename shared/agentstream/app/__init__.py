"""Running an app: tools in threads with their timeouts and loading an app from
``module:attribute`` (:mod:`agentstream.app.base`). What an app declares (App, Agent, tools,
inputs, prompts) is :mod:`agentstream.declarations`; the testing kit is :mod:`agentstream.testing`.
"""
