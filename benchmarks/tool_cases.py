"""Varied tool-calling cases for the forced-call suites (issue 42): tool sets of 1 to 20
tools drawn from a catalogue of agent-like functions (nested objects, enums, arrays of
objects, bounded integers, optional fields), a request in plain words for one of them,
and a ``tool_choice`` that requires a call (``required``) or names the tool. The same
seed gives the same cases: the test suite runs a sample, ``benchmarks.tool_calls`` all
of them on each default model, API shape and mode."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Final

S: Final = {"type": "string"}


def _obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


# name: (description, parameters, requests in plain words)
CATALOGUE: Final[dict[str, tuple[str, dict[str, Any], tuple[str, ...]]]] = {
    "get_weather": (
        "The weather forecast for a city",
        _obj(
            {
                "city": S,
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            ["city", "unit"],
        ),
        (
            "What's the weather in Paris this week?",
            "Will it rain in Tokyo tomorrow, in fahrenheit?",
        ),
    ),
    "search_web": (
        "Search the web",
        _obj({"query": S, "limit": {"type": "integer", "minimum": 1, "maximum": 20}}, ["query"]),
        ("Find recent news about electric cars.", "Look up the population of Brazil."),
    ),
    "read_file": (
        "Read a file from the workspace",
        _obj({"path": S}, ["path"]),
        ("Show me what's in src/main.py.", "Open the README file."),
    ),
    "write_file": (
        "Write text to a file, replacing it",
        _obj({"path": S, "content": S}, ["path", "content"]),
        ("Create notes.txt saying 'buy milk'.", "Save 'hello world' into greeting.txt."),
    ),
    "list_directory": (
        "List the entries of a directory",
        _obj({"path": S, "recursive": {"type": "boolean"}}, ["path"]),
        ("What files are in the tests folder?", "List everything under docs, recursively."),
    ),
    "run_command": (
        "Run a shell command",
        _obj({"command": S, "timeout_seconds": {"type": "number"}}, ["command"]),
        ("Run the test suite with pytest.", "Check the disk usage with df -h."),
    ),
    "create_event": (
        "Add an event to the calendar",
        _obj(
            {
                "title": S,
                "start": _obj({"date": S, "time": S}, ["date", "time"]),
                "attendees": {"type": "array", "items": S},
            },
            ["title", "start"],
        ),
        (
            "Schedule a team meeting on 2026-12-10 at 10:00 with Ana and Bo.",
            "Book lunch with Sam on Friday at noon.",
        ),
    ),
    "send_email": (
        "Send an email",
        _obj(
            {
                "to": {"type": "array", "items": S, "minItems": 1},
                "subject": S,
                "body": S,
                "priority": {"type": "string", "enum": ["low", "normal", "high"]},
            },
            ["to", "subject", "body"],
        ),
        (
            "Email bob@example.com that the build is fixed.",
            "Send an urgent note to ops@example.com about the outage.",
        ),
    ),
    "book_flight": (
        "Book a flight",
        _obj(
            {
                "origin": S,
                "destination": S,
                "passengers": {
                    "type": "array",
                    "items": _obj({"name": S, "age": {"type": "integer", "minimum": 0}}, ["name"]),
                },
                "cabin": {"type": "string", "enum": ["economy", "business", "first"]},
            },
            ["origin", "destination", "passengers"],
        ),
        (
            "Book me a flight from Lisbon to Rome, economy.",
            "Fly Ana (34) and Bo (7) from Oslo to Berlin.",
        ),
    ),
    "convert_currency": (
        "Convert an amount between currencies",
        _obj(
            {
                "amount": {"type": "number"},
                "source": {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY"]},
                "target": {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY"]},
            },
            ["amount", "source", "target"],
        ),
        ("How much is 100 dollars in euros?", "Convert 2500 yen to pounds."),
    ),
    "set_reminder": (
        "Set a reminder",
        _obj(
            {"text": S, "minutes_from_now": {"type": "integer", "minimum": 1}},
            ["text", "minutes_from_now"],
        ),
        ("Remind me to stretch in 30 minutes.", "Remind me about the oven in 15 minutes."),
    ),
    "translate_text": (
        "Translate text",
        _obj(
            {"text": S, "language": {"type": "string", "enum": ["fr", "de", "es", "ja"]}},
            ["text", "language"],
        ),
        ("Translate 'good morning' into German.", "How do you say 'thank you' in Japanese?"),
    ),
    "calculate": (
        "Evaluate an arithmetic expression",
        _obj({"expression": S}, ["expression"]),
        ("What is 17 times 23?", "Compute (4 + 5) * 12."),
    ),
    "get_stock_price": (
        "The latest price of a stock",
        _obj({"symbol": S}, ["symbol"]),
        ("How is Apple's stock doing?", "Price of NVDA right now?"),
    ),
    "add_todo": (
        "Add an item to the to-do list",
        _obj(
            {"title": S, "tags": {"type": "array", "items": S}, "due": _obj({"date": S}, ["date"])},
            ["title"],
        ),
        (
            "Add 'renew passport' to my to-do list, tag it urgent.",
            "Put 'call mum' on my list for Sunday.",
        ),
    ),
    "play_music": (
        "Play music",
        _obj(
            {"song": S, "artist": S, "volume": {"type": "integer", "minimum": 0, "maximum": 100}},
            ["song"],
        ),
        ("Play Bohemian Rhapsody by Queen.", "Put on some jazz, quietly."),
    ),
    "order_food": (
        "Order food for delivery",
        _obj(
            {
                "restaurant": S,
                "items": {
                    "type": "array",
                    "items": _obj(
                        {"name": S, "quantity": {"type": "integer", "minimum": 1}},
                        ["name", "quantity"],
                    ),
                    "minItems": 1,
                },
                "delivery": {"type": "boolean"},
            },
            ["restaurant", "items"],
        ),
        ("Order two margherita pizzas from Luigi's.", "Get me a burger and fries from Diner 5."),
    ),
    "update_settings": (
        "Change the app's settings",
        _obj(
            {
                "settings": _obj(
                    {
                        "theme": {"type": "string", "enum": ["dark", "light"]},
                        "notifications": {"type": "boolean"},
                        "language": S,
                    },
                    [],
                )
            },
            ["settings"],
        ),
        ("Switch to dark mode and turn notifications off.", "Set the language to French."),
    ),
    "git_commit": (
        "Commit staged changes",
        _obj(
            {"message": S, "files": {"type": "array", "items": S}, "amend": {"type": "boolean"}},
            ["message"],
        ),
        (
            "Commit the fix with the message 'fix login bug'.",
            "Commit README.md and setup.py as 'docs update'.",
        ),
    ),
    "lookup_user": (
        "Find a user by id",
        _obj({"user_id": {"type": "integer"}}, ["user_id"]),
        ("Who is user 4521?", "Look up the account with id 17."),
    ),
}


@dataclass(frozen=True)
class Case:
    """One forced call: the tools offered (chat completions' shape), the request, the
    tool it is about, and whether the choice names it (else ``required``)."""

    tools: tuple[str, ...]
    prompt: str
    target: str
    named: bool

    def chat_tools(self) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": n,
                    "description": CATALOGUE[n][0],
                    "parameters": CATALOGUE[n][1],
                },
            }
            for n in self.tools
        ]

    def chat_choice(self) -> Any:
        return {"type": "function", "function": {"name": self.target}} if self.named else "required"

    def schemas(self) -> dict[str, dict[str, Any]]:
        return {n: CATALOGUE[n][1] for n in self.tools}


def cases(count: int = 100, seed: int = 42) -> list[Case]:
    """``count`` cases: tool sets of 1 to 20 tools (every size), half of them named."""
    rng = random.Random(seed)
    names = list(CATALOGUE)
    found: list[Case] = []
    for index in range(count):
        size = index % len(names) + 1
        target = rng.choice(names)
        others = rng.sample([n for n in names if n != target], size - 1)
        tools = others[:]
        tools.insert(rng.randrange(size), target)
        prompt = rng.choice(CATALOGUE[target][2])
        found.append(Case(tuple(tools), prompt, target, named=index % 2 == 1))
    return found


__all__ = ["CATALOGUE", "Case", "cases"]
