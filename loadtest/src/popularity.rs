//! Entity popularity over days: where TopViews-shaped traffic comes from.
//!
//! Two sources: a Wikipedia TopViews-style CSV (`date,article,views`), or the built-in model:
//! each day the entities are ranked and drawn by Zipf(s) over rank; the ranking is reshuffled
//! daily by a log-normal jitter of every entity's base popularity, and on some days one
//! entity from outside the top ten trends to rank one for that day. Everything is seeded.

use std::collections::BTreeMap;
use std::path::Path;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

/// Parameters of the built-in popularity model. See `loadtest/README.md` for why the
/// defaults are what they are.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ZipfModel {
    /// Zipf exponent over the day's ranking.
    pub exponent: f64,
    /// Days the workload spans; queries are spread evenly over them.
    pub days: usize,
    /// Standard deviation of the daily log-normal jitter of base popularity (0: a fixed ranking).
    pub daily_jitter: f64,
    /// Chance per day that an entity from outside the top ten trends to rank one.
    pub burst_probability: f64,
    pub seed: u64,
}

impl Default for ZipfModel {
    fn default() -> Self {
        Self {
            exponent: 1.0,
            days: 7,
            daily_jitter: 0.5,
            burst_probability: 0.3,
            seed: 7,
        }
    }
}

/// Per day, the entities (indexes into the caller's entity list) with their draw weights.
#[derive(Clone, Debug, PartialEq)]
pub struct DailyPopularity {
    pub days: Vec<Vec<(usize, f64)>>,
}

#[derive(Debug, thiserror::Error)]
pub enum PopularityError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Format {
        path: String,
        line: usize,
        message: String,
    },
    #[error("no article in {0} matches an entity with questions")]
    NoMatch(String),
    #[error("invalid popularity model: {0}")]
    Invalid(String),
}

impl ZipfModel {
    /// Daily rankings of `entities` entities under the model.
    pub fn daily(&self, entities: usize) -> Result<DailyPopularity, PopularityError> {
        if entities == 0 || self.days == 0 {
            return Err(PopularityError::Invalid(
                "needs at least one entity and one day".into(),
            ));
        }
        if !(self.exponent.is_finite() && self.exponent >= 0.0) {
            return Err(PopularityError::Invalid(format!(
                "exponent {} must be finite and >= 0",
                self.exponent
            )));
        }
        if !(0.0..=1.0).contains(&self.burst_probability) {
            return Err(PopularityError::Invalid(
                "burst probability must be in [0, 1]".into(),
            ));
        }
        let jitter = Normal::new(0.0, self.daily_jitter.max(0.0))
            .map_err(|e| PopularityError::Invalid(e.to_string()))?;
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut base: Vec<usize> = (0..entities).collect();
        base.shuffle(&mut rng);
        // Base popularity of the entity at base rank r (1-based) is r^-s.
        let log_base: Vec<f64> = (0..entities)
            .map(|r| -self.exponent * ((r + 1) as f64).ln())
            .collect();
        let mut days = Vec::with_capacity(self.days);
        for _ in 0..self.days {
            let mut ranked: Vec<(usize, f64)> = base
                .iter()
                .zip(&log_base)
                .map(|(&e, &lb)| (e, lb + jitter.sample(&mut rng)))
                .collect();
            ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
            if entities > 10 && rng.random_bool(self.burst_probability) {
                let trending = ranked.remove(rng.random_range(10..entities));
                ranked.insert(0, trending);
            }
            days.push(
                ranked
                    .iter()
                    .enumerate()
                    .map(|(rank, &(e, _))| (e, ((rank + 1) as f64).powf(-self.exponent)))
                    .collect(),
            );
        }
        Ok(DailyPopularity { days })
    }
}

/// TopViews exports name articles with underscores (`Super_Bowl_50`); entities use spaces.
fn article_key(article: &str) -> String {
    article.trim().trim_matches('"').replace('_', " ")
}

