#!/usr/bin/env python3
"""Each part of src/ compiles with only the parts it includes.

A part names what it uses with `#include "part"` lines; amalgamate.py inlines each once, so
those lines put its dependencies before it in fiber_sched.hpp. This test holds them to the
truth: for every part the configuration at hand compiles (the backend, OS layer and idle
wait its cascades choose), it builds a translation unit of the system headers the header
includes (its own lines, every part left out) and config.hpp, then that part expanded as
amalgamate.py would, with the parts it includes and theirs, each once, and nothing else, and
compiles it (-fsyntax-only). A part that uses what a part it does not include declares fails
here, whatever the include order of fiber_sched.hpp happens to be.

What it cannot see: a part that includes more than it uses, and uses of config.hpp (it is
in every unit's prelude, for the macros the system includes depend on).

Usage: check.py --cxx g++ [--flag=-D...]... [--only-new LIST] [--record LIST] [--jobs N]
  --only-new/--record: skip the parts named in LIST (checked by an earlier configuration),
  then add the ones checked now, so that a cross compiler checks only its own backends.
"""

import argparse
import concurrent.futures
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import amalgamate  # noqa: E402

ENTRY = "fiber_sched.hpp"
BEGIN = re.compile(r"^// ---- begin src/(\S+) ----$", re.MULTILINE)
PRAGMA = re.compile(r'^#pragma fsched_part "([^"]+)"', re.MULTILINE)


def run(cmd, text):
    return subprocess.run(cmd, input=text, capture_output=True, text=True)


def active_parts(cxx, flags):
    """The parts this configuration compiles: the whole header with a #pragma marking the
    start of each part (pragmas survive preprocessing; the branches not taken vanish)."""
    marked = BEGIN.sub(lambda m: '#pragma fsched_part "%s"' % m.group(1), amalgamate.generate())
    result = run([cxx, "-E", "-x", "c++", "-std=c++17", *flags, "-"], "#define FIBER_SCHED_IMPLEMENTATION\n" + marked)
    if result.returncode != 0:
        raise SystemExit("check.py: preprocessing the header failed:\n" + result.stderr)
    return list(dict.fromkeys(PRAGMA.findall(result.stdout)))


def prelude():
    """fiber_sched.hpp's own lines (its system includes) with every part left out but
    config.hpp, which the system includes' conditions read; and where a public part and an
    implementation part go in it: where the header includes its first part of each kind,
    after the system headers that kind sees."""
    entry = (amalgamate.SRC / ENTRY).read_text(encoding="utf-8")
    kept, public_at, impl_at = [], None, None
    for line in entry.splitlines():
        match = amalgamate.INCLUDE.match(line)
        if match and match.group(1) != "config.hpp":
            if match.group(1).startswith("impl/"):
                impl_at = len(kept) if impl_at is None else impl_at
            else:
                public_at = len(kept) if public_at is None else public_at
            continue
        kept.append(line)
    if public_at is None or impl_at is None:
        raise SystemExit("check.py: no public or no implementation part included by src/fiber_sched.hpp")
    return kept, public_at, impl_at


def unit_for(part, head):
    kept, public_at, impl_at = head
    at = impl_at if part.startswith("impl/") else public_at
    text = "\n".join(kept[:at] + ['#include "%s"' % part] + kept[at:]) + "\n"
    return "#define FIBER_SCHED_IMPLEMENTATION\n" + amalgamate.expand(text, "<parts test of %s>" % part)


def compile_part(cxx, flags, part, head):
    unit = unit_for(part, head)
    result = run([cxx, "-fsyntax-only", "-x", "c++", "-std=c++17", "-Wall", "-Wextra", "-Wpedantic", "-Werror",
                  # A part alone leaves unused what the parts after it use (clang says so).
                  "-Wno-unused-function", "-Wno-unused-const-variable", "-Wno-unused-variable",
                  *flags, "-"], unit)
    return part, result.returncode, result.stderr


def first_error(stderr):
    lines = [l for l in stderr.splitlines() if "error" in l]
    return "\n    ".join(lines[:4]) if lines else stderr.strip()[:600]


def refused(text, files, expect):
    """amalgamate.py on a scratch src/ of `files` refuses `text` with a message holding `expect`."""
    with tempfile.TemporaryDirectory() as scratch:
        for name, body in files.items():
            pathlib.Path(scratch, name).write_text(body)
        saved, amalgamate.SRC = amalgamate.SRC, pathlib.Path(scratch)
        try:
            amalgamate.expand(text)
        except SystemExit as e:
            return expect in str(e)
        finally:
            amalgamate.SRC = saved
        return False


