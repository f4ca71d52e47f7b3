#!/usr/bin/env python3
"""The include rules of culprit's folders (docs/architecture.md, "Layers"), checked from the source.

Every library folder has a README.md with two machine-readable lines:
  May include: common, reduce, harness/config     the folders whose headers its files may include
  Public headers: culprit/data.h, culprit/model.h  the harness/include headers it implements (harness folders)
and a harness folder's README says "libtorch: yes" or "libtorch: no".

Checked, for every .h/.cpp/.cu under a library folder (its tests/ too):
  - a quoted include resolves to a folder's own file, another folder's header ("detect/vote.h"), or a
    public header ("culprit/x.h"); the owner must be the folder itself or named on its May include line;
  - no include reaches into another library's src/ ("../src/", "bisect/src/...");
  - a folder without libtorch includes no <torch/...>, <ATen/...>, <c10/...> header;
  - with a build's compile_commands.json (argument BUILD_DIR): no source is compiled into two targets.
Prints one line per violation and exits 1 when there is any; 0 and "layers: ok" otherwise.
  scripts/check-layers.py [BUILD_DIR]
"""
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARIES = ["common", "reduce", "checkpoint", "ledger", "harness/config", "harness/data", "harness/detect", "harness/model",
             "harness/optim", "harness/faults", "harness/screen", "harness/export",
             "harness/train", "replay", "bisect", "cli", "python"]
# Where each library keeps its public headers (include/culprit/).
PUBLIC_DIRS = {"common": "common/include", "reduce": "reduce/include", "checkpoint": "checkpoint/include",
               "ledger": "ledger/include",
               "replay": "replay/include", "bisect": "bisect/include", "cli": "cli/include"}
TORCH_HEADER = re.compile(r'#\s*include\s*<(torch|ATen|c10)/')
QUOTED = re.compile(r'#\s*include\s*"([^"]+)"')


def readme_line(folder, key):
    path = os.path.join(ROOT, folder, "README.md")
    if not os.path.exists(path):
        return None
    for line in open(path, encoding="utf-8"):
        line = line.strip().strip("`")
        if line.lower().startswith(key.lower() + ":"):
            return line.split(":", 1)[1].strip()
    return None


def names(value):
    return [v.strip().strip("`") for v in (value or "").split(",") if v.strip() and v.strip() != "nothing"]


def main():
    errors = []
    owner_of_public = {}  # "culprit/x.h" -> library
    for lib, d in PUBLIC_DIRS.items():
        for f in os.listdir(os.path.join(ROOT, d, "culprit")):
            owner_of_public["culprit/" + f] = lib
    may, torch = {}, {}
    for lib in LIBRARIES:
        line = readme_line(lib, "May include")
        if line is None:
            errors.append("%s/README.md: no 'May include:' line (what the folder may include)" % lib)
        may[lib] = set(names(line)) | {lib}
        if lib.startswith("harness/"):
            for h in names(readme_line(lib, "Public headers")):
                if not os.path.exists(os.path.join(ROOT, "harness/include", h)):
                    errors.append("%s/README.md: public header %s is not in harness/include" % (lib, h))
                owner_of_public[h] = lib
            t = (readme_line(lib, "libtorch") or "").lower()
            if t not in ("yes", "no"):
                errors.append("%s/README.md: no 'libtorch: yes|no' line" % lib)
            torch[lib] = t == "yes"
    for f in os.listdir(os.path.join(ROOT, "harness/include/culprit")):
        if "culprit/" + f not in owner_of_public:
            errors.append("harness/include/culprit/%s: no harness folder's README names it under 'Public headers'" % f)

    def owner_of(lib, src, inc):
        """The library a quoted include of file src (in lib) resolves to, or None."""
        here = os.path.join(os.path.dirname(src), inc)
        if os.path.exists(here):
            rel = os.path.relpath(os.path.normpath(here), ROOT)
            for other in sorted(LIBRARIES, key=len, reverse=True):
                if rel.startswith(other + "/"):
                    return other
            return "tests/support" if rel.startswith("tests/support/") else rel
        if inc in owner_of_public:
            return owner_of_public[inc]
        first = inc.split("/")[0]
        if os.path.isdir(os.path.join(ROOT, "harness", first)) and os.path.exists(os.path.join(ROOT, "harness", inc)):
            return "harness/" + first
        for d in ("src", "tests"):  # a library's own private dirs on its include path
            if os.path.exists(os.path.join(ROOT, lib, d, inc)):
                return lib
        if os.path.exists(os.path.join(ROOT, "tests/support", inc)):
            return "tests/support"
        return None

    for lib in LIBRARIES:
        base = os.path.join(ROOT, lib)
        for dirpath, dirnames, files in os.walk(base):
            rel_dir = os.path.relpath(dirpath, ROOT)
            # A harness folder's walk must not enter another folder (harness/ has none nested).
            dirnames[:] = [d for d in dirnames if os.path.join(rel_dir, d) not in LIBRARIES]
            for name in files:
                if not name.endswith((".h", ".cpp", ".cu")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, ROOT)
                in_tests = "/tests/" in "/" + rel
                for n, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
                    if lib in torch and not torch[lib] and TORCH_HEADER.search(line):
                        errors.append("%s:%d: %s is a folder without libtorch (its README), but includes %s"
                                      % (rel, n, lib, line.strip()))
                    m = QUOTED.search(line)
                    if not m:
                        continue
                    inc = m.group(1)
                    if "src/" in inc and not inc.startswith(lib + "/src/"):
                        errors.append("%s:%d: includes another library's src/ (%s)" % (rel, n, inc))
                        continue
                    who = owner_of(lib, path, inc)
                    if who is None:
                        errors.append("%s:%d: include \"%s\" resolves to no folder" % (rel, n, inc))
                    elif who == "tests/support" and in_tests:
                        continue
                    elif who.startswith("harness/") and "harness" in may[lib] and inc.startswith("culprit/"):
                        continue  # a public harness header, for a folder above the harness
                    elif who not in may[lib]:
                        errors.append("%s:%d: %s includes %s (of %s), not on its README's May include line"
                                      % (rel, n, lib, inc, who))
                    elif who in torch and torch[who] and lib in torch and not torch[lib]:
                        errors.append("%s:%d: %s (no libtorch) includes %s of the libtorch folder %s"
                                      % (rel, n, lib, inc, who))

    if len(sys.argv) > 1:
        db = os.path.join(sys.argv[1], "compile_commands.json")
        seen = {}
        for entry in json.load(open(db)):
            src = os.path.relpath(os.path.normpath(os.path.join(entry["directory"], entry["file"])), ROOT)
            out = entry.get("output") or entry["command"].split(" -o ")[1].split()[0]
            target = out.split("CMakeFiles/")[1].split(".dir/")[0] if "CMakeFiles/" in out else out
            if src.startswith("build") or src.endswith("torch_pch.cpp") or "cmake_pch" in src:
                continue
            seen.setdefault(src, set()).add(target)
        for src, targets in sorted(seen.items()):
            if len(targets) > 1:
                errors.append("%s: compiled into %d targets (%s): link the library that owns it instead"
                              % (src, len(targets), ", ".join(sorted(targets))))

    for e in errors:
        print("layers: " + e)
    if errors:
        print("layers: %d violation(s); the rules: docs/architecture.md, \"Layers\"" % len(errors))
        return 1
    print("layers: ok (%d folders)" % len(LIBRARIES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