/// Daily popularity from a TopViews-style CSV (`date,article,views`, header optional,
/// one row per article and day; gzipped or not). Articles are matched to `entities` by title; the rest of
/// the export (articles without questions) is ignored.
pub fn topviews_csv(path: &Path, entities: &[String]) -> Result<DailyPopularity, PopularityError> {
    let shown = path.display().to_string();
    let text = hasten_core::corpus::read_text(path).map_err(|source| PopularityError::Io {
        path: shown.clone(),
        source,
    })?;
    let index: BTreeMap<String, usize> = entities
        .iter()
        .enumerate()
        .map(|(i, e)| (article_key(e), i))
        .collect();
    let mut by_date: BTreeMap<String, Vec<(usize, f64)>> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.rsplitn(2, ',').collect();
        let (views, rest) = match fields.as_slice() {
            [views, rest] => (*views, *rest),
            _ => {
                return Err(PopularityError::Format {
                    path: shown,
                    line: i + 1,
                    message: "expected date,article,views".into(),
                });
            }
        };
        let Some((date, article)) = rest.split_once(',') else {
            return Err(PopularityError::Format {
                path: shown,
                line: i + 1,
                message: "expected date,article,views".into(),
            });
        };
        let views: f64 = match views.trim().parse() {
            Ok(v) => v,
            Err(_) if i == 0 => continue, // header
            Err(_) => {
                return Err(PopularityError::Format {
                    path: shown,
                    line: i + 1,
                    message: format!("views {views:?} is not a number"),
                });
            }
        };
        if let Some(&entity) = index.get(&article_key(article))
            && views > 0.0
        {
            by_date
                .entry(date.trim().to_string())
                .or_default()
                .push((entity, views));
        }
    }
    if by_date.is_empty() {
        return Err(PopularityError::NoMatch(shown));
    }
    Ok(DailyPopularity {
        days: by_date.into_values().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Least-squares slope of log(frequency) against log(rank) over the top `ranks` ranks.
    fn rank_frequency_slope(counts: &[usize], ranks: usize) -> f64 {
        let mut sorted: Vec<usize> = counts.to_vec();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let points: Vec<(f64, f64)> = sorted
            .iter()
            .take(ranks)
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(r, &c)| (((r + 1) as f64).ln(), (c as f64).ln()))
            .collect();
        let n = points.len() as f64;
        let (sx, sy) = points
            .iter()
            .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
        let (mx, my) = (sx / n, sy / n);
        let cov: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
        let var: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
        cov / var
    }

    fn draw_day(day: &[(usize, f64)], entities: usize, draws: usize, seed: u64) -> Vec<usize> {
        let total: f64 = day.iter().map(|(_, w)| w).sum();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut counts = vec![0usize; entities];
        for _ in 0..draws {
            let mut x = rng.random::<f64>() * total;
            for &(e, w) in day {
                if x < w {
                    counts[e] += 1;
                    break;
                }
                x -= w;
            }
        }
        counts
    }

    #[test]
    fn seeded_and_reproducible() {
        let model = ZipfModel::default();
        assert_eq!(model.daily(50).unwrap(), model.daily(50).unwrap());
        let other = ZipfModel {
            seed: 8,
            ..ZipfModel::default()
        };
        assert_ne!(model.daily(50).unwrap(), other.daily(50).unwrap());
    }

    #[test]
    fn rank_frequency_slope_is_near_the_exponent() {
        for exponent in [0.8, 1.0, 1.2] {
            let model = ZipfModel {
                exponent,
                days: 1,
                burst_probability: 0.0,
                ..ZipfModel::default()
            };
            let day = &model.daily(2000).unwrap().days[0];
            let counts = draw_day(day, 2000, 200_000, 1);
            let slope = rank_frequency_slope(&counts, 100);
            assert!(
                (slope + exponent).abs() < 0.1,
                "s = {exponent}: slope {slope}"
            );
        }
    }

    #[test]
    fn rankings_change_daily_and_bursts_reach_the_top() {
        let model = ZipfModel {
            days: 20,
            burst_probability: 1.0,
            ..ZipfModel::default()
        };
        let days = model.daily(100).unwrap().days;
        let tops: std::collections::HashSet<usize> = days.iter().map(|d| d[0].0).collect();
        assert!(tops.len() > 5, "the top entity never changes: {tops:?}");
        let still = ZipfModel {
            days: 5,
            daily_jitter: 0.0,
            burst_probability: 0.0,
            ..ZipfModel::default()
        };
        let fixed = still.daily(100).unwrap().days;
        assert!(
            fixed.windows(2).all(|w| w[0] == w[1]),
            "no jitter, no bursts: one ranking"
        );
    }

    #[test]
    fn topviews_csv_maps_articles_to_entities_by_day() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("topviews.csv");
        std::fs::write(
            &path,
            "date,article,views\n2026-01-01,Super_Bowl_50,900\n2026-01-01,Unknown_Article,5000\n\
             2026-01-01,Warsaw,100\n2026-01-02,Warsaw,300\n",
        )
        .unwrap();
        let entities = vec!["Warsaw".to_string(), "Super Bowl 50".to_string()];
        let days = topviews_csv(&path, &entities).unwrap().days;
        assert_eq!(days, vec![vec![(1, 900.0), (0, 100.0)], vec![(0, 300.0)]]);
        std::fs::write(&path, "2026-01-01,Warsaw,1\n2026-01-01,Warsaw,many\n").unwrap();
        assert!(matches!(
            topviews_csv(&path, &entities),
            Err(PopularityError::Format { line: 2, .. })
        ));
        std::fs::write(&path, "2026-01-01,Nothing,1\n").unwrap();
        assert!(matches!(
            topviews_csv(&path, &entities),
            Err(PopularityError::NoMatch(_))
        ));
    }
}
