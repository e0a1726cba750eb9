"""Compute payroll.csv from employees.csv and rates.csv (offline, deterministic)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

rates = {row["grade"]: float(row["hourly"]) for row in csv.DictReader(open("rates.csv"))}
rows = [
    (e["name"], float(e["hours"]) * rates[e["grade"]])
    for e in csv.DictReader(open("employees.csv"))
]
with open("payroll.csv", "w", newline="") as f:
    out = csv.writer(f)
    out.writerow(["name", "pay"])
    for name, pay in rows:
        out.writerow([name, f"{pay:.2f}"])
wake = json.loads(os.environ.get("SESSIOND_WAKE", '{"wakes": []}'))
why = wake["wakes"][0]["trigger"] if wake["wakes"] else "manual"
print(f"payroll.csv: {len(rows)} employees, total {sum(p for _, p in rows):.2f} (woken by {why})")
Path("payroll.log").open("a").write(f"{why}\n")
