//! The dashboard's pages as HTML, made on the server: tables, a job's
//! timeline and the cost chart as inline SVG. Everything that comes from
//! state (names, reasons, log lines, addresses) goes through [`esc`].

use std::fmt::Write;

use serde_json::Value;

use super::model::{ClusterView, EventView, JobView, Source, COST_DAYS, LOG_LINES};
use crate::core::state::now_ms;
use crate::services::ui::{ago, duration};
use crate::Error;

/// The pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Page {
    /// Clusters and their nodes (the first page).
    Clusters,
    /// Managed jobs.
    Jobs,
    /// One managed job: timeline, runs, events, log tail.
    Job(i64),
    /// The cost report as a chart.
    Cost,
    /// Managed jobs' transitions, newest first.
    Events,
}

impl Page {
    fn title(self) -> String {
        match self {
            Page::Clusters => "Clusters".into(),
            Page::Jobs => "Managed jobs".into(),
            Page::Job(id) => format!("Managed job {id}"),
            Page::Cost => "Cost".into(),
            Page::Events => "Events".into(),
        }
    }
}

/// `s` with the characters that mean something in HTML replaced, fit for
/// text and for quoted attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + s.len() / 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Terminal colours and other control bytes in logs.
            c if c.is_control() && c != '\n' && c != '\t' => {}
            c => out.push(c),
        }
    }
    out
}

fn opt(s: Option<&str>) -> String {
    s.map_or_else(|| "-".into(), esc)
}

/// A length of time with tenths under a minute (recoveries take seconds).
fn fine(ms: i64) -> String {
    if ms < 60_000 {
        format!("{:.1}s", ms.max(0) as f64 / 1000.0)
    } else {
        duration(ms)
    }
}

fn money(x: f64) -> String {
    format!("${x:.4}")
}

/// A state as a coloured badge (the class is one of a fixed set, never
/// the state's own text).
fn badge(state: &str) -> String {
    format!(
        "<span class=\"badge {}\">{}</span>",
        state_class(state),
        esc(state)
    )
}

fn state_class(state: &str) -> &'static str {
    let s = state.split_whitespace().next().unwrap_or("");
    match s {
        "UP" | "RUNNING" | "SUCCEEDED" => "ok",
        "PREEMPTED" | "NOTICE" | "FAILED" | "FAILED_SETUP" | "FAILED_NO_RESOURCE"
        | "FAILED_DRIVER" => "bad",
        "RECOVERING" | "PROVISIONING" | "STARTING" | "INIT" | "PENDING" | "TERMINATING" => "busy",
        _ => "idle",
    }
}

/// The whole page around `main` (the inside of `<main>`).
pub(crate) fn document(page: Page, token: &str, main: &str) -> String {
    let t = esc(token);
    let nav = [
        (Page::Clusters, "/", "Clusters"),
        (Page::Jobs, "/jobs", "Managed jobs"),
        (Page::Cost, "/cost", "Cost"),
        (Page::Events, "/events", "Events"),
    ];
    let mut links = String::new();
    for (p, href, label) in nav {
        let current = p == page || (matches!(page, Page::Job(_)) && p == Page::Jobs);
        let _ = write!(
            links,
            "<a href=\"{href}?t={t}\"{}>{label}</a>",
            if current {
                " aria-current=\"page\""
            } else {
                ""
            }
        );
    }
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>gangway · {title}</title>\
         <link rel=\"stylesheet\" href=\"/static/style.css?t={t}\"></head>\
         <body><header><span class=\"brand\">gangway</span><nav>{links}</nav>\
         <span id=\"live\" class=\"live\" title=\"updated every 2 s\">live</span></header>\
         <main id=\"main\">{main}</main>\
         <script src=\"/static/app.js?t={t}\"></script></body></html>\n",
        title = esc(&page.title()),
    )
}

/// A page's inside: an error said plainly.
pub(crate) fn error_main(message: &str) -> String {
    format!(
        "<h1>Something went wrong</h1><p class=\"error\">{}</p>",
        esc(message)
    )
}

