#!/usr/bin/env python3
"""What MSVC's cl.exe sees of fiber_sched.hpp, checked for GNU-only constructs.

cl.exe cannot run here, so this runs the GNU preprocessor in cl.exe's place: none of the
GNU compiler's predefined macros (-undef, and its builtin function-like macros undefined),
cl.exe's own (_MSC_VER, _WIN32, _WIN64, _M_X64 or _M_ARM64, ...), and the standard and
Windows headers cl.exe would find stubbed by empty files (a header outside that list, such as
<pthread.h> or <cxxabi.h>, is not found, as on MSVC). Each configuration preprocesses a
translation unit that includes the header, with and without FIBER_SCHED_IMPLEMENTATION, and
the text that comes out is searched for what cl.exe rejects: __attribute__ and other
__keyword__ spellings, __builtin_*, __sync_* and __atomic_* builtins, inline assembly,
__thread, __int128, typeof, statement expressions, case ranges, the ?: shorthand,
GCC or clang pragmas, and the POSIX calls Windows lacks.

What this cannot see: anything the compiler proper rejects (templates, overloads, MSVC's
own bugs and warnings). That needs cl.exe itself.

Usage: check.py --cxx g++ --include-dir DIR   (DIR holds fiber_sched.hpp)
       check.py --self-test                    (the search finds what it must, and only that)
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

# Headers cl.exe finds in its standard library, its C runtime and the Windows SDK; each is
# stubbed by an empty file.
MSVC_HEADERS = """
algorithm any array atomic bitset cassert cctype cerrno cfloat charconv chrono cinttypes
climits clocale cmath codecvt complex condition_variable csetjmp csignal cstdarg cstddef
cstdint cstdio cstdlib cstring ctime cwchar cwctype deque exception execution filesystem
forward_list fstream functional future initializer_list iomanip ios iosfwd iostream istream
iterator limits list locale map memory memory_resource mutex new numeric optional ostream
queue random ratio regex scoped_allocator set shared_mutex sstream stack stdexcept streambuf
string string_view system_error thread tuple type_traits typeindex typeinfo unordered_map
unordered_set utility valarray variant vector
assert.h errno.h fcntl.h io.h limits.h malloc.h process.h signal.h stddef.h stdint.h stdio.h
stdlib.h string.h time.h
windows.h intrin.h xmmintrin.h emmintrin.h immintrin.h
""".split()

COMMON_MACROS = {
    "_MSC_VER": "1938",
    "_MSC_FULL_VER": "193833135",
    "_MSC_BUILD": "0",
    "_MSVC_LANG": "201703L",  # /std:c++17
    "_WIN32": "1",
    "_WIN64": "1",
    "_MT": "1",
    "_CPPRTTI": "1",
    "_CPPUNWIND": "1",  # /EHsc
    "_NATIVE_WCHAR_T_DEFINED": "1",
    "_WCHAR_T_DEFINED": "1",
    "_INTEGRAL_MAX_BITS": "64",
    "__STDC_HOSTED__": "1",
}
TARGETS = {
    "x64": {"_M_X64": "100", "_M_AMD64": "100"},
    "arm64": {"_M_ARM64": "1"},
}
# Predefined by the GNU preprocessor even with -undef; undefined or redefined below. Its
# builtin function-like macros that cl.exe lacks go too (it has __has_include and
# __has_cpp_attribute).
GNU_BUILTIN_MACROS = ["__has_builtin", "__has_attribute", "__has_feature", "__has_extension",
                      "__has_warning", "__is_identifier", "__has_declspec_attribute",
                      "__STDC__", "__STDC_UTF_16__", "__STDC_UTF_32__", "_GNU_SOURCE",
                      "__GCC_HAVE_DWARF2_CFI_ASM", "__STDCPP_DEFAULT_NEW_ALIGNMENT__",
                      "__STDCPP_THREADS__"]
# What may stay predefined: the macros set here and the standard's.
ALLOWED_PREDEFINED = {"__cplusplus", "__STDC_HOSTED__"}

# (pattern, what it is). Searched in the preprocessed text with string and character
# literals blanked out; comments are gone already.
FORBIDDEN = [
    (r"\b__(?!func__)[a-z][a-z0-9_]*__\b", "a GNU __keyword__ (__attribute__, __asm__, __typeof__, ...)"),
    (r"\b__attribute\b", "__attribute"),
    (r"\b__builtin_\w+", "a GNU builtin"),
    (r"\b__(?:sync|atomic)_\w+", "a GNU atomic builtin"),
    (r"\b__cxa_\w+", "the Itanium C++ ABI (MSVC's runtime has none)"),
    (r"\b(?:asm|__asm)\b", "inline assembly (cl.exe has none on x64 and arm64)"),
    (r"\b__thread\b", "__thread (thread_local is standard)"),
    (r"\b__int128\b", "__int128"),
    (r"\btypeof\b", "typeof"),
    (r"\b__PRETTY_FUNCTION__\b", "__PRETTY_FUNCTION__"),
    (r"\bcase\b[^:;{}]*\.\.\.", "a case range"),
    (r"\?\s*:(?!:)", "the ?: shorthand"),
    (r"^\s*#\s*pragma\s+(?:GCC|clang)\b", "a GCC or clang pragma"),
    (r"\b(?:pthread_\w+|ucontext_t|swapcontext|mmap|munmap|mprotect|sigaltstack|sigaction|"
     r"epoll_\w+|eventfd)\b", "a POSIX call Windows lacks"),
]


def blank_literals(text):
    """Replaces the contents of string and character literals (raw strings too) by spaces,
    keeping line breaks, so that a rule's message never counts as code."""
    out = []
    i, n = 0, len(text)
    raw = re.compile(r'(?:u8|u|U|L)?R"([^ ()\\\t\n]{0,16})\(')
    while i < n:
        c = text[i]
        m = raw.match(text, i) if c in 'uULR' and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == '_')) else None
        if m:
            end = text.find(")" + m.group(1) + '"', m.end())
            end = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + "".join("\n" if ch == "\n" else " " for ch in text[i + 2:end]))
            i = end
            continue
        if c in "\"'":
            # A ' between digits is a digit separator (1'000), not a literal.
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                out.append(c)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + c)
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def statement_expressions(text):
    """Offsets of GNU statement expressions: `({ ...; })`. A braced list in a call, f({1, 2}),
    holds no `;` at its own depth; a lambda's body starts after `]` or `)`, not `(`."""
    found = []
    for m in re.finditer(r"\(\s*\{", text):
        depth, j, has_semicolon = 0, m.end() - 1, False
        while j < len(text):
            ch = text[j]
            if ch in "{([":
                depth += 1
            elif ch in "})]":
                depth -= 1
                if depth == 0:
                    break
            elif ch == ";" and depth == 1:
                has_semicolon = True
            j += 1
        rest = text[j + 1:j + 64].lstrip()
        if has_semicolon and rest.startswith(")"):
            found.append(m.start())
    return found


