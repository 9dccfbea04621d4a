"""The app surface: what a user's app declares (App, Agent, tools), what a running tool can
know about its call, and the testing kit.
"""