/// The inside of `<main>` for `page`, and the HTTP status.
pub(crate) fn main(src: &Source<'_>, page: Page, token: &str) -> Result<(u16, String), Error> {
    let t = esc(token);
    let mut out = String::new();
    if let Some(host) = src.controller() {
        let _ = write!(
            out,
            "<p class=\"note\">Managed jobs are read from the controller at {}.</p>",
            esc(&host)
        );
    }
    let status = match page {
        Page::Clusters => {
            clusters(&mut out, &src.clusters()?);
            200
        }
        Page::Jobs => {
            jobs(&mut out, &src.jobs()?, &t);
            200
        }
        Page::Job(id) => match src.job(id)? {
            Some(j) => {
                let events = src.events(id)?;
                let log = src.log_tail(id)?;
                job(&mut out, &j, &events, &log);
                200
            }
            None => {
                let _ = write!(
                    out,
                    "<h1>No managed job {id}</h1><p><a href=\"/jobs?t={t}\">All managed jobs</a></p>"
                );
                404
            }
        },
        Page::Cost => {
            cost(&mut out, &src.cost_report()?, &t);
            200
        }
        Page::Events => {
            events_page(&mut out, src.recent_events()?.as_deref(), &t);
            200
        }
    };
    Ok((status, out))
}

fn clusters(out: &mut String, list: &[ClusterView]) {
    let _ = write!(out, "<h1>Clusters <small>{}</small></h1>", list.len());
    if list.is_empty() {
        out.push_str(
            "<p class=\"empty\">No clusters. Launch one with <code>gangway launch TASK.yaml</code>.</p>",
        );
        return;
    }
    out.push_str(
        "<table class=\"clusters\"><thead><tr><th>Name</th><th>Status</th><th>Infra</th>\
         <th>Resources</th><th>Market</th><th class=\"num\">$/h</th><th class=\"num\">Jobs</th>\
         <th>Age</th></tr></thead><tbody>",
    );
    let now = now_ms();
    for c in list {
        let r = &c.row;
        let infra = match (&r.cloud, &r.region, &r.zone) {
            (Some(cl), Some(rg), Some(z)) => format!("{cl}/{rg}/{z}"),
            _ => "-".into(),
        };
        let gpus = r
            .accelerator
            .as_ref()
            .map(|g| format!(" ({g}:{})", r.accelerator_count))
            .unwrap_or_default();
        let _ = write!(
            out,
            "<tr class=\"cluster\" data-cluster=\"{name}\"><td class=\"name\">{name}{ctl}</td>\
             <td>{status}</td><td>{infra}</td><td>{n}x {ty}{gpus}</td><td>{market}</td>\
             <td class=\"num\">{price}</td><td class=\"num\">{jobs}</td>\
             <td title=\"launched {age_ms} ms ago\">{age}</td></tr>",
            name = esc(&r.name),
            ctl = if c.controller {
                " <small>(jobs controller)</small>"
            } else {
                ""
            },
            status = badge(&c.shown_status),
            infra = esc(&infra),
            n = r.num_nodes,
            ty = opt(r.instance_type.as_deref()),
            gpus = esc(&gpus),
            market = if r.use_spot { "spot" } else { "on-demand" },
            price = r
                .price_per_hour
                .map_or_else(|| "-".into(), |p| format!("{p:.2}")),
            jobs = c.active_jobs,
            age_ms = now - r.launched_at,
            age = esc(&ago(r.launched_at)),
        );
        if let Some(e) = &r.last_error {
            let _ = write!(
                out,
                "<tr class=\"problem\"><td></td><td colspan=\"7\">{}</td></tr>",
                esc(e)
            );
        }
        if !c.nodes.is_empty() {
            out.push_str(
                "<tr class=\"nodes\"><td></td><td colspan=\"7\"><table><thead><tr>\
                 <th>Rank</th><th>Instance</th><th>Private IP</th><th>Public IP</th><th>Zone</th>\
                 <th>Topology</th><th>State</th></tr></thead><tbody>",
            );
            for n in &c.nodes {
                let _ =
                    write!(
                    out,
                    "<tr class=\"node\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
                     <td>{}</td><td>{}</td></tr>",
                    n.rank,
                    esc(&n.instance_id),
                    esc(&n.private_ip),
                    opt(n.public_ip.as_deref()),
                    esc(&n.zone),
                    if n.topology.is_empty() { "-".into() } else { esc(&n.topology) },
                    esc(&n.state),
                );
            }
            out.push_str("</tbody></table></td></tr>");
        }
    }
    out.push_str("</tbody></table>");
}

