//! Reading a Prometheus text exposition, as Prometheus would scrape it.

use std::collections::BTreeMap;

use anyhow::{Context, Result};

/// One scrape: every sample as (metric name, labels, value).
#[derive(Debug)]
pub struct Scrape {
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl Scrape {
    /// GETs `http://{addr}/metrics` and parses it.
    pub async fn of(addr: &str) -> Result<Self> {
        let text = reqwest::get(format!("http://{addr}/metrics"))
            .await?
            .error_for_status()?
            .text()
            .await?;
        Self::parse(&text)
    }

    pub fn parse(text: &str) -> Result<Self> {
        let mut samples = Vec::new();
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let (series, value) = line
                .rsplit_once(' ')
                .with_context(|| format!("no value in `{line}`"))?;
            let value: f64 = value
                .parse()
                .with_context(|| format!("bad value in `{line}`"))?;
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|pair| !pair.is_empty())
                .filter_map(|pair| pair.split_once('='))
                .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
                .collect();
            samples.push((name.to_string(), labels, value));
        }
        Ok(Self { samples })
    }

    /// The sum of `name`'s samples whose labels include `labels` (0 when there is none).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).is_some_and(|have| have == v))
            })
            .map(|(_, _, v)| v)
            .sum()
    }

    /// Whether any sample of `name` exists.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|(n, _, _)| n == name)
    }
}
