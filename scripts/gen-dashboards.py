#!/usr/bin/env python3
"""Writes the Grafana dashboards of the Helm chart (helm/hasten/dashboards/*.json).

The panels, variables and dashboards are built with Grafana's own typed builders
(grafana-foundation-sdk, pinned in scripts/helm-tools.sh, which installs it into the chart
check's venv), so that the JSON follows Grafana's schema; this script keeps Hasten's
conventions (the `${datasource}` variable, `namespace`/`pod` filters, one layout grid) and
the queries. Edit this script and run it again rather than editing the JSON. `--check`
compares instead of writing and exits non-zero when a file is stale (scripts/check-helm.sh
runs it).

    $venv/bin/python scripts/gen-dashboards.py [--check]
"""

import argparse
import json
import pathlib
import sys

try:
    from grafana_foundation_sdk.builders import common as common_builders
    from grafana_foundation_sdk.builders import dashboard as dashboards
    from grafana_foundation_sdk.builders import heatmap as heatmaps
    from grafana_foundation_sdk.builders import prometheus
    from grafana_foundation_sdk.builders import stat as stats
    from grafana_foundation_sdk.builders import timeseries as timeseries_panels
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import common
    from grafana_foundation_sdk.models import dashboard as models
    from grafana_foundation_sdk.models import heatmap as heatmap_models
    from grafana_foundation_sdk.models import prometheus as prometheus_models
except ImportError:
    sys.exit(
        "gen-dashboards: grafana-foundation-sdk is missing; run it with the chart check's venv "
        "(source scripts/helm-tools.sh with tools=~/.cache/hasten-ci/tools, then $py)"
    )

OUT = pathlib.Path(__file__).resolve().parent.parent / "helm" / "hasten" / "dashboards"
DS = models.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"


class Layout:
    """Places panels left to right on Grafana's 24-column grid, rows under each other (the
    SDK's own placement lets a panel overflow the line it starts on)."""

    def __init__(self):
        self.items = []
        self.x = 0
        self.y = 0
        self.row_height = 0
        self.next_id = 1

    def _id(self):
        self.next_id += 1
        return self.next_id - 1

    def row(self, title):
        self._newline()
        row = dashboards.Row(title).id(self._id()).grid_pos(models.GridPos(h=1, w=24, x=0, y=self.y))
        self.items.append(("row", row))
        self.y += 1

    def _newline(self):
        if self.x:
            self.y += self.row_height
            self.x = 0
            self.row_height = 0

    def add(self, panel, w=12, h=8):
        if self.x + w > 24:
            self._newline()
        panel.id(self._id()).grid_pos(models.GridPos(h=h, w=w, x=self.x, y=self.y)).datasource(DS)
        self.items.append(("panel", panel))
        self.x += w
        self.row_height = max(self.row_height, h)


def target(expr, legend="", ref="A", fmt=None, instant=False):
    query = prometheus.Dataquery().datasource(DS).expr(expr).legend_format(legend).ref_id(ref)
    if fmt:
        query.format(prometheus_models.PromQueryFormat(fmt))
    if instant:
        query.instant()
    return query


def targets(*pairs):
    return [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(pairs)]


def timeseries(title, pairs, unit="short", description="", stack=False, minimum=None, maximum=None):
    panel = (
        timeseries_panels.Panel()
        .title(title)
        .description(description)
        .targets(targets(*pairs))
        .unit(unit)
        .draw_style(common.GraphDrawStyle.LINE)
        .line_width(1)
        .fill_opacity(25 if stack else 10)
        .show_points(common.VisibilityMode.NEVER)
        .span_nulls(False)
        .stacking(
            common_builders.StackingConfig()
            .mode(common.StackingMode.NORMAL if stack else common.StackingMode.NONE)
            .group("A")
        )
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.DESCENDING))
    )
    if minimum is not None:
        panel.min(minimum)
    if maximum is not None:
        panel.max(maximum)
    return panel