def findings(text):
    """[(offset, what, excerpt)] for each GNU-only construct in preprocessed `text`."""
    code = blank_literals(text)
    result = []
    for pattern, what in FORBIDDEN:
        for m in re.finditer(pattern, code, re.MULTILINE):
            result.append((m.start(), what, m.group(0)))
    for offset in statement_expressions(code):
        result.append((offset, "a statement expression", code[offset:offset + 24]))
    return sorted(result)


def where(text, offset):
    """The source file and line of `offset` in preprocessor output with line markers."""
    file, line = "?", 0
    for row in text[:offset].split("\n"):
        m = re.match(r'#\s*(\d+)\s+"([^"]*)"', row)
        if m:
            file, line = m.group(2), int(m.group(1))
        else:
            line += 1
    return "%s:%d" % (file, line - 1)


def preprocess(cxx, include_dir, stub_dir, macros, source, extra=()):
    args = [cxx, "-E", *extra, "-undef", "-nostdinc", "-w", "-x", "c++", "-std=c++17",
            "-isystem", stub_dir, "-I", os.path.abspath(include_dir)]
    args += ["-U" + name for name in GNU_BUILTIN_MACROS]
    args += ["-U__cplusplus", "-D__cplusplus=199711L"]  # cl.exe without /Zc:__cplusplus
    args += ["-D%s=%s" % item for item in sorted(macros.items())]
    # -U is not enough for some (clang sets __GCC_HAVE_DWARF2_CFI_ASM after the command line).
    undo = "".join("#undef %s\n" % name for name in GNU_BUILTIN_MACROS)
    # Run in the stub directory: a quoted #include in standard input is looked up in the
    # working directory first, which must not hold another fiber_sched.hpp.
    return subprocess.run(args + ["-"], input=undo + source, capture_output=True, text=True, cwd=stub_dir)


