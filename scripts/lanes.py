#!/usr/bin/env python3
"""Runs the workspace's test executables in lanes, as `cargo test` would run
them one after another, but side by side. The executables mostly wait (on
moto, on processes, on sweeps they count), so three lanes keep the two cores
busier than two would:

  - one lane starts with the crash suite and one with the local cloud's
    executable, the two longest; neither has a goal a loaded machine can
    miss (crash phases count sweeps; the local cloud runs its clouds one at
    a time and counts sweeps and observations within generous limits);
  - every lane then takes work from one queue: the other executables,
    heaviest first, the stack executable split into shards (by test name,
    each its own process with its own moto server), and last a command
    given with --also (the template checks, which no test needs).

Usage: lanes.py [--also COMMAND] ARTIFACTS [ARGS...]
  ARTIFACTS is the JSON cargo printed for the build with
  --message-format=json-render-diagnostics; ARGS go to every executable
  (an executable is not split when they name tests). COMMAND is run by bash;
  its output is printed after it ends, and its failure fails the suite.
Prints each executable's output as cargo test does ("Running ..." then its
own lines; a shard's source carries `[k/n]`): the queue-only lane's as it
goes, the others' when they are done. A closing `suite: N passed, N failed`
line; exits non-zero when any executable failed.
"""
import json
import os
import queue
import re
import subprocess
import sys
import threading

# What a lane starts with, one lane each; one more lane starts on the queue.
STARTS = ["crash", "cloud"]
# Executables split into this many shards, and the queue's order (heaviest first).
SHARDS = {"stack": 3}
WEIGHT = {"stack": 3, "aws": 2, "kube": 1}
# libtest options that take a value (anything else not starting with '-' names tests).
TAKES_VALUE = {"--skip", "--test-threads", "--format", "--color", "--logfile", "-Z"}
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


def names_tests(args):
    """Whether the arguments include a test name filter."""
    value_next = False
    for a in args:
        if value_next:
            value_next = False
        elif a in TAKES_VALUE:
            value_next = True
        elif not a.startswith("-") or a == "--exact":
            return True
    return False


def shards(exe, args):
    """The runs of one executable: (exe, label, extra args). Split into
    SHARDS[name] runs of whole test names (`--exact`) unless ARGS name tests."""
    n = SHARDS.get(exe[0], 1)
    if n == 1 or names_tests(args):
        return [(exe, "", [])]
    listed = subprocess.run(
        [exe[3], "--list", "--format", "terse"], cwd=exe[1], capture_output=True, text=True, check=True
    ).stdout
    tests = sorted(line[: -len(": test")] for line in listed.splitlines() if line.endswith(": test"))
    # Dealt out in turn, so one module's tests (often alike in cost) spread over the shards.
    parts = [part for part in (tests[k::n] for k in range(n)) if part]
    if len(parts) < 2:
        return [(exe, "", [])]
    return [(exe, f"[{k + 1}/{len(parts)}]", ["--exact", *part]) for k, part in enumerate(parts)]


def run(exe, args, out, label="", extra=()):
    """Runs one executable (or one shard: `label`, with `extra` arguments),
    writing its output to `out` (a list of lines, or None to print as it
    goes); returns (passed, failed, exit code)."""
    name, package_dir, source, path = exe
    kind = "unittests " if source.startswith("src/") else ""
    header = f"     Running {kind}{source}{label} ({os.path.relpath(path)})"
    emit = print if out is None else out.append
    emit(header)
    proc = subprocess.Popen(
        [path, *extra, *args],
        cwd=package_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    passed = failed = 0
    for line in proc.stdout:
        line = line.rstrip("\n")
        emit(line)
        if m := RESULT.match(line):
            passed, failed = int(m.group(1)), int(m.group(2))
    code = proc.wait()
    return passed, failed, code


def command(cmd, out):
    """Runs `cmd` with bash, its output captured and then written to `out`
    (a list of lines, or None to print it); returns (0, failed, exit code)."""
    emit = print if out is None else out.append
    done = subprocess.run(["bash", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    emit(f"     Running {cmd}")
    emit(done.stdout.rstrip("\n"))
    return 0, int(done.returncode != 0), done.returncode


def main():
    argv = sys.argv[1:]
    also = None
    if argv[:1] == ["--also"]:
        if len(argv) < 2:
            sys.exit("lanes: --also needs a command")
        also, argv = argv[1], argv[2:]
    if not argv:
        sys.exit(__doc__.strip())
    args = argv[1:]
    all_exes = executables(argv[0])
    starts = [[e for e in all_exes if e[0] == name] for name in STARTS]
    rest = [e for e in all_exes if e[0] not in STARTS]
    rest.sort(key=lambda e: -WEIGHT.get(e[0], 0))  # stable: cargo's order among equals
    work = queue.Queue()
    for e in rest:
        for exe, label, extra in shards(e, args):
            work.put((exe[0], lambda out, exe=exe, label=label, extra=extra: run(exe, args, out, label, extra)))
    if also:
        work.put((also, lambda out: command(also, out)))
    results = []
    lock = threading.Lock()
    buffered = []

    def take(out):
        while True:
            try:
                name, job = work.get_nowait()
            except queue.Empty:
                return
            result = job(out)
            with lock:
                results.append((name, result))
            if out is None:
                sys.stdout.flush()

    def lane(first):
        lines = []
        for e in first:
            result = run(e, args, lines)
            with lock:
                results.append((e[0], result))
        take(lines)
        with lock:
            buffered.append(lines)

    sides = [threading.Thread(target=lane, args=(first,)) for first in starts]
    for t in sides:
        t.start()
    take(None)
    for t in sides:
        t.join()
    for lines in buffered:
        print("\n".join(lines))
    passed = sum(r[0] for _, r in results)
    failed = sum(r[1] for _, r in results)
    broken = sorted({name for name, r in results if r[2] != 0})
    if broken:
        print(f"lanes: failed: {', '.join(broken)}", file=sys.stderr)
        failed = max(failed, len(broken))
    print(f"suite: {passed} passed, {failed} failed")
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
