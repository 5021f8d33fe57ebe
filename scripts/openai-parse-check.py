#!/usr/bin/env python3
"""Structured output and tool calls through the OpenAI Python client, as an app uses them.

Sends `chat.completions.parse` with a pydantic model (nested model, enum,
list, bounded numbers and strings) to a gerbil server three times, greedy
and sampled, and prints `parsed N answers` when every answer came back as
an instance of the model; then a strict tool made from a pydantic model
(`openai.pydantic_function_tool`), whole through `parse` and streamed through
`chat.completions.stream`, and prints `parsed tool calls` when both came back
with arguments parsed into the model. Used by
crates/cli/tests/cli/structured.rs; run it by hand against any server:

    python3 scripts/openai-parse-check.py --base-url http://127.0.0.1:8080/v1
"""

import argparse
import enum
import sys

import openai
import pydantic


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Point(pydantic.BaseModel):
    x: int = pydantic.Field(ge=0, le=9)
    y: int = pydantic.Field(ge=0, le=9)


class Answer(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=10)
    color: Color
    points: list[Point] = pydantic.Field(max_length=2)
    ok: bool


class GetWeather(pydantic.BaseModel):
    """The weather in a city."""

    city: str = pydantic.Field(max_length=12)
    unit: Color


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0)
    completions = client.chat.completions
    parse = getattr(completions, "parse", None) or client.beta.chat.completions.parse
    for i, temperature in enumerate([0.0, 1.0, 1.0]):
        completion = parse(
            model="m",
            messages=[{"role": "user", "content": f"Describe thing {i} as JSON."}],
            response_format=Answer,
            temperature=temperature,
            seed=i,
            max_tokens=400,
        )
        message = completion.choices[0].message
        if not isinstance(message.parsed, Answer):
            print(f"answer {i} did not parse: {message.content!r}", file=sys.stderr)
            return 1
    print("parsed 3 answers")

    tool = openai.pydantic_function_tool(GetWeather)
    request = dict(
        model="m",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[tool],
        tool_choice="required",
        temperature=0,
        max_tokens=300,
    )
    whole = parse(**request).choices[0]
    streamed = None
    with completions.stream(**request) as stream:
        streamed = stream.get_final_completion().choices[0]
    for choice in (whole, streamed):
        calls = choice.message.tool_calls or []
        if choice.finish_reason != "tool_calls" or not calls:
            print(f"no tool call: {choice!r}", file=sys.stderr)
            return 1
        if not isinstance(calls[0].function.parsed_arguments, GetWeather):
            print(f"arguments did not parse: {calls[0]!r}", file=sys.stderr)
            return 1
    if whole.message.tool_calls[0].function.arguments != streamed.message.tool_calls[0].function.arguments:
        print("the streamed call differs from the whole one", file=sys.stderr)
        return 1
    print("parsed tool calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
