"""One paper: its claims, method vs baselines trade-off, the claim benchmark over commits, raw numbers."""
import altair as alt
import streamlit as st

from claimbench import registry
from claimbench.app import queries, views

version = queries.db_version()
papers = queries.papers()
series = st.query_params.get("series", "")
suite_of = dict(zip(papers["suite"], papers["paper"]))
all_claims = queries.claims(version)
measured = queries.measured_papers(all_claims)
default = (st.query_params.get("paper") or (suite_of.get(series.split(".")[0]) if series else None)
           or (measured[0] if measured else papers["paper"].iloc[0]))
ids = list(papers["paper"])
paper_id = st.selectbox("Paper", ids, index=ids.index(default) if default in ids else 0,
                        format_func=lambda p: f"{p}: {papers.set_index('paper').loc[p, 'title']}")
paper = papers.set_index("paper").loc[paper_id]
st.title(paper["title"])
st.markdown(f"Tier **{paper['tier']}** · task `{paper['task']}` · method `{paper['method'] or 'not implemented yet'}` "
            f"· baselines: {paper['baselines']}")
views.empty_notice(queries.has_results(version))

claims = all_claims[all_claims["paper"] == paper_id]
st.subheader("Claims")
st.caption("Select a row (the box at its left edge) to read it in full.")
views.table_with_reader(claims, [*views.CLAIM_ORDER[1:], "why", "substitution"], views.CLAIM_COLUMNS,
                        views.read_claim, key="paper-claims")
for claim_id, across in claims.drop_duplicates("claim")[["claim", "across"]].itertuples(index=False):
    if across:
        st.caption(f"**{claim_id}** across machines: {across}")

if not paper["suite"]:
    st.info("No suite for this paper yet: its claims are listed as not measured.")
    st.stop()

kernels = queries.kernels(version, paper["suite"])
if not kernels.empty:
    st.subheader("Kernels")
    st.caption("The kernels behind the claims (`make kernels`, pytest-benchmark, one process, single thread): the "
               "median time per call with the 95% interval of its rounds, newest commit per machine. When a claim's "
               "ratio moves, the kernel that moved shows here.")
    latest = queries.latest_per_machine(kernels)
    st.dataframe(latest[["kernel", "machine", "commit", "value", "low", "high"]], hide_index=True, width="stretch",
                 column_config={c: st.column_config.NumberColumn(f"{c} (ms)" if c == "value" else c, format="%.4g")
                                for c in ("value", "low", "high")})
    st.altair_chart(alt.Chart(kernels).mark_line(point=True).encode(
        x=alt.X("commit_date:T", title="commit date", axis=views.DATE_AXIS),
        y=alt.Y("value:Q", title="ms per call", scale=alt.Scale(type="log")),
        color=alt.Color("kernel:N", scale=views.CATEGORIES), strokeDash="machine:N",
        tooltip=["kernel", "machine", "commit", "value", "low", "high"]).properties(height=260), width="stretch")

specs = registry.load()
spec = specs.paper(paper_id).tradeoff
if spec:
    points = queries.tradeoff(version, paper_id)
    if not points.empty:
        st.subheader("Method vs baselines: trade-off")
        st.caption(f"{spec.quality_label} vs {spec.speed_label}, one point per {spec.point}; "
                   "the Pareto front per machine is drawn large; a point whose gate failed is a cross; "
                   "bars: the 95% interval of the speed over interleaved rounds, where it was recorded.")
        points = points.assign(pareto=queries.pareto(points))
        base = alt.Chart(points).encode(
            x=alt.X("quality:Q", title=spec.quality_label, scale=alt.Scale(zero=False)),
            y=alt.Y("speed:Q", title=spec.speed_label, scale=alt.Scale(type="log")),
            color=alt.Color("method:N", scale=views.CATEGORIES), detail="machine:N",
            tooltip=["machine", "group", "point", "method", "quality", "speed", "speed_low", "speed_high", "gate"])
        layers = base.mark_line(opacity=0.4) + base.mark_point(filled=True).encode(
            shape=alt.condition("datum.gate == 'failed'", alt.value("cross"), alt.value("circle")),
            size=alt.condition("datum.pareto", alt.value(120), alt.value(40)))
        if points["speed_low"].notna().any():  # a layer of no bars leaves vega an empty extent (its warnings)
            layers += base.mark_rule().encode(y="speed_low:Q", y2="speed_high:Q")
        chart = layers.properties(width=240, height=220).facet(facet=alt.Facet("group:N", title=None), columns=3)
        st.altair_chart(chart)

