"""The report's robustness table (report/robustness.csv and a section of report.html): per split
and fault, what surviving the fault cost (summary.csv's medians over runs, paretopipe.faults),
ranked within each fault by the outage's cost."""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from .. import faults, records
from .keys import CONFIG_KEY, NO_FAULT, OPTIONAL_KEY, split_sort_key

FILE = "robustness.csv"
SHOWN = ["fault_detect_s", "fault_served_locally", "fault_recover_s", "fault_window_p99_s", "fault_cost_s",
         "fault_lost", "fault_duplicated"]


def robustness_table(configs: pd.DataFrame) -> pd.DataFrame:
    """One row per faulted configuration with its figures and ``cost_rank`` (1: the split whose
    outage cost least under that fault, network and setting); empty without faults."""
    if "fault" not in configs.columns or not configs["fault"].fillna(NO_FAULT).ne(NO_FAULT).any():
        return pd.DataFrame()
    rows = configs[configs["fault"].fillna(NO_FAULT).ne(NO_FAULT)].copy()
    key = [c for c in CONFIG_KEY if c in rows.columns and not (c in OPTIONAL_KEY and c != "fault" and
                                                               rows[c].fillna(OPTIONAL_KEY[c]).eq(OPTIONAL_KEY[c]).all())]
    rows = rows[key + [c for c in SHOWN if c in rows.columns]]
    group = [c for c in key if c != "split_index"]
    rows["cost_rank"] = rows.groupby(group, dropna=False)["fault_cost_s"].rank(method="min")
    rows["_split"] = rows["split_index"].map(split_sort_key)
    return rows.sort_values(group + ["cost_rank", "_split"]).drop(columns="_split").reset_index(drop=True)


def write(configs: pd.DataFrame, out: Path) -> pd.DataFrame:
    """robustness.csv in ``out`` (nothing without faults); returns the table."""
    table = robustness_table(configs)
    if not table.empty:
        records.atomic_write_csv(out / FILE, table.to_dict("records"), list(table.columns))
    return table


def html_section(table: pd.DataFrame) -> str:
    """report.html's robustness section (empty without faults)."""
    if table.empty:
        return ""
    keep = ["fault", "network", "split_index", "cost_rank", *[c for c in SHOWN if c in table.columns]]
    body = table[keep].to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep="-", border=0)
    return ("<h2>Robustness: what each split's outage cost</h2><p>" + html.escape(faults.__doc__.split("\n\n")[1])
            + " Ranked within each fault by the outage's cost (fault_cost_s).</p>" + body)
