//! `hasten-loadtest run`: load on a deployment that runs already (edge URLs, a token, a CA),
//! and what such a run reports: latency percentiles up to p99.99 and the maximum, an HDR
//! percentile spectrum (`.hgrm`, HdrHistogram's text format), a per-second time series, a
//! log-scale percentile plot, and thresholds that fail the run (k6's convention: exit 99).

use display_full_error::DisplayFullErrorExt;
use std::fmt::Write as _;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use hdrhistogram::Histogram;
use plotters::prelude::*;
use serde::Serialize;

use crate::driver::Sent;
use crate::scoring::histogram_of;

/// The exit status of a run whose thresholds failed (k6's).
pub const THRESHOLDS_FAILED_EXIT: i32 = 99;

/// Percentiles every run reports.
pub const PERCENTILES: [f64; 5] = [50.0, 90.0, 99.0, 99.9, 99.99];

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RemoteError {
    #[error(
        "threshold {0:?}: expected METRIC<VALUE or METRIC>VALUE (<=, >= too) with METRIC one of \
         p50, p90, p99, p99.9, p99.99, max, mean, errors, rps, e.g. p99<0.2s or errors<0.1%; \
         with --target answers, a latency figure of the first token or of the gaps between \
         tokens too: ttft_p99<2s, itl_p50<100ms"
    )]
    Threshold(String),
    #[error("duration {0:?}: expected a number with ms, s, m or h, e.g. 500ms or 60s")]
    Duration(String),
    #[error("writing {path}: {reason}")]
    Write { path: String, reason: String },
}

/// `500ms`, `60s`, `5m`, `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, RemoteError> {
    let bad = || RemoteError::Duration(text.to_string());
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(bad)?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit {
        "ms" => number / 1e3,
        "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => return Err(bad()),
    };
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// A latency percentile (50, 99.9, ...), in seconds.
    Percentile(f64),
    Max,
    Mean,
    /// Failed requests over all requests.
    Errors,
    /// Answered requests per second.
    Rps,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum Comparison {
    Below,
    AtMost,
    Above,
    AtLeast,
}

/// Which latency a figure is of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Series {
    /// Each request's whole latency (an answer's last token).
    #[default]
    Latency,
    /// An answer's first text (`ttft_`).
    Ttft,
    /// The gaps between an answer's text chunks (`itl_`).
    Itl,
}

/// A pass condition on one figure of the run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Threshold {
    pub text: String,
    pub series: Series,
    pub metric: Metric,
    pub comparison: Comparison,
    /// Seconds for latencies, a share for errors, per second for rps.
    pub bound: f64,
}

impl FromStr for Threshold {
    type Err = RemoteError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || RemoteError::Threshold(text.to_string());
        let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        let (at, comparison, width) = [
            ("<=", Comparison::AtMost),
            (">=", Comparison::AtLeast),
            ("<", Comparison::Below),
            (">", Comparison::Above),
        ]
        .into_iter()
        .find_map(|(op, comparison)| compact.find(op).map(|at| (at, comparison, op.len())))
        .ok_or_else(bad)?;
        let (name, value) = (&compact[..at], &compact[at + width..]);
        let (series, name) = match (name.strip_prefix("ttft_"), name.strip_prefix("itl_")) {
            (Some(rest), _) => (Series::Ttft, rest),
            (_, Some(rest)) => (Series::Itl, rest),
            _ => (Series::Latency, name),
        };
        let metric = match name {
            "max" => Metric::Max,
            "mean" | "avg" => Metric::Mean,
            "errors" => Metric::Errors,
            "rps" => Metric::Rps,
            p => {
                let percentile: f64 = p
                    .strip_prefix('p')
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(bad)?;
                if !(0.0..=100.0).contains(&percentile) {
                    return Err(bad());
                }
                Metric::Percentile(percentile)
            }
        };
        if series != Series::Latency && matches!(metric, Metric::Errors | Metric::Rps) {
            return Err(bad());
        }
        let bound = match metric {
            Metric::Errors => match value.strip_suffix('%') {
                Some(percent) => percent.parse::<f64>().map_err(|_| bad())? / 100.0,
                None => value.parse().map_err(|_| bad())?,
            },
            Metric::Rps => value.parse().map_err(|_| bad())?,
            _ => parse_duration(value).map_err(|_| bad())?.as_secs_f64(),
        };
        Ok(Self {
            text: text.trim().to_string(),
            series,
            metric,
            comparison,
            bound,
        })
    }
}

