#!/usr/bin/env python3
"""Summarizes scheduler_replay output on the held-out fleet sizes.

The method of docs/scheduler.md ("Second round"): queue and placement rules
are chosen on fleet sizes other than the reported 0.6x and 0.8x. From a run
at the held-out scales this keeps one table per distinct (trace, node count)
and drops every table whose node count equals that trace's 0.6x or 0.8x
fleet (given by a second run at --scales=0.6,0.8), then prints one line:
mean utilization while queued of ours (a table where ours never queued
counts 100), on how many tables ours is at or above every real policy on
that figure, at or below every real policy on gang (16-128) wait p95, within
3 points of the fluid bound, the largest gap to the fluid bound, mean JCT,
and the three 2-4 GPU p99 tails the second round quoted. With --base, also
how many tables moved for ours against a baseline run and the largest p99
changes per size class. Standard library only.

  R=build-sched/bench/scheduler/scheduler_replay
  $R --scales=0.4,0.45,0.5,0.55,0.65,0.7,0.75,0.85,0.9,0.95 > heldout.txt
  $R --scales=0.6,0.8 > reported.txt
  bench/scheduler/heldout_summary.py heldout.txt reported.txt [--base other.txt]
"""
import argparse
import re
import sys

REAL = ["random", "first-fit", "best-fit", "spread", "topo-tree"]
CLASSES = ["1", "2-4", "8", "16-128"]
QUOTED_TAILS = [("cluster08.csv", 15), ("cluster02.csv", 22), ("cluster10.csv", 3)]


def parse(path):
    tables, table = [], None
    with open(path) as f:
        for line in f:
            m = re.match(r"### (\S+): .*fleet ([\d.]+)x = (\d+) nodes", line)
            if m:
                table = {"trace": m.group(1), "nodes": int(m.group(3)), "rows": {}}
                tables.append(table)
                continue
            if table is None or not line.startswith("| ") or line.startswith("| policy"):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            queued_util, hours_queued = float(cells[2]), float(cells[3])
            # "ours, svd's move rule (52 moves)" -> "ours, svd's move rule"
            table["rows"][re.sub(r" \(\d+ moves\)$", "", cells[0])] = {
                "q": queued_util if (queued_util > 0 or hours_queued > 0) else 100.0,
                "waits": [[float(v) for v in cells[4 + k].split(" / ")] for k in range(4)],
                "jct": float(cells[8]),
            }
    return tables


def held_out(path, reported_path):
    reported = {}
    for t in parse(reported_path):
        reported.setdefault(t["trace"], set()).add(t["nodes"])
    seen, kept = set(), []
    for t in parse(path):
        key = (t["trace"], t["nodes"])
        if key in seen or t["nodes"] in reported.get(t["trace"], ()):
            continue
        seen.add(key)
        kept.append(t)
    return kept


def summary(tables, ours_row="ours"):
    n = len(tables)
    if n == 0:
        sys.exit("no held-out tables")
    ours = [t["rows"][ours_row] for t in tables]
    best = sum(all(t["rows"][ours_row]["q"] >= t["rows"][p]["q"] for p in REAL) for t in tables)
    gang = sum(all(t["rows"][ours_row]["waits"][3][1] <= t["rows"][p]["waits"][3][1] for p in REAL)
               for t in tables)
    gaps = [t["rows"]["fluid bound"]["q"] - t["rows"][ours_row]["q"] for t in tables]
    line = (f"{n} tables: mean util while queued {sum(o['q'] for o in ours) / n:.2f}, "
            f"ours best {best} / gang best {gang} / within 3 of fluid {sum(g <= 3 for g in gaps)}, "
            f"largest gap {max(gaps):.1f}, mean JCT {sum(o['jct'] for o in ours) / n:.2f} h")
    by_key = {(t["trace"], t["nodes"]): t for t in tables}
    tails = []
    for key in QUOTED_TAILS:
        if key in by_key:
            tails.append(f"{key[0].removesuffix('.csv')} {key[1]} nodes "
                         f"{by_key[key]['rows'][ours_row]['waits'][1][2]:.0f}")
    return line + ("; 2-4 GPU p99 min: " + ", ".join(tails) if tails else "")


def compare(base, tables):
    base_by_key = {(t["trace"], t["nodes"]): t for t in base}
    up = down = 0
    worst = [None] * 4
    for t in tables:
        b = base_by_key.get((t["trace"], t["nodes"]))
        if b is None:
            continue
        delta = t["rows"]["ours"]["q"] - b["rows"]["ours"]["q"]
        up += delta > 0.05
        down += delta < -0.05
        for k in range(4):
            before, after = b["rows"]["ours"]["waits"][k][2], t["rows"]["ours"]["waits"][k][2]
            if worst[k] is None or after - before > worst[k][0]:
                worst[k] = (after - before, t["trace"], t["nodes"], before, after)
    print(f"  ours util while queued vs base: {up} tables up, {down} down (by > 0.05 points)")
    for k, name in enumerate(CLASSES):
        d, trace, nodes, before, after = worst[k]
        print(f"  largest {name} GPU p99 rise: {trace} {nodes} nodes {before:.0f} -> {after:.0f} min")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("heldout", help="scheduler_replay output at the held-out scales")
    parser.add_argument("reported", help="scheduler_replay output at --scales=0.6,0.8")
    parser.add_argument("--base", help="held-out output of a baseline run to compare with")
    parser.add_argument("--ours", default="ours",
                        help="the row to summarize as ours, e.g. \"ours, svd's move rule\"")
    args = parser.parse_args()
    try:
        tables = held_out(args.heldout, args.reported)
        base = held_out(args.base, args.reported) if args.base else None
    except (OSError, ValueError, IndexError, KeyError) as error:
        sys.exit(f"heldout_summary: cannot read the replay output: {error!r}")
    print(summary(tables, args.ours))
    if base is not None:
        compare(base, tables)


if __name__ == "__main__":
    main()
