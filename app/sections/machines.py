"""Hardware and library versions of every machine that reported, what each needs to run again to be current
(verdicts.stale), and how fast each was at each run (claimbench.machinespeed's probes)."""
import altair as alt
import streamlit as st

from claimbench import verdicts
from claimbench.app import queries, views

version = queries.db_version()
st.title("Machines")
views.empty_notice(queries.has_results(version))
df = queries.machines(version)
if not df.empty:
    st.dataframe(df, hide_index=True, width="stretch")
stale = queries.stale(version)
if not stale.empty:
    st.subheader("Out of date")
    st.caption(verdicts.STALE_TEXT)
    st.dataframe(stale, hide_index=True, width="stretch")
speed = queries.machine_speed(version)
if not speed.empty:
    st.subheader("Machine speed at each run")
    st.caption("CPU milliseconds per round of three fixed single-threaded probes (interpreter, SIMD, memory "
               "copy), timed before (circle) and after (square) each `claimbench run`: median and 95% interval. "
               "A shared VM slows with no change in the code, sometimes during a run; a wall-clock alert says when "
               "its runs' probes slowed as much.")
    for machine, runs in speed.groupby("machine"):
        runs = runs.assign(run=runs["started"].dt.strftime("%m-%d %H:%M") + " " + runs["commit"])
        order = list(runs.sort_values("started")["run"].unique())
        base = alt.Chart(runs).encode(
            x=alt.X("run:O", sort=order, title="run (started, UTC; commit)",
                    axis=alt.Axis(labelAngle=0, labelLimit=240)),
            xOffset=alt.XOffset("end:N", sort=["before", "after"]), color=alt.Color("probe:N", scale=views.CATEGORIES),
            tooltip=["commit", "mode", "suites", "end", "probe", alt.Tooltip("ms:Q", format=".1f")])
        y = alt.Y("ms:Q", title="CPU ms per round", scale=alt.Scale(zero=False))
        chart = base.mark_point(filled=True, size=60).encode(
            y=y, shape=alt.Shape("end:N", sort=["before", "after"], scale=alt.Scale(range=["circle", "square"]))
        ) + base.mark_rule().encode(y="low_ms:Q", y2="high_ms:Q")
        st.markdown(f"**{machine}**")
        st.altair_chart(chart, width="stretch")