/// What a run measured, latencies in seconds.
#[derive(Clone, Debug, Serialize)]
pub struct RunSummary {
    pub requests: usize,
    pub errors: usize,
    pub error_rate: f64,
    /// Answered (successful) requests per second of the run.
    pub rps: f64,
    pub wall_s: f64,
    pub mean_s: f64,
    /// `(percentile, seconds)` for each of [`PERCENTILES`].
    pub percentiles: Vec<(f64, f64)>,
    pub max_s: f64,
    /// The first few distinct errors, with their counts.
    pub error_kinds: Vec<(String, usize)>,
    /// Answers: time to first text, and the gaps between text chunks.
    pub ttft: Option<SeriesFigures>,
    pub itl: Option<SeriesFigures>,
    /// Every latency, for thresholds on any percentile and the spectrum.
    #[serde(skip)]
    pub histogram: Histogram<u64>,
}

/// The percentiles of one more latency series of a run (seconds).
#[derive(Clone, Debug, Serialize)]
pub struct SeriesFigures {
    pub samples: u64,
    pub mean_s: f64,
    pub percentiles: Vec<(f64, f64)>,
    pub max_s: f64,
    #[serde(skip)]
    pub histogram: Histogram<u64>,
}

impl SeriesFigures {
    pub fn of(values: impl IntoIterator<Item = Duration>) -> Self {
        let histogram = histogram_of(values);
        Self {
            samples: histogram.len(),
            mean_s: histogram.mean() / 1e6,
            percentiles: PERCENTILES
                .iter()
                .map(|p| (*p, seconds(histogram.value_at_percentile(*p))))
                .collect(),
            max_s: seconds(histogram.max()),
            histogram,
        }
    }
}

fn seconds(micros: u64) -> f64 {
    micros as f64 / 1e6
}

impl RunSummary {
    pub fn new<R>(records: &[Sent<R>], wall: Duration) -> Self {
        let histogram = histogram_of(records.iter().map(|r| r.latency));
        let errors = records.iter().filter(|r| r.result.is_err()).count();
        let mut kinds: Vec<(String, usize)> = Vec::new();
        for error in records.iter().filter_map(|r| r.result.as_ref().err()) {
            // The kind, not the request's own details (status and first words).
            let kind: String = error.chars().take(60).collect();
            match kinds.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, n)) => *n += 1,
                None => kinds.push((kind, 1)),
            }
        }
        kinds.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        kinds.truncate(5);
        let wall_s = wall.as_secs_f64();
        Self {
            requests: records.len(),
            errors,
            error_rate: if records.is_empty() {
                0.0
            } else {
                errors as f64 / records.len() as f64
            },
            rps: if wall_s > 0.0 {
                (records.len() - errors) as f64 / wall_s
            } else {
                0.0
            },
            wall_s,
            mean_s: histogram.mean() / 1e6,
            percentiles: PERCENTILES
                .iter()
                .map(|p| (*p, seconds(histogram.value_at_percentile(*p))))
                .collect(),
            max_s: seconds(histogram.max()),
            error_kinds: kinds,
            ttft: None,
            itl: None,
            histogram,
        }
    }

    /// With answers' times to first text and gaps between text chunks.
    pub fn with_answer_times(
        mut self,
        ttfts: impl IntoIterator<Item = Duration>,
        gaps: impl IntoIterator<Item = Duration>,
    ) -> Self {
        self.ttft = Some(SeriesFigures::of(ttfts));
        self.itl = Some(SeriesFigures::of(gaps));
        self
    }

    fn value(&self, metric: Metric) -> f64 {
        match metric {
            Metric::Max => self.max_s,
            Metric::Mean => self.mean_s,
            Metric::Errors => self.error_rate,
            Metric::Rps => self.rps,
            Metric::Percentile(p) => self
                .percentiles
                .iter()
                .find(|(q, _)| (*q - p).abs() < 1e-9)
                .map_or(f64::NAN, |(_, v)| *v),
        }
    }

    /// Each threshold with the run's value and whether it held.
    pub fn judge(&self, thresholds: &[Threshold]) -> Vec<Verdict> {
        thresholds
            .iter()
            .map(|t| {
                let value = match t.series {
                    Series::Latency => match t.metric {
                        // Any percentile, not only the reported ones.
                        Metric::Percentile(p) => seconds(self.histogram.value_at_percentile(p)),
                        other => self.value(other),
                    },
                    // NaN (a failed threshold) when the run measured no answers.
                    Series::Ttft => self.ttft.as_ref().map_or(f64::NAN, |f| f.value(t.metric)),
                    Series::Itl => self.itl.as_ref().map_or(f64::NAN, |f| f.value(t.metric)),
                };
                let passed = match t.comparison {
                    Comparison::Below => value < t.bound,
                    Comparison::AtMost => value <= t.bound,
                    Comparison::Above => value > t.bound,
                    Comparison::AtLeast => value >= t.bound,
                };
                Verdict {
                    threshold: t.text.clone(),
                    value,
                    passed,
                }
            })
            .collect()
    }

    pub fn text(&self) -> String {
        let mut out = format!(
            "requests {}  errors {} ({:.3}%)  {:.1} answered/s over {:.1} s\nlatency  mean {}",
            self.requests,
            self.errors,
            self.error_rate * 100.0,
            self.rps,
            self.wall_s,
            ms(self.mean_s)
        );
        for (p, v) in &self.percentiles {
            let _ = write!(out, "  p{p} {}", ms(*v));
        }
        let _ = write!(out, "  max {}", ms(self.max_s));
        for (name, figures) in [("first token", &self.ttft), ("between tokens", &self.itl)] {
            if let Some(figures) = figures {
                let _ = write!(out, "\n{name}  mean {}", ms(figures.mean_s));
                for (p, v) in &figures.percentiles {
                    let _ = write!(out, "  p{p} {}", ms(*v));
                }
                let _ = write!(out, "  max {}", ms(figures.max_s));
            }
        }
        for (kind, n) in &self.error_kinds {
            let _ = write!(out, "\nerror x{n}: {kind}");
        }
        out
    }
}