fn jobs(out: &mut String, list: &[JobView], t: &str) {
    let _ = write!(out, "<h1>Managed jobs <small>{}</small></h1>", list.len());
    if list.is_empty() {
        out.push_str(
            "<p class=\"empty\">No managed jobs. Launch one with <code>gangway jobs launch TASK.yaml</code>.</p>",
        );
        return;
    }
    out.push_str(
        "<table class=\"jobs\"><thead><tr><th class=\"num\">ID</th><th>Name</th><th>State</th>\
         <th class=\"num\">Restarts</th><th class=\"num\">Preemptions</th>\
         <th class=\"num\">Cost so far</th><th>Placement</th><th>Last checkpoint</th>\
         <th>Submitted</th><th>Detail</th></tr></thead><tbody>",
    );
    for j in list.iter().rev() {
        let _ = write!(
            out,
            "<tr class=\"job\" data-job=\"{id}\"><td class=\"num\"><a href=\"/jobs/{id}?t={t}\">{id}</a></td>\
             <td><a href=\"/jobs/{id}?t={t}\">{name}</a></td><td>{state}</td>\
             <td class=\"num\">{restarts}</td><td class=\"num\">{pre}</td><td class=\"num\">{cost}</td>\
             <td>{placement}</td><td>{ckpt}</td><td>{submitted}</td><td>{detail}</td></tr>",
            id = j.id,
            name = opt(j.name.as_deref()),
            state = badge(&j.state),
            restarts = j.restarts,
            pre = j.preemptions,
            cost = money(j.cost),
            placement = opt(j.placement.as_deref()),
            ckpt = j.last_checkpoint.map_or_else(|| "-".into(), ago),
            submitted = esc(&ago(j.submitted_at)),
            detail = esc(
                j.detail
                    .as_deref()
                    .and_then(|d| d.lines().next())
                    .unwrap_or("")
            ),
        );
    }
    out.push_str("</tbody></table>");
}

/// One stretch of a job's timeline: a state from `from` to `to`.
struct Stretch<'a> {
    event: &'a EventView,
    to: i64,
}

fn stretches<'a>(events: &'a [EventView], end: i64) -> Vec<Stretch<'a>> {
    events
        .iter()
        .enumerate()
        .map(|(i, e)| Stretch {
            event: e,
            to: events.get(i + 1).map_or(end, |n| n.at).max(e.at),
        })
        .collect()
}

