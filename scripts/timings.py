#!/usr/bin/env python3
"""Per test executable: its build-and-link time (from cargo's --timings report)
and its run time (from the test log), sorted by their sum.

Usage: timings.py CARGO_TIMING_HTML TEST_LOG
"""
import json
import re
import sys

# "Running tests/crash.rs (target/debug/deps/crash-0123abcd)" or "Running unittests src/lib.rs (...)".
RUNNING = re.compile(r"^\s*Running (unittests )?(\S+) \((?:\S*/)?deps/([A-Za-z0-9_]+)-[0-9a-f]+\)")
FINISHED = re.compile(r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored.*finished in ([0-9.]+)s")
# A unit's target in cargo's report: `crash "test" (test)`, `nodesmith "lib" (test)`, `sweep "bin"`.
TARGET = re.compile(r'^\s*(\S*)\s*"(\w+)"\s*(\(test\))?')


def build_times(html_path):
    """(target name, kind) -> seconds to compile and link its test harness, and
    the number of units with that key (a name two packages share is ambiguous)."""
    try:
        with open(html_path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        sys.exit(f"timings: cannot read cargo's report {html_path}: {e}")
    match = re.search(r"const UNIT_DATA = (\[.*?\]);\n", text, re.S)
    if not match:
        sys.exit(f"timings: {html_path} has no UNIT_DATA (cargo's report format changed?)")
    times, counts, plain = {}, {}, []
    for unit in json.loads(match.group(1)):
        m = TARGET.match(unit.get("target", ""))
        if not m:
            continue  # a library built as a dependency: its target is empty
        name, kind, harness = (m.group(1) or unit["name"]).replace("-", "_"), m.group(2), m.group(3)
        if not harness:
            plain.append((f'{unit["name"]} {kind} {name}', float(unit["duration"])))
            continue
        key = (name, "test" if kind in ("test", "bench") else kind)
        times[key] = times.get(key, 0.0) + float(unit["duration"])
        counts[key] = counts.get(key, 0) + 1
    return times, counts, plain


def run_times(log_path):
    """(executable stem, kind, source, tests passed, seconds), in run order."""
    runs, current = [], None
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if m := RUNNING.match(line):
                source = m.group(2)
                kind = "test" if not m.group(1) else ("lib" if source.endswith("lib.rs") else "bin")
                current = (m.group(3), kind, source)
            elif (m := FINISHED.match(line)) and current:
                runs.append((*current, int(m.group(1)), float(m.group(4))))
                current = None
    return runs


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip())
    built, counts, plain = build_times(sys.argv[1])
    rows, shown = [], set()
    for stem, kind, source, tests, run in run_times(sys.argv[2]):
        key = (stem, kind)
        build = built.get(key) if key not in shown else None
        shown.add(key)
        note = f" ({counts[key]} share the name)" if counts.get(key, 0) > 1 and build is not None else ""
        rows.append(((build or 0.0) + run, stem + note, source, tests, build, run))
    rows.sort(key=lambda r: r[0], reverse=True)
    print(f"{'executable':<40} {'source':<32} {'tests':>5} {'build s':>8} {'run s':>8} {'total s':>8}")
    for total, stem, source, tests, build, run in rows:
        shown_build = f"{build:8.1f}" if build is not None else f"{'-':>8}"
        print(f"{stem:<40} {source:<32} {tests:>5} {shown_build} {run:8.1f} {total:8.1f}")
    print(
        f"{len(rows)} executables, {sum(r[3] for r in rows)} tests; "
        f"their own build {sum(r[4] or 0 for r in rows):.0f} s of compiler time (units overlap on 2 cores), "
        f"run {sum(r[5] for r in rows):.0f} s"
    )
    if plain:
        print("also built (binaries, not test harnesses): " + ", ".join(f"{n} {t:.1f} s" for n, t in plain))


if __name__ == "__main__":
    main()