impl SeriesFigures {
    fn value(&self, metric: Metric) -> f64 {
        match metric {
            Metric::Percentile(p) => seconds(self.histogram.value_at_percentile(p)),
            Metric::Max => self.max_s,
            Metric::Mean => self.mean_s,
            Metric::Errors | Metric::Rps => f64::NAN,
        }
    }
}

fn ms(seconds: f64) -> String {
    format!("{:.2} ms", seconds * 1e3)
}

#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub threshold: String,
    pub value: f64,
    pub passed: bool,
}

/// The histogram's percentile spectrum in HdrHistogram's `.hgrm` text format (values in
/// milliseconds), which HdrHistogram's plotter and most latency tools read.
pub fn hgrm(histogram: &Histogram<u64>) -> String {
    let mut out = format!(
        "{:>12} {:>14} {:>10} {:>14}\n\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    );
    let mut total = 0u64;
    for step in histogram.iter_quantiles(5) {
        total += step.count_since_last_iteration();
        let quantile = step.quantile_iterated_to();
        let inverse = if quantile < 1.0 {
            format!("{:>14.2}", 1.0 / (1.0 - quantile))
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "{:>12.3} {:>14.12} {:>10} {inverse}",
            step.value_iterated_to() as f64 / 1e3,
            quantile,
            total,
        );
    }
    let _ = writeln!(
        out,
        "#[Mean    = {:>12.3}, StdDeviation   = {:>12.3}]",
        histogram.mean() / 1e3,
        histogram.stdev() / 1e3
    );
    let _ = writeln!(
        out,
        "#[Max     = {:>12.3}, Total count    = {:>12}]",
        histogram.max() as f64 / 1e3,
        histogram.len()
    );
    // HdrHistogram's sub-bucket count: 2 x 10^digits rounded up to a power of two.
    let sub_buckets = (2.0 * 10f64.powi(i32::from(histogram.sigfig())))
        .log2()
        .ceil()
        .exp2();
    let _ = writeln!(
        out,
        "#[Buckets = {:>12}, SubBuckets     = {:>12}]",
        histogram.buckets(),
        sub_buckets
    );
    out
}

/// One second of the run: requests sent in it (by intended send time), their errors, and
/// their latency percentiles.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SecondRow {
    pub second: u64,
    pub requests: usize,
    pub errors: usize,
    pub p50_s: f64,
    pub p99_s: f64,
    pub max_s: f64,
}

pub fn time_series<R>(records: &[Sent<R>]) -> Vec<SecondRow> {
    let mut seconds: std::collections::BTreeMap<u64, Vec<&Sent<R>>> = Default::default();
    for record in records {
        seconds
            .entry(record.sent.as_secs())
            .or_default()
            .push(record);
    }
    seconds
        .into_iter()
        .map(|(second, group)| {
            let histogram = histogram_of(group.iter().map(|r| r.latency));
            SecondRow {
                second,
                requests: group.len(),
                errors: group.iter().filter(|r| r.result.is_err()).count(),
                p50_s: seconds_of(&histogram, 50.0),
                p99_s: seconds_of(&histogram, 99.0),
                max_s: histogram.max() as f64 / 1e6,
            }
        })
        .collect()
}

