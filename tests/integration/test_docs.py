"""The docs say what the binary does: docs/cli.md shows each command's --help as built, and every
command the binary lists has its section there. The tests' exit codes are the binary's
(common/include/culprit/exit_codes.h)."""
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import CULPRIT, EXIT_CODES, VERDICTS, exit_codes_h, run  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


class Docs(unittest.TestCase):
    def test_cli_page_shows_the_help_as_built(self):
        res = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "cli-help.py"), "--check", CULPRIT],
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


class ExitCodes(unittest.TestCase):
    def test_the_tests_table_is_the_headers(self):
        header = exit_codes_h()
        self.assertGreaterEqual(len(header), 18, header)  # the enum was read, not a part of it
        self.assertEqual(EXIT_CODES, header)
        # Each verdict exits the code named after it ("none" 0, a damaged record kExitDamaged), and
        # every code from 20 on is a verdict's.
        for verdict, code in VERDICTS.items():
            name = {"none": "EXIT_OK", "damaged-record": "EXIT_DAMAGED"}.get(
                verdict, "EXIT_" + verdict.upper().replace("-", "_"))
            self.assertEqual(header[name], code, verdict)
        self.assertEqual(sorted(c for c in header.values() if c >= 20), sorted(c for c in VERDICTS.values() if c >= 20))
        # Negative control: a header whose number changed no longer matches.
        with open(os.path.join(ROOT, "common", "include", "culprit", "exit_codes.h")) as f:
            text = f.read()
        self.assertIn("kExitIo = 6,", text)
        with tempfile.NamedTemporaryFile("w", suffix=".h") as f:
            f.write(text.replace("kExitIo = 6,", "kExitIo = 7,"))
            f.flush()
            self.assertNotEqual(exit_codes_h(f.name), EXIT_CODES)


if __name__ == "__main__":
    unittest.main(verbosity=2)
