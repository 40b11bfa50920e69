"""claimbench leaderboard: `claimbench app` (or `streamlit run app/main.py`)."""
import streamlit as st

st.set_page_config(page_title="claimbench", page_icon=":material/fact_check:", layout="wide")
page = st.navigation([
    st.Page("sections/claims.py", title="Claims", icon=":material/fact_check:", default=True),
    st.Page("sections/leaderboard.py", title="Leaderboard", icon=":material/leaderboard:", url_path="leaderboard"),
    st.Page("sections/paper.py", title="Paper", icon=":material/article:", url_path="paper"),
    st.Page("sections/alerts.py", title="Alerts", icon=":material/notifications_active:", url_path="alerts"),
    st.Page("sections/machines.py", title="Machines", icon=":material/memory:", url_path="machines"),
])
page.run()