fn seconds_of(histogram: &Histogram<u64>, percentile: f64) -> f64 {
    histogram.value_at_percentile(percentile) as f64 / 1e6
}

pub fn time_series_csv(rows: &[SecondRow]) -> String {
    let mut out = String::from("second,requests,errors,p50_s,p99_s,max_s\n");
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{:.6},{:.6},{:.6}",
            r.second, r.requests, r.errors, r.p50_s, r.p99_s, r.max_s
        );
    }
    out
}

/// Latency against percentile on a log scale of 1/(1-p), so that p99.9 and p99.99 get as
/// much room as the median.
pub fn percentile_plot(histogram: &Histogram<u64>, path: &Path) -> Result<(), RemoteError> {
    let failed = |e: String| RemoteError::Write {
        path: path.display().to_string(),
        reason: e,
    };
    let points: Vec<(f64, f64)> = histogram
        .iter_quantiles(5)
        .filter(|s| s.quantile_iterated_to() < 1.0)
        .map(|s| {
            (
                1.0 / (1.0 - s.quantile_iterated_to()),
                s.value_iterated_to() as f64 / 1e3,
            )
        })
        .collect();
    let top = points.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-3) * 1.1;
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed(e.to_string_full()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Latency by percentile", ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d((1.0..1e5).log_scale(), 0.0..top)
        .map_err(|e| failed(e.to_string_full()))?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (ms)")
        .x_label_formatter(&|x| {
            let percentile = 100.0 * (1.0 - 1.0 / x);
            format!("{percentile:.2}%")
        })
        .draw()
        .map_err(|e| failed(e.to_string_full()))?;
    chart
        .draw_series(LineSeries::new(points, BLUE.stroke_width(2)))
        .map_err(|e| failed(e.to_string_full()))?;
    root.present().map_err(|e| failed(e.to_string_full()))
}

