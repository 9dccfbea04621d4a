"""Apps whose tools nest pydantic models (schemas with ``$defs``/``$ref``), for the endpoint
defaults tests: ``tests.support.schema_apps:app`` and ``:recursive_app``."""

from __future__ import annotations

from pydantic import BaseModel

from agentstream import Agent, App, tool


class Place(BaseModel):
    city: str
    country: str = "FR"


class Trip(BaseModel):
    origin: Place
    destination: Place
    nights: int = 1


@tool(timeout_s=5)
def book_trip(trip: Trip) -> str:
    """Book a trip between two places."""
    return f"booked {trip.origin.city} -> {trip.destination.city} for {trip.nights} nights"


class Node(BaseModel):
    name: str
    children: list[Node] = []


@tool(timeout_s=5)
def walk_tree(root: Node) -> str:
    """Walk a tree of names."""
    return root.name


app = App(agents=[Agent(name="trips", system_prompt="You book trips.", tools=[book_trip], max_passes=3)])
recursive_app = App(agents=[Agent(name="trees", system_prompt="You walk trees.", tools=[walk_tree], max_passes=3)])
