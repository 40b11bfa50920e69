"""Hardware and library versions of every machine that reported, and how fast each was at each run
(claimbench.machinespeed's probes)."""
import altair as alt
import streamlit as st

from claimbench.app import queries, views

version = queries.db_version()
st.title("Machines")
views.empty_notice(queries.has_results(version))
df = queries.machines(version)
if not df.empty:
    st.dataframe(df, hide_index=True, width="stretch")
speed = queries.machine_speed(version)
if not speed.empty:
    st.subheader("Machine speed at each run")
    st.caption("CPU milliseconds per round of three fixed single-threaded probes (interpreter, SIMD, memory "
               "copy), timed before and after each `claimbench run`: median and 95% interval. A shared VM slows "
               "with no change in the code; a wall-clock alert says when its runs' probes slowed as much.")
    for machine, runs in speed.groupby("machine"):
        base = alt.Chart(runs).encode(x=alt.X("started:T", title="run started"), color="probe:N",
                                      tooltip=["commit", "mode", "suites", "probe", alt.Tooltip("ms:Q", format=".1f")])
        y = alt.Y("ms:Q", title="CPU ms per round", scale=alt.Scale(zero=False))
        chart = base.mark_line(point=True).encode(y=y) + base.mark_rule().encode(y="low_ms:Q", y2="high_ms:Q")
        st.markdown(f"**{machine}**")
        st.altair_chart(chart, width="stretch")