def leftover_macros(cxx, stub_dir, macros):
    """Predefined macros the GNU preprocessor still sets beyond cl.exe's: must be none."""
    run = preprocess(cxx, stub_dir, stub_dir, macros, "", ["-dM"])
    names = set(re.findall(r"^#define\s+(\w+)", run.stdout, re.MULTILINE))
    return sorted(names - set(macros) - ALLOWED_PREDEFINED)


def check(cxx, include_dir):
    failures = 0
    with tempfile.TemporaryDirectory() as stub_dir:
        for name in MSVC_HEADERS:
            open(os.path.join(stub_dir, name), "w").close()
        for target, target_macros in sorted(TARGETS.items()):
            macros = dict(COMMON_MACROS, **target_macros)
            extra = leftover_macros(cxx, stub_dir, macros)
            if extra:
                print("FAIL %s: %s still predefines %s; cl.exe would not" % (target, cxx, " ".join(extra)))
                failures += 1
                continue
            for part, prelude in (("declarations", ""),
                                  ("implementation", "#define FIBER_SCHED_IMPLEMENTATION\n"),
                                  ("implementation, fault injection",
                                   "#define FIBER_SCHED_IMPLEMENTATION\n#define FIBER_SCHED_FAULT_INJECTION\n")):
                run = preprocess(cxx, include_dir, stub_dir, macros, prelude + '#include "fiber_sched.hpp"\n')
                label = "%s, %s" % (target, part)
                if run.returncode != 0:
                    print("FAIL %s: the preprocessor refused it (a header cl.exe lacks, or an #error):\n%s"
                          % (label, run.stderr.strip()))
                    failures += 1
                    continue
                found = findings(run.stdout)
                # The cascade gives cl.exe the Win32 fiber backend (it has no GNU inline assembly).
                if "implementation" in part and 'backend_name = "winfiber"' not in run.stdout:
                    print("FAIL %s: the backend cascade did not choose winfiber" % label)
                    failures += 1
                for offset, what, excerpt in found:
                    print("FAIL %s: %s: %s: %r" % (label, where(run.stdout, offset), what, excerpt))
                failures += len(found)
                lines = run.stdout.count("\n")
                if not found:
                    print("ok   %s: %d lines as cl.exe sees them, no GNU-only construct" % (label, lines))
    return failures


# (snippet, expected number of findings): the search finds each construct and passes the
# standard code that resembles one.
SELF_TEST = [
    ('static void f() __attribute__((noinline));', 1),
    ('if (__builtin_expect(x, 0)) {}', 1),
    ('__asm__ volatile("" ::: "memory");', 1),
    ('asm("nop");', 1),
    ('static __thread int x;', 1),
    ('__int128 wide;', 1),
    ('typeof(x) y = x;', 1),
    ('int y = ({ int z = 1; z; });', 1),
    ('switch (x) { case 1 ... 3: break; }', 1),
    ('int y = x ?: 2;', 1),
    ('#pragma GCC diagnostic push', 1),
    ('__sync_synchronize();', 1),
    ('pthread_self();', 1),
    ('abi::__cxa_get_globals();', 1),
    ('void f() { puts(__PRETTY_FUNCTION__); }', 1),
    ('__extension__ int x;', 1),
    # Standard code that looks alike.
    ('f({1, 2}); g({});', 0),
    ('int y = c ? ::ns::v : 2;', 0),
    ('auto l = [](int) { return 1; }; h([] { x(); });', 0),
    ('const char* m = "__attribute__ and asm ?: in a message";', 0),
    ('const char* r = R"x(__builtin_trap() "quoted")x";', 0),
    ("char c = ':'; int big = 1'000'000;", 0),
    ('template <class... Ts> void v(Ts... ts) { w(ts...); }', 0),
    ('static const char* n = __func__; __declspec(noinline) void g(); __forceinline void h();', 0),
    ('int y = x ? 1 : 2;', 0),
]


def self_test():
    failures = 0
    for snippet, expected in SELF_TEST:
        got = findings(snippet)
        if len(got) != expected:
            print("FAIL self-test: %r: %d findings, expected %d: %r" % (snippet, len(got), expected, got))
            failures += 1
    print("self-test: %d snippets, %d wrong" % (len(SELF_TEST), failures))
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cxx", default="g++", help="a GNU-compatible preprocessor driver (g++ or clang++)")
    parser.add_argument("--include-dir", help="the directory holding fiber_sched.hpp")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return 1 if self_test() else 0
    if not args.include_dir:
        parser.error("--include-dir is required")
    failures = self_test() + check(args.cxx, args.include_dir)
    print("cl.exe view: %s" % ("%d problems" % failures if failures else "clean"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
