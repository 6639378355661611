#!/usr/bin/env python3
"""Print the command README.md gives under one of its bold leads, so CI runs it as written.

    python3 .ci/readme_command.py "Build and run an example"
    python3 .ci/readme_command.py "Run the tests"

The command is the first ```sh block after the paragraph that starts with **<lead>**; exit
1 (with a message) when README.md has no such lead or no block after it.
"""
import pathlib
import sys

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def command(lead: str) -> str:
    lines = README.read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("**" + lead)), None)
    if start is None:
        raise SystemExit(f"readme_command: README.md has no paragraph starting with **{lead}")
    for i in range(start + 1, len(lines)):
        if lines[i].startswith("**"):
            break  # the next lead: this one has no block
        if lines[i].strip() == "```sh":
            body = []
            for line in lines[i + 1:]:
                if line.strip() == "```":
                    return "\n".join(body)
                body.append(line)
            break
    raise SystemExit(f"readme_command: no ```sh block under **{lead}** in README.md")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(command(sys.argv[1]))