def heatmap(title, bucket_expr, unit="s", description=""):
    """A heatmap of a Prometheus histogram's buckets (increase per interval, by `le`)."""
    return (
        heatmaps.Panel()
        .title(title)
        .description(description)
        .targets([target(bucket_expr, "{{le}}", fmt="heatmap")])
        .scale_distribution(common_builders.ScaleDistributionConfig().type(common.ScaleDistribution.LINEAR))
        .calculate(False)
        .cell_gap(1)
        .color(
            heatmaps.HeatmapColorOptions()
            .mode(heatmap_models.HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .steps(64)
            .exponent(0.5)
            .fill("dark-orange")
            .scale(heatmap_models.HeatmapColorScale.EXPONENTIAL)
            .reverse(False)
        )
        .y_axis(heatmaps.YAxisConfig().axis_placement(common.AxisPlacement.LEFT).unit(unit).reverse(False))
        .rows_frame(heatmaps.RowsHeatmapOptions().layout(common.HeatmapCellLayout.AUTO))
        .cell_values(heatmaps.CellValues().unit("short"))
        .mode(common.TooltipDisplayMode.SINGLE)
        .show_y_histogram()
        .show_color_scale(True)
        .show_legend()
        .exemplars_color("rgba(255,0,255,0.7)")
        .filter_values(heatmaps.FilterValueRange().le(1e-9))
    )


def thresholds(*steps):
    """Absolute thresholds: (value, colour) pairs, the first value None (the base)."""
    return (
        dashboards.ThresholdsConfig()
        .mode(models.ThresholdsMode.ABSOLUTE)
        .steps([models.Threshold(value=value, color=color) for value, color in steps])
    )


def value_mapping(texts):
    """Displays each value (a string) as (text, colour)."""
    return models.ValueMap(
        options={value: models.ValueMappingResult(text=text, color=color) for value, (text, color) in texts.items()}
    )


def stat(title, expr, legend="", unit="short", description="", mappings=None, text_mode="auto", steps=None):
    return (
        stats.Panel()
        .title(title)
        .description(description)
        .targets([target(expr, legend, instant=True)])
        .unit(unit)
        .mappings([value_mapping(mappings)] if mappings else [])
        .thresholds(thresholds(*(steps or [(None, "green")])))
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.NONE)
        .text_mode(common.BigValueTextMode(text_mode))
        .justify_mode(common.BigValueJustifyMode.AUTO)
        .orientation(common.VizOrientation.AUTO)
    )


def quantile(q, metric, sel, by=""):
    """The q-quantile of a histogram from the chart's recording rules
    (templates/monitoring/recordingrules.yaml: per-pod bucket rates), optionally per label."""
    group = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({group}) (namespace_pod:{metric}_bucket:rate{{{sel}}}))"


def quantiles(metric, sel, by="", legend_prefix=""):
    """p50/p95/p99 of a histogram, optionally per label (`by`)."""
    return [
        (
            quantile(q, metric, sel, by),
            f"{legend_prefix}p{int(q * 100)}" + (f" {{{{{by}}}}}" if by else ""),
        )
        for q in (0.5, 0.95, 0.99)
    ]


def use_panels(layout, sel):
    """USE: CPU, memory and file descriptors of every process, from process_* metrics."""
    layout.row("Resources (USE)")
    layout.add(
        timeseries(
            "CPU used",
            [(f"sum by (pod) (rate(process_cpu_seconds_total{{{sel}}}[{RATE}]))", "{{pod}}")],
            unit="cores",
            description="CPU seconds per second of each process (compare with the pod's CPU limit).",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Resident memory",
            [(f"sum by (pod) (process_resident_memory_bytes{{{sel}}})", "{{pod}}")],
            unit="bytes",
            description="Resident set size of each process (compare with the pod's memory limit).",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "File descriptors used",
            [(f"sum by (pod) (process_open_fds{{{sel}}}) / sum by (pod) (process_max_fds{{{sel}}})", "{{pod}}")],
            unit="percentunit",
            minimum=0,
            description="Open file descriptors as a share of the process's limit (connections, index files).",
        ),
        w=8,
    )


def variables(metric, tenants=False):
    """The datasource, namespace and pod variables, the last two read off `metric`; with
    `tenants`, a tenant variable too (also read off `metric`, which must carry the label)."""
    found = [
        dashboards.DatasourceVariable("datasource").label("Data source").type("prometheus").multi(False).include_all(False),
        label_variable("namespace", "Namespace", f"label_values({metric}, namespace)", pick_many=False),
        label_variable("pod", "Pod", f'label_values({metric}{{namespace="$namespace"}}, pod)'),
    ]
    if tenants:
        tenant = label_variable("tenant", "Tenant", f'label_values({metric}{{namespace="$namespace"}}, tenant)')
        tenant.description("Filters the panels whose metrics carry a tenant label (requests and caches).")
        found.append(tenant)
    return found


