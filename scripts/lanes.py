#!/usr/bin/env python3
"""Runs the workspace's test executables in lanes, as `cargo test` would run
them one after another, but using both cores:

  1. the crash suite (it counts sweeps, not seconds, so load does not change
     its outcome) runs alongside every other executable but the local cloud's;
  2. then the local cloud's executable runs alone: its stories have timed goals.

Usage: lanes.py ARTIFACTS [ARGS...]
  ARTIFACTS is the JSON cargo printed for `cargo test --no-run
  --message-format=json-render-diagnostics`; ARGS go to every executable.
Prints each executable's output as cargo test does ("Running ..." then its
own lines), and a closing `suite: N passed, N failed` line; exits non-zero
when any executable failed.
"""
import json
import os
import re
import subprocess
import sys
import threading

ALONGSIDE = {"crash"}
ALONE = {"cloud"}
RESULT = re.compile(r"^test result: \w+\. (\d+) passed; (\d+) failed")


def executables(path):
    """(name, package dir, source, executable) of every test harness built."""
    found = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                m = json.loads(line)
            except json.JSONDecodeError:
                continue
            if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
                continue
            target = m["target"]
            if "bench" in target["kind"]:
                continue  # built so clippy sees them; criterion runs them, not the suite
            package_dir = os.path.dirname(m["manifest_path"])
            source = os.path.relpath(target["src_path"], package_dir)
            found.append((target["name"], package_dir, source, m["executable"]))
    if not found:
        sys.exit(f"lanes: {path} names no test executable")
    return found


def run(exe, args, out):
    """Runs one executable, writing its output to `out` (a list of lines, or
    None to print as it goes); returns (passed, failed, exit code)."""
    name, package_dir, source, path = exe
    kind = "unittests " if source.startswith("src/") else ""
    header = f"     Running {kind}{source} ({os.path.relpath(path)})"
    emit = print if out is None else out.append
    emit(header)
    proc = subprocess.Popen(
        [path, *args], cwd=package_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    passed = failed = 0
    for line in proc.stdout:
        line = line.rstrip("\n")
        emit(line)
        if m := RESULT.match(line):
            passed, failed = int(m.group(1)), int(m.group(2))
    code = proc.wait()
    return passed, failed, code


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__.strip())
    args = sys.argv[2:]
    all_exes = executables(sys.argv[1])
    alongside = [e for e in all_exes if e[0] in ALONGSIDE]
    alone = [e for e in all_exes if e[0] in ALONE]
    rest = [e for e in all_exes if e[0] not in ALONGSIDE | ALONE]
    results = []
    buffered = []

    def background():
        for e in alongside:
            lines = []
            results.append((e, run(e, args, lines)))
            buffered.append(lines)

    side = threading.Thread(target=background)
    side.start()
    for e in rest:
        results.append((e, run(e, args, None)))
        sys.stdout.flush()
    side.join()
    for lines in buffered:
        print("\n".join(lines))
    for e in alone:
        results.append((e, run(e, args, None)))
    passed = sum(r[0] for _, r in results)
    failed = sum(r[1] for _, r in results)
    broken = [e[0] for e, r in results if r[2] != 0]
    if broken:
        print(f"lanes: failed: {', '.join(broken)}", file=sys.stderr)
        failed = max(failed, len(broken))
    print(f"suite: {passed} passed, {failed} failed")
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
