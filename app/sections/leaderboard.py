"""Methods and baselines ranked by their gated metric, per task and machine."""
import altair as alt
import streamlit as st

from claimbench.app import queries, views

version = queries.db_version()
st.title("Leaderboard")
views.empty_notice(queries.has_results(version))
for task, spec in queries.BOARDS.items():
    st.subheader(spec["title"])
    df = queries.board(version, task)
    if df.empty:
        st.caption("No results for this task yet.")
        continue
    st.caption("Ranked per machine and dataset; a method that failed its quality gate is shown, not ranked.")
    chart = alt.Chart(df).mark_bar().encode(
        x=alt.X("value:Q", title=spec["unit"]), y=alt.Y("method:N", title=None),
        color=alt.Color("gate:N", scale=alt.Scale(domain=["passed", "none", "failed"],
                                                  range=["#1a7f37", "#57606a", "#cf222e"])),
        row=alt.Row("group:N", title=None), column=alt.Column("machine:N", title=None),
        tooltip=["machine", "group", "method", "value", "gate", "rank"],
    ).properties(height=60, width=280)
    st.altair_chart(chart)
    st.dataframe(df, hide_index=True, width="stretch",
                 column_config={"value": st.column_config.NumberColumn(spec["unit"], format="%.1f")})