/// Where a deployment is and how to reach it.
#[derive(Clone, Debug, Default)]
pub struct Deployment {
    /// Edge base URLs (`http://host:port`, `https://...`).
    pub edges: Vec<String>,
    /// Bearer token every request carries (a tenant's).
    pub token: Option<String>,
    /// PEM CA certificate to trust for `https` edges, beside the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    pub request_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the token is not a valid header value")]
    Token,
    #[error("the CA certificate")]
    Ca(#[source] reqwest::Error),
    #[error("building the HTTP client")]
    Build(#[source] reqwest::Error),
}

impl Deployment {
    /// The client every request goes through: the token on each, the CA trusted.
    pub fn client(&self) -> Result<reqwest::Client, ClientError> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = &self.token {
            let value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| ClientError::Token)?;
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let mut builder =
            crate::driver::client_builder(self.request_timeout).default_headers(headers);
        if let Some(pem) = &self.ca_pem {
            builder = builder.add_root_certificate(
                reqwest::Certificate::from_pem(pem).map_err(ClientError::Ca)?,
            );
        }
        builder.build().map_err(ClientError::Build)
    }
}

/// Writes `summary.json` (figures, thresholds and verdicts), `latency.hgrm`,
/// `timeseries.csv` and `percentiles.svg` into `dir`.
pub fn write_outputs<R>(
    dir: &Path,
    summary: &RunSummary,
    verdicts: &[Verdict],
    records: &[Sent<R>],
) -> Result<(), RemoteError> {
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| RemoteError::Write {
            path: path.display().to_string(),
            reason: e.to_string_full(),
        })
    };
    std::fs::create_dir_all(dir).map_err(|e| RemoteError::Write {
        path: dir.display().to_string(),
        reason: e.to_string_full(),
    })?;
    let histogram = &summary.histogram;
    let json = serde_json::json!({"summary": summary, "thresholds": verdicts});
    write(
        "summary.json",
        serde_json::to_string_pretty(&json).unwrap_or_default(),
    )?;
    write("latency.hgrm", hgrm(histogram))?;
    write("timeseries.csv", time_series_csv(&time_series(records)))?;
    percentile_plot(histogram, &dir.join("percentiles.svg"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scoring::QueryRecord;
    use crate::workload::WorkloadQuery;

    fn record(latency_ms: u64, sent_s: u64, ok: bool) -> QueryRecord {
        QueryRecord {
            question: WorkloadQuery::default(),
            edge: 0,
            latency: Duration::from_millis(latency_ms),
            sent: Duration::from_secs(sent_s),
            result: if ok {
                Ok(serde_json::from_value(serde_json::json!({
                    "documents": [], "outcome": "fallback", "matched_query": null
                }))
                .unwrap())
            } else {
                Err("HTTP 503: unavailable".into())
            },
        }
    }

    #[test]
    fn thresholds_parse_with_units_and_refuse_nonsense() {
        let t: Threshold = "p99<0.2s".parse().unwrap();
        assert_eq!(
            (t.metric, t.comparison, t.bound),
            (Metric::Percentile(99.0), Comparison::Below, 0.2)
        );
        let t: Threshold = "p99.9 <= 500ms".parse().unwrap();
        assert_eq!((t.metric, t.bound), (Metric::Percentile(99.9), 0.5));
        let t: Threshold = "errors<0.1%".parse().unwrap();
        assert_eq!((t.metric, t.bound), (Metric::Errors, 0.001));
        let t: Threshold = "rps>=100".parse().unwrap();
        assert_eq!((t.metric, t.comparison), (Metric::Rps, Comparison::AtLeast));
        let t: Threshold = "ttft_p99<2s".parse().unwrap();
        assert_eq!(
            (t.series, t.metric, t.bound),
            (Series::Ttft, Metric::Percentile(99.0), 2.0)
        );
        let t: Threshold = "itl_mean<=80ms".parse().unwrap();
        assert_eq!(
            (t.series, t.metric, t.bound),
            (Series::Itl, Metric::Mean, 0.08)
        );
        for bad in [
            "p99",
            "p101<1s",
            "latency<1s",
            "p99<fast",
            "errors<lots",
            "ttft_errors<1%",
            "itl_rps>1",
        ] {
            assert!(bad.parse::<Threshold>().is_err(), "{bad}");
        }
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert!(parse_duration("10").is_err());
    }

    #[test]
    fn a_run_is_judged_on_its_own_figures() {
        // 98 fast answers, one slow, one error.
        let mut records: Vec<QueryRecord> = (0..98).map(|i| record(10, i / 50, true)).collect();
        records.push(record(900, 1, true));
        records.push(record(5, 1, false));
        let summary = RunSummary::new(&records, Duration::from_secs(2));
        assert_eq!((summary.requests, summary.errors), (100, 1));
        assert!((summary.rps - 49.5).abs() < 1e-9);
        assert!((summary.max_s - 0.9).abs() < 0.001, "{}", summary.max_s);
        let verdicts = summary.judge(&[
            "p50<20ms".parse().unwrap(),
            "max<100ms".parse().unwrap(),
            "errors<=1%".parse().unwrap(),
            "errors<1%".parse().unwrap(),
        ]);
        let passed: Vec<bool> = verdicts.iter().map(|v| v.passed).collect();
        assert_eq!(passed, [true, false, true, false]);

        // Answer thresholds fail a run that measured no answers, and judge the answers'
        // own times when it did: first text after 1-2 s, 50 ms between tokens.
        let answers: Vec<Threshold> = vec![
            "ttft_p99<2s".parse().unwrap(),
            "itl_p50<=60ms".parse().unwrap(),
        ];
        assert!(
            summary
                .judge(&answers)
                .iter()
                .all(|v| !v.passed && v.value.is_nan())
        );
        let ttfts = (0..100).map(|i| Duration::from_millis(1000 + 10 * i));
        let gaps = std::iter::repeat_n(Duration::from_millis(50), 300);
        let answered = summary.clone().with_answer_times(ttfts, gaps);
        let verdicts = answered.judge(&answers);
        assert!(verdicts.iter().all(|v| v.passed), "{verdicts:?}");
        assert!((verdicts[0].value - 1.99).abs() < 0.01, "{verdicts:?}");
        let slow = answered.judge(&["ttft_p50<1s".parse().unwrap()]);
        assert!(!slow[0].passed);

        let series = time_series(&records);
        assert_eq!(series.len(), 2);
        assert_eq!((series[0].requests, series[1].requests), (50, 50));
        assert_eq!(series[1].errors, 1);
        let spectrum = hgrm(&summary.histogram);
        assert!(spectrum.starts_with("       Value"), "{spectrum}");
        assert!(
            spectrum.contains("Total count    =          100"),
            "{spectrum}"
        );
    }
}
