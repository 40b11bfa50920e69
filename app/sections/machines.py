"""Hardware and library versions of every machine that reported."""
import streamlit as st

from claimbench.app import queries, views

version = queries.db_version()
st.title("Machines")
views.empty_notice(queries.has_results(version))
df = queries.machines(version)
if not df.empty:
    st.dataframe(df, hide_index=True, width="stretch")
