"""The warm-up unit by unit from units.sh's logs (compiled_units' debug lines): per log, the seconds spent
on target and draft units and their counts, then each unit of 0.5 s or more (kind, width, its post).
    python units_sum.py runs/s47/units_cold.log runs/s47/units_warm.log"""

import re
import sys

UNIT = re.compile(r"unit \(\((\d+), .*?(?:<function (\w+)|<bound method (\w+\.\w+))")
READY = re.compile(r"ready in ([\d.]+) s")

for name in sys.argv[1:]:
    seconds: dict[str, float] = {}
    counts: dict[str, int] = {}
    rows = []
    with open(name) as log:
        for line in log:
            ready = READY.search(line)
            if not ready:
                continue
            unit = UNIT.search(line)
            width, post = (unit.group(1), unit.group(2) or unit.group(3)) if unit else ("?", "none")
            kind = "draft" if "draft" in post else "target"
            seconds[kind] = seconds.get(kind, 0.0) + float(ready.group(1))
            counts[kind] = counts.get(kind, 0) + 1
            rows.append((kind, width, post, float(ready.group(1))))
    print(name, {k: round(v, 1) for k, v in seconds.items()}, counts)
    for row in rows:
        if row[3] >= 0.5:
            print("  ", *row)