fn job(out: &mut String, j: &JobView, events: &[EventView], log: &str) {
    let now = now_ms();
    let _ = write!(
        out,
        "<h1>Managed job {} <small>{}</small> {}</h1>\
         <dl class=\"facts\"><dt>Cost so far</dt><dd class=\"cost\">{}</dd>\
         <dt>$/h now</dt><dd>{}</dd>\
         <dt>Restarts</dt><dd>{}</dd><dt>Preemptions</dt><dd class=\"preemptions\">{}</dd>\
         <dt>Placement</dt><dd>{}</dd><dt>Last checkpoint</dt><dd>{}</dd>\
         <dt>Submitted</dt><dd>{}</dd></dl>",
        j.id,
        opt(j.name.as_deref()),
        badge(&j.state),
        money(j.cost),
        j.price_per_hour
            .filter(|_| !j.ended())
            .map_or_else(|| "-".into(), |p| format!("{p:.2}")),
        j.restarts,
        j.preemptions,
        opt(j.placement.as_deref()),
        j.last_checkpoint.map_or_else(|| "none yet".into(), ago),
        esc(&ago(j.submitted_at)),
    );
    if j.nodes_replaced > 0 || j.survivors_waiting.0 > 0.0 {
        let (s, usd) = j.survivors_waiting;
        let _ = write!(
            out,
            "<p class=\"replaced\">{} lost node(s) replaced in place; the survivors waited \
             {s:.2} s alone, {} (<code>gangway cost-report</code> has the estimate against a \
             whole-gang recovery).</p>",
            j.nodes_replaced,
            if usd > 0.0 && usd < 0.01 {
                format!("${usd:.6}")
            } else {
                money(usd)
            }
        );
    }
    if let Some(d) = &j.detail {
        let _ = write!(
            out,
            "<p class=\"detail {}\">{}</p>",
            state_class(&j.state),
            esc(d)
        );
    }
    let end = if j.ended() {
        j.ended_at.or(events.last().map(|e| e.at)).unwrap_or(now)
    } else {
        now
    };
    let parts = stretches(events, end);
    out.push_str("<h2>Timeline</h2>");
    timeline_svg(out, &parts);
    story(out, &parts);
    out.push_str(
        "<h2>Events</h2><table class=\"events\"><thead><tr><th>At</th><th>State</th>\
         <th>For</th><th>Placement</th><th>Reason</th></tr></thead><tbody>",
    );
    let first = events.first().map_or(0, |e| e.at);
    for s in &parts {
        let e = s.event;
        let _ = write!(
            out,
            "<tr class=\"event\"><td>+{:.1}s</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (e.at - first) as f64 / 1000.0,
            badge(&e.state),
            esc(&fine(s.to - e.at)),
            opt(e.placement.as_deref()),
            esc(&e.reason),
        );
    }
    out.push_str("</tbody></table>");
    let _ = write!(
        out,
        "<h2>Log <small>last {LOG_LINES} lines, every run</small></h2><pre class=\"log\" id=\"log\">{}</pre>",
        esc(log)
    );
}

/// The timeline as bars: one rectangle per stretch in its state's colour,
/// a mark at each preemption.
fn timeline_svg(out: &mut String, parts: &[Stretch<'_>]) {
    const W: f64 = 960.0;
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
        out.push_str("<p class=\"empty\">No transitions yet.</p>");
        return;
    };
    let t0 = first.event.at;
    let span = (last.to - t0).max(1) as f64;
    let x = |t: i64| (t - t0) as f64 / span * W;
    let _ = write!(
        out,
        "<svg class=\"timeline\" viewBox=\"0 0 {W} 64\" width=\"100%\" role=\"img\" \
         aria-label=\"timeline\" preserveAspectRatio=\"none\">"
    );
    for s in parts {
        let (x0, x1) = (x(s.event.at), x(s.to));
        let _ = write!(
            out,
            "<rect class=\"st {cls}\" x=\"{x0:.1}\" y=\"8\" width=\"{w:.1}\" height=\"28\">\
             <title>{state} for {d}{why}</title></rect>",
            cls = state_class(&s.event.state),
            w = (x1 - x0).max(1.0),
            state = esc(&s.event.state),
            d = esc(&fine(s.to - s.event.at)),
            why = if s.event.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", esc(&s.event.reason))
            },
        );
        if s.event.state == "PREEMPTED" {
            let _ = write!(
                out,
                "<line class=\"preempt\" x1=\"{x0:.1}\" x2=\"{x0:.1}\" y1=\"2\" y2=\"42\"/>"
            );
        }
    }
    let _ = write!(
        out,
        "<text x=\"0\" y=\"58\">0s</text><text x=\"{W}\" y=\"58\" text-anchor=\"end\">{}</text></svg>",
        esc(&duration(last.to - t0))
    );
}

