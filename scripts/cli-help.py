#!/usr/bin/env python3
"""Writes each command's --help, as built, into docs/cli.md between its markers
    <!-- help: COMMAND -->
    ```
    ...
    ```
    <!-- /help -->
so the page shows what `culprit COMMAND --help` prints. --check: exit 1 (naming the commands) when the
page is not current; tests/integration/test_docs.py runs that.
    scripts/cli-help.py [--check] [CULPRIT_BINARY]"""
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PAGE = os.path.join(ROOT, "docs", "cli.md")
MARK = re.compile(r"(<!-- help: (\S+) -->\n)(.*?)(<!-- /help -->)", re.S)


def help_of(culprit, command):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = subprocess.run([culprit, command, "--help"], capture_output=True, text=True, env=env, timeout=60)
    if out.returncode != 0:
        raise SystemExit("culprit %s --help failed: %s" % (command, out.stderr))
    return out.stdout.rstrip("\n")


def main():
    args = [a for a in sys.argv[1:] if a != "--check"]
    check = "--check" in sys.argv[1:]
    culprit = args[0] if args else os.path.join(ROOT, "build", "culprit")
    page = open(PAGE).read()
    stale = []

    def fill(m):
        block = "```\n" + help_of(culprit, m.group(2)) + "\n```\n"
        if m.group(3) != block:
            stale.append(m.group(2))
        return m.group(1) + block + m.group(4)

    new = MARK.sub(fill, page)
    if check:
        if stale:
            print("docs/cli.md is not current for: %s (run scripts/cli-help.py)" % ", ".join(stale))
            sys.exit(1)
        return
    with open(PAGE, "w") as f:
        f.write(new)


if __name__ == "__main__":
    main()
