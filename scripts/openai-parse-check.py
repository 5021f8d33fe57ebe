#!/usr/bin/env python3
"""Structured output through the OpenAI Python client, as an app uses it.

Sends `chat.completions.parse` with a pydantic model (nested model, enum,
list, bounded numbers and strings) to a gerbil server three times, greedy
and sampled, and prints `parsed N answers` when every answer came back as
an instance of the model. Used by crates/cli/tests/cli/structured.rs; run it
by hand against any server:

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
    return 0


if __name__ == "__main__":
    sys.exit(main())
