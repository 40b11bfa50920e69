"""Every headline claim of papers.toml, its verdict per machine, gate and conditions."""
import altair as alt
import streamlit as st

from claimbench.app import queries, views

version = queries.db_version()
st.title("Claims vs measured")
st.caption("Each paper's headline claim beside what this project measured, per machine, with the 95% interval "
           "of the measured value in brackets. A ratio counts only when the method passes its quality gate; "
           "'inconclusive' means the interval spans both the baseline and the claim. `run`: the mode the verdict "
           "comes from (full runs preferred) and whether its inputs are this checkout's.")
views.run_progress()
views.empty_notice(queries.has_results(version))
df = queries.claims(version)

cols = st.columns(4)
paper = cols[0].multiselect("Paper", sorted(df["paper"].unique()))
tier = cols[1].multiselect("Tier", sorted(df["tier"].unique()))
machine = cols[2].multiselect("Machine", sorted(df["machine"].unique()))
verdict = cols[3].multiselect("Verdict", list(views.VERDICT_COLORS))
shown = df
for column, chosen in (("paper", paper), ("tier", tier), ("machine", machine), ("verdict", verdict)):
    if chosen:
        shown = shown[shown[column].isin(chosen)]

side_by_side = st.toggle("Machines side by side", help="one row per claim, one column group per machine "
                                                       "(verdict, measured, commit): a fleet run's machines at a glance")
if side_by_side:
    st.dataframe(queries.by_machine(shown), hide_index=True, width="stretch")
else:
    st.caption("Select a row (the box at its left edge) to read its claim, verdict and reasons in full.")
    views.table_with_reader(shown, [*views.CLAIM_ORDER, "tier", "why", "conditions", "substitution", "commit"],
                            views.CLAIM_COLUMNS, views.read_claim, key="claims")
counts = shown.groupby("verdict").size().reset_index(name="claims")
chart = alt.Chart(counts).mark_bar().encode(
    x=alt.X("claims:Q", title="claims x machines"),
    y=alt.Y("verdict:N", sort=list(views.VERDICT_COLORS), title=None, axis=alt.Axis(labelOverlap=False)),
    color=alt.Color("verdict:N", scale=alt.Scale(domain=list(views.VERDICT_COLORS),
                                                 range=list(views.VERDICT_COLORS.values())), legend=None),
).properties(height=28 * len(views.VERDICT_COLORS))
st.altair_chart(chart, width="stretch")  # after the table: the table paints first

not_measured = sorted(set(df["paper"]) - set(queries.measured_papers(df)))
if not_measured:
    st.caption("Not measured yet on any machine: " + ", ".join(not_measured))