def label_variable(name, label, definition, pick_many=True):
    """A query variable over the label values `definition` lists; with `pick_many`, several
    values or all of them may be picked."""
    variable = (
        dashboards.QueryVariable(name)
        .label(label)
        .datasource(DS)
        .query({"query": definition, "refId": name})
        .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(models.VariableSort.ALPHABETICAL_ASC)
        .include_all(pick_many)
        .multi(pick_many)
    )
    if pick_many:
        variable.all_value(".*")
    return variable


def dashboard(uid, title, description, layout, templating):
    built = (
        dashboards.Dashboard(title)
        .uid(uid)
        .description(description)
        .editable()
        .tooltip(models.DashboardCursorSync.CROSSHAIR)
        .annotation(
            dashboards.AnnotationQuery()
            .name("Annotations & Alerts")
            .datasource(models.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .type("dashboard")
            .built_in(1)
        )
        .link(
            dashboards.DashboardLink("Hasten")
            .type(models.DashboardLinkType.DASHBOARDS)
            .tags(["hasten"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
        .refresh("30s")
        .tags(["hasten"])
        .time("now-3h", "now")
        .timezone("")
        .version(1)
        .variables(templating)
    )
    for kind, item in layout.items:
        if kind == "row":
            built.with_row(item)
        else:
            built.with_panel(item)
    return built.build()


def edge():
    s = 'namespace="$namespace", pod=~"$pod"'
    # Series that carry a tenant label (requests, cache sizes) also follow the tenant filter.
    # Requests refused before their tenant was known (no or an unknown bearer token) have an
    # empty tenant, which the filter's "All" (.*) keeps.
    st = f'{s}, tenant=~"$tenant"'
    req = "hasten_edge_requests_total"
    layout = Layout()
    layout.row("Requests (RED)")
    layout.add(
        timeseries(
            "Requests by outcome",
            [(f"sum by (outcome) (rate({req}{{{st}}}[{RATE}]))", "{{outcome}}")],
            unit="reqps",
            stack=True,
            description="Queries answered per second, all tenants together: accepted drafts, "
            "cloud fallbacks and errors.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Errors by kind",
            [(f"sum by (kind) (rate(hasten_edge_request_errors_total{{{s}}}[{RATE}]))", "{{kind}}")],
            unit="reqps",
            stack=True,
            description="Client side: invalid_argument (bad requests), unauthenticated (no or an "
            "unknown bearer token). Server side: unavailable (the cloud was unreachable or too "
            "slow for a query that needed it), deadline_exceeded (the client's "
            "x-request-timeout-ms or grpc-timeout passed first), overloaded (max_in_flight "
            "reached), internal (a bug). Not split by tenant.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Error ratio",
            [(f'sum(rate({req}{{{st}, outcome="error"}}[{RATE}])) / sum(rate({req}{{{st}}}[{RATE}]))', "errors")],
            unit="percentunit",
            minimum=0,
            description="Share of requests that ended in an error (the HastenEdgeErrorRate alert "
            "counts server-side errors only).",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Latency (end to end, all outcomes)",
            quantiles("hasten_edge_request_duration_seconds", s),
            unit="s",
            description="Time inside the edge from request to response, encoder and cloud included.",
        )
    )
    layout.add(
        timeseries(
            "Latency by outcome (p50, p99)",
            [
                (quantile(0.5, "hasten_edge_request_duration_seconds", s, "outcome"), "p50 {{outcome}}"),
                (quantile(0.99, "hasten_edge_request_duration_seconds", s, "outcome"), "p99 {{outcome}}"),
            ],
            unit="s",
            description="Accepted drafts are answered at the edge (about a millisecond); "
            "fallbacks pay the round trip to the cloud.",
        )
    )
    layout.row("Tenants")
    layout.add(
        timeseries(
            "Requests by tenant",
            [(f'sum by (tenant) (rate({req}{{{st}, tenant!=""}}[{RATE}]))', "{{tenant}}")],
            unit="reqps",
            stack=True,
            description="Requests per second of each tenant, whatever their outcome. Edges without "
            "a tenants file count everything under `default`; requests refused for their token "
            "belong to no tenant (Errors by kind: unauthenticated).",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Draft acceptance rate by tenant",
            [
                (
                    f'sum by (tenant) (rate({req}{{{st}, outcome="accepted"}}[{RATE}])) / sum by (tenant) (rate({req}{{{st}, outcome=~"accepted|fallback"}}[{RATE}]))',
                    "{{tenant}}",
                )
            ],
            unit="percentunit",
            minimum=0,
            maximum=1,
            description="Each tenant's drafts are validated against its own cache only, so a "
            "tenant with few or scattered queries accepts fewer drafts.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Cached queries by tenant",
            [(f"max by (tenant) (hasten_edge_cache_entries{{{st}}})", "{{tenant}}")],
            description="Entries of each tenant's hot cache on the edge holding most (with the "
            "control plane every edge holds the same entries). Each tenant's cache holds up to "
            "cache_capacity queries.",
        ),
        w=8,
    )
    layout.row("HaS speculation")
    layout.add(
        timeseries(
            "Draft acceptance rate (DAR)",
            [
                (
                    f'sum(rate({req}{{{st}, outcome="accepted"}}[{RATE}])) / sum(rate({req}{{{st}, outcome=~"accepted|fallback"}}[{RATE}]))',
                    "all edges",
                ),
                (f"hasten_edge_draft_acceptance_ratio{{{s}}}", "{{pod}} (last 1000)"),
            ],
            unit="percentunit",
            minimum=0,
            maximum=1,
            description="Share of answered queries whose draft was accepted (the HaS paper: ~30%). "
            "A sudden drop means the hot cache was lost or the workload moved to new topics. The "
            "per-edge gauge covers every tenant.",
        )
    )
    layout.add(
        timeseries(
            "Cloud fallbacks",
            [
                (f'sum by (pod) (rate({req}{{{st}, outcome="fallback"}}[{RATE}]))', "{{pod}}"),
            ],
            unit="reqps",
            stack=True,
            description="Queries per second whose draft was rejected and that went to the cloud "
            "(each one is cached, and replicated when the control plane runs).",
        )
    )
    layout.add(
        heatmap(
            "Latency of accepted drafts",
            f'sum by (le) (increase(hasten_edge_request_duration_seconds_bucket{{{s}, outcome="accepted"}}[{RATE}]))',
        ),
        w=8,
    )
    layout.add(
        heatmap(
            "Latency of fallbacks",
            f'sum by (le) (increase(hasten_edge_request_duration_seconds_bucket{{{s}, outcome="fallback"}}[{RATE}]))',
        ),
        w=8,
    )
    layout.add(
        heatmap(
            "Homology score distribution",
            f"sum by (le) (increase(hasten_edge_homology_score_bucket{{{s}}}[{RATE}]))",
            unit="none",
            description="Best cached query's votes / k for every draft; drafts at or above tau "
            "(0.2 by default) are accepted. Mass piling up at 0 means the cache holds nothing "
            "related to the current queries.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Stage latency p95",
            [
                (
                    quantile(0.95, "hasten_edge_stage_duration_seconds", s, "stage"),
                    "{{stage}}",
                )
            ],
            unit="s",
            description="encode, the two draft channels, homology validation and the cloud fallback.",
        ),
        w=24,
    )
    layout.row("Hot cache and replication")
    layout.add(
        timeseries(
            "Cached queries",
            [(f"sum by (pod) (hasten_edge_cache_entries{{{st}}})", "{{pod}}")],
            description="Entries of the FIFO hot caches of each edge, summed over tenants.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Cached documents",
            [(f"sum by (pod) (hasten_edge_cache_documents{{{st}}})", "{{pod}}")],
            description="Distinct documents in each tenant's cache channel, summed over tenants.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Cache memory",
            [(f"sum by (pod) (hasten_edge_cache_bytes{{{st}}})", "{{pod}}")],
            unit="bytes",
            description="Estimated bytes held by each edge's hot caches, summed over tenants.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Subscribed to the control plane",
            [(f"hasten_edge_control_plane_subscribed{{{s}}}", "{{pod}}")],
            minimum=0,
            maximum=1,
            description="1 while the edge streams committed entries from a control-plane node.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Applied control-plane index",
            [(f"hasten_edge_control_plane_applied_index{{{s}}}", "{{pod}}")],
            description="Edges that applied the same index hold the same cache; a flat line "
            "under the others is an edge falling behind.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Cache proposals",
            [(f"sum by (result) (rate(hasten_edge_proposals_total{{{s}}}[{RATE}]))", "{{result}}")],
            unit="ops",
            stack=True,
            description="Fallback results offered to the control plane: sent, or dropped on a full queue.",
        ),
        w=8,
    )
    use_panels(layout, s)
    return dashboard(
        "hasten-edge",
        "Hasten / Edge",
        "HaS edges: traffic, errors and latency by outcome, tenants, speculation (DAR, "
        "fallbacks, homology scores), the hot caches and their replication, resources.",
        layout,
        variables("hasten_edge_requests_total", tenants=True),
    )


def cloud():
    s = 'namespace="$namespace", pod=~"$pod"'
    searches = "hasten_cloud_searches_total"
    dur = "hasten_cloud_search_duration_seconds"
    layout = Layout()
    layout.row("Searches (RED)")
    layout.add(
        timeseries(
            "Searches by role and outcome",
            [(f"sum by (role, outcome) (rate({searches}{{{s}}}[{RATE}]))", "{{role}} {{outcome}}")],
            unit="reqps",
            description="Router: searches from edges and tools; shard: searches fanned out to it.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Error ratio by role",
            [
                (
                    f'sum by (role) (rate({searches}{{{s}, outcome="error"}}[{RATE}])) / sum by (role) (rate({searches}{{{s}}}[{RATE}]))',
                    "{{role}}",
                )
            ],
            unit="percentunit",
            minimum=0,
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Routed search latency",
            quantiles(dur, f'{s}, role="router", shard="all"'),
            unit="s",
            description="Whole search through the router: fan-out, slowest shard, merge.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Shard search latency p99 (on the shards)",
            [
                (
                    quantile(0.99, dur, f'{s}, role="shard"', "shard"),
                    "shard {{shard}}",
                )
            ],
            unit="s",
        )
    )
    layout.add(
        timeseries(
            "Shard fan-out latency p99 (seen by the routers)",
            [
                (
                    quantile(0.99, dur, f'{s}, role="router", shard!="all"', "shard"),
                    "shard {{shard}}",
                )
            ],
            unit="s",
            description="Network and failover included; a gap to the shard-side latency is time on the wire or in retries.",
        )
    )
    layout.add(
        heatmap(
            "Routed search latency distribution",
            f'sum by (le) (increase({dur}_bucket{{{s}, role="router", shard="all"}}[{RATE}]))',
        ),
        w=24,
    )
    layout.row("Batching")
    layout.add(
        timeseries(
            "Average batch size",
            [
                (
                    f"sum by (role) (rate(hasten_cloud_batch_queries_sum{{{s}}}[{RATE}])) / sum by (role) (rate(hasten_cloud_batch_queries_count{{{s}}}[{RATE}]))",
                    "{{role}}",
                )
            ],
            description="Query vectors per batch: concurrent searches coalesced into one faiss call (shard) or one request per shard (router).",
        ),
        w=8,
    )
    layout.add(
        heatmap(
            "Batch size distribution (shards)",
            f'sum by (le) (increase(hasten_cloud_batch_queries_bucket{{{s}, role="shard"}}[{RATE}]))',
            unit="short",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Queue depth",
            [(f"hasten_cloud_queue_depth{{{s}}}", "{{pod}} ({{role}})")],
            description="Searches waiting to be batched; a queue that keeps growing is a saturated shard.",
        ),
        w=8,
    )
    layout.row("Replicas and failover")
    layout.add(
        timeseries(
            "Live replicas per shard",
            [(f"min by (shard) (hasten_cloud_shard_live_replicas{{{s}}})", "shard {{shard}}")],
            minimum=0,
            description="Fewest live replicas any router sees. 0: searches fail with UNAVAILABLE.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Replica health",
            [(f"min by (shard, endpoint) (hasten_cloud_replica_up{{{s}}})", "{{shard}} {{endpoint}}")],
            minimum=0,
            maximum=1,
            description="1 while the routers' health checks pass for the replica.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Failovers",
            [(f"sum by (shard) (rate(hasten_cloud_failovers_total{{{s}}}[{RATE}]))", "shard {{shard}}")],
            unit="ops",
            description="Searches retried on another replica after one failed or timed out.",
        ),
        w=8,
    )
    use_panels(layout, s)
    return dashboard(
        "hasten-cloud",
        "Hasten / Cloud",
        "The cloud tier: routed and per-shard search traffic, errors and latency, batching, "
        "replica health and failovers, resources.",
        layout,
        variables("hasten_cloud_searches_total"),
    )


def control_plane():
    s = 'namespace="$namespace", pod=~"$pod"'
    layout = Layout()
    layout.row("Raft health")
    layout.add(
        stat(
            "Has a leader",
            'min(hasten_cp_has_leader{namespace="$namespace"})',
            mappings={"0": ("NO LEADER", "red"), "1": ("yes", "green")},
            steps=[(None, "red"), (1, "green")],
            description="Every node knows a leader (the least informed node counts).",
        ),
        w=6,
        h=5,
    )
    layout.add(
        stat(
            "Leader",
            'max by (pod) (hasten_cp_is_leader{namespace="$namespace"}) == 1',
            legend="{{pod}}",
            text_mode="name",
            description="The node that considers itself leader (two names: a split brain during a term change).",
        ),
        w=6,
        h=5,
    )
    layout.add(stat("Term", 'max(hasten_cp_term{namespace="$namespace"})', description="Raft term; it grows at each election."), w=6, h=5)
    layout.add(
        stat(
            "Leader changes (1h)",
            'sum(increase(hasten_cp_leader_changes_total{namespace="$namespace"}[1h]))',
            steps=[(None, "green"), (3, "orange"), (10, "red")],
            description="Frequent elections point at an overloaded node, a flaky network or a tick too short for it.",
        ),
        w=6,
        h=5,
    )
    layout.add(
        timeseries("Leadership by node", [(f"hasten_cp_is_leader{{{s}}}", "{{pod}}")], minimum=0, maximum=1, stack=True),
        w=8,
    )
    layout.add(timeseries("Term by node", [(f"hasten_cp_term{{{s}}}", "{{pod}}")]), w=8)
    layout.add(
        timeseries(
            "Has leader by node",
            [(f"hasten_cp_has_leader{{{s}}}", "{{pod}}")],
            minimum=0,
            maximum=1,
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Commit and applied index",
            [
                (f"hasten_cp_commit_index{{{s}}}", "commit {{pod}}"),
                (f"hasten_cp_applied_index{{{s}}}", "applied {{pod}}"),
            ],
        )
    )
    layout.add(
        timeseries(
            "Commit - applied gap",
            [(f"hasten_cp_commit_index{{{s}}} - hasten_cp_applied_index{{{s}}}", "{{pod}}")],
            minimum=0,
            description="Committed entries a node has not applied yet; it should stay near 0.",
        )
    )
    layout.row("Proposals and replication")
    layout.add(
        timeseries(
            "Proposals by result",
            [(f"sum by (result) (rate(hasten_cp_proposals_total{{{s}}}[{RATE}]))", "{{result}}")],
            unit="ops",
            stack=True,
            description="Proposals (edges' cached fallbacks) committed or dropped (no leader, timeout).",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Replication lag",
            quantiles("hasten_cp_replication_lag_seconds", s),
            unit="s",
            description="From a proposal to its application on the node that proposed it.",
        ),
        w=8,
    )
    layout.add(
        heatmap(
            "Replication lag distribution",
            f"sum by (le) (increase(hasten_cp_replication_lag_seconds_bucket{{{s}}}[{RATE}]))",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Subscribers",
            [(f"hasten_cp_subscribers{{{s}}}", "{{pod}}")],
            description="Edges streaming committed entries from each node.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Leader changes",
            [(f"sum by (pod) (increase(hasten_cp_leader_changes_total{{{s}}}[{RATE}]))", "{{pod}}")],
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Snapshots",
            [(f"sum by (pod) (increase(hasten_cp_snapshots_total{{{s}}}[{RATE}]))", "{{pod}}")],
            description="Snapshots taken (log compaction) or installed.",
        ),
        w=8,
    )
    layout.row("Log and snapshots")
    layout.add(
        timeseries(
            "Log entries kept",
            [(f"hasten_cp_log_entries{{{s}}}", "{{pod}}")],
            description="Applied entries kept before the next snapshot truncates the log (max_log_entries).",
        )
    )
    layout.add(
        timeseries("Snapshot size", [(f"hasten_cp_snapshot_bytes{{{s}}}", "{{pod}}")], unit="bytes")
    )
    layout.add(
        timeseries(
            "Raft thread time per Ready, by phase",
            [
                (
                    f"sum by (pod, phase) (rate(hasten_cp_ready_phase_seconds_sum{{{s}}}[{RATE}])) "
                    f"/ sum by (pod, phase) (rate(hasten_cp_ready_phase_seconds_count{{{s}}}[{RATE}]))",
                    "{{pod}} {{phase}}",
                )
            ],
            unit="s",
            description="Mean time on the node's Raft thread per Ready: persist (log write and "
            "fdatasync; slow disks show here), apply (state machine, events to subscribers), "
            "compact (per snapshot: taking the state and truncating the log).",
        ),
        w=24,
    )
    use_panels(layout, s)
    return dashboard(
        "hasten-control-plane",
        "Hasten / Control plane",
        "The Raft control plane that replicates the edges' hot cache: leadership, terms, "
        "commit and apply progress, proposals, replication lag, log and snapshots, resources.",
        layout,
        variables("hasten_cp_term"),
    )


def kv_workers():
    s = 'namespace="$namespace", pod=~"$pod"'
    ns = 'namespace="$namespace"'
    layout = Layout()
    layout.row("Pools (KV operator)")
    layout.add(
        timeseries(
            "Workers ready of asked, by pool",
            [
                (f"sum by (pool) (hasten_kv_pool_ready_replicas{{{ns}}})", "{{pool}} ready"),
                (f"sum by (pool) (hasten_kv_pool_replicas{{{ns}}})", "{{pool}} asked"),
            ],
            minimum=0,
            description="Ready worker pods against the pool's replicas (KvWorkerPool spec, as the operator last reconciled it).",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Preprocessing Job age, by pool",
            [(f"max by (pool) (hasten_kv_pool_preprocessing_seconds{{{ns}}})", "{{pool}}")],
            unit="s",
            minimum=0,
            description="How long a new corpus version's preprocessing Job has run (0: none runs); workers serve the previous version meanwhile.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Operator reconciles",
            [
                (f"sum by (result) (rate(hasten_kv_operator_reconciles_total{{{ns}}}[{RATE}]))", "{{result}}"),
                (f"sum by (reason) (rate(hasten_kv_operator_reconcile_errors_total{{{ns}}}[{RATE}]))", "error: {{reason}}"),
                (f"max(hasten_kv_operator_leader{{{ns}}})", "leading"),
            ],
            unit="reqps",
            minimum=0,
            description="Reconciles per second by result, failures by reason (conflicts are retried at once), and whether a replica holds the Lease.",
        ),
        w=8,
    )
    layout.row("Generation")
    layout.add(
        timeseries(
            "Time to first token",
            quantiles("hasten_kv_time_to_first_token_seconds", s, by="mode"),
            unit="s",
            description="From receiving a request to its first token (queue and KV loads included), by fusion mode.",
        ),
        w=12,
    )
    layout.add(
        timeseries(
            "Time per output token and answer latency",
            quantiles("hasten_kv_time_per_output_token_seconds", s, by="mode", legend_prefix="per token ")
            + quantiles("hasten_kv_answer_duration_seconds", s, by="mode", legend_prefix="answer "),
            unit="s",
            description="An answer's decode time over its tokens after the first, and from "
            "receiving a request to its last token (queue included), by fusion mode.",
        ),
        w=12,
    )
    layout.add(
        timeseries(
            "Recomputed share of context tokens",
            [
                (
                    f"sum by (mode) (rate(hasten_kv_recomputed_tokens_total{{{s}}}[{RATE}])) / sum by (mode) (rate(hasten_kv_context_tokens_total{{{s}}}[{RATE}]))",
                    "{{mode}}",
                )
            ],
            unit="percentunit",
            minimum=0,
            maximum=1,
            description="Context tokens computed per request over all context tokens (1 in full-prefill; about the recompute ratio in fusionrag).",
        ),
        w=12,
    )
    layout.add(
        timeseries(
            "Chunk KV by source",
            [(f"sum by (from) (rate(hasten_kv_chunks_total{{{s}}}[{RATE}]))", "{{from}}")],
            unit="ops",
            stack=True,
            minimum=0,
            description="Chunks whose KV came from a memory tier, from disk, or was computed; KV-aware routing raises the memory share.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "KV load time",
            quantiles("hasten_kv_load_seconds", s),
            unit="s",
            description="Seconds to read a chunk's entry from disk into memory.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Queue and tier bytes",
            [
                (f"sum by (pod) (hasten_kv_queue{{{s}}})", "queue {{pod}}"),
                (f"sum by (tier) (hasten_kv_tier_bytes{{{s}}})", "bytes {{tier}}"),
            ],
            description="Requests waiting per worker, and chunk KV bytes held per tier.",
        ),
        w=8,
    )
    use_panels(layout, s)
    return dashboard(
        "hasten-kv-workers",
        "Hasten / KV workers",
        "FusionRAG KV worker pools: the operator's view of each pool, time to first token, where chunk KV comes from.",
        layout,
        variables("hasten_kv_queue"),
    )


def answers():
    s = 'namespace="$namespace", pod=~"$pod"'
    ns = 'namespace="$namespace"'
    layout = Layout()
    layout.row("Answers as users wait for them")
    layout.add(
        timeseries(
            "Time to first token",
            quantiles("hasten_edge_answer_first_token_seconds", s, by="mode"),
            unit="s",
            description="From a chat completion or /v1/answer reaching the edge to its first text: "
            "retrieval, the answer queue and the backend's prefill (KV workers: KV loads, "
            "selection, recompute). Alert: HastenAnswerTimeToFirstTokenHigh.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Time per output token",
            quantiles("hasten_edge_answer_time_per_output_token_seconds", s, by="mode"),
            unit="s",
            description="An answer's decode time over its tokens after the first (standard mode): "
            "the pace a streaming client sees.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Answer latency",
            quantiles("hasten_edge_answer_duration_seconds", s, by="mode"),
            unit="s",
            description="From request to the answer's last token.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Goodput and throughput",
            [
                ("sum(namespace:hasten_edge_answer_goodput:rate{" + ns + "})", "goodput (first token within the objective)"),
                (f"sum(rate(hasten_edge_answers_total{{{s}}}[{RATE}]))", "answers"),
            ],
            unit="reqps",
            minimum=0,
            description="Answers per second, and those whose first token came within "
            "`monitoring.answerGoodput.ttftSeconds` (the recording rule "
            "namespace:hasten_edge_answer_goodput:rate, namespace-wide). Goodput falling "
            "behind throughput is load beyond the answer backend.",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Answer queue",
            [(f"sum by (pod) (hasten_edge_answer_queue{{{s}}})", "{{pod}}")],
            minimum=0,
            description="Answers waiting for the answer backend on each edge (answer_queue "
            "bounds it; beyond it requests get 429 with Retry-After).",
        ),
        w=8,
    )
    layout.add(
        timeseries(
            "Cancelled and refused answers",
            [
                (f"sum(rate(hasten_answer_cancelled_total{{{s}}}[{RATE}]))", "cancelled by the client"),
                (f"sum by (kind) (rate(hasten_edge_answer_errors_total{{{s}}}[{RATE}]))", "{{kind}}"),
            ],
            unit="reqps",
            minimum=0,
            description="Streams whose client left before the end (generation stops at the next "
            "piece), and requests refused or failed by kind (overloaded: the queue was full).",
        ),
        w=8,
    )
    return dashboard(
        "hasten-answers",
        "Hasten / Answers",
        "Answers on the edges as users wait for them: time to first token, time per output token, answer latency, goodput at the objective, the answer queue, cancellations and refusals.",
        layout,
        variables("hasten_edge_answer_queue"),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when a file is stale instead of writing")
    args = parser.parse_args()
    stale = []
    for name, build in (
        ("hasten-edge", edge),
        ("hasten-answers", answers),
        ("hasten-cloud", cloud),
        ("hasten-control-plane", control_plane),
        ("hasten-kv-workers", kv_workers),
    ):
        text = json.dumps(build(), cls=JSONEncoder, indent=2) + "\n"
        path = OUT / f"{name}.json"
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}", file=sys.stderr)
    if stale:
        print("stale dashboards (run scripts/gen-dashboards.py): " + ", ".join(stale), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
