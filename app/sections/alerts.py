"""Regressions (asv step detection), gate failures and verdict flips: open ones first, then those
within noise, the acknowledged ones, those a recheck traced to the machine and those of a superseded
series, newest first."""
import urllib.parse

import pandas as pd
import streamlit as st

from claimbench import alerts
from claimbench.app import queries, views


def read_alert(row) -> None:
    moved = "" if pd.isna(row.change) else f", {row.change:+.1%} ({row.before:.4g} -> {row.after:.4g})"
    st.markdown(f"**{row.benchmark}** " + views.literal(f"{row.params or ''} on {row.machine}: {row.kind}, "
                                                        f"{row.status}{moved}"))
    st.markdown(views.literal(row.detail))
    st.caption(f"commit {row.commit} · [open its series]({row.series})")


version = queries.db_version()
st.title("Alerts")
views.empty_notice(queries.has_results(version))
df = queries.alert_table(version)
open_count = int((df["status"] == "open").sum())
if not open_count:
    st.success("No open regressions, gate failures or verdict flips.")
if not df.empty:
    drift = int(((df["status"] == "open") & df["detail"].str.contains(alerts.CODE_UNCHANGED, regex=False)).sum())
    slower = int(((df["status"] == "open") & df["detail"].str.contains(alerts.MACHINE_SLOWER, regex=False)).sum())
    noise = int((df["status"] == "within noise").sum())
    machine = int((df["status"] == alerts.NOT_THE_CODE).sum())
    superseded = int((df["status"] == alerts.SUPERSEDED).sum())
    acknowledged = len(df) - open_count - noise - machine - superseded
    st.caption(f"{open_count} open, {acknowledged} acknowledged (intended changes, each with its reason in "
               f"pyproject.toml), {noise} within noise (steps the two runs' own samples cannot tell apart: see their "
               f"detail), {machine} {alerts.NOT_THE_CODE} (steps a recheck traced to the machine, with what it "
               f"measured), {superseded} {alerts.SUPERSEDED} (steps in a series the machine no longer extends: its "
               "later runs form a series of their own)"
               + (f"; {drift} of the open ones are steps with no change on their code path (the machine, its load "
                  "or its libraries changed: see their detail)" if drift else "")
               + (f"; {slower} of the open ones are wall-clock steps over which {alerts.MACHINE_SLOWER} (its speed "
                  "probes: see the Machines page)" if slower else ""))
    kind_column, status_column = st.columns(2)
    kinds = kind_column.multiselect("Kind", sorted(df["kind"].unique()))
    statuses = status_column.multiselect("Status", sorted(df["status"].unique(), key=lambda s: s != "open"))
    for column, chosen in (("kind", kinds), ("status", statuses)):
        if chosen:
            df = df[df[column].isin(chosen)]
    df = df.assign(series=[f"paper?series={urllib.parse.quote(b)}" for b in df["benchmark"]])
    st.caption("Select a row (the box at its left edge) to read its detail in full.")
    # what moved, where and by how much first (the benchmark pinned), then why
    views.table_with_reader(df, ["benchmark", "machine", "change", "kind", "status", "params", "commit", "detail",
                                 "series", "before", "after", "commit_date"],
                            {"benchmark": st.column_config.TextColumn(pinned=True),
                             "series": st.column_config.LinkColumn("series", display_text="open series"),
                             "change": st.column_config.NumberColumn(format="percent"),
                             "detail": st.column_config.TextColumn(width="large")}, read_alert, key="alerts")
