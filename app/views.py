"""Small pieces every page shares: the empty-store notice, the run's progress, the verdict colours and badges."""
import json
import re

import altair as alt
import pandas as pd
import streamlit as st

from claimbench import report, store

VERDICT_COLORS = {"reproduced": "#1a7f37", "partly": "#bf8700", "not reproduced": "#cf222e",
                  "inconclusive": "#0969da", "gate failed": "#8250df", "not testable here": "#6e7781",
                  "not measured yet": "#afb8c1"}

HOW_TO_RUN = """
**No results in the store yet** (`{db}`).

Run the quick suites on this machine and load them:

```bash
make run                      # or, step by step:
claimbench run --quick        # asv on this machine, saved under HEAD
claimbench ingest .asv/results reports/results
```

then refresh this page.
"""


def run_progress() -> None:
    """While `claimbench run --serve` measures this machine: which suite runs and about how long is left."""
    from claimbench import progressive
    state = progressive.read_progress()
    if state:
        st.info(f"Measuring now: {progressive.progress_text(state)}. Refresh to see each suite's rows as it "
                "finishes.")


def empty_notice(has_results: bool) -> None:
    if not has_results:
        st.info(HOW_TO_RUN.format(db=store.db_path()), icon="ℹ️")


# Claim tables: the verdict and the measured value right after what identifies the row (paper and
# claim, pinned while the wider columns scroll), the claim's wording after them; the verdict as its
# badge (a pandas Styler would cost the first paint a second here).
CLAIM_ORDER = ["paper", "claim", "machine", "badge", "interval", "claimed", "gate", "mode", "inputs"]
CLAIM_COLUMNS = {"paper": st.column_config.TextColumn(pinned=True), "claim": st.column_config.TextColumn(pinned=True),
                 "badge": st.column_config.TextColumn("verdict"),
                 "interval": st.column_config.TextColumn("measured [95% interval]"),
                 "why": st.column_config.TextColumn(width="large")}


def literal(text: str) -> str:
    """Text for st.markdown as written: $ (math), * and ~ (emphasis, strike-through) escaped."""
    return re.sub(r"([$*~])", r"\\\1", text)


def table_with_reader(df, columns: list[str], column_config: dict, read, key: str) -> None:
    """df's columns as a table whose long cells clip in the grid, and the row a reader selects (the box at
    its left edge) written out in full below it by read(row), which sees every column of df."""
    df = df[columns + [column for column in df.columns if column not in columns]]  # the shown ones first
    # keyed by its rows too: a filter that changes them starts a fresh selection (Streamlit keeps one by
    # position, which would then point at another row, or past the end)
    event = st.dataframe(df, hide_index=True, width="stretch", column_order=columns, column_config=column_config,
                         on_select="rerun", selection_mode="single-row", key=f"{key}-{hash(tuple(df.index))}")
    for position in event.selection.rows:
        with st.container(border=True):
            read(df.iloc[position])


def read_claim(row) -> None:
    """One claim row of queries.claims in full: verdict, measured, the claim's words, why, and across machines."""
    st.markdown(f"**{row.paper} / {row.claim}** on {row.machine}: "
                + literal(row.badge + (f", measured {row.interval}" if row.interval else "")))
    st.markdown(literal(f"Claimed: {row.claimed}" + (f" ({row.conditions})" if row.conditions else "")))
    for label, text in (("Why", row.why), ("Measured instead of the paper's setting", row.substitution),
                        ("Across machines", row.across)):
        if text:
            st.markdown(f"{label}: {literal(text)}")
    detail = json.loads(row.detail or "[]")
    if detail:
        explain = list(dict.fromkeys(label for entry in detail for label in entry.get("explain", {})))
        headers, rows = report.combinations(row.unit, explain, detail)
        st.caption("Per parameter combination (95% intervals in brackets where recorded):")
        st.dataframe(pd.DataFrame(rows, columns=headers), hide_index=True)
    if row.commit:
        st.caption(f"commit {row.commit} · {row['mode']} run, {row.inputs}")


# Categories in distinct hues (Streamlit's own palette starts with two blues: Lychee and faiss, or two
# probes, looked alike).
CATEGORIES = alt.Scale(scheme="tableau10")
# Commit dates as dates (vega's own choice on a day's commits or a single one is a bare ":24")
DATE_AXIS = alt.Axis(format="%b %d %H:%M", labelAngle=0)


def board_chart(df, spec):
    """A task board as bars: one row of bars per group, one column per machine (a quick run's marked
    ' · quick'), coloured by gate; a log axis where the spec asks (values spanning decades)."""
    scale = alt.Scale(type="log") if spec.log else alt.Scale()
    return alt.Chart(df).mark_bar().encode(
        # unstacked: a stacked bar starts at zero, which a log scale's domain cannot hold (no bar is drawn)
        x=alt.X("value:Q", title=spec.unit + (" (log scale)" if spec.log else ""), scale=scale,
                stack=None if spec.log else "zero"),
        y=alt.Y("method:N", title=None),
        color=alt.Color("gate:N", scale=alt.Scale(domain=["passed", "none", "failed"],
                                                  range=["#1a7f37", "#57606a", "#cf222e"])),
        row=alt.Row("group:N", title=spec.group.replace("_", " "), sort=sorted(set(df["group"]), key=_numeric_first),
                    header=alt.Header(labelAngle=0, labelAlign="left")),
        column=alt.Column("machine:N", title=None),
        tooltip=["machine", "group", "method", "value", "gate", "rank"],
    ).properties(height=22 * df["method"].nunique(), width=280)


def _numeric_first(value: str):
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)