/// Runs, preemptions and recoveries in words: what a person reads first.
/// A run starts when its cluster is up (`STARTING`) and is timed from when
/// it ran (`RUNNING`, if it got there); a preemption, a requeue or the end
/// closes it. A recovery is timed from the preemption to the next run
/// running.
fn story(out: &mut String, parts: &[Stretch<'_>]) {
    struct Open {
        started: i64,
        running: Option<i64>,
        placement: Option<String>,
    }
    let mut items: Vec<String> = Vec::new();
    let mut runs = 0;
    let mut preemptions = 0;
    let mut open: Option<Open> = None;
    let mut lost: Option<(i64, u32)> = None;
    let recovered = |items: &mut Vec<String>, lost: &mut Option<(i64, u32)>, at: i64| {
        if let Some((from, n)) = lost.take() {
            items.push(format!(
                "<li class=\"recovery\">Recovery {n}: running again after {}</li>",
                esc(&fine(at - from))
            ));
        }
    };
    let mut close = |items: &mut Vec<String>, open: &mut Option<Open>, at: i64, so_far: bool| {
        if let Some(r) = open.take() {
            runs += 1;
            items.push(format!(
                "<li class=\"run\">Run {runs} on {}: {}{}</li>",
                opt(r.placement.as_deref()),
                esc(&fine(at - r.running.unwrap_or(r.started))),
                if so_far { " so far" } else { "" }
            ));
        }
    };
    for s in parts {
        let e = s.event;
        match e.state.as_str() {
            "STARTING" | "RUNNING" => {
                let r = open.get_or_insert_with(|| Open {
                    started: e.at,
                    running: None,
                    placement: e.placement.clone(),
                });
                if e.state == "RUNNING" && r.running.is_none() {
                    r.running = Some(e.at);
                    recovered(&mut items, &mut lost, e.at);
                }
            }
            "PREEMPTED" => {
                close(&mut items, &mut open, e.at, false);
                preemptions += 1;
                lost = Some((e.at, preemptions));
                items.push(format!(
                    "<li class=\"preemption\">Preemption {preemptions}{}</li>",
                    if e.reason.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", esc(&e.reason))
                    }
                ));
            }
            "RECOVERING" => close(&mut items, &mut open, e.at, false),
            state
                if matches!(
                    state,
                    "SUCCEEDED" | "FAILED" | "FAILED_SETUP" | "FAILED_NO_RESOURCE" | "CANCELLED"
                ) =>
            {
                if let Some(r) = &open {
                    let at = r.started;
                    recovered(&mut items, &mut lost, at);
                }
                close(&mut items, &mut open, e.at, false);
                items.push(format!(
                    "<li class=\"end\">{}{}</li>",
                    badge(state),
                    if e.reason.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", esc(&e.reason))
                    }
                ));
            }
            _ => {}
        }
    }
    if let Some(last) = parts.last() {
        close(&mut items, &mut open, last.to, true);
    }
    if let Some((_, n)) = lost {
        items.push(format!(
            "<li class=\"recovery\">Recovery {n}: under way</li>"
        ));
    }
    if !items.is_empty() {
        let _ = write!(out, "<ol class=\"story\">{}</ol>", items.join(""));
    }
}

