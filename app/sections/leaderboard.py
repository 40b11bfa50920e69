"""Methods and baselines ranked by their gated metric, per task and machine: one tab per task."""
import streamlit as st

from claimbench.app import queries, views

version = queries.db_version()
st.title("Leaderboard")
views.empty_notice(queries.has_results(version))
TAB_NAMES = {"vector-search": "Vector search", "sparse-attention": "Sparse attention", "storage-io": "Storage I/O",
             "agent-context": "Agent context", "engine-build": "Engine builds"}
for tab, (task, spec) in zip(st.tabs([TAB_NAMES[t] for t in queries.BOARDS]), queries.BOARDS.items()):
    with tab:
        st.subheader(spec["title"])
        df = queries.board(version, task)
        if df.empty:
            st.caption("No results for this task yet.")
            continue
        order = "lowest first" if spec.get("lower_is_better") else "highest first"
        st.caption(f"Ranked per machine and {spec['group'].replace('_', ' ')} ({order}); a method that failed its "
                   "quality gate is shown, not ranked.")
        st.altair_chart(views.board_chart(df, spec))
        st.dataframe(df, hide_index=True, width="stretch",
                     column_config={"value": st.column_config.NumberColumn(spec["unit"], format="%.4g"),
                                    "group": st.column_config.TextColumn(spec["group"].replace("_", " "))})
