"""Methods and baselines ranked by their gated metric, per task and machine: one tab per board in papers.toml."""
import streamlit as st

from claimbench import registry
from claimbench.app import queries, views

version = queries.db_version()
st.title("Leaderboard")
views.empty_notice(queries.has_results(version))
boards = registry.load().boards
for tab, spec in zip(st.tabs([b.tab for b in boards]), boards):
    with tab:
        st.subheader(spec.title)
        df = queries.board(version, spec.task)
        if df.empty:
            st.caption("No results for this task yet.")
            continue
        order = "lowest first" if spec.lower_is_better else "highest first"
        st.caption(f"Ranked per machine and {spec.group.replace('_', ' ')} ({order}); a method that failed its "
                   "quality gate is shown, not ranked.")
        st.altair_chart(views.board_chart(df, spec))
        st.dataframe(df, hide_index=True, width="stretch",
                     column_config={"value": st.column_config.NumberColumn(spec.unit, format="%.4g"),
                                    "group": st.column_config.TextColumn(spec.group.replace("_", " "))})