sweep = specs.paper(paper_id).sweep
if sweep:
    points = queries.sweep(version, paper_id)
    if not points.empty:
        st.subheader("Sweep")
        st.caption(sweep.title + "; bars: the 95% interval, where it was recorded.")
        base = alt.Chart(points).encode(
            x=alt.X("x:N", title=sweep.x, sort=list(sweep.x_order)), y=alt.Y("value:Q", title=None),
            color=alt.Color("series:N", title=sweep.series), strokeDash="machine:N",
            tooltip=["machine", "x", "series", "metric", "value", "low", "high"])
        layers = base.mark_line(point=True)
        if points["low"].notna().any():  # a layer of no bars leaves vega an empty extent (its warnings)
            layers += base.mark_rule().encode(y="low:Q", y2="high:Q", strokeDash=alt.value([1, 0]))
        chart = layers.properties(width=260, height=220).facet(facet=alt.Facet("metric:N", title=None),
                                                               columns=3).resolve_scale(y="independent")
        st.altair_chart(chart)

board = specs.board(paper["task"])
if not spec and board:
    df = queries.board(version, board.task)
    if not df.empty:
        st.subheader("Method vs baselines")
        st.caption(board.title)
        st.altair_chart(views.board_chart(df, board))

raw = queries.results(version, paper["suite"] + ".")
benchmarks = [b for b in claims["benchmark"].unique() if b]
chosen = st.selectbox("Benchmark over commits", sorted(set(raw["benchmark"])) if len(raw) else benchmarks,
                      index=None, placeholder=series or (benchmarks[0] if benchmarks else ""))
chosen = chosen or series or (benchmarks[0] if benchmarks else None)
history = raw[raw["benchmark"] == chosen] if chosen else raw.iloc[0:0]
if not history.empty:
    st.subheader(f"`{chosen}` over commits")
    alerts = queries.alert_table(version)
    alerts = alerts[(alerts["benchmark"] == chosen) & (alerts["kind"] == "regression")]
    st.caption("One line per parameter combination, machine and run mode (quick and full runs are separate "
               "series); bars: 95% intervals where they were recorded.")
    history = history.assign(series=history["machine"] + " · " + history["mode"].fillna("unrecorded"))
    chart = alt.Chart(history).encode(
        x=alt.X("commit_date:T", title="commit date", axis=views.DATE_AXIS),
        y=alt.Y("value:Q", title=history["unit"].iloc[0]),
        color=alt.Color("params:N", title="params", scale=views.CATEGORIES),
        strokeDash=alt.StrokeDash("series:N", title="machine · mode"),
        detail="series:N", tooltip=["machine", "mode", "commit", "params", "value", "low", "high", "status"])
    layers = chart.mark_line(point=True)
    if history["low"].notna().any():
        layers += chart.mark_rule().encode(y="low:Q", y2="high:Q")
    if not alerts.empty:
        layers += alt.Chart(alerts).mark_point(shape="triangle-down", size=200, color="#cf222e", filled=True).encode(
            x="commit_date:T", y="after:Q", tooltip=["detail"])
    st.altair_chart(layers.properties(height=300), width="stretch")

st.subheader("Raw numbers")
st.dataframe(raw.drop(columns=["params"]), hide_index=True, width="stretch")
st.download_button("Download CSV", raw.to_csv(index=False).encode(), file_name=f"{paper_id}-results.csv",
                   mime="text/csv")