def map_mismatches():
    """Rows of src/README.md's map whose **uses** column is not the parts' #include lines."""
    readme = (amalgamate.SRC / "README.md").read_text(encoding="utf-8")
    short = lambda name: name.replace("impl/", "").rsplit(".", 1)[0]
    wrong, rows = [], 0
    for line in readme.splitlines():
        m = re.match(r"^\| ((?:`[^`]+`(?:, )?)+) \| .* \| ([^|]*) \|$", line)
        if not m:
            continue
        files = re.findall(r"`([^`]+)`", m.group(1))
        if files == [ENTRY]:
            continue
        rows += 1
        public = not any(f.endswith(".ipp") for f in files)
        included = []
        for f in files:
            path = amalgamate.SRC / (f if public else "impl/" + f)
            if not path.is_file():
                wrong.append("%s: no such part" % f)
                continue
            text = path.read_text(encoding="utf-8")
            included += [short(x) for x in re.findall(r'^#include "([^"]+)"$', text, re.M)]
        said = [u.strip() for u in m.group(2).split(",") if u.strip() not in ("", "-")]
        if set(said) != set(included):
            wrong.append("%s: the map says %s, the includes say %s"
                         % (", ".join(files), ", ".join(sorted(said)) or "-", ", ".join(sorted(set(included))) or "-"))
    listed = {f for line in readme.splitlines() for f in re.findall(r"^\| ((?:`[^`]+`(?:, )?)+) \|", line)
              for f in re.findall(r"`([^`]+)`", f)}
    for path in sorted(amalgamate.SRC.glob("*.hpp")) + sorted((amalgamate.SRC / "impl").glob("*.ipp")):
        if path.name not in listed:
            wrong.append("%s: a part the map does not list" % path.relative_to(amalgamate.SRC))
    return rows, wrong


def self_test(cxx, flags):
    failures = 0
    rows, wrong = map_mismatches()
    for line in wrong:
        print("FAIL src/README.md's map: %s" % line)
    failures += len(wrong)
    if rows < 20:
        print("FAIL src/README.md's map: only %d rows found" % rows)
        failures += 1
    # 1. A part that drops an include it needs fails the check (sched_find.ipp uses Worker).
    with tempfile.TemporaryDirectory() as scratch:
        copy = pathlib.Path(scratch, "src")
        subprocess.run(["cp", "-r", str(amalgamate.SRC), str(copy)], check=True)
        find = copy / "impl" / "sched_find.ipp"
        find.write_text(find.read_text().replace('#include "impl/sched_core.ipp"\n', ""))
        saved, amalgamate.SRC = amalgamate.SRC, copy
        try:
            _, rc, _ = compile_part(cxx, flags, "impl/sched_find.ipp", prelude())
            _, rc_kept, _ = compile_part(cxx, flags, "impl/sched_core.ipp", prelude())
        finally:
            amalgamate.SRC = saved
        if rc == 0 or rc_kept != 0:
            print("FAIL self-test: a part without the include it needs compiled (or its dependency did not)")
            failures += 1
    # 2. amalgamate.py's rules.
    cases = [
        ("a part first inlined in a branch, included again outside it",
         '#if defined(X)\n#include "b.hpp"\n#endif\n#include "b.hpp"\n', {"b.hpp": "int b;\n"},
         "inlined first inside a preprocessor branch"),
        ("the same in another branch of the same #if",
         '#if defined(X)\n#include "b.hpp"\n#else\n#include "b.hpp"\n#endif\n', {"b.hpp": "int b;\n"},
         "inlined first inside a preprocessor branch"),
        ("a comment after an #include \"part\"", '#include "b.hpp"  // b\n', {"b.hpp": "int b;\n"},
         "alone on its line"),
        ("an include cycle", '#include "b.hpp"\n', {"b.hpp": '#include "c.hpp"\n', "c.hpp": '#include "b.hpp"\n'},
         "include cycle"),
    ]
    for what, text, files, expect in cases:
        if not refused(text, files, expect):
            print("FAIL self-test: amalgamate.py accepted %s" % what)
            failures += 1
    accepted = [
        '#ifndef FIBER_SCHED_X_INCLUDED\n#include "b.hpp"\n#endif\n#if defined(I)\n#include "b.hpp"\n#endif\n',
        '#include "b.hpp"\n#if defined(X)\n#include "b.hpp"\n#endif\n',
        '#if defined(X)\n#include "b.hpp"\n#if defined(Y)\n#include "b.hpp"\n#endif\n#endif\n',
    ]
    for text in accepted:
        if refused(text, {"b.hpp": "int b;\n"}, ""):
            print("FAIL self-test: amalgamate.py refused %r" % text)
            failures += 1
    print("self-test: %d cases, %d wrong" % (1 + len(cases) + len(accepted), failures))
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cxx", default="g++")
    parser.add_argument("--flag", action="append", default=[], help="a compiler flag (repeatable)")
    parser.add_argument("--only-new", metavar="LIST", help="skip the parts listed in this file")
    parser.add_argument("--record", metavar="LIST", help="append the parts checked to this file")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--self-test", action="store_true",
                        help="show that the check and amalgamate.py's rules catch what they must")
    args = parser.parse_args()
    if args.self_test:
        return self_test(args.cxx, args.flag)
    parts = [p for p in active_parts(args.cxx, args.flag) if p != ENTRY]
    if not parts:
        raise SystemExit("check.py: no part found in the header: the breadcrumbs changed?")
    done = set()
    if args.only_new and os.path.exists(args.only_new):
        done = set(pathlib.Path(args.only_new).read_text().split())
    todo = [p for p in parts if p not in done]
    head = prelude()
    failures = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for part, rc, stderr in pool.map(lambda p: compile_part(args.cxx, args.flag, p, head), todo):
            if rc != 0:
                failures += 1
                print("FAIL src/%s does not compile with only what it includes:\n    %s" % (part, first_error(stderr)))
            else:
                print("ok   src/%s" % part)
    if args.record:
        with open(args.record, "a") as f:
            f.write("\n".join(todo) + "\n")
    print("%s: %d of %d parts checked here (%d by an earlier configuration), %d failed"
          % (" ".join([args.cxx] + args.flag), len(todo), len(parts), len(parts) - len(todo), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