fn cost(out: &mut String, report: &Value, t: &str) {
    const SHOWN: usize = 25;
    let total = report["total"].as_f64().unwrap_or(0.0);
    let _ = write!(
        out,
        "<h1>Cost <small>last {COST_DAYS} days</small></h1><p class=\"total\">Total {}</p>",
        money(total)
    );
    let mut bars: Vec<(String, Option<String>, f64, f64)> = Vec::new();
    // Borrowed: the report holds every ledger row of every job.
    let list = |k: &str| report[k].as_array().map_or(&[][..], Vec::as_slice);
    for c in list("clusters") {
        let m = &c["by_market"];
        bars.push((
            format!("cluster {}", c["name"].as_str().unwrap_or("-")),
            None,
            m["spot"].as_f64().unwrap_or(0.0),
            c["cost"].as_f64().unwrap_or(0.0),
        ));
    }
    for j in list("managed_jobs") {
        let m = &j["by_market"];
        let id = j["id"].as_i64().unwrap_or(0);
        let name = j["name"]
            .as_str()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        bars.push((
            format!("job {id}{name}"),
            Some(format!("/jobs/{id}?t={t}")),
            m["spot"].as_f64().unwrap_or(0.0),
            j["cost"].as_f64().unwrap_or(0.0),
        ));
    }
    if bars.is_empty() {
        let _ = write!(
            out,
            "<p class=\"empty\">Nothing was up in the last {COST_DAYS} days: no cost recorded.</p>"
        );
        return;
    }
    bars.sort_by(|a, b| b.3.total_cmp(&a.3));
    let most = bars.first().map_or(0.0, |b| b.3).max(1e-9);
    let shown = bars.len().min(SHOWN);
    let (label_w, bar_w, row_h) = (260.0, 560.0, 26.0);
    let height = row_h * shown as f64 + 30.0;
    let _ = write!(
        out,
        "<svg class=\"chart\" viewBox=\"0 0 {w} {height}\" width=\"100%\" role=\"img\" \
         aria-label=\"cost by cluster and managed job\">\
         <g class=\"legend\"><rect class=\"spot\" x=\"{label_w}\" y=\"4\" width=\"12\" height=\"12\"/>\
         <text x=\"{lx1}\" y=\"14\">spot</text>\
         <rect class=\"ondemand\" x=\"{lx2}\" y=\"4\" width=\"12\" height=\"12\"/>\
         <text x=\"{lx3}\" y=\"14\">on-demand</text></g>",
        w = label_w + bar_w + 120.0,
        lx1 = label_w + 16.0,
        lx2 = label_w + 70.0,
        lx3 = label_w + 86.0,
    );
    for (i, (label, link, spot, all)) in bars.iter().take(shown).enumerate() {
        let y = 26.0 + row_h * i as f64;
        let spot_w = spot.min(*all) / most * bar_w;
        let all_w = all / most * bar_w;
        // Long names are cut to fit; the bar's tooltip has them whole.
        let shown_label: String = if label.chars().count() > 36 {
            label.chars().take(35).chain(['…']).collect()
        } else {
            label.clone()
        };
        let text = format!(
            "<text class=\"label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            label_w - 8.0,
            y + 15.0,
            esc(&shown_label)
        );
        match link {
            Some(href) => {
                let _ = write!(out, "<a href=\"{href}\">{text}</a>");
            }
            None => out.push_str(&text),
        }
        let _ = write!(
            out,
            "<g class=\"bar\"><title>{title}: {cost}</title>\
             <rect class=\"ondemand\" x=\"{label_w}\" y=\"{y}\" width=\"{od:.1}\" height=\"20\"/>\
             <rect class=\"spot\" x=\"{label_w}\" y=\"{y}\" width=\"{spot_w:.1}\" height=\"20\"/></g>\
             <text class=\"value\" x=\"{vx:.1}\" y=\"{ty}\">{cost}</text>",
            title = esc(label),
            cost = money(*all),
            od = all_w.max(0.5),
            vx = label_w + all_w + 6.0,
            ty = y + 15.0,
        );
    }
    out.push_str("</svg>");
    if bars.len() > shown {
        let rest: f64 = bars.iter().skip(shown).map(|b| b.3).sum();
        let _ = write!(
            out,
            "<p class=\"note\">{} more, {} together (<code>gangway cost-report</code> lists every one).</p>",
            bars.len() - shown,
            money(rest)
        );
    }
    let controller = &report["controller"];
    let _ = write!(
        out,
        "<p class=\"note\">Managed-job controller: {} ({}).</p>",
        esc(controller["host"].as_str().unwrap_or("local")),
        money(controller["cost"].as_f64().unwrap_or(0.0))
    );
}

