"""The docs say what the binary does: docs/cli.md shows each command's --help as built, and every
command the binary lists has its section there."""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import CULPRIT, run  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


class Docs(unittest.TestCase):
    def test_cli_page_shows_the_help_as_built(self):
        res = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "scripts", "cli-help.py"), "--check", CULPRIT],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)

    def test_every_command_has_its_help_on_the_page(self):
        usage = run(["--help"])
        self.assertEqual(usage.code, 0, usage.err)
        commands = []
        for line in usage.out.split("commands:\n", 1)[1].splitlines():
            if not line.startswith("  "):
                break
            commands.append(line.split()[0])
        self.assertGreaterEqual(len(commands), 10, usage.out)
        page = open(os.path.join(ROOT, "docs", "cli.md")).read()
        for c in commands:
            self.assertIn("<!-- help: %s -->" % c, page, c)


if __name__ == "__main__":
    unittest.main(verbosity=2)