fn events_page(out: &mut String, events: Option<&[EventView]>, t: &str) {
    out.push_str("<h1>Events</h1>");
    let Some(events) = events else {
        out.push_str(
            "<p class=\"empty\">The hosted controller keeps the events: each managed job's page shows its own.</p>",
        );
        return;
    };
    if events.is_empty() {
        out.push_str("<p class=\"empty\">No managed-job events yet.</p>");
        return;
    }
    out.push_str(
        "<table class=\"events\"><thead><tr><th>When</th><th>Job</th><th>State</th>\
         <th>Placement</th><th>Reason</th></tr></thead><tbody>",
    );
    for e in events {
        let _ = write!(
            out,
            "<tr class=\"event\"><td>{}</td><td><a href=\"/jobs/{id}?t={t}\">{id}</a></td><td>{}</td>\
             <td>{}</td><td>{}</td></tr>",
            esc(&ago(e.at)),
            badge(&e.state),
            opt(e.placement.as_deref()),
            esc(&e.reason),
            id = e.job,
        );
    }
    out.push_str("</tbody></table>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"y\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;"
        );
        assert_eq!(esc("a\x1b[31mred\x1b[0m\n"), "a[31mred[0m\n");
    }

    fn ev(at: i64, state: &str, reason: &str) -> EventView {
        EventView {
            job: 1,
            at,
            state: state.into(),
            placement: Some("local/local/local-1".into()),
            reason: reason.into(),
        }
    }

    #[test]
    fn the_story_tells_runs_preemptions_and_recoveries() {
        let events = vec![
            ev(0, "PROVISIONING", ""),
            ev(1_000, "RUNNING", ""),
            ev(11_000, "PREEMPTED", "node 1 was preempted"),
            ev(12_000, "RECOVERING", "relaunching"),
            ev(20_000, "RUNNING", ""),
            ev(30_000, "SUCCEEDED", ""),
        ];
        let parts = stretches(&events, 30_000);
        let mut out = String::new();
        story(&mut out, &parts);
        assert!(out.contains("Run 1 on local/local/local-1: 10.0s"), "{out}");
        assert!(out.contains("Preemption 1: node 1 was preempted"), "{out}");
        assert!(
            out.contains("Recovery 1: running again after 9.0s"),
            "{out}"
        );
        assert!(
            out.contains("Run 2 on local/local/local-1: 10.0s</li>"),
            "{out}"
        );
        // A run that ended before it was seen running is still a run.
        let quick = vec![ev(0, "STARTING", ""), ev(300, "SUCCEEDED", "")];
        let mut out = String::new();
        story(&mut out, &stretches(&quick, 300));
        assert!(
            out.contains("Run 1 on local/local/local-1: 0.3s</li>"),
            "{out}"
        );
        // A job still running: its run so far, and a recovery under way.
        let live = vec![ev(0, "RUNNING", ""), ev(5_000, "PREEMPTED", "gone")];
        let mut out = String::new();
        story(&mut out, &stretches(&live, 7_000));
        assert!(
            out.contains("Run 1 on local/local/local-1: 5.0s</li>"),
            "{out}"
        );
        assert!(out.contains("Recovery 1: under way"), "{out}");
        let mut svg = String::new();
        timeline_svg(&mut svg, &parts);
        assert_eq!(svg.matches("<rect").count(), 6, "{svg}");
        assert!(svg.contains("class=\"preempt\""), "{svg}");
        assert!(svg.contains("x1=\"352.0\""), "{svg}");
    }

    #[test]
    fn hostile_names_stay_text_in_every_table() {
        let j = JobView {
            id: 7,
            name: Some("<script>alert(1)</script>".into()),
            state: "RUNNING".into(),
            restarts: 0,
            preemptions: 0,
            cost: 0.5,
            placement: Some("<img src=x onerror=alert(2)>".into()),
            detail: None,
            last_checkpoint: None,
            submitted_at: 0,
            ended_at: None,
            price_per_hour: Some(1.0),
            nodes_replaced: 0,
            survivors_waiting: (0.0, 0.0),
        };
        let mut out = String::new();
        jobs(&mut out, std::slice::from_ref(&j), "tok");
        job(
            &mut out,
            &j,
            &[ev(0, "RUNNING", "<b>why</b>")],
            "<script>log</script>",
        );
        assert!(!out.contains("<script>"), "{out}");
        assert!(!out.contains("<img"), "{out}");
        assert!(!out.contains("<b>"), "{out}");
        assert!(
            out.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{out}"
        );
        assert!(!out.contains("class=\"replaced\""), "{out}");
        // A job whose lost node was replaced says so, with the wait.
        let j = JobView {
            nodes_replaced: 1,
            survivors_waiting: (12.5, 0.031),
            ..j
        };
        let mut out = String::new();
        job(&mut out, &j, &[], "");
        assert!(
            out.contains(
                "1 lost node(s) replaced in place; the survivors waited 12.50 s alone, $0.03"
            ),
            "{out}"
        );
    }
}
